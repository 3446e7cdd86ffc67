"""Attention of one vLLM batch over witcert pages, built from the reference pieces.

A vLLM batch mixes decode rows (one query token) and prefill/extend rows (several).
Decode rows are attended together by ``decode_batched`` through the library's one dispatch
(``witcert.runtime.dispatch.decode_attention``): the fused C decode, one call for the whole
batch, when it builds and serves the pool, else the reference. Extend rows (several new tokens: prompts, chunked
prefill over a cached prefix) go through ``extend_rows``: the stored prefix read back from
the pool, the new tokens exact and causal among themselves, a certificate per (new token,
query head) (the spec ``witcert.ref.extend.extend_attention_cert``; the budget of each new
token is the anytime allocation at its position, docs/MATH.md §4), through the dispatch's
``extend_batch``: on the native path one C call (``witcert.native.extend``) for all the
extend rows of the batch; otherwise the spec one sequence at a time.

With the gate on (``WITCERT_VLLM_GATE``), decode rows go through ``decode_gated``: the
same dispatch with the layer's exact copy as ``exact_copy=`` (the C decode reads it as an
overlay, the reference gets its live entries as data), then the library's one gate
(``witcert.runtime.repair_rows.RowCtx.repair_row``, the HF cache's) for every (sequence,
query head) with ``cert > tau``. Extend rows never read the exact copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from witcert.config import CertConfig, RepairPolicy
from witcert.integrations.vllm.gate import ExactCopy, GateEvents, finite_sum_max
from witcert.ref.cert import delta_local
from witcert.ref.pool import LayerKV
from witcert.runtime import dispatch
from witcert.runtime.repair_rows import RowCtx


@dataclass
class BatchOut:
    """decode_rows: int64 [Bd] batch rows that were decode queries; cert f32 [Bd, Hq]
    (after repair when gated); gate: the gate's counters, None when not gating;
    prefill_cert: f32 [prefill_tokens, Hq] the extend rows' certificates (their tokens in
    batch order), None when the batch has none."""

    decode_rows: torch.Tensor
    cert: torch.Tensor | None
    prefill_tokens: int
    gate: GateEvents | None = None
    prefill_cert: torch.Tensor | None = None


def anytime_delta(cert: CertConfig, *, num_layers: int, num_q_heads: int,
                  positions: torch.Tensor | list[int]) -> torch.Tensor:
    """Per-query budget of the anytime allocation (docs/MATH.md §4), f64 [B].

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


_BACKEND = {"auto": "auto", "on": "native", "off": "ref"}


def _backend(native: str) -> str:
    """The plugin's ``native`` mode as the dispatch's backend choice (for CPU batches)."""
    if native not in _BACKEND:
        raise ValueError(f"native: {native!r} must be one of {tuple(_BACKEND)}")
    return _BACKEND[native]


def decode_batched(q: torch.Tensor, layer_kv: LayerKV, block_table: torch.Tensor,
                   seq_lens: torch.Tensor, *, page_size: int, sm_scale: float, cert: CertConfig,
                   delta_loc: torch.Tensor, native: str = "auto",
                   num_threads: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode query per sequence, all sequences at once, through the library's one
    dispatch (``witcert.runtime.dispatch.decode_attention``, one split).

    q: float [B, Hq, D]; block_table: int32 [B, pages]; seq_lens: int32 [B] (>= 1);
    delta_loc: f64 [B]. Returns (out f32 [B, Hq, D], cert f32 [B, Hq]); a non-finite
    query head is attended with those entries zeroed and gets cert = +inf.
    native: ``auto`` (the fused C decode, one call for the batch, when it builds and serves
    the pool, else the reference), ``on`` (the C path or ``RuntimeError``), ``off`` (the
    reference). num_threads: C threads.
    """
    res = dispatch.decode_attention(q, layer_kv, block_table, seq_lens, page_size=page_size,
                                    sm_scale=sm_scale, cert=cert, delta_loc=delta_loc, num_splits=1,
                                    backend=_backend(native), num_threads=num_threads,
                                    lse_vbound=False)
    return res.out, res.cert


def decode_gated(q: torch.Tensor, layer_kv: LayerKV, exact: ExactCopy,
                 block_table: torch.Tensor, seq_lens: torch.Tensor, *, page_size: int,
                 sm_scale: float, cert: CertConfig, delta_loc: torch.Tensor,
                 repair: RepairPolicy, native: str = "auto", num_threads: int = 1,
                 terms_first: bool = False) -> tuple[torch.Tensor, torch.Tensor, GateEvents]:
    """``decode_batched`` with the gate: entries made exact at an earlier step
    (``exact.live``) are read exactly (exact logit, the copy's rounding witness as radius,
    exact value); every (sequence, query head) with ``cert > cert.tau`` then goes through
    the library's one gate, ``witcert.runtime.repair_rows.RowCtx.repair_row`` (the one the
    HF cache uses): the plan from the logits / whole radii the path used and the exact logits
    of the candidates, the entries marked in ``exact``, the row decoded again while a head is
    still above tau; rows in batch order (a later row sees the entries an earlier one made
    exact); the certificate delivered is the recomputed one. Policy ``block`` (the greedy
    blocks) or ``head`` (the whole KV head; counted in ``fallbacks``); entries without a
    finite held copy never. Returns (out f32 [B, Hq, D], cert f32 [B, Hq], GateEvents).
    The fired rows go through ``RowCtx.repair_rows``: on the C path one C call for all of
    them (``witcert.native.repair``, the same bits as ``repair_row`` row by row). The
    counters are summed once over the call's fired heads.

    native, num_threads: as ``decode_batched``. Both passes go through the dispatch with the
    copy as ``exact_copy=``: the C decode reads it as its overlay, the reference gets its live
    entries as data. The fired rows are decoded a second time with
    the logits / radii the plan reads (asked only when something fires).
    terms_first: ask for the logits / radii (and lse, vbound) in the first pass instead, for
    every row, and decode no row a second time (on the C path they cost the first pass about
    15% more, a second pass over the fired rows costs their whole decode again). A cost hint
    only: the outputs, certificates and entries made exact are the same either way (each
    row's decode does not depend on the other rows of the batch). The plugin sets it for a
    layer whose previous gated call fired.
    """
    from witcert.native import repair as native_repair

    # Where the fired rows go through the C repair (RowCtx.repair_rows), it reads the first pass's
    # out, cert and the fired heads' logits / radii only: the C decode then skips lse / vbound and
    # writes the terms of the heads above tau alone (terms_tau). Elsewhere (the reference's
    # repair_row) the first state is whole. Same outputs, certificates and entries either way.
    c_rows = native_repair.unsupported(exact, q, mode=repair.mode) is None
    kw = dict(page_size=page_size, sm_scale=sm_scale, cert=cert, num_splits=1,
              backend=_backend(native), num_threads=num_threads, exact_copy=exact,
              terms_tau=cert.tau if c_rows else None)
    terms: dict | None = {} if terms_first else None
    first = dispatch.decode_attention(q, layer_kv, block_table, seq_lens, delta_loc=delta_loc,
                                      lse_vbound=terms_first and not c_rows, terms=terms, **kw)
    o, c = first.out, first.cert
    tau = cert.tau
    ev = GateEvents(raw_covered=int((c <= tau).sum()))
    fired = c > tau
    if not bool(fired.any()):  # the one check on the common path
        return o, c, ev
    fired &= torch.isfinite(q.to(torch.float32)).all(-1)  # a non-finite query head: never
    if not bool(fired.any()):                              # repaired (its cert is +inf)
        return o, c, ev
    sel = fired.any(1).nonzero().flatten()
    if terms_first:  # the first pass is the fired rows' state: context row b is batch row b
        rows = list(zip(sel.tolist(), sel.tolist()))
        q_c, bt_c, sl_c, dl_c, f = q, block_table, seq_lens, delta_loc, first
    else:  # decode the fired rows again, with their logits and radii
        rows = list(enumerate(sel.tolist()))
        q_c, bt_c, sl_c, dl_c = (x.index_select(0, sel)
                                 for x in (q, block_table, seq_lens, delta_loc))
        terms = {}
        f = dispatch.decode_attention(q_c, layer_kv, bt_c, sl_c, delta_loc=dl_c, terms=terms, **kw)
    ctx = RowCtx(q_c, layer_kv, bt_c, sl_c, page_size, sm_scale, cert, dl_c, copy=exact, tau=tau,
                 policy=repair, native=terms.get("backend") == "native", num_threads=num_threads,
                 first=f, terms=terms)
    res = ctx.repair_rows([i for i, _ in rows], fired if terms_first else fired.index_select(0, sel))
    out, cout = o.clone(), c.clone()
    bi = torch.tensor([b for _, b in rows], dtype=torch.int64)
    ci = torch.tensor([i for i, _ in rows], dtype=torch.int64)
    out[bi], cout[bi] = res.out[ci], res.cert[ci]
    ev.add_(_events(c[bi], cout[bi], fired[bi], entries=res.entries, blocks=res.blocks,
                    fallbacks=res.fallbacks, tau=tau))
    return out, cout, ev


def _events(before: torch.Tensor, after: torch.Tensor, fired: torch.Tensor, *, entries: int,
            blocks: int, fallbacks: int, tau: float) -> GateEvents:
    """GateEvents of the repaired rows: before / after f32 [rows, Hq] their certificates,
    fired bool [rows, Hq] the heads gated; entries, blocks, fallbacks: what the repair did."""
    s0, m0 = finite_sum_max(before[fired].double())
    s1, m1 = finite_sum_max(after[fired].double())
    return GateEvents(fired=int(fired.sum()), repaired=int((after[fired] <= tau).sum()),
                      blocks=blocks, tokens=entries, fallbacks=fallbacks, before_sum=s0,
                      before_max=m0, after_sum=s1, after_max=m1)


def extend_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_kv: LayerKV,
                rows: list[int], *, query_start_loc: list[int], seq_lens: torch.Tensor,
                block_table: torch.Tensor, page_size: int, sm_scale: float, cert: CertConfig,
                num_layers: int, out: torch.Tensor, native: str = "auto",
                num_threads: int = 1, pool_read: bool = False) -> torch.Tensor | None:
    """The batch rows ``rows`` with several new tokens: causal attention over the stored
    prefix (``seq_lens[i] - new`` tokens) and the exact new tokens, written into ``out``.
    pool_read (the position-keyed dither's consistent reads, docs/VLLM.md "Dither key"):
    instead, new token j of row i attends causally over the pool, tokens ``0 .. prefix + j``
    all read compressed (the step's tokens are stored before attention), exactly as a decode
    query at that position reads: the result does not depend on the scheduling (chunked
    prefill splits, prefix-cache hits).
    Returns their certificates f32 [n, Hq] (tokens in row order; None with certificates off).
    query_start_loc: the B + 1 row offsets; seq_lens: int32 [B].

    Budget of new token j of row i: the anytime allocation at its 1-based position
    ``prefix + j + 1`` (as a decode query's, docs/MATH.md §4). Through the one dispatch
    (``witcert.runtime.dispatch.extend_batch``): ``auto`` / ``on``: all rows in one C call
    (``witcert.native.extend``); ``off`` (or unavailable under ``auto``): the spec
    ``extend_attention_cert`` one sequence at a time.
    query: [T, Hq, D]; key, value: [T, Hkv, D]; block_table: int32 [B, pages].
    """
    Hq = query.shape[1]
    qsl, lens = query_start_loc, seq_lens.tolist()
    qlen = [qsl[i + 1] - qsl[i] for i in rows]
    prefix = [lens[i] - n for i, n in zip(rows, qlen)]
    dl = anytime_delta(cert, num_layers=num_layers, num_q_heads=Hq,
                       positions=[p + j + 1 for p, n in zip(prefix, qlen) for j in range(n)])
    tok = torch.cat([torch.arange(qsl[i], qsl[i + 1], dtype=torch.int64) for i in rows])
    dl_rows = torch.full((query.shape[0],), 0.5, dtype=torch.float64)  # non-extend rows: unread
    dl_rows[tok] = dl
    o, c = dispatch.extend_batch(
        query, key, value, layer_kv, q_start=[qsl[i] for i in rows], q_len=qlen,
        prefix_len=[lens[i] for i in rows] if pool_read else prefix,
        block_table=block_table.index_select(0, torch.tensor(rows)), page_size=page_size,
        sm_scale=sm_scale, cert=cert, delta_loc=dl_rows, pool_read=pool_read,
        backend=_backend(native), num_threads=num_threads)
    out.index_copy_(0, tok, o.index_select(0, tok).to(out.dtype))
    return None if c is None else c.index_select(0, tok)


def attend_batch(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 layer_kv: LayerKV, *, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                 block_table: torch.Tensor, page_size: int, sm_scale: float, cert: CertConfig,
                 num_layers: int, out: torch.Tensor, exact: ExactCopy | None = None,
                 repair: RepairPolicy | None = None, native: str = "auto",
                 num_threads: int = 1, pool_read: bool = False,
                 terms_first: bool = False) -> BatchOut:
    """Attention for every query token of the batch, written into ``out``.

    exact, repair: the layer's exact copy and the gate policy (both or neither): decode
    rows go through ``decode_gated``. Extend rows read the stored prefix either way.
    native, num_threads: whether decode rows (``decode_batched``, ``decode_gated``) and
    extend rows (``extend_rows``) run the fused C path, and its thread count.
    pool_read: extend rows read the new tokens back from the pool (``extend_rows``; the
    position-keyed dither's consistent reads). terms_first: ``decode_gated``'s cost hint.

    query: [T, Hq, D]; key, value: [T, Hkv, D] (the new tokens, already stored);
    query_start_loc: int32 [B + 1]; seq_lens: int32 [B] (context incl. new tokens);
    block_table: int32 [B, pages]; out: [T, Hq, D] in the model dtype.
    """
    qsl = query_start_loc.tolist()
    lens = seq_lens.tolist()
    B, Hq = len(lens), query.shape[1]
    qlen = [qsl[i + 1] - qsl[i] for i in range(B)]
    dec = [i for i in range(B) if qlen[i] == 1]
    ext = [i for i in range(B) if qlen[i] > 1]
    prefill_tokens = sum(qlen[i] for i in ext)
    prefill_cert = None
    if ext:
        prefill_cert = extend_rows(query, key, value, layer_kv, ext, query_start_loc=qsl,
                                   seq_lens=seq_lens, block_table=block_table, page_size=page_size,
                                   sm_scale=sm_scale, cert=cert, num_layers=num_layers, out=out,
                                   native=native, num_threads=num_threads, pool_read=pool_read)
    if not dec:
        return BatchOut(torch.empty(0, dtype=torch.int64), None, prefill_tokens,
                        prefill_cert=prefill_cert)
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
                                num_threads=num_threads, terms_first=terms_first)
    else:
        o, c = decode_batched(q, layer_kv, bt, sl, **kw, native=native, num_threads=num_threads)
    if pure:
        out[:B].copy_(o)
    else:
        out[tok] = o.to(out.dtype)
    return BatchOut(rows, c, prefill_tokens, ev, prefill_cert)
