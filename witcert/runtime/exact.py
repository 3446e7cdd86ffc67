"""The exact K/V entries a gate has made exact: one layout for every gate and decode path.

``ExactCopy`` holds, for ONE layer, the exact K and V of every slot and which (slot, KV
head) entries are *live*, i.e. read exactly instead of from the compressed record:

- ``k``, ``v``: ``[num_slots, Hkv, D]`` in f32 / f16 / bf16, keyed by slot like the pool.
  The vLLM plugin keeps its own copy (``write_`` with every new token, in the model dtype);
  the HF gate (``witcert.runtime.repair``) passes the pool's exact host backup of that layer, so
  making an entry exact copies nothing.
- ``exact``: bool ``[num_slots, Hkv]``; ``exact_epoch``: int64 ``[num_slots, Hkv]``, the
  slot epoch at which the entry was made exact; ``epochs``: the pool's int64
  ``[num_slots]`` slot epochs (shared, not copied). An entry is live while ``exact`` is set
  and its epoch is the slot's current one, so a freed and reused slot (its epoch bumped)
  never reads a stale value.
- ``rounds``: the copy may have rounded the model's K/V (an fp16 backup of an fp32 model).
  Then a live entry's rounding witness ``w >= ||x_model - x_copy||_2`` is
  ``rounding_witness`` of its copy row, a function of the row itself, so nothing more is
  stored (``witness_constants`` gives its two constants to the C code). False: exact.
- ``have``: optional bool ``[num_slots]`` shared by all layers (the vLLM plugin's bounded
  copy, ``copystore``): the slot's copy is held. None: every slot has one. A slot without
  a copy reads NaN (``read``), is never finite (``finite``) and so is never made exact;
  the store clears ``exact`` when it drops a copy.

Readers: the native C decode (``witcert.native.decode``, ``exact=``: live entries read
with radius ``sm ||q||_2 w_k`` plus the arithmetic slack, value witness ``w_v``), the
reference decode (``entries`` / ``batch_entries`` gather the live entries into the spec's
plain ``witcert.ref.overlay.ExactEntries``, passed down as ``exact=``; the spec never
calls this class), the vLLM torch path (``live``). All read the same fields, so there is
one layout for the HF gate, the vLLM gate and the C code.
"""

from __future__ import annotations

import math

import torch

from witcert.ref.attention import token_slots
from witcert.ref.overlay import ExactEntries
from witcert.ref.validate import check_attention_dtypes

_ROUND_UP = 1.0 + 2.0**-20  # slack on the rounding witness (it is itself computed in fp32)
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)  # f64: reference only


def rounding_witness(x: torch.Tensor, *, kv_dtype: torch.dtype | None) -> torch.Tensor:
    """``w >= ||x_true - x||_2`` per row for ``x`` [n, D] read from a copy that rounded
    ``x_true`` (of ``kv_dtype``) to ``x.dtype`` (round to nearest). 0 when no rounding
    happened: the copy is fp32, or it has the model's own K/V dtype.

    Per element ``|e| <= ur |x_true|`` (normal range) or ``<= sub/2`` (subnormal), with
    ``ur = eps/2``; ``|x_true| <= |x| / (1 - ur)``, so ``||e|| <= ur/(1-ur) ||x|| + sqrt(D) sub/2``.
    Returns f32 [n].
    """
    if not copy_rounds(x.dtype, kv_dtype=kv_dtype):
        return torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
    rel, abs_ = witness_constants(x.dtype, x.shape[-1])
    n = torch.linalg.vector_norm(x.float(), dim=-1)
    return (n * rel + abs_) * _ROUND_UP


def copy_rounds(copy_dtype: torch.dtype, *, kv_dtype: torch.dtype | None) -> bool:
    """Whether a copy in ``copy_dtype`` may have rounded K/V of ``kv_dtype`` (None: unknown)."""
    return not (copy_dtype in (torch.float32, torch.float64) or copy_dtype == kv_dtype)


def witness_constants(copy_dtype: torch.dtype, head_dim: int) -> tuple[float, float]:
    """``(rel, abs)`` with ``rounding_witness(x) = (rel ||x||_2 + abs) (1 + 2^-20)`` for a
    rounding copy of ``copy_dtype`` and rows of ``head_dim`` values."""
    fi = torch.finfo(copy_dtype)
    ur = fi.eps / 2
    return ur / (1 - ur), math.sqrt(head_dim) * (fi.tiny * fi.eps) / 2


class ExactCopy:
    """Exact K/V of one layer, keyed by slot (see the module docstring for the fields).

    num_slots, num_kv_heads, head_dim: the layer's pool geometry. dtype: the copy's dtype
    (f32 / f16 / bf16; f64 too, which only the reference reads). epochs: the pool's int64
    [num_slots] slot epochs. k, v: existing ``[num_slots, Hkv, D]`` tensors to use as the
    values (the HF backup), else zeros are allocated. rounds: the copy may have rounded the
    model's K/V (``kv_dtype``, None if unknown): live entries carry the rounding witness of
    their row; False: the copy is exact. The flags live on ``epochs``' device, the values
    where ``k`` lives.
    """

    def __init__(self, *, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, epochs: torch.Tensor, k: torch.Tensor | None = None,
                 v: torch.Tensor | None = None, rounds: bool = False,
                 kv_dtype: torch.dtype | None = None, have: torch.Tensor | None = None) -> None:
        if epochs.shape != (num_slots,):
            raise ValueError(f"epochs {tuple(epochs.shape)} != num_slots {num_slots}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype: {dtype} (the exact copy holds f32, f16, bf16 or f64)")
        shape = (num_slots, num_kv_heads, head_dim)
        for name, t in (("k", k), ("v", v)):
            if t is not None and (tuple(t.shape) != shape or t.dtype != dtype):
                raise ValueError(f"{name}: {t.dtype} {tuple(t.shape)} (need {dtype} {list(shape)})")
        if have is not None and (have.shape != (num_slots,) or have.dtype != torch.bool):
            raise ValueError(f"have: need bool [{num_slots}], got {have.dtype} "
                             f"{tuple(have.shape)}")
        self.k = torch.zeros(shape, dtype=dtype) if k is None else k
        self.v = torch.zeros(shape, dtype=dtype) if v is None else v
        dev = epochs.device
        self.exact = torch.zeros(num_slots, num_kv_heads, dtype=torch.bool, device=dev)
        self.exact_epoch = torch.zeros(num_slots, num_kv_heads, dtype=torch.int64, device=dev)
        self.epochs = epochs
        self.rounds, self.kv_dtype = bool(rounds), kv_dtype
        self.have = have

    @staticmethod
    def bytes_per_slot(*, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """K and V copies plus the exact flag and its epoch, per slot of one layer."""
        return num_kv_heads * (2 * head_dim * dtype.itemsize + 1 + 8)

    def entry_bytes(self) -> int:
        """Bytes one exact entry stands for: its K and V rows at the copy's precision, the
        flag and the epoch."""
        return 2 * self.k.shape[-1] * self.k.element_size() + 1 + 8

    def flag_bytes(self) -> int:
        """Bytes of the flags and epochs (what a gate allocates besides the values)."""
        return sum(t.numel() * t.element_size() for t in (self.exact, self.exact_epoch))

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2 + self.flag_bytes()

    def witness_constants(self) -> tuple[float, float]:
        """``(rel, abs)`` of the rows' rounding witness (``(0, 0)`` for an exact copy)."""
        return witness_constants(self.k.dtype, self.k.shape[-1]) if self.rounds else (0.0, 0.0)

    def witness(self, rows: torch.Tensor) -> torch.Tensor:
        """f32 [...] rounding witnesses of copy rows [..., D] (zeros for an exact copy)."""
        if not self.rounds:
            return torch.zeros(rows.shape[:-1], dtype=torch.float32, device=rows.device)
        flat = rows.reshape(-1, rows.shape[-1])
        return rounding_witness(flat, kv_dtype=self.kv_dtype).view(rows.shape[:-1])

    def write_(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy the new tokens (call after the epoch bump); a rewritten slot is not exact.
        With ``have``, only the slots whose copy is held are written. k, v: fp32 / fp16 / bf16
        (float64 refused: its rounding into the copy would be covered by no witness)."""
        check_attention_dtypes(k=k, v=v)
        if self.have is not None:
            keep = self.have[slots]
            if not bool(keep.all()):
                self.exact[slots] = False
                slots, k, v = slots[keep], k[keep], v[keep]
        self.k[slots] = k.to(self.k.dtype)
        self.v[slots] = v.to(self.v.dtype)
        self.exact[slots] = False

    def read(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) rows ``[*slots.shape, Hkv, D]`` in the copy's dtype, NaN where no copy is
        held (``have``)."""
        k, v = self.k[slots], self.v[slots]
        if self.have is not None:
            miss = ~self.have[slots]
            if bool(miss.any()):
                nan = torch.tensor(float("nan"), dtype=k.dtype)
                k = torch.where(miss[..., None, None], nan, k)
                v = torch.where(miss[..., None, None], nan, v)
        return k, v

    def live(self, slots: torch.Tensor) -> torch.Tensor:
        """bool [*slots.shape, Hkv]: made exact, at the slot's current epoch."""
        return self.exact[slots] & (self.exact_epoch[slots] == self.epochs[slots].unsqueeze(-1))

    def finite(self, slots: torch.Tensor, head: int) -> torch.Tensor:
        """bool [n] (on the values' device): the copy of (slots [n], head) is finite on both
        sides; an entry whose copy is not finite can never be made exact."""
        s = slots.to(self.k.device)
        ok = torch.isfinite(self.k[s, head]).all(-1) & torch.isfinite(self.v[s, head]).all(-1)
        return ok if self.have is None else ok & self.have.to(ok.device)[s]

    def mark_(self, slots: torch.Tensor, heads: torch.Tensor | int) -> None:
        """Make the (slot, KV head) entries exact from now on (until the slot's epoch moves)."""
        dev = self.exact.device
        slots, heads = slots.to(dev), torch.as_tensor(heads, device=dev)
        self.exact[slots, heads] = True
        self.exact_epoch[slots, heads] = self.epochs[slots]

    def entries(self, slots: torch.Tensor, *,
                device: torch.device | str | None = None) -> ExactEntries:
        """The live entries among ``slots`` (int64 [n], repeats allowed) as the spec's plain
        data (``witcert.ref.overlay.ExactEntries``, on ``device``, default the values'):
        their slots and KV heads, K/V rows widened to f32 and rounding witnesses
        (``witness`` of the rows, zeros for an exact copy)."""
        s = torch.unique(slots.to(self.exact.device))
        ok = self.live(s)
        t_idx, head = ok.nonzero(as_tuple=True)
        slot = s[t_idx]
        dev = self.k.device if device is None else torch.device(device)
        rows = (slot.to(self.k.device), head.to(self.k.device))
        ks, vs = self.k[rows].to(dev), self.v[rows].to(dev)  # only the live rows move
        return ExactEntries(slot=slot.to(dev), kv_head=head.to(dev), k=ks.to(torch.float32),
                            v=vs.to(torch.float32), wk=self.witness(ks), wv=self.witness(vs))

    def batch_entries(self, block_table: torch.Tensor, seq_lens: torch.Tensor, *, page_size: int,
                      device: torch.device | str | None = None) -> ExactEntries:
        """``entries`` of every slot a decode batch reads: block_table int [B, pages],
        seq_lens int [B] (the pool's page layout, ``page_size``)."""
        slots = [token_slots(block_table[b], int(seq_lens[b]), page_size=page_size)
                 for b in range(block_table.shape[0])]
        flat = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64)
        return self.entries(flat, device=device)
