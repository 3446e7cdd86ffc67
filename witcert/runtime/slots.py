"""Paged slot allocation for the KV pool: pages per sequence, slot epochs, block tables.

All bookkeeping is host-side Python (the "plan" half of plan/run): deciding where tokens go
never waits on the device. Only the results (slot lists, block tables, sequence lengths,
epochs) live on the device. Slot ``s`` of page ``p`` is ``p * P + s % P`` (DESIGN.md,
Pool layout), the same formula the kernels use with ``block_table``.

Epochs (docs/MATH.md §6): the dither counter includes the slot's epoch. Freeing a sequence bumps
the epoch of every slot of its pages, so a reused slot never reuses a dither.

Position-keyed dither (``dither_key="position"``): the counter's first word is the token's
position in its sequence (``positions[slot]``) and ``epochs[slot]`` holds the sequence's
32-bit nonce (``set_nonce``; a fresh secret one by default), so where a token is placed
does not change its dither: a request with a given nonce gets the same dither anywhere.
"""

from __future__ import annotations

import itertools
import secrets

import torch

_MAX_EPOCH = 2**32 - 1  # counter word c3 (DESIGN.md, Integers and Philox)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host-made metadata to ``device`` without a host-device sync: a plain ``.to(cuda)`` of
    pageable memory synchronises the stream; a pinned, non-blocking copy does not (torch's
    pinned allocator keeps the source alive until the copy is done)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class CapacityError(RuntimeError):
    """The pool has too few free pages for a request. Raised before anything is written."""


class SlotAllocator:
    """Pages of ``page_size`` slots handed out to sequences, smallest free page first.

    num_pages: ``N`` pages; ``num_slots = N * P``.
    page_size: ``P`` tokens per page.
    device: where ``epochs`` and the returned tensors live.
    """

    def __init__(self, *, num_pages: int, page_size: int, device: torch.device | str = "cpu",
                 dither_key: str = "slot"):
        if num_pages < 1:
            raise ValueError(f"num_pages: {num_pages} must be >= 1")
        if page_size < 1:
            raise ValueError(f"page_size: {page_size} must be >= 1")
        if num_pages * page_size >= 2**32:
            raise ValueError(f"num_pages * page_size = {num_pages * page_size} slots must be < 2^32 "
                             "(the slot is one 32-bit Philox counter word)")
        self.num_pages = num_pages
        self.page_size = page_size
        self.device = torch.device(device)
        if dither_key not in ("slot", "position"):
            raise ValueError(f"dither_key: {dither_key!r} must be 'slot' or 'position'")
        self.dither_key = dither_key
        self.epochs = torch.zeros(num_pages * page_size, dtype=torch.int64, device=self.device)
        # position-keyed dither: the token's position per slot (counter word 0), nonces per seq
        self.positions = (torch.zeros(num_pages * page_size, dtype=torch.int64, device=self.device)
                          if dither_key == "position" else None)
        self._nonce: dict[int, int] = {}
        self._host_epoch_max = 0
        self._free: list[int] = list(range(num_pages - 1, -1, -1))  # pop() -> smallest page
        self._pages: dict[int, list[int]] = {}
        self._lens: dict[int, int] = {}
        self._next_id = itertools.count()

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def new_seq_id(self) -> int:
        """A sequence id never handed out by this allocator before (ids may also be chosen freely)."""
        while True:
            sid = next(self._next_id)
            if sid not in self._pages:
                return sid

    def set_nonce(self, seq_id: int, nonce: int) -> None:
        """The 32-bit nonce of ``seq_id`` under the position-keyed dither (before its first
        allocation). Identical requests given the same nonce get the same dither."""
        if self.dither_key != "position":
            raise ValueError("set_nonce: the pool uses the slot-keyed dither (dither_key='slot')")
        if not 0 <= int(nonce) < 2**32:
            raise ValueError(f"nonce: {nonce} must be a 32-bit unsigned integer")
        if self._lens.get(seq_id, 0):
            raise ValueError(f"set_nonce: sequence {seq_id} already holds tokens")
        self._nonce[seq_id] = int(nonce)

    def seq_len(self, seq_id: int) -> int:
        """Tokens allocated so far to ``seq_id`` (0 for an unknown sequence)."""
        return self._lens.get(seq_id, 0)

    def _pages_needed(self, seq_id: int, n_tokens: int) -> int:
        have = len(self._pages.get(seq_id, ()))
        total = -(-(self.seq_len(seq_id) + n_tokens) // self.page_size)
        return max(0, total - have)

    def _allocate_host(self, seq_ids: list[int], n_tokens: list[int]) -> list[torch.Tensor]:
        if len(seq_ids) != len(n_tokens):
            raise ValueError(f"{len(seq_ids)} seq_ids but {len(n_tokens)} token counts")
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"duplicate seq_ids in {seq_ids}")
        if any(n < 0 for n in n_tokens):
            raise ValueError(f"negative token count in {n_tokens}")
        need = sum(self._pages_needed(s, n) for s, n in zip(seq_ids, n_tokens))
        if need > len(self._free):
            raise CapacityError(
                f"KV pool full: {need} more pages of {self.page_size} tokens needed for "
                f"{sum(n_tokens)} tokens, {len(self._free)} of {self.num_pages} free "
                f"(capacity {self.num_slots} tokens per layer); raise CacheConfig.num_pages "
                "or free finished sequences")
        out, keyed = [], []
        for sid, n in zip(seq_ids, n_tokens):
            pages = self._pages.setdefault(sid, [])
            for _ in range(self._pages_needed(sid, n)):
                pages.append(self._free.pop())
            start = self._lens.get(sid, 0)
            self._lens[sid] = start + n
            pos = torch.arange(start, start + n, dtype=torch.int64)
            table = torch.tensor(pages, dtype=torch.int64)
            out.append(table[pos // self.page_size] * self.page_size + pos % self.page_size)
            if self.positions is not None:
                if pos.numel() and int(pos[-1]) >= 2**32:
                    raise ValueError("position-keyed dither: a position reached 2^32")
                nonce = self._nonce.setdefault(sid, secrets.randbits(32))
                keyed.append((out[-1], pos, torch.full_like(pos, nonce)))
        if keyed:  # counter words of the new tokens, before anything is written to them
            sl, ps, nc = (torch.cat(x) for x in zip(*keyed))
            sl = to_device(sl, self.device)
            self.positions[sl] = to_device(ps, self.device)
            self.epochs[sl] = to_device(nc, self.device)
        return out

    def allocate_many(self, seq_ids: list[int], n_tokens: list[int]) -> list[torch.Tensor]:
        """Slots for ``n_tokens[i]`` more tokens of each ``seq_ids[i]`` (all or nothing).

        Returns one int64 tensor ``[n_tokens[i]]`` of slots per sequence, in token order,
        on ``device``. Raises ``CapacityError`` before changing any state when the free
        pages do not cover the whole request.
        """
        return [to_device(t, self.device) for t in self._allocate_host(seq_ids, n_tokens)]

    def allocate_flat(self, seq_ids: list[int], n_tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Like ``allocate_many`` but concatenated (sequence-major, token order):
        ``(slots int64 [sum n] on device, the same on the CPU)`` with one host-to-device copy."""
        host = self._allocate_host(seq_ids, n_tokens)
        flat = torch.cat(host) if host else torch.zeros(0, dtype=torch.int64)
        return to_device(flat, self.device), flat

    def allocate(self, seq_id: int, n_tokens: int) -> torch.Tensor:
        """Slots (int64 ``[n_tokens]``, token order) for ``n_tokens`` more tokens of ``seq_id``."""
        return self.allocate_many([seq_id], [n_tokens])[0]

    def free(self, seq_id: int) -> None:
        """Return ``seq_id``'s pages to the pool and bump the epoch of all their slots."""
        pages = self._pages.pop(seq_id, None)
        self._lens.pop(seq_id, None)
        self._nonce.pop(seq_id, None)
        if not pages or self.dither_key == "position":
            if pages:  # the next owner's positions and nonce rekey these slots
                self._free.extend(sorted(pages, reverse=True))
                self._free.sort(reverse=True)
            return
        if self._host_epoch_max >= _MAX_EPOCH:
            raise OverflowError("slot epoch would exceed 2^32 - 1 (the Philox counter word c3)")
        # Host-side upper bound on every epoch: one bump per free at most.
        self._host_epoch_max += 1
        idx = torch.tensor(pages, dtype=torch.int64)
        slots = (idx[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)
        slots = to_device(slots, self.device)
        self.epochs.index_add_(0, slots, torch.ones_like(slots))
        self._free.extend(sorted(pages, reverse=True))
        self._free.sort(reverse=True)

    def slots(self, seq_id: int) -> torch.Tensor:
        """All slots of ``seq_id`` in token order, int64 ``[seq_len]`` on ``device``."""
        n = self.seq_len(seq_id)
        table = torch.tensor(self._pages.get(seq_id, []), dtype=torch.int64)
        pos = torch.arange(n, dtype=torch.int64)
        return to_device(table[pos // self.page_size] * self.page_size + pos % self.page_size, self.device)

    def block_table(self, seq_ids: list[int]) -> torch.Tensor:
        """Page table, int32 ``[B, max_pages]`` on ``device``; unused entries are 0 (never read:
        every reader bounds its loop by ``seq_lens``)."""
        rows = [self._pages.get(s, []) for s in seq_ids]
        width = max([1] + [len(r) for r in rows])
        table = torch.zeros(len(rows), width, dtype=torch.int32)
        for b, r in enumerate(rows):
            if r:
                table[b, :len(r)] = torch.tensor(r, dtype=torch.int32)
        return to_device(table, self.device)

    def seq_lens(self, seq_ids: list[int]) -> torch.Tensor:
        """Tokens per sequence, int32 ``[B]`` on ``device``."""
        return to_device(torch.tensor([self.seq_len(s) for s in seq_ids], dtype=torch.int32), self.device)
