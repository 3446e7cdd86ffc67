"""Adversarial soundness of the extend paths: the decode families of tests/soundness_cases.py
(huge logits, rounding edges, tiny / huge / overflowing queries, massive bypassed channels,
fp16-edge scales, long peaked contexts) as one sequence's compressed prefix plus exact new
tokens. Used by tests/test_fp_soundness.py and benchmarks/soundness_sweep.py.
"""

from __future__ import annotations

import torch

import fpexact
from cases import extend_visible
from soundness_cases import family_case, make_pool

from witcert.config import CertConfig, QuantConfig


def run_extend(path: str, q, kn, vn, layer, slots, *, sm, cert, dl):
    """(cert [T, Hq], used logits [T, Hq, Np + T] f64 (-inf where not attended), out [T, Hq, D])."""
    dbg = {}
    if path in ("triton", "triton_fp16", "triton_bf16"):  # the 16-bit paths: q and keys in that type
        from witcert.kernels.extend import extend_attention
        res = extend_attention(q, kn, vn, layer, slots, sm_scale=sm, cert=cert, delta_loc=dl, debug=dbg)
    elif path in ("native", "native_f64", "native_bf16"):  # the C extend: fp32 dots (its
        # default; native_bf16: bf16 operands, so its bf16-pair dots where the CPU has them) or f64
        from witcert.native import extend as ne
        T = q.shape[0]
        out, _, c = ne.extend_attention(
            q, kn, vn, layer, q_start=[0], q_len=[T], prefix_len=[slots.shape[0]],
            block_table=slots.to(torch.int32).reshape(1, -1).contiguous(), page_size=1,
            sm_scale=sm, radius=cert.radius, delta_loc=torch.full((T,), dl, dtype=torch.float64),
            debug=dbg, arith="f64" if path == "native_f64" else "f32")
        return c, dbg["logits"].double(), out
    else:
        raise ValueError(f"extend path {path!r}")
    return res.cert, dbg["logits"].double(), res.out


# the paths whose operands are rounded to 16 bits (check_extend_case)
LOW_PRECISION = {"native_bf16": torch.bfloat16, "triton_fp16": torch.float16, "triton_bf16": torch.bfloat16}


def check_extend_case(path: str, family: str, quant: QuantConfig, cert: CertConfig, *, gen: torch.Generator,
                      device="cpu", n_prefix: int = 12, T: int = 5, hq: int = 4, hkv: int = 2, D: int = 64,
                      delta_loc: float = 1e-6) -> dict:
    """One sequence: the family's first ``n_prefix`` tokens written to the pool, the next
    ``T`` exact new tokens (causal), queries drawn per new token. Checks every (new token,
    head) as ``soundness_cases.check_case`` does (a row that attends a non-finite exact key
    must be +inf); returns the same counts. The massive_bypass family runs with 2 outlier pairs
    (its point is the bypassed channel) when ``quant`` has none. path ``native_bf16``: the C
    extend with the family's queries, keys and values rounded to bf16 (its bf16-pair dots need
    bf16 operands and several work items per sequence: use T >= 2 * 128 / (hq / hkv)); paths
    ``triton_fp16`` / ``triton_bf16``: the Triton extend with them rounded to fp16 / bf16 (a
    value past the type's range: inf) and passed in that type, so the exact new tokens' q.k takes
    the tensor-core dots (PROOFS 5.4)."""
    if family == "massive_bypass" and not quant.outliers:
        quant = quant.replace(outliers=2)
    if family == "peaked_long":  # a long context, as in the decode families
        n_prefix *= 4
    n = n_prefix + T
    k, v, _, sm = family_case(family, B=1, N=n, hq=hq, hkv=hkv, D=D, gen=gen)
    _, _, q, _ = family_case(family, B=T, N=8, hq=hq, hkv=hkv, D=D, gen=gen)
    k, v = k[0], v[0]  # [N, Hkv, D]
    low = LOW_PRECISION.get(path)
    if low is not None:  # 16-bit model activations (an fp32 value past the type's range: inf)
        q, k, v = (x.to(low).float() for x in (q, k, v))
    layer = make_pool(quant, B=1, N=max(n_prefix, 1), hkv=hkv, D=D, device=device, writer=None)
    slots = torch.arange(n_prefix, device=device)
    if n_prefix:
        from witcert.runtime import dispatch as backend
        backend.write_kv_(layer, k[:n_prefix].to(device), v[:n_prefix].to(device), slots=slots)
    kn, vn = k[n_prefix:].to(device), v[n_prefix:].to(device)
    qd = q.to(device)
    if low is not None:
        kn, vn = kn.to(low), vn.to(low)
        qd = qd if path == "native_bf16" else qd.to(low)
    c, used, out = run_extend(path, qd, kn, vn, layer, slots, sm=sm, cert=cert, dl=delta_loc)
    c, used = c.double().cpu(), used.cpu()
    kvh = torch.arange(hq) // (hq // hkv)
    vis = extend_visible(n_prefix, T)  # [T, N]
    mask = vis[:, None, :].expand(T, hq, n)
    qf = torch.where(torch.isfinite(q), q, 0.0)
    kx = k[:, kvh].transpose(0, 1)[None].expand(T, hq, n, D)
    # an attended exact key that is not finite (fp16 overflow): the row must say +inf
    no_exact = ~(torch.isfinite(kx).all(-1) | ~mask).all(-1)
    z = fpexact.exact_shifted_logits(qf, torch.where(torch.isfinite(kx), kx, 0.0), sm_scale=sm, mask=mask)
    tv = fpexact.tv(z, torch.where(mask, used, float("-inf")), c, mask=mask)
    ok = torch.where(no_exact, torch.isposinf(c), c >= tv)
    fin = torch.isfinite(c) & (c > 0) & ~no_exact
    return dict(certs=T * hq, violations=int((~ok).sum()), nan=int(torch.isnan(c).sum()),
                negative=int((c < 0).sum()), inf=int(torch.isinf(c).sum()),
                nan_out=int(torch.isnan(out).sum()),
                worst_ratio=float((tv[fin] / c[fin]).max()) if fin.any() else 0.0,
                examples=(c[~ok][:4].tolist(), tv[~ok][:4].tolist()))
