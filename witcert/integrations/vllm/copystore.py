"""The gate's exact K/V copy for all layers, optionally bounded in memory.

With ``WITCERT_VLLM_GATE`` on, each layer keeps an ``gate.ExactCopy``: K and V in the
model dtype for every slot of vLLM's pool, ``2 * Hkv * D * itemsize`` bytes per slot and
layer (23,040 B per token over the 30 layers of SmolLM2 in bf16, plus 810 B of flags: more
than the witcert pages themselves). ``WITCERT_VLLM_GATE_COPY`` bounds it.

Layout. The fused C decode reads a live exact entry as ``k[slot]`` of a contiguous
``[num_slots, Hkv, D]`` tensor, so every layer's K and V keep that shape, but over an
anonymous private memory map: a page is resident only once written, and a released range
(``madvise(MADV_DONTNEED)``) reads back as zeros and costs nothing again. Huge pages are
turned off on the map so one write never makes 2 MiB resident.

Bound. Copies are held per *unit*: the smallest run of whole vLLM blocks whose rows fill
whole memory pages (one 128-token block for SmolLM2), the same units in every layer. With
a bound of ``B`` bytes at most ``B // unit_bytes`` units are held (``unit_bytes`` over all
layers, K and V). At every engine step (first layer's KV write) the units read by the
step's sequences (their block tables) are marked used; a unit written by the step gets a
copy if there is room, else the least recently used unit *not used by this step* is
evicted (its rows released in every layer, its ``have`` and exact flags cleared); if all
held units are in use the new rows get no copy. A slot without a copy reads NaN from
``ExactCopy.read``, so the repair never makes it exact: a head that needs it stays above
``tau`` and is counted ``unrepaired``. Nothing is ever read exact from a copy that is not
held. Unbounded (``all``, the default) every slot has a copy and none of this runs.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch

from witcert.integrations.vllm.gate import ExactCopy

FLAG_BYTES = 1 + 8  # per (slot, KV head, layer): exact flag (bool) and its epoch (int64)


@dataclass(frozen=True)
class CopyGeometry:
    """Sizes of the exact copy. budget_bytes: bound on the K/V rows (None: every slot)."""

    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    itemsize: int
    budget_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_blocks", "block_size", "num_kv_heads", "head_dim",
                     "itemsize"):
            if getattr(self, name) < 1:
                raise ValueError(f"CopyGeometry.{name} must be >= 1, got {getattr(self, name)}")
        if self.budget_bytes is not None and self.budget_bytes < 0:
            raise ValueError(f"CopyGeometry.budget_bytes must be >= 0, got {self.budget_bytes}")

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def row_bytes(self) -> int:
        """One side (K or V), one slot, one layer."""
        return self.num_kv_heads * self.head_dim * self.itemsize

    @property
    def unit_blocks(self) -> int:
        """Blocks per unit: the fewest whole blocks whose rows are whole memory pages."""
        b = self.block_size * self.row_bytes
        return mmap.PAGESIZE // math.gcd(b, mmap.PAGESIZE)

    @property
    def unit_slots(self) -> int:
        return self.unit_blocks * self.block_size

    @property
    def num_units(self) -> int:
        return -(-self.num_blocks // self.unit_blocks)

    @property
    def unit_bytes(self) -> int:
        """K and V rows of one unit over all layers."""
        return 2 * self.num_layers * self.unit_slots * self.row_bytes

    @property
    def bounded(self) -> bool:
        return self.budget_units < self.num_units

    @property
    def budget_units(self) -> int:
        if self.budget_bytes is None:
            return self.num_units
        return min(self.num_units, self.budget_bytes // self.unit_bytes)

    @property
    def capacity_tokens(self) -> int:
        """Slots that can hold a copy at once."""
        return min(self.num_slots, self.budget_units * self.unit_slots)

    @property
    def kv_bytes(self) -> int:
        """Most bytes of K/V rows resident at once (all layers)."""
        return 2 * self.num_layers * self.capacity_tokens * self.row_bytes

    @property
    def flag_bytes(self) -> int:
        return self.num_layers * self.num_slots * self.num_kv_heads * FLAG_BYTES

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.flag_bytes

    @property
    def full_bytes_per_token(self) -> int:
        """Bytes per token of an unbounded copy (K/V rows and flags, all layers)."""
        return self.num_layers * self.num_kv_heads * (2 * self.head_dim * self.itemsize
                                                      + FLAG_BYTES)


def _anonymous(nbytes: int) -> mmap.mmap:
    m = mmap.mmap(-1, max(nbytes, mmap.PAGESIZE), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        m.madvise(mmap.MADV_NOHUGEPAGE)
    return m


class CopyStore:
    """Every layer's ``ExactCopy`` and, when bounded, which units hold a copy.

    epochs: the worker's slot epochs (int64 [num_slots]); dtype: the model dtype.
    Call ``begin_step`` once per engine step before the layers write (first layer's
    ``do_kv_cache_update``), then ``layer(i).write_`` per layer.
    """

    def __init__(self, geom: CopyGeometry, *, dtype: torch.dtype, epochs: torch.Tensor) -> None:
        if dtype.itemsize != geom.itemsize:
            raise ValueError(f"dtype {dtype} does not match CopyGeometry.itemsize {geom.itemsize}")
        self.geom, self.dtype, self.epochs = geom, dtype, epochs
        g = geom
        self.have = torch.zeros(g.num_slots, dtype=torch.bool) if g.bounded else None
        self.covered = torch.zeros(g.num_units, dtype=torch.bool)
        self.last_use = torch.zeros(g.num_units, dtype=torch.int64)
        self.step = 0
        self.evicted_units = 0
        self.uncopied_tokens = 0  # (token) rows written without a copy (no room)
        self._layers: dict[int, ExactCopy] = {}
        self._maps: dict[int, tuple[mmap.mmap, mmap.mmap]] = {}

    def layer(self, index: int) -> ExactCopy:
        ex = self._layers.get(index)
        if ex is None:
            g = self.geom
            maps = (_anonymous(g.num_units * g.unit_slots * g.row_bytes),
                    _anonymous(g.num_units * g.unit_slots * g.row_bytes))
            k, v = (torch.frombuffer(m, dtype=self.dtype, count=g.num_slots * g.row_bytes
                                     // g.itemsize).view(g.num_slots, g.num_kv_heads, g.head_dim)
                    for m in maps)
            ex = ExactCopy(num_slots=g.num_slots, num_kv_heads=g.num_kv_heads,
                           head_dim=g.head_dim, dtype=self.dtype, epochs=self.epochs, k=k, v=v,
                           have=self.have)
            self._layers[index], self._maps[index] = ex, maps
        return ex

    @property
    def covered_tokens(self) -> int:
        if self.have is None:
            return self.geom.num_slots
        return int(self.have.sum())

    def begin_step(self, slots: torch.Tensor, *, block_table: torch.Tensor | None,
                   seq_lens: torch.Tensor | None) -> None:
        """The step's bookkeeping: units read by its sequences are used now; units of the
        written ``slots`` (int64 [T], no padding) get a copy if there is room.

        block_table: int [B, pages]; seq_lens: int [B] (None: no reads known)."""
        if self.have is None:
            return
        g = self.geom
        self.step += 1
        if block_table is not None and seq_lens is not None and block_table.numel():
            pages = (seq_lens.to(torch.int64) + g.block_size - 1) // g.block_size
            cols = torch.arange(block_table.shape[1], dtype=torch.int64)
            used = block_table.to(torch.int64)[cols[None, :] < pages[:, None]]
            self.last_use[used // g.unit_blocks] = self.step
        if not slots.numel():
            return
        units = torch.unique(slots // g.unit_slots)
        self.last_use[units] = self.step
        new = units[~self.covered[units]]
        room = g.budget_units - int(self.covered.sum())
        if new.numel() > room:
            self._evict(new.numel() - room)
            room = g.budget_units - int(self.covered.sum())
        take = new[:max(room, 0)]
        self.covered[take] = True
        held = self.covered[slots // g.unit_slots]
        self.have[slots] = held
        self.uncopied_tokens += int((~held).sum())

    def _evict(self, n: int) -> None:
        """Release up to n held units not used in this step, least recently used first."""
        cand = (self.covered & (self.last_use < self.step)).nonzero().flatten()
        if not cand.numel():
            return
        order = torch.argsort(self.last_use[cand], stable=True)
        g = self.geom
        for u in cand[order[:n]].tolist():
            lo = u * g.unit_slots
            hi = min(lo + g.unit_slots, g.num_slots)
            self.have[lo:hi] = False
            nbytes = (hi - lo) * g.row_bytes
            for li, ex in self._layers.items():
                ex.exact[lo:hi] = False
                for m in self._maps[li]:
                    m.madvise(mmap.MADV_DONTNEED, lo * g.row_bytes,
                              -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)
            self.covered[u] = False
            self.evicted_units += 1
