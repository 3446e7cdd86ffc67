"""Per-layer cost of the vLLM plugin's gated decode (``attend.decode_gated``) when the gate fires.

A realistic gated batch: SmolLM2's attention (Hq 9, Hkv 3, D 64), ``--batch`` sequences of
``--min-len`` .. ``--max-len`` context tokens (seeded), page 16, keys with a few wide
channels (large radii) so that many (sequence, query head) certificates exceed tau 0.2.
Each timed call starts from an exact copy with no live entry (the flags are reset), so
every call repairs the same fired heads from scratch: what is timed is the first pass plus
the repair. Prints best-of-repeats ms per call, the fired heads and the ms per fired head,
for ``native="on"`` (the C first pass and the native repair) and, with ``--torch``, the
reference path (``native="off"``: the reference decode and the same gate).

    python benchmarks/bench_vllm_gate.py [--batch 16] [--min-len 300] [--max-len 1500]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from witcert.config import CertConfig, RepairPolicy
from witcert.integrations.vllm.attend import anytime_delta, decode_gated
from witcert.ref.pool import write_

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from cases import vllm_gated_layer  # noqa: E402  (the tests' shared case generator)


def build(*, B, lo, hi, hq, hkv, D, page, wide, seed):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (B,), generator=g)
    pages = [-(-int(n) // page) for n in lens]
    blocks = sum(pages) + 1
    perm = torch.randperm(blocks - 1, generator=g) + 1  # scattered pages, block 0 unused
    bt = torch.zeros(B, max(pages), dtype=torch.int32)
    at = 0
    for b, p in enumerate(pages):
        bt[b, :p] = perm[at:at + p].to(torch.int32)
        at += p
    lkv, ex = vllm_gated_layer(blocks=blocks, page=page, hkv=hkv, d=D, layer=3)
    epochs = lkv.epochs
    S = blocks * page
    k = torch.randn(S, hkv, D, generator=g) * 1.5
    k[:, :, :2] += wide * torch.rand(S, hkv, 2, generator=g)  # wide groups: large radii
    v = torch.randn(S, hkv, D, generator=g)
    slots = torch.arange(S)
    epochs[slots] += 1
    write_(lkv, k.bfloat16(), v.bfloat16(), slots=slots)
    ex.write_(slots, k.bfloat16(), v.bfloat16())
    q = torch.randn(B, hq, D, generator=g)
    q[:, :, :2] *= 2.0
    return lkv, ex, q, bt, lens.to(torch.int32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--min-len", type=int, default=300)
    ap.add_argument("--max-len", type=int, default=1500)
    ap.add_argument("--hq", type=int, default=9)
    ap.add_argument("--hkv", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--wide", type=float, default=24.0, help="spread of the wide key channels")
    ap.add_argument("--tau", type=float, default=0.2)
    ap.add_argument("--mode", default="block", choices=["block", "head"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--torch", action="store_true", help="also time native='off'")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    lkv, ex, q, bt, sl = build(B=a.batch, lo=a.min_len, hi=a.max_len, hq=a.hq, hkv=a.hkv,
                               D=a.head_dim, page=16, wide=a.wide, seed=a.seed)
    cert = CertConfig(radius="min", allocation="anytime", tau=a.tau)
    d = anytime_delta(cert, num_layers=30, num_q_heads=a.hq, positions=sl)
    pol = RepairPolicy(mode=a.mode, block_tokens=16)
    print(f"batch {a.batch} x {a.min_len}..{a.max_len} (sum {int(sl.sum())} tokens), "
          f"Hq {a.hq} Hkv {a.hkv} D {a.head_dim}, tau {a.tau}, mode {a.mode}, 1 thread")
    for nat in (["on", "off"] if a.torch else ["on"]):
        def call():
            ex.exact.zero_()
            return decode_gated(q, lkv, ex, bt, sl, page_size=16, sm_scale=a.head_dim ** -0.5,
                                cert=cert, delta_loc=d, repair=pol, native=nat, num_threads=1)
        _, c, ev = call()
        runs = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            call()
            runs.append((time.perf_counter() - t0) * 1e3)
        ms = min(runs)
        print(f"native={nat}: {ms:9.2f} ms/call  fired {ev.fired}/{c.numel()} heads, "
              f"repaired {ev.repaired}, tokens {ev.tokens}, blocks {ev.blocks}, "
              f"after_max {ev.after_max:.4f}  -> {ms / max(ev.fired, 1):.3f} ms per fired head")
    # the same first pass with a tau nothing exceeds: the cost of the decode alone
    c0 = CertConfig(radius="min", allocation="anytime", tau=1e30)
    ex.exact.zero_()
    f = lambda: decode_gated(q, lkv, ex, bt, sl, page_size=16, sm_scale=a.head_dim ** -0.5,  # noqa: E731
                             cert=c0, delta_loc=d, repair=pol, native="on", num_threads=1)
    f()
    runs = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        f()
        runs.append((time.perf_counter() - t0) * 1e3)
    print(f"first pass only (nothing fires): {min(runs):9.2f} ms/call")


if __name__ == "__main__":
    main()
