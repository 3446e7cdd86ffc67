"""Cost of the certificate gate when nothing fires (witcert.runtime.repair).

A decode step here is L layers of backend ``decode_attention`` over a filled pool (the
attention part of a model step only, so the gate's share is a worst case), followed by
one host sync (``generate`` syncs once per step on its stopping check). Variants:
``plain`` (no gate), ``gate-layer`` (check per layer: one ``any()`` read per layer) and
``gate-step`` (one device flag per step, read at the next step). tau is huge, so the gate
never fires: what is timed is the check alone. Prints ms per step and the overhead.

    python benchmarks/bench_gate.py --device cuda     # Triton kernels
    python benchmarks/bench_gate.py --device cpu      # reference (small sizes)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from witcert.runtime import dispatch as backend
from witcert.config import CacheConfig, CertConfig, QuantConfig, RepairPolicy
from witcert.runtime.pool import PagedPool
from witcert.runtime.repair import Gate


def build(*, L, B, S, hkv, hq, D, device):
    pool = PagedPool(num_layers=L, num_kv_heads=hkv, head_dim=D, quant=QuantConfig(seed=1),
                     cache=CacheConfig(page_size=16, num_pages=B * S // 16), device=device)
    g = torch.Generator(device=device).manual_seed(0)
    slots = pool.allocator.allocate_many(list(range(B)), [S] * B)
    flat = torch.cat(slots)
    k = (torch.randn(B * S, hkv, D, device=device, generator=g)
         * torch.exp(torch.randn(1, hkv, D, device=device, generator=g))).half()
    v = torch.randn(B * S, hkv, D, device=device, generator=g).half()
    for lkv in pool.layers:
        backend.write_kv_(lkv, k, v, slots=flat)
    q = torch.randn(B, hq, D, device=device, generator=g)
    return pool, q, pool.allocator.block_table(list(range(B))), pool.allocator.seq_lens(list(range(B)))


def step_fn(pool, q, bt, sl, ops, cert, D):
    dl = torch.full((q.shape[0],), 1e-6, dtype=torch.float32, device=q.device)

    def step():
        for lkv in pool.layers:
            ops.decode_attention(q, lkv, bt, sl, page_size=16, sm_scale=D ** -0.5, cert=cert,
                                 delta_loc=dl, num_splits=None)
        if q.is_cuda:
            torch.cuda.synchronize()
    return step


def time_ms(step, *, steps, repeats):
    step()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        out.append(1e3 * (time.perf_counter() - t0) / steps)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    cuda = a.device == "cuda"
    shape = dict(L=a.layers or (24 if cuda else 4), B=8 if cuda else 1, S=2048 if cuda else 256,
                 hkv=8 if cuda else 3, hq=32 if cuda else 9, D=128 if cuda else 64)
    steps = a.steps or (50 if cuda else 5)
    pool, q, bt, sl = build(device=a.device, **shape)
    cert = CertConfig(radius="min", tau=0.2)
    rows = []
    plain = time_ms(step_fn(pool, q, bt, sl, backend, cert, shape["D"]), steps=steps, repeats=a.repeats)
    rows.append(("plain", plain))
    for check in ("layer", "step"):
        gate = Gate(pool, RepairPolicy(mode="block"), tau=1e30, check=check)
        ops = gate.wrap(backend)
        ms = time_ms(step_fn(pool, q, bt, sl, ops, cert, shape["D"]), steps=steps, repeats=a.repeats)
        assert gate.stats.heads_gated == 0
        gate.close()
        rows.append((f"gate-{check}", ms))
    # The gate's own work alone (no decode): after_decode on a stored output, every layer.
    # Noise-free upper bound of what the gate adds to a step that does not fire.
    dl = torch.full((q.shape[0],), 1e-6, dtype=torch.float32, device=q.device)
    outs = [backend.decode_attention(q, lkv, bt, sl, page_size=16, sm_scale=shape["D"] ** -0.5,
                                     cert=cert, delta_loc=dl) for lkv in pool.layers]
    for check in ("layer", "step"):
        gate = Gate(pool, RepairPolicy(mode="block"), tau=1e30, check=check)

        def only_gate():
            for lkv, out in zip(pool.layers, outs):
                gate.after_decode(out, q, lkv, bt, sl, page_size=16, sm_scale=shape["D"] ** -0.5,
                                  cert=cert, delta_loc=dl)
            if cuda:
                torch.cuda.synchronize()
        rows.append((f"check-{check} only", time_ms(only_gate, steps=steps, repeats=a.repeats)))
        gate.close()
    # plain again: the spread between the two plain runs is the noise floor
    rows.append(("plain (again)", time_ms(step_fn(pool, q, bt, sl, backend, cert, shape["D"]),
                                          steps=steps, repeats=a.repeats)))
    base = min(rows[0][1], rows[-1][1])
    print(f"device {a.device} ({torch.cuda.get_device_name() if cuda else 'cpu'}), shape {shape}, "
          f"backend {backend.backend_for(q, pool.layers[0])}, {steps} steps x {a.repeats} repeats")
    print(f"{'variant':<18} {'ms/step':>9} {'vs plain':>9}")
    for name, ms in rows:
        rel = ms / base if name.endswith("only") else ms / base - 1
        print(f"{name:<18} {ms:>9.3f} {100 * rel:>+8.2f}%{'  (of plain)' if name.endswith('only') else ''}")


if __name__ == "__main__":
    main()
