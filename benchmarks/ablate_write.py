"""Where the write kernel's time goes: the shipped kernel and ablations of it, timed against
a device copy in the same run (T = 65536 tokens, Hkv 8, D 128, b = 16 and 8).

Each ablation is built from ``witcert/kernels/write.py`` by replacing one piece of its source
(``abl_nof64``: the witness's float64 error sum in fp32; ``abl_nodiv``: the IEEE division
``x / s`` by a multiply; ``abl_nophilox``: the dither by a constant; ``abl_all3``: all three).
Their results are wrong on purpose (column ``bitwise`` n/a): they measure what each piece of
the bitwise contract costs. The shipped kernel's plans (rows per program, warps) are checked
bitwise against its default. Usage: python benchmarks/ablate_write.py

``python benchmarks/ablate_write.py --profile NAME BITS ROWS WARPS`` runs one variant three
times and exits (no timing), for Nsight Compute::

    ncu --kernel-name regex:_write_kernel --launch-skip 1 --launch-count 1 \
        python benchmarks/ablate_write.py --profile base 16 8 2
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile

import torch

from bench_decode import bench_us, copy_bandwidth, kv_like, make_layer, print_table

SRC = open(os.path.join(os.path.dirname(__file__), "..", "witcert", "kernels", "write.py")).read()
NOF64 = ("err = xhat.to(tl.float64) - x.to(tl.float64)", "err = xhat - x")
NODIV = ("y = tl.math.div_rn(x, s3) + xi", "y = x * (1.0 / s3) + xi")
NOPHILOX = ("xi = dither_xi(tl.reshape(dither_r_join(w0, w1, w2, w3, BLOCK_R, D, BITS), (BLOCK_R, NG, G)), BITS)",
            "xi = 0.25 + x * 0.0 + side * 0.0")
VARS = {"base": [], "abl_nof64": [NOF64], "abl_nodiv": [NODIV], "abl_nophilox": [NOPHILOX],
        "abl_all3": [NOF64, NODIV, NOPHILOX]}  # name: [(old source, new source)]


def load(name: str, reps: list[tuple[str, str]]):
    """The write module with ``reps`` (old, new) applied to its source, imported from a
    temporary file."""
    src = SRC
    for a, b in reps:
        assert a in src, (name, a[:60])
        src = src.replace(a, b)
    d = tempfile.mkdtemp()
    p = os.path.join(d, f"wv_{name}.py")
    open(p, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"wv_{name}", p)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def profile(name: str, bits: int, rows: int, warps: int) -> None:
    """Three launches of one variant (the first compiles), for a profiler."""
    m = load(name, VARS[name])
    T, HKV, D = 65536, 8, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    layer = make_layer(hkv=HKV, d=D, num_slots=2 * T, bits=bits, outliers=0, device="cuda",
                       gen=torch.Generator().manual_seed(T))
    k, v = kv_like(T, HKV, D, gen=gen), kv_like(T, HKV, D, gen=gen)
    slots = torch.randperm(2 * T, device="cuda", generator=gen)[:T]
    for _ in range(3):
        m.write_kv_(layer, k, v, slots=slots, block_rows=rows, num_warps=warps, impl="triton")
    torch.cuda.synchronize()


def main() -> None:
    if sys.argv[1:2] == ["--profile"]:
        name, bits, rows, warps = sys.argv[2], *(int(x) for x in sys.argv[3:6])
        return profile(name, bits, rows, warps)
    HKV, D = 8, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    copy_bps = copy_bandwidth()
    mods = {n: load(n, r) for n, r in VARS.items()}
    rows = [dict(case="device copy 1 GiB", GBps=round(copy_bps / 1e9), pct_copy=100)]
    T = 65536
    for bits in (16, 8):
        layer = make_layer(hkv=HKV, d=D, num_slots=2 * T, bits=bits, outliers=0, device="cuda",
                           gen=torch.Generator().manual_seed(T))
        k = kv_like(T, HKV, D, gen=gen)
        v = kv_like(T, HKV, D, gen=gen)
        slots = torch.randperm(2 * T, device="cuda", generator=gen)[:T]
        ng = D // 32
        stored = 2 * T * HKV * (D + 2 * ng * 2)
        read = 2 * T * HKV * D * 2 + T * 16
        ref = None
        configs = [(n, 8, 2) for n in mods] + [("base", 8, 1), ("base", 16, 4), ("base", 16, 2), ("base", 32, 8)]
        for name, br, nw in configs:
            m = mods[name]
            for t in list(layer.k.values()) + list(layer.v.values()):
                t.zero_()
            try:
                m.write_kv_(layer, k, v, slots=slots, block_rows=br, num_warps=nw, impl="triton")
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                print(name, br, nw, "FAILED", type(e).__name__, str(e)[:200]); continue
            out = [t.clone() for t in list(layer.k.values()) + list(layer.v.values())]
            if ref is None:
                ref = out
            same = all(torch.equal(a, b) for a, b in zip(ref, out))
            us = bench_us(lambda: m.write_kv_(layer, k, v, slots=slots, block_rows=br, num_warps=nw, impl="triton"))
            rows.append(dict(case=f"b{bits} {name} rows={br} warps={nw}", us=round(us, 1),
                             pct_copy=round(100 * (read + stored) / (us * 1e-6) / copy_bps),
                             bitwise="yes" if same else ("n/a" if name.startswith("abl") else "NO")))
            print(rows[-1], flush=True)
    print_table(rows, ["case", "us", "pct_copy", "bitwise"])


if __name__ == "__main__":
    main()
