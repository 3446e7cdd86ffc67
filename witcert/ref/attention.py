"""Decode and extend attention over the paged packed pool (DESIGN, Decode attention).

``decode_attention`` is written exactly as the Triton kernels are: ``decode_split_partials``
emits per split ``(m, l, acc, a, vmax, vw)`` and ``merge_partials`` combines splits with
log-sum-exp weights. The certificate therefore costs no second pass over the cache.
Letters: B batch, Hq query heads, Hkv KV heads, D head dim, P page size, S splits,
N tokens of a sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from witcert.config import CertConfig
from witcert.ref.arith import f32_round_up, reference_model, tail_bound
from witcert.ref.cert import excess_terms
from witcert.ref.logits import logits_and_radii
from witcert.ref.overlay import ExactEntries, overlay_exact
from witcert.ref.validate import check_attention_dtypes, check_delta_loc, check_sm_scale
from witcert.ref.pool import LayerKV, gather
from witcert.ref.types import K_SIDE, V_SIDE

INF = float("inf")


@dataclass
class DecodeOut:
    """out f32 [B, Hq, D]; lse f32 [B, Hq] (natural log of sum_t exp(z^_t)).

    cert f32 [B, Hq] = A - 1 (``+inf`` = no guarantee) and vbound f32 [B, Hq] (docs/MATH.md §5),
    both ``None`` when ``CertConfig.enabled`` is False: a disabled certificate is never
    a number that could be mistaken for a bound. radius f32 [B, Hq, Nmax] (0 beyond
    each seq_len) when requested, else None. radius_kind: "det", "prob", "min" or "none".
    """

    out: torch.Tensor
    lse: torch.Tensor
    cert: torch.Tensor | None
    vbound: torch.Tensor | None
    radius: torch.Tensor | None
    radius_kind: str


@dataclass
class Partials:
    """Per-split state, each [B, Hq, S] except acc [B, Hq, S, D]; float64 in the reference.

    m: running max of the logits; l: sum exp(l_t - m); acc: sum exp(l_t - m) v^;
    a: sum exp(l_t - m) expm1(u_t) (the excess, cert = a / l; see cert.excess_terms);
    vmax: max (||v^|| + w^v) (0 for an empty split); vw: sum exp(l_t - m) w^v;
    umax: the largest radius; n: live tokens (the tail term, witcert.ref.arith.tail_bound).
    Empty splits have m = -inf and zero sums.
    """

    m: torch.Tensor
    l: torch.Tensor
    acc: torch.Tensor
    a: torch.Tensor
    vmax: torch.Tensor
    vw: torch.Tensor
    umax: torch.Tensor | None = None
    n: torch.Tensor | None = None


def check_decode_tensors(q, layer_kv, block_table, seq_lens, *, page_size) -> None:
    """The tensor checks of ``decode_attention``'s arguments (one-line ``ValueError``s):
    q float [B, Hq, D] fitting the pool, block_table int32 [B, pages], seq_lens int32 [B] in
    [1, pages * page_size], page_size dividing the pool. Every decode path's entry point
    runs them; the scalars are ``validate_decode``'s (or the path's own) business."""
    if q.dim() != 3 or not q.is_floating_point():
        raise ValueError(f"q must be float [B, Hq, D], got {q.dtype} {tuple(q.shape)}")
    check_attention_dtypes(q=q)
    B, Hq, D = q.shape
    Hkv = layer_kv.num_kv_heads
    if B < 1:
        raise ValueError("q: empty batch (B = 0)")
    if D != layer_kv.head_dim or Hq % Hkv != 0:
        raise ValueError(f"q [B, Hq={Hq}, D={D}] does not fit the pool (Hkv={Hkv}, D={layer_kv.head_dim})")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != B:
        raise ValueError(f"block_table must be int32 [B={B}, pages], got {block_table.dtype} "
                         f"{tuple(block_table.shape)}")
    if seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) != (B,):
        raise ValueError(f"seq_lens must be int32 [B={B}], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    if page_size < 1 or layer_kv.num_slots % page_size != 0:
        raise ValueError(f"page_size {page_size} must divide num_slots {layer_kv.num_slots}")
    lo, hi = torch.aminmax(seq_lens)
    if int(lo) < 1 or int(hi) > block_table.shape[1] * page_size:
        raise ValueError("seq_lens must be in [1, pages * page_size]")


def validate_decode(q, layer_kv, block_table, seq_lens, *, page_size, num_splits, sm_scale,
                    delta_loc) -> None:
    """The checks of ``decode_attention``'s arguments (one-line ``ValueError``s): the tensors
    (``check_decode_tensors``), num_splits, sm_scale and the budget delta_loc."""
    check_decode_tensors(q, layer_kv, block_table, seq_lens, page_size=page_size)
    if num_splits < 1:
        raise ValueError(f"num_splits {num_splits} must be >= 1")
    check_sm_scale(sm_scale)
    check_delta_loc(delta_loc, batch=q.shape[0])


def token_slots(block_row: torch.Tensor, n: int, *, page_size: int) -> torch.Tensor:
    """Slots of tokens 0..n-1 of one sequence: int64 [n]."""
    t = torch.arange(n, dtype=torch.int64, device=block_row.device)
    return block_row.to(torch.int64)[t // page_size] * page_size + t % page_size


def _zero_where(x: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    return torch.where(bad, torch.zeros((), dtype=x.dtype, device=x.device), x)


def sequence_terms(q: torch.Tensor, layer_kv: LayerKV, slots: torch.Tensor, *, sm_scale: float,
                   cert: CertConfig, delta_loc: float, exact: ExactEntries | None = None):
    """One sequence: logits l f32 [Hq, N], v^ f32 [Hq, N, D], whole radii u f32 [Hq, N] (None if
    disabled), w^v f32 [Hq, N]. The logits and radii follow ``witcert.ref.logits``; the
    entries of ``exact`` (the layer's repaired entries) are read exactly
    (``witcert.ref.overlay.overlay_exact``)."""
    Hq = q.shape[0]
    kvh = torch.arange(Hq, device=q.device) // (Hq // layer_kv.num_kv_heads)
    khat, kp = gather(layer_kv, K_SIDE, slots)
    vhat, vp = gather(layer_kv, V_SIDE, slots)
    kbad = ~torch.isfinite(kp["wit"].float()).all(-1)  # [N, Hkv], flagged at write time
    vbad = ~torch.isfinite(vp["wit"].float()).all(-1)
    khat = _zero_where(khat, kbad[..., None] | ~torch.isfinite(khat))
    vhat = _zero_where(vhat, vbad[..., None] | ~torch.isfinite(vhat))
    v = vhat[:, kvh].transpose(0, 1)  # [Hq, N, D]
    wv = torch.linalg.vector_norm(vp["wit"].float(), dim=-1)[:, kvh].transpose(0, 1)
    wv = torch.where(vbad[:, kvh].transpose(0, 1), INF, wv)
    G = layer_kv.head_dim // kp["wit"].shape[-1]
    bypass = layer_kv.bypass_mask(K_SIDE)
    bypass = None if bypass is None else bypass[kvh]
    per_head = lambda t: t[:, kvh].transpose(0, 1)  # noqa: E731  [N, Hkv, ...] -> [Hq, N, ...]
    z, u = logits_and_radii(
        q, per_head(khat), sm_scale=sm_scale, cert=cert, wit=per_head(kp["wit"]),
        scales=per_head(kp["scales"]) if "scales" in kp else None,
        flagged=per_head(kbad | vbad), group_size=G, bits=layer_kv.quant.dither_bits,
        n_tokens=slots.shape[0], delta_loc=delta_loc, bypass=bypass,
        has_prob=layer_kv.compressor.has_prob_radius)
    return overlay_exact(q, slots, z, v, u, wv, exact, num_kv_heads=layer_kv.num_kv_heads,
                         sm_scale=sm_scale)


def split_state(z, v, u, wv):
    """Partials of one split in float64: z [Hq, n] (the fp32 logits), v [Hq, n, D], u and
    wv [Hq, n] (n may be 0). Returns (m, l, acc, a, vmax, vw, umax, n) or, with u None,
    (m, l, acc) and Nones."""
    Hq, n, D = v.shape
    z = z.to(torch.float64)
    if n == 0:
        zero = z.new_zeros(Hq)
        return (torch.full_like(zero, -INF), zero, z.new_zeros(Hq, D), zero, zero, zero, zero, zero)
    m = z.amax(dim=-1)
    e = torch.exp(z - m[:, None])
    l = e.sum(-1)
    acc = torch.einsum("hn,hnd->hd", e, v.to(torch.float64))
    if u is None:
        return m, l, acc, None, None, None, None, None
    u = u.to(torch.float64)
    a = excess_terms(z - m[:, None], u).sum(-1)
    wv = wv.to(torch.float64)
    vmax = (torch.linalg.vector_norm(v.to(torch.float64), dim=-1) + wv).amax(-1)
    vw = torch.where(torch.isposinf(wv), INF, e * wv).sum(-1)
    return m, l, acc, a, vmax, vw, u.amax(-1), torch.full_like(m, float(n))


def decode_split_partials(q: torch.Tensor, layer_kv: LayerKV, block_table: torch.Tensor,
                          seq_lens: torch.Tensor, *, page_size: int, sm_scale: float,
                          cert: CertConfig, delta_loc, num_splits: int = 1,
                          exact: ExactEntries | None = None):
    """Split-KV pass. Split s of a length-N sequence covers tokens
    ``[s * ceil(N/S), (s+1) * ceil(N/S))``. Returns ``(Partials, radius [B, Hq, Nmax] | None)``;
    Partials fields a/vmax/vw are None when the certificate is disabled. ``q`` must be
    finite (decode_attention zeroes non-finite entries first). exact: as ``decode_attention``."""
    B, Hq, D = q.shape
    S = num_splits
    nmax = int(seq_lens.max())
    dl = torch.as_tensor(delta_loc, dtype=torch.float64).expand(B)
    fields = [[] for _ in range(8)]
    radius = q.new_zeros(B, Hq, nmax) if cert.enabled else None
    for b in range(B):
        n = int(seq_lens[b])
        slots = token_slots(block_table[b], n, page_size=page_size)
        z, v, u, wv = sequence_terms(q[b], layer_kv, slots, sm_scale=sm_scale, cert=cert,
                                      delta_loc=float(dl[b]), exact=exact)
        if u is not None:
            radius[b, :, :n] = u
        chunk = -(-n // S)
        per_split = [split_state(z[:, s * chunk:(s + 1) * chunk], v[:, s * chunk:(s + 1) * chunk],
                                  None if u is None else u[:, s * chunk:(s + 1) * chunk],
                                  wv[:, s * chunk:(s + 1) * chunk]) for s in range(S)]
        for i in range(8):
            fields[i].append(None if per_split[0][i] is None else torch.stack([p[i] for p in per_split], 1))
    stacked = [None if f[0] is None else torch.stack(f) for f in fields]
    return Partials(*stacked), radius


def merge_partials(p: Partials) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Combine splits with weights exp(m_s - M), in float64. Returns (out f32 [B, Hq, D],
    lse f32 [B, Hq], cert f32 [B, Hq] or None, vbound f32 [B, Hq] or None).

    ``cert = (1 + 2^-20) sum_s w_s a_s / L + tail`` (docs/PROOFS.md section 5), rounded up to
    f32: never negative, never NaN; vbound is rounded up too."""
    M = p.m.amax(-1, keepdim=True)
    w = torch.where(torch.isneginf(p.m), torch.zeros_like(p.m), torch.exp(p.m - M))
    L = (w * p.l).sum(-1)
    out = ((w[..., None] * p.acc).sum(-2) / L[..., None]).to(torch.float32)
    lse = (M[..., 0] + torch.log(L)).to(torch.float32)
    if p.a is None:
        return out, lse, None, None
    wa = torch.where(w > 0, w * p.a, torch.zeros_like(w)).sum(-1)
    n = p.n.sum(-1) if p.n is not None else torch.ones_like(L)
    umax = p.umax.amax(-1) if p.umax is not None else torch.zeros_like(L)
    model = reference_model(p.acc.shape[-1])
    c64 = wa / L * (1.0 + model.sum_rel) + tail_bound(n, umax, model=model)
    cert = f32_round_up(c64)
    wvw = torch.where(w > 0, w * p.vw, torch.zeros_like(w)).sum(-1)
    c1 = torch.clamp(c64, max=1.0)
    vb64 = (2.0 * c1 * p.vmax.amax(-1) + wvw / L) * (1.0 + model.sum_rel)
    return out, lse, cert, f32_round_up(vb64)


def decode_attention(q: torch.Tensor, layer_kv: LayerKV, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, *, page_size: int, sm_scale: float, cert: CertConfig,
                     delta_loc, num_splits: int = 1, return_radius: bool = False,
                     exact: ExactEntries | None = None) -> DecodeOut:
    """One decode step for B sequences over one layer's pool.

    q: float [B, Hq, D]; query head h reads KV head ``h // (Hq / Hkv)``.
    block_table: int32 [B, pages]; seq_lens: int32 [B] (>= 1).
    delta_loc: float or tensor [B], the per-(layer, head, step) budget (docs/MATH.md §4).
    exact: None, or the layer's repaired entries (``witcert.ref.overlay.ExactEntries``, what a
    gate made exact): read exactly instead of from the codes.
    A non-finite q head is computed with those entries zeroed and gets cert = vbound = inf.
    """
    validate_decode(q, layer_kv, block_table, seq_lens, page_size=page_size, num_splits=num_splits,
                    sm_scale=sm_scale, delta_loc=delta_loc)
    q32 = q.to(torch.float32)
    qbad = ~torch.isfinite(q32).all(-1)
    q32 = _zero_where(q32, ~torch.isfinite(q32))
    parts, radius = decode_split_partials(q32, layer_kv, block_table, seq_lens, page_size=page_size,
                                          sm_scale=sm_scale, cert=cert, delta_loc=delta_loc,
                                          num_splits=num_splits, exact=exact)
    out, lse, c, vb = merge_partials(parts)
    if c is not None:
        c = torch.where(qbad, INF, c)
        vb = torch.where(qbad, INF, vb)
        radius = torch.where(qbad[..., None], INF, radius)
    return DecodeOut(out=out, lse=lse, cert=c, vbound=vb, radius=radius if return_radius else None,
                     radius_kind=cert.radius if cert.enabled else "none")


def extend_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, layer_kv: LayerKV,
                     prefix_slots: torch.Tensor, *, sm_scale: float, causal: bool = True) -> torch.Tensor:
    """Prefill/extend for one sequence: T new tokens attend to the dequantized prefix
    (slots int64 [Np]) and to the exact new K/V, causally among themselves.
    q: float [T, Hq, D]; k_new, v_new: float [T, Hkv, D]. Returns f32 [T, Hq, D]."""
    if q.dim() != 3 or k_new.shape != v_new.shape or k_new.shape[0] != q.shape[0]:
        raise ValueError(f"q [T, Hq, D] {tuple(q.shape)}, k_new/v_new [T, Hkv, D] "
                         f"{tuple(k_new.shape)}/{tuple(v_new.shape)} disagree")
    T, Hq, D = q.shape
    if D != layer_kv.head_dim or k_new.shape[1:] != (layer_kv.num_kv_heads, D) or Hq % k_new.shape[1]:
        raise ValueError("k_new must be [T, Hkv, D] matching the pool; Hq % Hkv must be 0")
    kvh = torch.arange(Hq, device=q.device) // (Hq // k_new.shape[1])
    kp, _ = gather(layer_kv, K_SIDE, prefix_slots)
    vp, _ = gather(layer_kv, V_SIDE, prefix_slots)
    k = torch.cat([kp, k_new.to(torch.float32)])[:, kvh]  # [Np + T, Hq, D]
    v = torch.cat([vp, v_new.to(torch.float32)])[:, kvh]
    z = sm_scale * torch.einsum("thd,nhd->htn", q.to(torch.float32), k)
    if causal:
        Np = prefix_slots.shape[0]
        j = torch.arange(Np + T, device=q.device)
        z = z.masked_fill((j[None, :] - Np > torch.arange(T, device=q.device)[:, None])[None], -INF)
    return torch.einsum("htn,nhd->thd", torch.softmax(z, dim=-1), v)


def exact_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, sm_scale: float,
                    return_probs: bool = False):
    """Float64 GQA attention for tests. q [..., Hq, D], k and v [N, Hkv, D].
    Returns out f64 [..., Hq, D] (and probs f64 [..., Hq, N] if return_probs)."""
    Hq, Hkv = q.shape[-2], k.shape[1]
    kvh = torch.arange(Hq, device=q.device) // (Hq // Hkv)
    z = sm_scale * torch.einsum("...hd,nhd->...hn", q.double(), k.double()[:, kvh])
    p = torch.softmax(z, dim=-1)
    out = torch.einsum("...hn,nhd->...hd", p, v.double()[:, kvh])
    return (out, p) if return_probs else out
