"""Attention of one vLLM batch over witcert pages, built from the reference pieces.

A vLLM batch mixes decode rows (one query token) and prefill/extend rows (several).
Decode rows are attended together by ``decode_batched``: one ``pool.gather`` per side for
the whole batch (sequences padded to the longest, padding masked), then the reference
radii (``radius_det``, ``radius_prob``, ``combine_radius``) and ``certificate``. It is
``witcert.ref.attention.decode_attention`` (one sequence at a time, split partials)
rearranged so the per-op overhead is paid once per layer, not once per sequence; the
tests check it against that function. Extend rows go through the reference
``extend_attention`` (cached prefix read back from the pool, the new tokens exact and
causal among themselves). Only decode queries carry a certificate (MATH 1).

With the gate on (``WITCERT_VLLM_GATE``), decode rows go through ``decode_gated``: the
same batched pass with the entries made exact at earlier steps read from the layer's
``gate.ExactCopy``, then the repair of every (sequence, query head) with ``cert > tau``
(``gate.repair_sequence``). On the native path that first pass is the fused C decode with
the exact copy as an overlay, and the torch terms are built only for the sequences that
repair. Extend rows never read the exact copy.

``decode_batched`` runs the fused C path (``witcert.native.decode``: one pass per (sequence,
KV head) over the packed pages, dither and dequantization bitwise the reference, float64
softmax and certificate) when it builds and supports the pool (dither8 (the plugin stores no
outliers), CPU tensors): ``native="auto"``; ``"on"`` requires it, ``"off"`` keeps the torch path below.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from witcert import native as _native
from witcert.config import CertConfig, RepairPolicy
from witcert.integrations.vllm.gate import (ExactCopy, GateEvents, count_blocks, finite_sum_max,
                                            repair_sequence)
from witcert.native import decode as _native_decode
from witcert.ref.attention import extend_attention, token_slots
from witcert.ref.cert import certificate, combine_radius, delta_local, radius_det, radius_prob
from witcert.ref.pool import LayerKV, gather
from witcert.ref.types import K_SIDE, V_SIDE

INF = float("inf")


@dataclass
class BatchOut:
    """decode_rows: int64 [Bd] batch rows that were decode queries; cert f32 [Bd, Hq]
    (after repair when gated); gate: the gate's counters, None when not gating."""

    decode_rows: torch.Tensor
    cert: torch.Tensor | None
    prefill_tokens: int
    gate: GateEvents | None = None


def anytime_delta(cert: CertConfig, *, num_layers: int, num_q_heads: int,
                  positions: torch.Tensor | list[int]) -> torch.Tensor:
    """Per-query budget of the anytime allocation (MATH 4), f64 [B].

    A server has no horizon; the step index of a decode query is its 1-based token
    position, distinct for every decode step of a sequence, so the sum over steps stays
    below ``delta``. ``6 delta / (pi^2 t^2) / (L Hq)`` is ``delta_local(step=1) / t^2``.
    positions: int tensor [B] or a list of ints (same values bit for bit: t^2 is exact).
    """
    d1 = delta_local(delta=cert.delta, num_layers=num_layers, num_q_heads=num_q_heads,
                     allocation="anytime", step=1)
    if isinstance(positions, list):
        return torch.tensor([d1 / float(max(t, 1) ** 2) for t in positions], dtype=torch.float64)
    return d1 / positions.to(torch.float64).clamp(min=1) ** 2


def _zero_where(x: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    return torch.where(bad, torch.zeros((), dtype=x.dtype), x)


@dataclass
class _Terms:
    """The stored (compressed) side of a decode batch, before any exact overlay."""

    slots: torch.Tensor  # int64 [B, N] (padding points at a live slot, masked)
    valid: torch.Tensor  # bool [B, N]
    n: torch.Tensor  # int64 [B]
    qg: torch.Tensor  # f32 [B, Hkv, R, D], non-finite entries zeroed
    qbad: torch.Tensor  # bool [B, Hq]
    khat: torch.Tensor  # f32 [B, N, Hkv, D]
    vhat: torch.Tensor  # f32 [B, N, Hkv, D]
    u: torch.Tensor  # f32 [B, Hkv, R, N] radii (+inf flagged)
    mask: torch.Tensor  # bool [B, Hkv, R, N]


def _terms(q, layer_kv, block_table, seq_lens, *, page_size, sm_scale, cert,
           delta_loc) -> _Terms:
    B, Hq, D = q.shape
    Hkv = layer_kv.num_kv_heads
    R = Hq // Hkv
    n = seq_lens.to(torch.int64)
    N = int(n.max())
    pos = torch.arange(N, dtype=torch.int64)
    valid = pos[None, :] < n[:, None]  # [B, N]
    page = (pos // page_size).clamp(max=block_table.shape[1] - 1).expand(B, N)
    slots = block_table.to(torch.int64).gather(1, page) * page_size + pos % page_size
    slots = torch.where(valid, slots, slots[:, :1])  # padding reads a live slot, masked below
    khat, kp = gather(layer_kv, K_SIDE, slots.reshape(-1))
    vhat, vp = gather(layer_kv, V_SIDE, slots.reshape(-1))
    kbad = ~torch.isfinite(kp["wit"].float()).all(-1)  # [B*N, Hkv], flagged at write time
    vbad = ~torch.isfinite(vp["wit"].float()).all(-1)
    khat = _zero_where(khat, kbad[..., None] | ~torch.isfinite(khat)).view(B, N, Hkv, D)
    vhat = _zero_where(vhat, vbad[..., None] | ~torch.isfinite(vhat)).view(B, N, Hkv, D)
    q32 = q.to(torch.float32)
    qbad = ~torch.isfinite(q32).all(-1)
    qg = _zero_where(q32, ~torch.isfinite(q32)).view(B, Hkv, R, D)
    mask = valid[:, None, None, :].expand(B, Hkv, R, N)
    G = D // kp["wit"].shape[-1]
    per_tok = lambda t: t.view(B, N, Hkv, -1).permute(0, 2, 1, 3)[:, :, None]  # noqa: E731
    u_det = radius_det(qg, per_tok(kp["wit"]), sm_scale=sm_scale, group_size=G)
    u_prob = None
    if cert.radius != "det":
        if not layer_kv.compressor.has_prob_radius:
            raise ValueError(f"cert.radius={cert.radius!r} needs a dither method")
        u_prob = radius_prob(qg, per_tok(kp["scales"]), sm_scale=sm_scale, group_size=G,
                             bits=layer_kv.quant.dither_bits, n_tokens=n.view(B, 1, 1, 1),
                             delta_loc=delta_loc.view(B, 1, 1, 1))
    u = combine_radius(u_det, u_prob, cert.radius)
    # a flagged key is read as 0 above, so its radius must be +inf whatever the radius mode
    # (a finite fp16 scale with an overflowed witness would otherwise keep a finite u_prob
    # for a logit that is no longer the dithered one); the native path and the Triton
    # kernel flag the same way
    flagged = (kbad | vbad).view(B, N, Hkv).permute(0, 2, 1)[:, :, None]
    u = torch.where(flagged, INF, u)
    return _Terms(slots, valid, n, qg, qbad, khat, vhat, u, mask)


def _attend(t: _Terms, khat, vhat, u, *, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    B, Hkv, R, D = t.qg.shape
    z = sm_scale * torch.einsum("bhrd,bnhd->bhrn", t.qg, khat)
    p = torch.softmax(torch.where(t.mask, z, -INF), dim=-1)
    out = torch.einsum("bhrn,bnhd->bhrd", p, vhat).reshape(B, Hkv * R, D)
    _, c = certificate(z, u, mask=t.mask)
    return out, torch.where(t.qbad, INF, c.reshape(B, Hkv * R))


def native_unsupported(q: torch.Tensor, layer_kv: LayerKV, block_table: torch.Tensor,
                       seq_lens: torch.Tensor) -> str | None:
    """Why the fused C decode cannot serve this call (building it on first use); None if it can."""
    if not _native.available():
        return _native.reason()
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        return f"block_table / seq_lens dtypes {block_table.dtype} / {seq_lens.dtype} (need int32)"
    return _native_decode.unsupported(layer_kv, q)


def decode_batched(q: torch.Tensor, layer_kv: LayerKV, block_table: torch.Tensor,
                   seq_lens: torch.Tensor, *, page_size: int, sm_scale: float, cert: CertConfig,
                   delta_loc: torch.Tensor, native: str = "auto",
                   num_threads: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode query per sequence, all sequences at once.

    q: float [B, Hq, D]; block_table: int [B, pages]; seq_lens: int [B] (>= 1);
    delta_loc: f64 [B]. Returns (out f32 [B, Hq, D], cert f32 [B, Hq]); a non-finite
    query head is attended with those entries zeroed and gets cert = +inf.
    native: ``auto`` (the C path when available, else torch with one logged warning),
    ``on`` (the C path or ``RuntimeError``), ``off`` (torch). num_threads: C threads.
    """
    if native != "off":
        why = native_unsupported(q, layer_kv, block_table, seq_lens)
        if why is None:
            return _native_decode.decode_attention(
                q, layer_kv, block_table, seq_lens, page_size=page_size, sm_scale=sm_scale,
                radius=cert.radius, delta_loc=delta_loc, num_threads=num_threads)
        if native == "on":
            raise RuntimeError(f"witcert: native decode required (native='on') but unavailable: {why}")
        _native.warn_unavailable(why)
    t = _terms(q, layer_kv, block_table, seq_lens, page_size=page_size, sm_scale=sm_scale,
               cert=cert, delta_loc=delta_loc)
    return _attend(t, t.khat, t.vhat, t.u, sm_scale=sm_scale)


def decode_gated(q: torch.Tensor, layer_kv: LayerKV, exact: ExactCopy,
                 block_table: torch.Tensor, seq_lens: torch.Tensor, *, page_size: int,
                 sm_scale: float, cert: CertConfig, delta_loc: torch.Tensor,
                 repair: RepairPolicy, native: str = "auto",
                 num_threads: int = 1) -> tuple[torch.Tensor, torch.Tensor, GateEvents]:
    """``decode_batched`` with the gate (``gate.py``): entries made exact at an earlier step
    (``exact.live``) are read exactly (exact logit with radius 0, exact value); every
    (sequence, query head) with ``cert > cert.tau`` then repairs its KV head
    (``gate.repair_sequence``), the new exact entries are recorded in ``exact``, and the
    rows of those sequences are recomputed in float64 over the mixed values.
    Returns (out f32 [B, Hq, D], cert f32 [B, Hq], GateEvents).

    native, num_threads: as ``decode_batched``. On the native path the first pass (stored
    values with the live exact overlay) is one C call for the whole batch; the torch terms
    are built only for the sequences with a fired head, for their repair.
    """
    if native != "off":
        why = native_unsupported(q, layer_kv, block_table, seq_lens) \
            or _native_decode.exact_unsupported(exact, layer_kv)
        if why is None:
            out, c = _native_decode.decode_attention(
                q, layer_kv, block_table, seq_lens, page_size=page_size, sm_scale=sm_scale,
                radius=cert.radius, delta_loc=delta_loc, num_threads=num_threads, exact=exact)
            qbad = ~torch.isfinite(q.to(torch.float32)).all(-1)
            return _repair_fired(out, c, qbad, q, layer_kv, exact, block_table, seq_lens,
                                 page_size=page_size, sm_scale=sm_scale, cert=cert,
                                 delta_loc=delta_loc, repair=repair)
        if native == "on":
            raise RuntimeError(f"witcert: native decode required (native='on') but unavailable: {why}")
        _native.warn_unavailable(why)
    t = _terms(q, layer_kv, block_table, seq_lens, page_size=page_size, sm_scale=sm_scale,
               cert=cert, delta_loc=delta_loc)
    live = exact.live(t.slots) & t.valid[..., None]  # [B, N, Hkv]
    khat, vhat, u = t.khat, t.vhat, t.u
    if bool(live.any()):
        lk = live[..., None]
        khat = torch.where(lk, exact.k[t.slots].to(torch.float32), khat)
        vhat = torch.where(lk, exact.v[t.slots].to(torch.float32), vhat)
        u = torch.where(live.permute(0, 2, 1)[:, :, None], torch.zeros((), dtype=u.dtype), u)
    out, c = _attend(t, khat, vhat, u, sm_scale=sm_scale)
    tau = cert.tau
    ev = GateEvents(raw_covered=int((c <= tau).sum()))
    fired = (c > tau) & ~t.qbad
    if not bool(fired.any()):
        return out, c, ev
    rows = fired.any(1).nonzero().flatten().tolist()
    _repair_rows(out, c, fired, t, rows, rows, exact, ev, sm_scale=sm_scale, tau=tau,
                 repair=repair)
    return out, c, ev


def _repair_fired(out, c, qbad, q, layer_kv, exact, block_table, seq_lens, *, page_size,
                  sm_scale, cert, delta_loc, repair) -> tuple[torch.Tensor, torch.Tensor,
                                                          GateEvents]:
    """The repair after a first pass computed elsewhere (out, c over the live overlay):
    the torch terms of the sequences with a fired head only, then ``_repair_rows``."""
    tau = cert.tau
    ev = GateEvents(raw_covered=int((c <= tau).sum()))
    fired = (c > tau) & ~qbad
    if not bool(fired.any()):
        return out, c, ev
    sel = fired.any(1).nonzero().flatten()
    t = _terms(q.index_select(0, sel), layer_kv, block_table.index_select(0, sel),
               seq_lens.index_select(0, sel), page_size=page_size, sm_scale=sm_scale,
               cert=cert, delta_loc=delta_loc.index_select(0, sel))
    _repair_rows(out, c, fired, t, sel.tolist(), list(range(sel.numel())), exact, ev,
                 sm_scale=sm_scale, tau=tau, repair=repair)
    return out, c, ev


def _repair_rows(out, c, fired, t: _Terms, rows: list[int], trows: list[int], exact: ExactCopy,
                 ev: GateEvents, *, sm_scale: float, tau: float, repair: RepairPolicy) -> None:
    """Repair batch rows ``rows`` (row ``trows[i]`` of the terms ``t``) in order, in place:
    new exact entries into ``exact``, out / c recomputed, counters into ``ev``."""
    for b, i in zip(rows, trows):
        n = int(t.n[i])
        sl = t.slots[i, :n]
        # the live entries now: an earlier row of this batch may have repaired a shared
        # (prefix-cached) slot; this row's output and certificate are over this state
        ex0 = exact.live(sl).T.contiguous()  # [Hkv, n]
        r = repair_sequence(t.qg[i], t.khat[i, :n], t.vhat[i, :n], t.u[i, ..., :n],
                            exact.k[sl], exact.v[sl], ex0, fired[b], t.qbad[i],
                            sm_scale=sm_scale, tau=tau, policy=repair)
        new = r.exact & ~ex0
        heads, toks = new.nonzero(as_tuple=True)
        if heads.numel():
            exact.mark_(sl[toks], heads)
        cb = torch.where(t.qbad[i], INF, r.cert.to(torch.float32))
        s0, m0 = finite_sum_max(c[b][fired[b]].double())
        s1, m1 = finite_sum_max(cb[fired[b]].double())
        ev.add_(GateEvents(fired=int(fired[b].sum()), repaired=int((cb[fired[b]] <= tau).sum()),
                           blocks=count_blocks(new, repair.block_tokens), tokens=int(heads.numel()),
                           fallbacks=r.fallbacks, before_sum=s0, before_max=m0, after_sum=s1,
                           after_max=m1))
        out[b] = r.out.to(torch.float32)
        c[b] = cb


def attend_batch(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 layer_kv: LayerKV, *, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                 block_table: torch.Tensor, page_size: int, sm_scale: float, cert: CertConfig,
                 num_layers: int, out: torch.Tensor, exact: ExactCopy | None = None,
                 repair: RepairPolicy | None = None, native: str = "auto",
                 num_threads: int = 1) -> BatchOut:
    """Attention for every query token of the batch, written into ``out``.

    exact, repair: the layer's exact copy and the gate policy (both or neither): decode
    rows go through ``decode_gated``. Extend rows read the stored prefix either way.
    native, num_threads: whether decode rows run the fused C path (``decode_batched``,
    ``decode_gated``) and its thread count.

    query: [T, Hq, D]; key, value: [T, Hkv, D] (the new tokens, already stored);
    query_start_loc: int32 [B + 1]; seq_lens: int32 [B] (context incl. new tokens);
    block_table: int32 [B, pages]; out: [T, Hq, D] in the model dtype.
    """
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    B, Hq = len(lens), query.shape[1]
    qlen = [qsl[i + 1] - qsl[i] for i in range(B)]
    dec = [i for i in range(B) if qlen[i] == 1]
    prefill_tokens = 0
    for i in range(B):
        n_new = qlen[i]
        if n_new <= 1:
            continue
        lo, hi = qsl[i], qsl[i + 1]
        prefix = token_slots(block_table[i], lens[i], page_size=page_size)[:lens[i] - n_new]
        o = extend_attention(query[lo:hi], key[lo:hi], value[lo:hi], layer_kv, prefix,
                             sm_scale=sm_scale)
        out[lo:hi] = o.to(out.dtype)
        prefill_tokens += n_new
    if not dec:
        return BatchOut(torch.empty(0, dtype=torch.int64), None, prefill_tokens)
    pure = len(dec) == B  # a pure decode batch: row i is query token i, nothing to select
    if pure:
        rows = torch.arange(B, dtype=torch.int64)
        q, bt, sl = query[:B], block_table[:B], seq_lens[:B]
    else:
        rows = torch.tensor(dec, dtype=torch.int64)
        tok = torch.tensor([qsl[i] for i in dec], dtype=torch.int64)
        q, bt = query.index_select(0, tok), block_table.index_select(0, rows)
        sl = seq_lens.index_select(0, rows)
    d = anytime_delta(cert, num_layers=num_layers, num_q_heads=Hq, positions=[lens[i] for i in dec])
    kw = dict(page_size=page_size, sm_scale=sm_scale, cert=cert, delta_loc=d)
    ev = None
    if exact is not None and repair is not None and repair.mode != "off":
        o, c, ev = decode_gated(q, layer_kv, exact, bt, sl, **kw, repair=repair, native=native,
                                num_threads=num_threads)
    else:
        o, c = decode_batched(q, layer_kv, bt, sl, **kw, native=native, num_threads=num_threads)
    if pure:
        out[:B].copy_(o)
    else:
        out[tok] = o.to(out.dtype)
    return BatchOut(rows, c, prefill_tokens, ev)
