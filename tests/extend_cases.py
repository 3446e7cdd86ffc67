"""Extend cases shared by the native extend tests and the engine-path tests.

``make_batch`` builds a paged dither8 pool holding the prefixes of B sequences (reference
writer, shuffled pages, random epochs), plus each sequence's new tokens (exact K/V in the
model dtype) and queries, laid out the way engines pass them: all new tokens concatenated,
sequence b at rows ``q_start[b] ..``. ``exact_tv`` is the soundness check: TV between the
softmax of the exact keys and the softmax of the logits a path used, per (new token, head),
computed exactly (tests/fpexact.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import fpexact
from witcert.config import QuantConfig
from witcert.ref import attention as ref_attn
from witcert.ref.pool import LayerKV, gather, write_
from witcert.ref.types import K_SIDE, V_SIDE

SEED = 0x9E3779B97F4A7C15  # both key words >= 2^31


@dataclass
class Batch:
    """layer: the pool; q f32 [rows, Hq, D]; k_new, v_new [rows, Hkv, D] (model dtype);
    block_table int32 [B, pages]; q_start, q_len, prefix_len: lists of B ints; exact_prefix:
    per sequence (k, v) [Np, Hkv, D] as written (model dtype); page: page size."""

    layer: LayerKV
    q: torch.Tensor
    k_new: torch.Tensor
    v_new: torch.Tensor
    block_table: torch.Tensor
    q_start: list[int]
    q_len: list[int]
    prefix_len: list[int]
    exact_prefix: list[tuple[torch.Tensor, torch.Tensor]]
    page: int

    def prefix_slots(self, b: int) -> torch.Tensor:
        return ref_attn.token_slots(self.block_table[b], self.prefix_len[b], page_size=self.page)

    def rows(self, b: int) -> slice:
        return slice(self.q_start[b], self.q_start[b] + self.q_len[b])

    def stored_prefix(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The dequantized prefix (what every path reads), f32 [Np, Hkv, D] each."""
        s = self.prefix_slots(b)
        return gather(self.layer, K_SIDE, s)[0], gather(self.layer, V_SIDE, s)[0]


def make_batch(*, prefix_lens, new_lens, hq, hkv, d, page, bits=8, group=32, layer=3, seed=0,
               dtype=torch.bfloat16, gap_rows: int = 0, q_scale: float = 2.0,
               key: str = "slot", pool_read: bool = False) -> Batch:
    """B sequences (prefix_lens[b] stored tokens, new_lens[b] new tokens). gap_rows: unused
    rows between sequences (the engine layouts interleave decode rows). key "position": the
    pool has ``positions`` (random in [0, 2^32): the position-keyed dither, docs/MATH.md §6).
    pool_read: the layout of the pool-read extend (``new_from_pool``): the new tokens' K/V are
    also written into the pool after the prefix, so ``prefix_len[b]`` (and ``exact_prefix``,
    ``prefix_slots``) count ``prefix_lens[b] + new_lens[b]`` tokens, the new ones last."""
    gen = torch.Generator().manual_seed(seed)
    pages_per = [max(1, -(-(n + t) // page)) for n, t in zip(prefix_lens, new_lens)]
    num_pages = sum(pages_per) + 1
    epochs = torch.randint(0, 2**32, (num_pages * page,), generator=gen, dtype=torch.int64)
    positions = (torch.randint(0, 2**32, (num_pages * page,), generator=gen, dtype=torch.int64)
                 if key == "position" else None)
    lkv = LayerKV.allocate(num_slots=num_pages * page, num_kv_heads=hkv, head_dim=d,
                           quant=QuantConfig(dither_bits=bits, group_size=group), layer=layer,
                           seed=SEED, epochs=epochs, positions=positions)
    perm = torch.randperm(num_pages, generator=gen)
    bt = torch.zeros(len(prefix_lens), max(pages_per), dtype=torch.int32)
    exact, used, starts, row = [], 0, [], 0
    for b, n in enumerate(prefix_lens):
        bt[b, :pages_per[b]] = perm[used:used + pages_per[b]].to(torch.int32)
        used += pages_per[b]
        k = (torch.randn(n, hkv, d, generator=gen)
             * torch.exp(torch.randn(1, hkv, d, generator=gen))).to(dtype)
        v = torch.randn(n, hkv, d, generator=gen).to(dtype)
        if n and not pool_read:
            write_(lkv, k, v, slots=ref_attn.token_slots(bt[b], n, page_size=page))
        exact.append((k, v))
        starts.append(row)
        row += new_lens[b] + gap_rows
    rows = row
    q = torch.randn(rows, hq, d, generator=gen) * q_scale
    kn = (torch.randn(rows, hkv, d, generator=gen)
          * torch.exp(torch.randn(1, hkv, d, generator=gen))).to(dtype)
    vn = torch.randn(rows, hkv, d, generator=gen).to(dtype)
    plens = list(prefix_lens)
    if pool_read:  # the step's new tokens are written before attention: prefix, then new
        for b, t in enumerate(new_lens):
            r = slice(starts[b], starts[b] + t)
            exact[b] = (torch.cat([exact[b][0], kn[r]]), torch.cat([exact[b][1], vn[r]]))
            plens[b] += t
            if plens[b]:
                write_(lkv, *exact[b], slots=ref_attn.token_slots(bt[b], plens[b], page_size=page))
    return Batch(lkv, q, kn, vn, bt, starts, list(new_lens), plens, exact, page)


def exact_tv(batch: Batch, b: int, used: torch.Tensor, cert: torch.Tensor, *, sm: float,
             causal: bool = True, pool_read: bool = False) -> torch.Tensor:
    """TV per (new token, head) f64 [T, Hq] between softmax of the exact keys (the prefix as
    written, the new tokens' K) and softmax of ``used`` f64 [T, Hq, Np + T] (the logits the
    path used, keys ordered prefix then new). Masked keys: causal. pool_read (a
    ``make_batch(pool_read=True)`` batch): the keys are the ``prefix_len`` pool tokens, new
    token t sees the first ``prefix_len - T + t + 1``; ``used`` f64 [T, Hq, prefix_len]."""
    hq, hkv = batch.q.shape[1], batch.k_new.shape[1]
    kvh = torch.arange(hq) // (hq // hkv)
    rows = batch.rows(b)
    T, Np = batch.q_len[b], batch.prefix_len[b]
    keys = batch.exact_prefix[b][0].float()
    if not pool_read:
        keys = torch.cat([keys, batch.k_new[rows].float()])
    N = keys.shape[0]
    keys = keys[:, kvh].transpose(0, 1)  # [Hq, N, D]
    out = torch.empty(T, hq, dtype=torch.float64)
    for t in range(T):
        live = (Np - T + t + 1 if pool_read else Np + t + 1) if causal else Np + T
        mask = (torch.arange(N) < live)[None].expand(hq, -1)
        z = fpexact.exact_shifted_logits(batch.q[rows][t], keys, sm_scale=sm, mask=mask)
        out[t] = fpexact.tv(z, used[t], cert[t], mask=mask)
    return out


def exact_attention_f64(batch: Batch, b: int, *, sm: float, causal: bool = True,
                        pool_read: bool = False) -> torch.Tensor:
    """Float64 attention over the stored prefix and the exact new tokens, f64 [T, Hq, D]
    (non-finite rows are not expected here). pool_read: over the stored pool tokens alone,
    new token t seeing the first ``prefix_len - T + t + 1``."""
    hq, hkv = batch.q.shape[1], batch.k_new.shape[1]
    kvh = torch.arange(hq) // (hq // hkv)
    rows = batch.rows(b)
    T, Np = batch.q_len[b], batch.prefix_len[b]
    kh, vh = batch.stored_prefix(b)
    if pool_read:
        k, v, Np = kh.double()[:, kvh], vh.double()[:, kvh], Np - T
    else:
        k = torch.cat([kh.double(), batch.k_new[rows].double()])[:, kvh]
        v = torch.cat([vh.double(), batch.v_new[rows].double()])[:, kvh]
    z = sm * torch.einsum("thd,nhd->thn", batch.q[rows].double(), k)
    if causal:
        j = torch.arange(k.shape[0])
        z = z.masked_fill((j[None, :] - Np > torch.arange(T)[:, None])[:, None], float("-inf"))
    return torch.einsum("thn,nhd->thd", torch.softmax(z, -1), v)
