"""Section 1, the quad report: error, bytes, latency and coverage per variant.

- attention-output error ``||o^ - o|| / ||o||`` against exact float64 attention with the
  real (exact) V; median and 90th percentile over (layer, head, step);
- bytes per token per KV head, mean of the K and V sides, witness included (what the
  cache stores; for KIVI the steady-state amortised cost, exact recent tokens excluded);
- decode latency of the read path (dequantise K and V, attention, radius, certificate)
  for one layer at N tokens, on the device the report ran on (the pure-torch reference
  on CPU: a relative cost, not a kernel benchmark);
- certificate coverage: fraction of (layer, head, step) with ``cert <= tau`` for the
  variant's reported radius (det; min(det, prob) for witcert).
On synthetic Gaussian keys (queries independent of keys) and on the real-activation runs.
"""

from __future__ import annotations

import time
from fractions import Fraction

import torch

from witcert.eval.calibrate import calibrate_from_kv
from witcert.config import QuantConfig
from witcert.ref.cert import certificate
from witcert.ref.compressors import get_compressor
from witcert.ref.types import K_SIDE, V_SIDE, EncodeCtx
from witcert.report.engine import EXCEED_ATOL, EXCEED_RTOL, Variant, radii, store
from witcert.report.stats import quantiles

HQ, HKV, D = 9, 3, 64


def bytes_per_token_head(variant: Variant, head_dim: int = D) -> float:
    """Mean of K and V stored bytes per (token, KV head), witness included."""
    comp = get_compressor(QuantConfig(method=variant.method, outliers=variant.outliers))
    if hasattr(comp, "bytes_per_token"):
        return float((comp.bytes_per_token(head_dim, K_SIDE) + comp.bytes_per_token(head_dim, V_SIDE)) / 2)
    return float(Fraction(comp.bytes_per_token_head(head_dim)))


def _outliers(k, v, m):
    if m == 0:
        return None
    prof = calibrate_from_kv([k], [v], m=m)
    return prof.outlier_idx(m)[0]


def synthetic_unit(variant: Variant, *, tokens: int, queries: int, seed: int, tau: float,
                   delta: float) -> dict:
    """Gaussian q, k, v (N(0, 1), D=64, Hq=9, Hkv=3): every query attends all ``tokens``."""
    g = torch.Generator().manual_seed(seed)
    # fp16 K/V: the KV dtype witcert stores from (engine.KV_DTYPE)
    k = torch.randn(tokens, HKV, D, generator=g).half()
    v = torch.randn(tokens, HKV, D, generator=g).half()
    q = torch.randn(HQ, queries, D, generator=g, dtype=torch.float64)
    sm = D ** -0.5
    st = store(variant, k, v, layer=0, seed=seed, outlier_idx=_outliers(k, v, variant.outliers))
    kvh = torch.arange(HQ) // (HQ // HKV)
    kx, vx = k[:, kvh].transpose(0, 1).double(), v[:, kvh].transpose(0, 1).double()
    kh, vh = st.khat[:, kvh].transpose(0, 1).double(), st.vhat[:, kvh].transpose(0, 1).double()
    z = sm * torch.einsum("htd,hnd->htn", q, kx)
    zh = sm * torch.einsum("htd,hnd->htn", q, kh)
    p, ph = torch.softmax(z, -1), torch.softmax(zh, -1)
    o, oh = torch.einsum("htn,hnd->htd", p, vx), torch.einsum("htn,hnd->htd", ph, vh)
    err = (torch.linalg.vector_norm(oh - o, dim=-1) / torch.linalg.vector_norm(o, dim=-1)).flatten()
    tv = 0.5 * (p - ph).abs().sum(-1).flatten()
    n_tok = torch.full((queries, 1), float(tokens), dtype=torch.float64)
    from witcert.ref.cert import delta_local
    dl = delta_local(delta=delta, num_layers=1, num_q_heads=HQ, allocation="fixed", horizon=queries)
    certs, exceed = {}, {}
    if variant.radius_kinds:
        u = radii(variant, q, st, sm=sm, n_tokens=n_tok, delta_loc=dl)
        certs = {kk: certificate(zh, uu)[1].flatten() for kk, uu in u.items()}
        exceed = {kk: int(((zh - z).abs() > uu * (1 + EXCEED_RTOL) + EXCEED_ATOL).sum()) for kk, uu in u.items()}
    return {"err": err, "tv": tv, "certs": certs, "exceed": exceed}


def latency_unit(variant: Variant, *, tokens: int, seed: int, reps: int = 5) -> dict:
    """Median wall time of the read path of one decode step, one layer, Hq=9 queries."""
    dev = "cpu"
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(tokens, HKV, D, generator=g).half()
    v = torch.randn(tokens, HKV, D, generator=g).half()
    q = torch.randn(HQ, D, generator=g)
    comp = get_compressor(QuantConfig(method=variant.method, outliers=variant.outliers, seed=seed))
    oidx = _outliers(k, v, variant.outliers) or (None, None)
    ctxs = [EncodeCtx.simple(num_tokens=tokens, num_heads=HKV, seed=seed, side=s, outlier_idx=o)
            for s, o in ((K_SIDE, oidx[0]), (V_SIDE, oidx[1]))]
    pk, pv = comp.encode(k, ctx=ctxs[0]), comp.encode(v, ctx=ctxs[1])
    kvh = torch.arange(HQ) // (HQ // HKV)
    sm = D ** -0.5
    from witcert.ref.cert import radius_det

    def step():
        kh = comp.decode(pk, ctx=ctxs[0])[:, kvh].transpose(0, 1)
        vh = comp.decode(pv, ctx=ctxs[1])[:, kvh].transpose(0, 1)
        z = sm * torch.einsum("hd,hnd->hn", q, kh)
        o = torch.einsum("hn,hnd->hd", torch.softmax(z, -1), vh)
        u = radius_det(q, pk["wit"][:, kvh].transpose(0, 1), sm_scale=sm, group_size=32)
        return o, certificate(z, u)[1]

    step()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"ms": 1e3 * times[len(times) // 2], "device": dev, "tokens": tokens,
            "what": "pure-torch reference read path (decode K,V + attention + det radius + cert)"}


def quad_rows(per_variant: dict, variants, *, tau: float) -> dict:
    """Aggregate {label: unit result} to the quad table rows."""
    rows = {}
    for v in variants:
        r = per_variant[v.label]
        e50, e90 = quantiles(r["err"])
        row = {"err_median": e50, "err_p90": e90, "bytes": bytes_per_token_head(v)}
        c = r["certs"].get(v.reported_radius)
        row["coverage"] = None if c is None else float((c <= tau).double().mean())
        row["radius"] = v.reported_radius
        rows[v.label] = row
    return rows
