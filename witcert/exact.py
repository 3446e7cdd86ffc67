"""The exact K/V entries a gate has made exact: one layout for every gate and decode path.

``ExactCopy`` holds, for ONE layer, the exact K and V of every slot and which (slot, KV
head) entries are *live*, i.e. read exactly instead of from the compressed record:

- ``k``, ``v``: ``[num_slots, Hkv, D]`` in f32 / f16 / bf16, keyed by slot like the pool.
  The vLLM plugin keeps its own copy (``write_`` with every new token, in the model dtype);
  the HF gate (``witcert.repair``) passes the pool's exact host backup of that layer, so
  making an entry exact copies nothing.
- ``exact``: bool ``[num_slots, Hkv]``; ``exact_epoch``: int64 ``[num_slots, Hkv]``, the
  slot epoch at which the entry was made exact; ``epochs``: the pool's int64
  ``[num_slots]`` slot epochs (shared, not copied). An entry is live while ``exact`` is set
  and its epoch is the slot's current one, so a freed and reused slot (its epoch bumped)
  never reads a stale value.
- ``wk``, ``wv``: None (the copy holds the model's values exactly), or f32
  ``[num_slots, Hkv]``: per-entry rounding witnesses ``w >= ||x_model - x_copy||_2``, set
  when the entry is made exact (an fp16 backup of an fp32 model).

Readers: the native C decode (``witcert.native.decode``, ``exact=``: live entries read
with radius ``sm ||q||_2 wk`` plus the arithmetic slack), the reference decode (through
``LayerKV.exact.overlay``), the vLLM torch path (``live``). All read the same fields, so
there is one layout for the HF gate, the vLLM gate and the C code.
"""

from __future__ import annotations

import math

import torch

from witcert.ref.logits import exact_logits_and_radii

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
    fi = torch.finfo(x.dtype)
    ur = fi.eps / 2
    sub = fi.tiny * fi.eps
    n = torch.linalg.vector_norm(x.float(), dim=-1)
    return (n * (ur / (1 - ur)) + math.sqrt(x.shape[-1]) * sub / 2) * _ROUND_UP


def copy_rounds(copy_dtype: torch.dtype, *, kv_dtype: torch.dtype | None) -> bool:
    """Whether a copy in ``copy_dtype`` may have rounded K/V of ``kv_dtype`` (None: unknown)."""
    return not (copy_dtype in (torch.float32, torch.float64) or copy_dtype == kv_dtype)


class ExactCopy:
    """Exact K/V of one layer, keyed by slot (see the module docstring for the fields).

    num_slots, num_kv_heads, head_dim: the layer's pool geometry. dtype: the copy's dtype
    (f32 / f16 / bf16; f64 too, which only the reference reads). epochs: the pool's int64
    [num_slots] slot epochs. k, v: existing ``[num_slots, Hkv, D]`` tensors to use as the
    values (the HF backup), else zeros are allocated. rounds: the copy may have rounded the model's K/V (then the per-entry
    rounding witnesses ``wk``/``wv`` are kept, computed by ``rounding_witness`` with
    ``kv_dtype``, the model's K/V dtype or None if unknown); False: the copy is exact.
    The flags live on ``epochs``' device, the values where ``k`` lives.
    """

    def __init__(self, *, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, epochs: torch.Tensor, k: torch.Tensor | None = None,
                 v: torch.Tensor | None = None, rounds: bool = False,
                 kv_dtype: torch.dtype | None = None) -> None:
        if epochs.shape != (num_slots,):
            raise ValueError(f"epochs {tuple(epochs.shape)} != num_slots {num_slots}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype: {dtype} (the exact copy holds f32, f16, bf16 or f64)")
        shape = (num_slots, num_kv_heads, head_dim)
        for name, t in (("k", k), ("v", v)):
            if t is not None and (tuple(t.shape) != shape or t.dtype != dtype):
                raise ValueError(f"{name}: {t.dtype} {tuple(t.shape)} (need {dtype} {list(shape)})")
        self.k = torch.zeros(shape, dtype=dtype) if k is None else k
        self.v = torch.zeros(shape, dtype=dtype) if v is None else v
        dev = epochs.device
        self.exact = torch.zeros(num_slots, num_kv_heads, dtype=torch.bool, device=dev)
        self.exact_epoch = torch.zeros(num_slots, num_kv_heads, dtype=torch.int64, device=dev)
        self.epochs = epochs
        self.kv_dtype = kv_dtype
        self.wk = self.wv = None
        if rounds:
            self.wk = torch.zeros(num_slots, num_kv_heads, dtype=torch.float32, device=dev)
            self.wv = torch.zeros(num_slots, num_kv_heads, dtype=torch.float32, device=dev)

    @staticmethod
    def bytes_per_slot(*, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """K and V copies plus the exact flag and its epoch, per slot of one layer (an exact
        copy: no witnesses)."""
        return num_kv_heads * (2 * head_dim * dtype.itemsize + 1 + 8)

    def entry_bytes(self) -> int:
        """Bytes one exact entry stands for: its K and V rows at the copy's precision, the
        flag, the epoch and (when kept) the two f32 witnesses."""
        return 2 * self.k.shape[-1] * self.k.element_size() + 1 + 8 + (8 if self.wk is not None else 0)

    def flag_bytes(self) -> int:
        """Bytes of the flags, epochs and witnesses (what the gate allocates besides values)."""
        ts = [t for t in (self.exact, self.exact_epoch, self.wk, self.wv) if t is not None]
        return sum(t.numel() * t.element_size() for t in ts)

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2 + self.flag_bytes()

    def write_(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy the new tokens (call after the epoch bump); a rewritten slot is not exact."""
        self.k[slots] = k.to(self.k.dtype)
        self.v[slots] = v.to(self.v.dtype)
        self.exact[slots] = False

    def live(self, slots: torch.Tensor) -> torch.Tensor:
        """bool [*slots.shape, Hkv]: made exact, at the slot's current epoch."""
        return self.exact[slots] & (self.exact_epoch[slots] == self.epochs[slots].unsqueeze(-1))

    def finite(self, slots: torch.Tensor, head: int) -> torch.Tensor:
        """bool [n] (on the values' device): the copy of (slots [n], head) is finite on both
        sides; an entry whose copy is not finite can never be made exact."""
        s = slots.to(self.k.device)
        return (torch.isfinite(self.k[s, head]).all(-1) & torch.isfinite(self.v[s, head]).all(-1))

    def mark_(self, slots: torch.Tensor, heads: torch.Tensor | int, *,
              wk: torch.Tensor | None = None) -> None:
        """Make the (slot, KV head) entries exact from now on (until the slot's epoch moves);
        with witnesses, also record the rounding witness of each entry's K and V rows (wk:
        the K ones when the caller already computed them, ``rounding_witness`` of the same
        rows)."""
        dev = self.exact.device
        slots, heads = slots.to(dev), torch.as_tensor(heads, device=dev)
        self.exact[slots, heads] = True
        self.exact_epoch[slots, heads] = self.epochs[slots]
        if self.wk is not None:
            hs = slots.to(self.k.device)
            hh = heads.to(self.k.device).expand_as(hs)
            if wk is None:
                wk = rounding_witness(self.k[hs, hh], kv_dtype=self.kv_dtype)
            self.wk[slots, heads] = wk.to(dev)
            self.wv[slots, heads] = rounding_witness(self.v[hs, hh], kv_dtype=self.kv_dtype).to(dev)

    def witness(self, w: torch.Tensor | None, slots: torch.Tensor) -> torch.Tensor:
        """f32 [n, Hkv] witnesses of ``slots`` from ``w`` (``self.wk`` / ``self.wv``; zeros
        when the copy is exact)."""
        if w is None:
            return torch.zeros(slots.shape[0], self.exact.shape[1], dtype=torch.float32,
                               device=self.exact.device)
        return w[slots]

    def overlay(self, layer: int, q: torch.Tensor, slots: torch.Tensor, z, v, u, wv, *,
                sm_scale: float):
        """The reference decode's hook (``LayerKV.exact``): replace the terms of live entries
        of one sequence. q f32 [Hq, D]; slots int64 [N]; z, u, wv [Hq, N], v [Hq, N, D] as
        ``witcert.ref.attention._sequence_terms`` builds them. Live entries get the exact
        logit with radius ``sm ||q||_2 wk`` plus the arithmetic slack, the exact value and
        the value witness ``wv``. ``layer`` is the caller's (unused: one copy per layer)."""
        ok = self.live(slots.to(self.exact.device))
        if not bool(ok.any()):
            return z, v, u, wv
        Hq, Hkv = q.shape[0], ok.shape[1]
        kvh = torch.arange(Hq, device=ok.device) // (Hq // Hkv)
        m = ok[:, kvh].T.to(q.device)  # [Hq, N]
        s = slots.to(self.k.device)
        kx = self.k[s].to(device=q.device, dtype=torch.float32)[:, kvh.to(q.device)].transpose(0, 1)
        vx = self.v[s].to(device=q.device, dtype=torch.float32)[:, kvh.to(q.device)].transpose(0, 1)
        sd = slots.to(self.exact.device)
        wk = self.witness(self.wk, sd)[:, kvh].T.to(q.device)
        ze, ue = exact_logits_and_radii(q, kx, wk, sm_scale=sm_scale)
        z = torch.where(m, ze, z)
        v = torch.where(m[..., None], vx, v)
        wv = torch.where(m, self.witness(self.wv, sd)[:, kvh].T.to(q.device), wv)
        if u is not None:
            u = torch.where(m, ue, u)
        return z, v, u, wv
