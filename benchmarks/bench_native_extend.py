"""Per-layer cost of the extend (prompt tokens over a compressed prefix) on CPU.

Four implementations on the same pool and tokens, in the same run, per (new tokens,
prefix) size:

- ``native``: the C extend with a certificate per (new token, query head)
  (``witcert.native.extend``, its default fp32 dots and value pass, with the exact new
  tokens' bf16-pair dots where the CPU has AVX512-BF16; also timed with the certificate off,
  with ``bf16_dots=False`` (no bf16 route: fp32 dots and value pass throughout, ``no bf16`` and
  the ``bf16 gain`` ratio), with the bf16 dots but the fp32 value pass (a build without the
  bf16 value pass, ``-DWCX_NO_BFV``: ``fp32 values`` and the ``bf16 v gain`` ratio),
  and with ``arith="f64"``, float64 throughout, docs/PROOFS.md 5.3);
- ``spec``: the float64 reference with certificates (``witcert.ref.extend``), what a CPU
  path without the C library runs;
- ``torch fp32``: the plain reference extend without certificates
  (``witcert.ref.attention.extend_attention``: dequantize, fp32 einsum softmax), the vLLM
  plugin's extend before the C path;
- ``SDPA``: ``torch.nn.functional.scaled_dot_product_attention`` in float32 on exact K/V
  with the causal mask (no compression, no certificate): the dense baseline.

Default shape: SmolLM2's attention (Hq 9, Hkv 3, D 64, what the CPU plugins serve);
``--shape llama`` for Hq 32, Hkv 8, D 128. 8-bit dither (the default preset; ``--bits``), radius min.
Prints the best-of-repeats ms per layer and the ratios against SDPA.

    python benchmarks/bench_native_extend.py [--new 128 512 1536] [--prefix 0 1024]
        [--shape smol|llama] [--threads 1] [--clock wall|cpu] [--out result.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

from witcert.config import CertConfig, QuantConfig
from witcert.native.extend import extend_one
from witcert.ref.attention import extend_attention
from witcert.ref.extend import extend_attention_cert
from witcert.ref.pool import LayerKV, write_

SHAPES = {"smol": (9, 3, 64), "llama": (32, 8, 128)}


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def best_ms(fn, *, repeats: int, clock=time.perf_counter) -> float:
    fn()  # warm-up (the first native call builds / loads the library)
    runs = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        runs.append((clock() - t0) * 1e3)
    return min(runs)


def case(*, T: int, Np: int, hq: int, hkv: int, d: int, bits: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n = max(Np, 1)
    lkv = LayerKV.allocate(num_slots=n, num_kv_heads=hkv, head_dim=d,
                           quant=QuantConfig(dither_bits=bits), layer=3, seed=0x5EED,
                           epochs=torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64))
    kp = torch.randn(Np, hkv, d, generator=g).bfloat16()
    vp = torch.randn(Np, hkv, d, generator=g).bfloat16()
    slots = torch.randperm(n, generator=g)[:Np]
    if Np:
        write_(lkv, kp, vp, slots=slots)
    q = torch.randn(T, hq, d, generator=g).bfloat16()
    kn = torch.randn(T, hkv, d, generator=g).bfloat16()
    vn = torch.randn(T, hkv, d, generator=g).bfloat16()
    return lkv, slots, q, kn, vn, kp, vp


def sdpa(q, k, v, *, Np: int, sm: float):
    T, N = q.shape[0], k.shape[0]
    mask = torch.ones(T, N, dtype=torch.bool).tril(Np)  # new token i sees keys < Np + i + 1
    return torch.nn.functional.scaled_dot_product_attention(
        q.float().transpose(0, 1)[None], k.float().transpose(0, 1)[None],
        v.float().transpose(0, 1)[None], attn_mask=mask, scale=sm, enable_gqa=True)


def run_size(*, T: int, Np: int, shape: tuple[int, int, int], bits: int, threads: int,
             repeats: int, spec_repeats: int, clock) -> dict:
    hq, hkv, d = shape
    lkv, slots, q, kn, vn, kp, vp = case(T=T, Np=Np, hq=hq, hkv=hkv, d=d, bits=bits)
    sm = d ** -0.5
    cert, off = CertConfig(radius="min"), CertConfig(enabled=False)
    dl = 1e-9
    k_all, v_all = torch.cat([kp, kn]), torch.cat([vp, vn])
    best = lambda fn, n=repeats: best_ms(fn, repeats=n, clock=clock)  # noqa: E731
    t = {
        "native": best(lambda: extend_one(q, kn, vn, lkv, slots, sm_scale=sm, cert=cert,
                                          delta_loc=dl, num_threads=threads)),
        "native_nocert": best(lambda: extend_one(q, kn, vn, lkv, slots, sm_scale=sm, cert=off,
                                                 delta_loc=dl, num_threads=threads)),
        "native_fp32dots": best(lambda: extend_one(q, kn, vn, lkv, slots, sm_scale=sm, cert=cert,
                                                   delta_loc=dl, num_threads=threads,
                                                   bf16_dots=False)),
        "native_fp32values": best(lambda: extend_one(q, kn, vn, lkv, slots, sm_scale=sm,
                                                     cert=cert, delta_loc=dl,
                                                     num_threads=threads,
                                                     _extra_flags=("-DWCX_NO_BFV",))),
        "native_f64": best(lambda: extend_one(q, kn, vn, lkv, slots, sm_scale=sm, cert=cert,
                                              delta_loc=dl, num_threads=threads, arith="f64")),
        "torch_fp32": best(lambda: extend_attention(q, kn, vn, lkv, slots, sm_scale=sm)),
        "sdpa_fp32": best(lambda: sdpa(q, k_all, v_all, Np=Np, sm=sm)),
        # --spec-repeats 0 skips the slow float64 spec (nan in the table)
        "spec": best(lambda: extend_attention_cert(q, kn, vn, lkv, slots, sm_scale=sm, cert=cert,
                                                   delta_loc=dl), spec_repeats)
        if spec_repeats > 0 else float("nan"),
    }
    return {"new_tokens": T, "prefix": Np, "ms": t}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", type=int, nargs="+", default=[128, 512, 1536])
    ap.add_argument("--prefix", type=int, nargs="+", default=[0, 1024])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="smol")
    ap.add_argument("--bits", type=int, default=QuantConfig.dither_bits)
    ap.add_argument("--threads", type=int, default=1, help="native threads and torch threads")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--spec-repeats", type=int, default=1, help="the float64 spec is slow; 0 skips it")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall time, or the process's CPU time (steadier on a shared machine; "
                         "with one thread the same quantity)")
    ap.add_argument("--out", default=None, help="also write the results as JSON")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    shape = SHAPES[a.shape]
    print(f"extend, shape {a.shape} (Hq, Hkv, D) = {shape}, {a.bits}-bit dither, radius min, "
          f"{a.threads} thread(s); best of {a.repeats} (spec: {a.spec_repeats}), ms per layer "
          f"({a.clock} clock)")
    head = (f"{'new':>5} {'prefix':>6} | {'native':>9} {'no cert':>9} {'no bf16':>9} "
            f"{'fp32 values':>11} {'f64':>9} "
            f"{'torch fp32':>10} {'spec f64':>10} {'SDPA fp32':>9} | {'SDPA/native':>11} "
            f"{'cert on/off':>11} {'bf16 gain':>9} {'bf16 v gain':>11} {'spec/native':>11} "
            f"{'fp32/native':>11}")
    print(head)
    rows = []
    for Np in a.prefix:
        for T in a.new:
            r = run_size(T=T, Np=Np, shape=shape, bits=a.bits, threads=a.threads,
                         repeats=a.repeats, spec_repeats=a.spec_repeats, clock=CLOCKS[a.clock])
            t = r["ms"]
            r["ratios"] = {"sdpa_over_native": t["sdpa_fp32"] / t["native"],
                           "cert_on_over_off": t["native"] / t["native_nocert"],
                           "fp32dots_over_native": t["native_fp32dots"] / t["native"],
                           "fp32values_over_native": t["native_fp32values"] / t["native"],
                           "spec_over_native": t["spec"] / t["native"],
                           "torch_fp32_over_native": t["torch_fp32"] / t["native"]}
            x = r["ratios"]
            print(f"{T:>5} {Np:>6} | {t['native']:9.1f} {t['native_nocert']:9.1f} "
                  f"{t['native_fp32dots']:9.1f} {t['native_fp32values']:11.1f} "
                  f"{t['native_f64']:9.1f} "
                  f"{t['torch_fp32']:10.1f} {t['spec']:10.1f} {t['sdpa_fp32']:9.1f} | "
                  f"{x['sdpa_over_native']:10.2f}x {x['cert_on_over_off']:10.2f}x "
                  f"{x['fp32dots_over_native']:8.2f}x {x['fp32values_over_native']:10.2f}x "
                  f"{x['spec_over_native']:10.1f}x {x['torch_fp32_over_native']:10.1f}x", flush=True)
            rows.append(r)
    if a.out:
        meta = {"shape": a.shape, "hq_hkv_d": shape, "bits": a.bits, "threads": a.threads,
                "clock": a.clock,
                "repeats": a.repeats, "machine": platform.platform(), "torch": torch.__version__}
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
