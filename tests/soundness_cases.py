"""Adversarial soundness cases shared by tests/test_fp_soundness.py and
benchmarks/soundness_sweep.py (docs/PROOFS.md section 5.6): families of exact keys and
queries chosen as an attacker would, pools for a compressor, and one function that runs a
path and returns its certificates, the logits it used and its output.
"""

from __future__ import annotations

import torch

import fpexact

from witcert.config import CertConfig, QuantConfig
from witcert.ref import attention as ref_attn
from witcert.ref.logits import logits_f32
from witcert.ref.pool import LayerKV, gather, write_
from witcert.ref.types import K_SIDE

FAMILIES = ("normal", "huge_logits", "rounding_edge", "tiny_q", "huge_q", "peaked_long",
            "massive_bypass", "fp16_edge_scales", "overflow")


def family_case(name: str, *, B: int, N: int, hq: int, hkv: int, D: int, gen: torch.Generator):
    """Exact k, v [B, N, Hkv, D] (fp16 or fp32 values), q f32 [B, Hq, D], sm_scale."""
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    k = r(B, N, hkv, D)
    v = r(B, N, hkv, D)
    q = r(B, hq, D)
    sm = D ** -0.5
    if name == "huge_logits":  # logits 1e3 .. 1e9 (a legal query: det holds for every query)
        mag = 10.0 ** (3 + 6 * torch.rand(B, 1, 1, generator=gen))
        q = q * mag
        k = k * 8.0
    elif name == "rounding_edge":  # keys on a coarse grid: tiny errors, witnesses near their norm
        k = torch.round(k * 4) / 4
        q = q * 10.0 ** (1 + 4 * torch.rand(B, 1, 1, generator=gen))
    elif name == "tiny_q":
        q = q * 10.0 ** (-7 - 13 * torch.rand(B, 1, 1, generator=gen))
    elif name == "huge_q":  # |q_c| ~ 1e20 on a few channels
        q = q * 1e-3
        q[:, :, :4] = 1e20 * torch.sign(r(B, hq, 4))
    elif name == "peaked_long":  # one token dominates (large gap), long context
        k[:, 7] = k[:, 7] * 20
        q = q * 3
    elif name == "massive_bypass":  # fp16-exact 60000 in channel 0 (bypassed when outliers are on)
        k[:, :, :, 0] = 60000.0 * torch.sign(r(B, N, hkv))
        q[:, :, 0] = 1.0
    elif name == "fp16_edge_scales":  # values near fp16's max and min normal
        k = k * torch.where(torch.rand(B, 1, 1, 1, generator=gen) < 0.5, 6e4 / 4.0, 2.0**-14)
    elif name == "overflow":  # finite query whose logits overflow fp32
        q = q * 1e35
    return k.to(torch.float16).float(), v.to(torch.float16).float(), q, sm


def make_pool(quant: QuantConfig, *, B: int, N: int, hkv: int, D: int, device, writer):
    pages = B * N
    epochs = torch.zeros(pages, dtype=torch.int64, device=device)
    outl = None
    if quant.outliers:
        outl = torch.stack([torch.arange(2 * quant.outliers) for _ in range(hkv)]).to(device)
    layer = LayerKV.allocate(num_slots=pages, num_kv_heads=hkv, head_dim=D, quant=quant, layer=1,
                             seed=1234567, epochs=epochs, device=device, k_outlier_idx=outl,
                             v_outlier_idx=outl)
    return layer


def run_path(path, layer, q, bt, sl, *, sm, cert, dl):
    """(cert [B, Hq], used logits [B, Hq, N] f64, out [B, Hq, D])."""
    dbg = {}
    if path == "ref":
        res = ref_attn.decode_attention(q, layer, bt, sl, page_size=1, sm_scale=sm, cert=cert, delta_loc=dl)
        B, hq = q.shape[:2]
        used = torch.full((B, hq, bt.shape[1]), float("nan"), dtype=torch.float64)
        for b in range(B):
            slots = bt[b, :int(sl[b])].long()
            kh, _ = gather(layer, K_SIDE, slots)
            kbad = ~torch.isfinite(gather(layer, K_SIDE, slots)[1]["wit"].float()).all(-1)
            kh = torch.where(kbad[..., None] | ~torch.isfinite(kh), 0.0, kh)
            kvh = torch.arange(hq) // (hq // layer.num_kv_heads)
            qb = torch.where(torch.isfinite(q[b]), q[b], 0.0)
            l, _, _ = logits_f32(qb, kh[:, kvh].transpose(0, 1), sm_scale=sm)
            used[b, :, :l.shape[-1]] = l.double()
        return res.cert, used, res.out
    if path == "native":
        from witcert.native.decode import decode_attention_full
        out, _, c, _ = decode_attention_full(q, layer, bt, sl, page_size=1, sm_scale=sm, radius=cert.radius,
                                             delta_loc=torch.full((q.shape[0],), dl, dtype=torch.float64),
                                             debug=dbg)
        return c, dbg["logits"], out
    from witcert.kernels.decode import decode_attention
    from witcert.kernels.plan import decode_plan
    plan = decode_plan("cuda:0" if q.is_cuda else "cpu").replace(impl="cuda" if path == "cuda" else "triton")
    res = decode_attention(q, layer, bt, sl, page_size=1, sm_scale=sm, cert=cert, delta_loc=dl, num_splits=None,
                           plan=plan, debug=dbg)
    return res.cert, dbg["logits"].double(), res.out


def configs(path):
    """(QuantConfig, CertConfig) pairs a path serves."""
    out = []
    for bits in (8, 16):
        for radius in ("det", "prob", "min"):
            out.append((QuantConfig(dither_bits=bits, seed=7), CertConfig(radius=radius)))
    if path in ("ref", "triton", "native"):
        out.append((QuantConfig(outliers=2, seed=7), CertConfig(radius="min")))
    if path == "ref":
        for m in ("rtn8", "rtn4", "sr8", "fp8", "fp8_scaled", "fp16"):
            out.append((QuantConfig(method=m, seed=7), CertConfig(radius="det")))
    return out


def check_case(path: str, family: str, quant: QuantConfig, cert: CertConfig, *, gen: torch.Generator,
               device="cpu", B: int = 8, N: int = 16, hq: int = 4, hkv: int = 2, D: int = 64,
               delta_loc: float = 1e-6) -> dict:
    """Write one family's exact keys, decode with ``path``, check every (sequence, head):
    0 <= cert, never NaN, cert >= TV(exact softmax, softmax of the path's logits) (or +inf where
    an attended exact key is not finite), output never NaN. Returns counts."""
    from witcert.runtime import dispatch as backend
    n = N * 4 if family == "peaked_long" else N
    k, v, q, sm = family_case(family, B=B, N=n, hq=hq, hkv=hkv, D=D, gen=gen)
    layer = make_pool(quant, B=B, N=n, hkv=hkv, D=D, device=device, writer=None)
    bt = torch.arange(B * n, dtype=torch.int32).view(B, n)
    sl = torch.randint(1, n + 1, (B,), generator=gen, dtype=torch.int32)
    slots = bt.reshape(-1).long()
    kk, vv = k.reshape(-1, hkv, D), v.reshape(-1, hkv, D)
    if device == "cpu":
        write_(layer, kk, vv, slots=slots)
    else:
        backend.write_kv_(layer, kk.to(device), vv.to(device), slots=slots.to(device))
    c, used, out = run_path(path, layer, q.to(device), bt.to(device), sl.to(device), sm=sm, cert=cert,
                            dl=delta_loc)
    c = c.double()
    used = used.to(c.device)
    if used.shape[-1] < n:  # a path's debug logits stop at the longest sequence
        used = torch.nn.functional.pad(used, (0, n - used.shape[-1]), value=float("nan"))
    kvh = torch.arange(hq) // (hq // hkv)
    mask = (torch.arange(n)[None, :] < sl[:, None]).to(c.device)[:, None, :].expand(B, hq, n)
    qf = torch.where(torch.isfinite(q), q, 0.0).to(c.device)
    kx = k[:, :, kvh].permute(0, 2, 1, 3).to(c.device)  # [B, Hq, N, D]
    no_exact = ~(torch.isfinite(kx).all(-1) | ~mask).all(-1)  # an attended exact key is inf/NaN
    z = fpexact.exact_shifted_logits(qf, torch.where(torch.isfinite(kx), kx, 0.0), sm_scale=sm, mask=mask)
    u = torch.where(mask, used[:, :, :n], torch.full_like(used[:, :, :n], float("-inf")))
    tv = fpexact.tv(z, u, c, mask=mask)
    ok = torch.where(no_exact, torch.isposinf(c), c >= tv)
    fin = torch.isfinite(c) & (c > 0) & ~no_exact
    return dict(certs=B * hq, violations=int((~ok).sum()), nan=int(torch.isnan(c).sum()),
                negative=int((c < 0).sum()), inf=int(torch.isinf(c).sum()), nan_out=int(torch.isnan(out).sum()),
                worst_ratio=float((tv[fin] / c[fin]).max()) if fin.any() else 0.0,
                examples=(c[~ok][:4].tolist(), tv[~ok][:4].tolist()))
