"""Section 2, runtime part: the certificates the runtime decode paths emit, on the report's
real activations, against the exact TV.

The engine (``engine.py``) re-derives every certificate in float64, so it cannot see what a
runtime path computes (its own logits, its arithmetic slack, its rounding of the
certificate). Here, per (domain, witcert variant) and per layer, the exact fp16 K/V of the
teacher-forced run (prefix and fed tokens) are written into a ``witcert.ref.pool.LayerKV``
with ``witcert.runtime.dispatch.write_kv_``, token t in slot t at epoch 0 (so the stored records are
the engine's, bit for bit), and the T decode steps run as one batch of T sequences over the
same slots: step i reads tokens 0 .. P + i, and a token's record does not depend on later
tokens. The path is the one the runtime dispatch picks (``witcert.runtime.dispatch.backend_for``):
the native C decode on CPU, the Triton kernel on CUDA, else the torch reference; each
returns its certificate and the logits it used (the reference's are recomputed from its
dequantised keys, ``witcert.ref.logits.logits_f32``).

Every (layer, query head, step) certificate is checked against
``TV(softmax(sm q.k) of the exact keys, softmax of the path's own logits)``, computed exactly
(``witcert.report.exact_tv``). A violation is ``cert < TV`` with no tolerance (a NaN
certificate fails it), or anything but ``+inf`` where an attended exact key is not finite.

Letters: L layers, Hq query heads, Hkv KV heads, D head dim, P context, T decode steps,
N = P + T tokens.
"""

from __future__ import annotations

import time

import torch

from witcert.config import CertConfig, QuantConfig
from witcert.ref.cert import delta_local
from witcert.ref.pool import LayerKV, gather
from witcert.ref.types import K_SIDE
from witcert.report import exact_tv
from witcert.report.soundness import TV_ATOL
from witcert.report.stats import quantiles

# elements of one [steps, Hq, N, D] block of the double-double dot (bounds its memory)
EXACT_BLOCK = 1 << 22


def device_name(device: torch.device | str) -> str:
    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def make_pool(quant: QuantConfig, *, num_tokens: int, num_kv_heads: int, head_dim: int, layer: int,
              outlier_idx: tuple[torch.Tensor, torch.Tensor] | None, device) -> LayerKV:
    """An empty pool of ``num_tokens`` slots (epoch 0) keyed like the engine's stores
    (seed ``quant.seed``, ``layer``); outlier_idx: (K, V) int64 [Hkv, 2m] iff quant.outliers."""
    kidx = vidx = None
    if quant.outliers:
        kidx, vidx = (x.to(torch.int64).to(device).contiguous() for x in outlier_idx)
    return LayerKV.allocate(num_slots=num_tokens, num_kv_heads=num_kv_heads, head_dim=head_dim,
                            quant=quant, layer=layer, seed=quant.seed,
                            epochs=torch.zeros(num_tokens, dtype=torch.int64, device=device),
                            device=device, k_outlier_idx=kidx, v_outlier_idx=vidx)


def choose_path(pool: LayerKV, q: torch.Tensor) -> tuple[str, str | None]:
    """(path, why): the decode path the runtime dispatch uses for ``q`` over ``pool``:
    ``native``, ``triton`` or ``reference``; ``why`` says why the reference runs (else None)."""
    from witcert import native
    from witcert.runtime import dispatch as backend

    which = backend.backend_for(q, pool)
    if which == "triton":
        return "triton", None
    if q.device.type == "cpu" and native.available():
        from witcert.native.decode import unsupported

        why = unsupported(pool, q)
        if which == "native" and why is None:
            return "native", None
        return "reference", f"native decode: {why}" if why else "the backend dispatch chose it"
    if q.device.type == "cpu":
        return "reference", f"native decode unavailable: {native.reason()}"
    return "reference", f"{pool.quant.method} on {q.device} is not served by the Triton kernels"


def plan_path(model, quant: QuantConfig, *, device) -> tuple[str, str | None]:
    """``choose_path`` for the attention geometry of ``model`` (a transformers model), from a
    one-slot probe pool: which path a run of ``quant`` on ``device`` will take (the cache key)."""
    from witcert.hf.geometry import AttentionGeometry

    geo = AttentionGeometry.of(model)
    hq, hkv, d = geo.num_q_heads, geo.num_kv_heads, geo.head_dim
    idx = torch.arange(2 * quant.outliers, dtype=torch.int64).expand(hkv, -1)
    pool = make_pool(quant, num_tokens=1, num_kv_heads=hkv, head_dim=d, layer=0,
                     outlier_idx=(idx, idx), device=device)
    return choose_path(pool, torch.zeros(1, hq, d, device=device))


def _reference_logits(pool: LayerKV, q: torch.Tensor, seq_lens: torch.Tensor, sm: float) -> torch.Tensor:
    """The reference decode's logits f64 [B, Hq, Nmax] (NaN past each length): the fp32 logits
    of its dequantised keys, flagged or non-finite keys read as 0, as it computes them.
    Sequence b holds tokens 0 .. seq_lens[b] - 1 in slots of the same numbers (``check_layer``)."""
    from witcert.ref.logits import logits_f32

    B, Hq, _ = q.shape
    kvh = torch.arange(Hq, device=q.device) // (Hq // pool.num_kv_heads)
    n_all = int(seq_lens.max())
    used = torch.full((B, Hq, n_all), float("nan"), dtype=torch.float64)
    kh, kp = gather(pool, K_SIDE, torch.arange(n_all, dtype=torch.int64, device=q.device))
    kbad = ~torch.isfinite(kp["wit"].float()).all(-1)
    kh = torch.where(kbad[..., None] | ~torch.isfinite(kh), 0.0, kh)[:, kvh].transpose(0, 1)
    qf = torch.where(torch.isfinite(q), q, 0.0)
    for b in range(B):
        n = int(seq_lens[b])
        used[b, :, :n] = logits_f32(qf[b], kh[:, :n], sm_scale=sm)[0].double().cpu()
    return used


def run_path(path: str, pool: LayerKV, q: torch.Tensor, block_table: torch.Tensor,
             seq_lens: torch.Tensor, *, sm: float, cert: CertConfig,
             delta_loc: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode call of ``path`` for B sequences: (cert f64 [B, Hq], the logits the path
    used f64 [B, Hq, Nmax], NaN past each length), both on the CPU. q f32 [B, Hq, D];
    block_table int32 [B, Nmax] (page size 1); seq_lens int32 [B]."""
    B = q.shape[0]
    dbg: dict = {}
    if path == "native":
        from witcert.native.decode import decode_attention_full

        _, _, c, _ = decode_attention_full(
            q, pool, block_table, seq_lens, page_size=1, sm_scale=sm, radius=cert.radius,
            delta_loc=torch.full((B,), delta_loc, dtype=torch.float64),
            num_threads=max(1, torch.get_num_threads()), debug=dbg)  # same bits for any count
        return c.double(), dbg["logits"].double()
    if path == "triton":
        from witcert.kernels.decode import decode_attention

        res = decode_attention(q, pool, block_table, seq_lens, page_size=1, sm_scale=sm, cert=cert,
                               delta_loc=delta_loc, num_splits=None, debug=dbg)
        return res.cert.double().cpu(), dbg["logits"].double().cpu()
    from witcert.ref.attention import decode_attention

    res = decode_attention(q, pool, block_table, seq_lens, page_size=1, sm_scale=sm, cert=cert,
                           delta_loc=delta_loc)
    return res.cert.double().cpu(), _reference_logits(pool, q, seq_lens, sm)


def exact_tv_rows(q: torch.Tensor, k: torch.Tensor, used: torch.Tensor, cert: torch.Tensor, *,
                  sm: float, seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(TV f64 [B, Hq], no_exact bool [B, Hq]): exact TV between the softmax of the exact keys
    and of ``used`` per row (float64, mpmath where float64 cannot decide against ``cert``);
    no_exact marks rows with a non-finite attended exact key. q f32 [B, Hq, D] (CPU); k exact
    [N, Hkv, D]; used f64 [B, Hq, >= max seq_len]; cert f64 [B, Hq]; seq_lens int [B]."""
    B, Hq, D = q.shape
    N = int(seq_lens.max())
    kvh = torch.arange(Hq) // (Hq // k.shape[1])
    kx = k[:N, kvh].transpose(0, 1).float()[None]  # [1, Hq, N, D]
    fin_k = torch.isfinite(kx).all(-1)
    kx = torch.where(torch.isfinite(kx), kx, 0.0)
    qf = torch.where(torch.isfinite(q), q, 0.0)
    mask = (torch.arange(N)[None, :] < seq_lens.cpu()[:, None])[:, None, :].expand(B, Hq, N)
    used = used[..., :N]
    step = max(1, EXACT_BLOCK // (Hq * N * D))
    tv = torch.empty(B, Hq, dtype=torch.float64)
    for s in range(0, B, step):
        sl = slice(s, s + step)
        z = exact_tv.exact_shifted_logits(qf[sl], kx, sm_scale=sm, mask=mask[sl])
        tv[sl] = exact_tv.tv(z, used[sl], cert[sl], mask=mask[sl])
    no_exact = (mask & ~fin_k).any(-1)
    return tv, no_exact


def violations(cert: torch.Tensor, tv: torch.Tensor, no_exact: torch.Tensor) -> torch.Tensor:
    """bool, per row: the certificate fails (``cert < TV``, NaN, or not ``+inf`` where an
    exact key is not finite)."""
    return ~torch.where(no_exact, torch.isposinf(cert), cert >= tv)


def check_layer(*, k: torch.Tensor, v: torch.Tensor, q: torch.Tensor, sm: float, quant: QuantConfig,
                layer: int, outlier_idx, cert: CertConfig, delta_loc: float, device="cpu") -> dict:
    """One layer of a run through the runtime path. k, v exact [N, Hkv, D] (fp16 values);
    q f32 [T, Hq, D], step i attends tokens 0 .. N - T + i. Returns {"cert", "tv": f64
    [T, Hq], "no_exact": bool [T, Hq], "path", "why"}."""
    N, Hkv, D = k.shape
    T = q.shape[0]
    pool = make_pool(quant, num_tokens=N, num_kv_heads=Hkv, head_dim=D, layer=layer,
                     outlier_idx=outlier_idx, device=device)
    from witcert.runtime import dispatch as backend
    backend.write_kv_(pool, k.to(device), v.to(device),
                      slots=torch.arange(N, dtype=torch.int64, device=device))
    qd = q.to(device)
    path, why = choose_path(pool, qd)
    seq_lens = torch.arange(N - T + 1, N + 1, dtype=torch.int32)
    bt = torch.arange(N, dtype=torch.int32).expand(T, N).contiguous()
    c, used = run_path(path, pool, qd, bt.to(device), seq_lens.to(device), sm=sm, cert=cert,
                       delta_loc=delta_loc)
    tv, no_exact = exact_tv_rows(q, k.cpu(), used, c, sm=sm, seq_lens=seq_lens)
    return {"cert": c, "tv": tv, "no_exact": no_exact, "path": path, "why": why}


def runtime_unit(layers: list, prefix_k: list, prefix_v: list, *, quant: QuantConfig, radius: str,
                 delta: float, outlier_idx: list | None, device="cpu") -> dict:
    """Every layer of one teacher-forced run. layers: ``engine.Captured`` per layer;
    prefix_k/v: the engine's exact prefix fp16 [P, Hkv, D] per layer; outlier_idx: per layer
    (K, V) int64 [Hkv, >= 2m] (calibration) when ``quant.outliers``. Returns flat f64 / bool
    tensors over (layer, query head, step), the engine's record order, plus path and device."""
    t0 = time.perf_counter()
    L = len(layers)
    T, Hq, _ = layers[0].q.shape
    dl = delta_local(delta=delta, num_layers=L, num_q_heads=Hq, allocation="fixed", horizon=max(T, 1))
    cfg = CertConfig(radius=radius, delta=delta, horizon=max(T, 1))
    m2 = 2 * quant.outliers
    parts, paths, whys = [], [], set()
    for i, cap in enumerate(layers):
        oi = (outlier_idx[i][0][:, :m2], outlier_idx[i][1][:, :m2]) if m2 else None
        r = check_layer(k=torch.cat([prefix_k[i], cap.k_new]), v=torch.cat([prefix_v[i], cap.v_new]),
                        q=cap.q, sm=cap.sm_scale, quant=quant, layer=i, outlier_idx=oi, cert=cfg,
                        delta_loc=dl, device=device)
        parts.append(r)
        if r["path"] not in paths:
            paths.append(r["path"])
        if r["why"]:
            whys.add(r["why"])
    flat = {key: torch.cat([r[key].T.reshape(-1) for r in parts]) for key in ("cert", "tv", "no_exact")}
    return flat | {"path": "+".join(paths), "radius": radius, "why": "; ".join(sorted(whys)) or None,
                   "device": device_name(device), "seconds": time.perf_counter() - t0}


def cert_stats(cert: torch.Tensor, tv: torch.Tensor, bad: torch.Tensor) -> dict:
    """Counts and tightness of certificates ``cert`` against ``tv`` (f64 [R]); bad: bool [R],
    the rows that violate (each source's own criterion)."""
    use = (tv > 0) & torch.isfinite(cert)
    fin = torch.isfinite(cert) & (cert > 0)
    t50, t90 = quantiles(cert[use] / tv[use])
    return {"checked": int(cert.numel()), "violations": int(bad.sum()),
            "nan": int(torch.isnan(cert).sum()), "negative": int((cert < 0).sum()),
            "inf": int(torch.isposinf(cert).sum()), "tight_median": t50, "tight_p90": t90,
            "max_tv_over_cert": float((tv[fin] / cert[fin]).max()) if fin.any() else None}


def runtime_rows(units: dict, runs: dict) -> dict:
    """units: {domain: {label: runtime_unit}}; runs: {domain: {label: real unit}} (the engine's
    records of the same rows). Returns {label: row} over all domains: the runtime path's
    ``cert_stats`` (violation: ``violations``), ``engine`` the float64 re-derivation's on the
    same rows (violation: TV > cert + TV_ATOL, section 2's criterion), and the relative
    excess of the path's certificate over the engine's."""
    labels = list(dict.fromkeys(lab for per in units.values() for lab in per))
    out = {}
    for lab in labels:
        us = [(per[lab], runs[dom][lab]) for dom, per in units.items() if lab in per]
        cert = torch.cat([u["cert"] for u, _ in us])
        tv = torch.cat([u["tv"] for u, _ in us])
        no_exact = torch.cat([u["no_exact"] for u, _ in us])
        radius = us[0][0]["radius"]
        e_tv = torch.cat([r["tv"] for _, r in us])
        e_cert = torch.cat([r["certs"][radius] for _, r in us])
        if e_tv.shape != tv.shape:
            raise ValueError(f"{lab}: runtime rows {tuple(tv.shape)} and engine rows {tuple(e_tv.shape)} differ")
        both = torch.isfinite(cert) & torch.isfinite(e_cert) & (e_cert > 0)
        rel = cert[both] / e_cert[both] - 1.0  # the path's arithmetic slack and f32 rounding up
        out[lab] = {
            "path": " / ".join(dict.fromkeys(u["path"] for u, _ in us)),
            "why": "; ".join(dict.fromkeys(u["why"] for u, _ in us if u["why"])) or None,
            "device": " / ".join(dict.fromkeys(u["device"] for u, _ in us)), "radius": radius,
            **cert_stats(cert, tv, violations(cert, tv, no_exact)),
            "engine": cert_stats(e_cert, e_tv, e_tv > e_cert + TV_ATOL),
            "cert_excess_median": quantiles(rel)[0],
            "cert_excess_min": float(rel.min()) if rel.numel() else None,
            "cert_excess_max": float(rel.max()) if rel.numel() else None,
            "seconds": sum(u["seconds"] for u, _ in us)}
    return out
