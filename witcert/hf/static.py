"""Device-resident decode metadata for a fixed batch: the static half of ``WitCertCache``.

The dynamic planner (``WitCertCache._make_plan``) builds fresh slot, block-table and
sequence-length tensors on every forward, sized to the current lengths. A CUDA graph
replays fixed addresses and fixed shapes, so a captured decode step needs the opposite:
tensors allocated once, with a block table as wide as the capacity, and updated in
place before each step. ``StaticDecode`` holds them; ``WitCertCache.static_step_``
fills them from the host (the allocator stays host-side Python, its results go to the
device with non-blocking pinned copies and a scatter: no host-device sync).
"""

from __future__ import annotations

import torch

from witcert.runtime.slots import to_device

_ORDER = "begin_static_decode_, then static_step_ / forward / finish_static_step_ per token"


class StaticDecode:
    """Preallocated per-step decode tensors of ``B`` sequences with ``capacity`` tokens each.

    pool: the ``PagedPool``; seq_ids: the cache's sequence ids (fixed batch order).
    capacity: most tokens any sequence may hold (block-table width ``ceil(capacity / P)``).
    num_q_heads: ``Hq``; with_certs: keep a float64 ``[L, B, Hq]`` certificate buffer.
    kv_dtype: dtype of the model's K/V; with_backup: stage each step's exact K/V
        (``[L, B, Hkv, D]``) on the device so the host backup is written after the step.

    Tensors (on ``pool.device``): ``slots`` int64 [B], ``block_table`` int32 [B, pages],
    ``seq_lens`` int32 [B], ``delta_loc`` f32 [B], ``certs`` float64 [L, B, Hq] or None,
    ``k_stage``/``v_stage`` or None.
    """

    def __init__(self, *, pool, seq_ids: list[int], capacity: int, num_q_heads: int,
                 with_certs: bool, kv_dtype: torch.dtype, with_backup: bool):
        alloc = pool.allocator
        B, P, dev = len(seq_ids), pool.page_size, pool.device
        if capacity < 1:
            raise ValueError(f"capacity: {capacity} must be >= 1 token per sequence")
        longest = max(alloc.seq_len(s) for s in seq_ids)
        if longest >= capacity:
            raise ValueError(f"capacity: {capacity} tokens per sequence leaves no room to decode "
                             f"(a sequence already holds {longest}); raise it")
        self.pool, self.seq_ids, self.capacity = pool, list(seq_ids), capacity
        self.pages = -(-capacity // P)
        self.block_table = torch.zeros(B, self.pages, dtype=torch.int32, device=dev)
        now = alloc.block_table(self.seq_ids)
        self.block_table[:, :now.shape[1]].copy_(now)
        self.seq_lens = alloc.seq_lens(self.seq_ids).clone()
        self.slots = torch.zeros(B, dtype=torch.int64, device=dev)
        self.slots_host = torch.zeros(B, dtype=torch.int64)
        self.delta_loc = torch.zeros(B, dtype=torch.float32, device=dev)
        self._delta_value: float | None = None
        self._rows = torch.arange(B, dtype=torch.int64, device=dev) * self.pages
        L = pool.num_layers
        self.certs = torch.zeros(L, B, num_q_heads, dtype=torch.float64, device=dev) \
            if with_certs else None
        shape = (L, B, pool.num_kv_heads, pool.head_dim)
        self.k_stage = torch.zeros(shape, dtype=kv_dtype, device=dev) if with_backup else None
        self.v_stage = torch.zeros(shape, dtype=kv_dtype, device=dev) if with_backup else None
        self.prepared = False

    @property
    def batch_size(self) -> int:
        return len(self.seq_ids)

    def stage_(self, *, slots: torch.Tensor, slots_host: torch.Tensor, delta: float) -> None:
        """Point the tensors at the next token of every sequence (already allocated).

        slots: int64 [B] on the device (the allocator's copy); slots_host: the same on the
        CPU; delta: this step's per-(layer, head) failure budget. Device work only: two
        small pinned host-to-device copies, a copy and a scatter into the block table.
        """
        alloc, P = self.pool.allocator, self.pool.page_size
        lens = [alloc.seq_len(s) for s in self.seq_ids]
        cols = [(n - 1) // P for n in lens]
        meta = to_device(torch.tensor([lens, cols], dtype=torch.int64), self.pool.device)
        self.slots.copy_(slots)
        self.slots_host.copy_(slots_host)
        self.seq_lens.copy_(meta[0])
        # the page of the new token, written at its column (idempotent when the page is old)
        self.block_table.view(-1).scatter_(0, self._rows + meta[1], (slots // P).to(torch.int32))
        if delta != self._delta_value:
            self.delta_loc.copy_(to_device(torch.full((self.batch_size,), delta, dtype=torch.float32),
                                           self.pool.device))
            self._delta_value = delta

    def backup_after_step_(self) -> None:
        """Copy the staged exact K/V of the step just run into the pool's host backup."""
        if self.k_stage is None:
            return
        slots_host = self.slots_host.clone()  # a CUDA backup keeps it until its copies land
        for layer in range(self.pool.num_layers):
            self.pool.backup_write_(layer, self.k_stage[layer], self.v_stage[layer],
                                    slots_host=slots_host)


class StaticDecodeMixin:
    """Static decode mode of ``WitCertCache`` (see the module docstring).

    Per token: ``static_step_()`` (host: allocate the slots, risk budget, in-place updates
    of the device tensors), one forward of one token per sequence (device work only, so
    it can be a CUDA-graph replay), ``finish_static_step_()`` (host bookkeeping). Also
    ``store_prompt_kv_``: a prompt's K/V stored without a forward (benchmark fills).
    """

    @property
    def static_active(self) -> bool:
        """True between ``begin_static_decode_`` and ``end_static_decode_``."""
        return self._static is not None

    def begin_static_decode_(self, *, capacity: int) -> None:
        """Switch to static decode after the prefill; ``capacity``: most tokens (prompt
        included) any sequence will hold. Refuses the repair gate and observers (both do
        host work between layers)."""
        if self._static is not None:
            raise ValueError("begin_static_decode_: already in static decode mode")
        if self._seq_ids is None or self._seen == 0:
            raise ValueError("begin_static_decode_: run the prefill first (its forward fixes the batch)")
        if self.gate is not None:
            raise ValueError("static decode does not support the repair gate (it repairs on the host "
                             "between layers): build the cache with repair=None")
        if self.observer is not None:
            raise ValueError("static decode does not support an observer (it runs on the host per "
                             "layer): build the cache with observer=None")
        from witcert.hf.cache import _Plan

        backup = self.pool.backup
        st = StaticDecode(pool=self.pool, seq_ids=self._seq_ids, capacity=capacity,
                          num_q_heads=self.num_q_heads, with_certs=self.cert_log is not None,
                          kv_dtype=backup.k[0].dtype if backup is not None else torch.float16,
                          with_backup=backup is not None)
        B = st.batch_size
        st.plan = _Plan(kind="decode", B=B, T=1, counts=[1] * B, slots=st.slots,
                        slots_host=st.slots_host, block_table=st.block_table, seq_lens=st.seq_lens,
                        delta_loc=st.delta_loc, cert=self.cert)
        self._static, self._plan = st, None

    def _require_static(self, what: str) -> StaticDecode:
        if self._static is None:
            raise RuntimeError(f"{what}: not in static decode mode ({_ORDER})")
        return self._static

    def static_step_(self) -> None:
        """Prepare the next one-token forward: slots, block table, lengths and risk budget
        into the static tensors (no host sync)."""
        st = self._require_static("static_step_")
        if st.prepared:
            raise RuntimeError(f"static_step_: the previous step was not finished ({_ORDER})")
        alloc = self.pool.allocator
        longest = max(alloc.seq_len(s) for s in st.seq_ids) + 1
        if longest > st.capacity:
            raise ValueError(f"capacity: the next token makes {longest} tokens, more than the static "
                             f"capacity {st.capacity}; begin static decode with a larger capacity")
        self.pool.flush_backup_(wait=False)
        slots, slots_host = alloc.allocate_flat(st.seq_ids, [1] * st.batch_size)
        st.plan.step, st.plan.cert, delta = self._step_budget()
        st.stage_(slots=slots, slots_host=slots_host, delta=delta)
        st.prepared = True

    @property
    def static_cert(self):
        """The ``CertConfig`` of the prepared static step (decides the kernels it launches)."""
        return self._require_static("static_cert").plan.cert

    def _static_plan(self, layer_idx: int, query: torch.Tensor, mask2d: torch.Tensor | None):
        st = self._static
        if not st.prepared:
            raise RuntimeError(f"static decode mode: call static_step_() before each forward ({_ORDER})")
        if query.shape[2] != 1 or query.shape[0] != st.batch_size:
            raise ValueError(f"static decode takes one token for each of the {st.batch_size} sequences, "
                             f"got a query of [B, Hq, T, D] = {tuple(query.shape)}; call "
                             "end_static_decode_() for other forwards")
        if mask2d is not None and layer_idx == 0:
            self._decode_pad += (~mask2d[:, -1]).sum()
        return st.plan

    def finish_static_step_(self) -> None:
        """After the step's forward (eager or replayed): count the step in the ``CertLog``,
        write the exact K/V to the host backup (when there is one)."""
        st = self._require_static("finish_static_step_")
        if not st.prepared:
            raise RuntimeError(f"finish_static_step_: no step was prepared ({_ORDER})")
        st.prepared = False
        self._seen += 1
        if st.certs is not None and st.plan.cert.enabled:
            self.cert_log.count_step_(st.certs)
        st.backup_after_step_()

    def end_static_decode_(self) -> None:
        """Back to per-forward planning (the allocator already holds every token)."""
        st = self._require_static("end_static_decode_")
        if st.prepared:
            raise RuntimeError("end_static_decode_: a prepared step was not finished")
        self._static, self._plan = None, None

    def store_prompt_kv_(self, kv, *, batch_size: int, prompt_len: int) -> None:
        """Fill an empty cache with a prompt's K/V without running the model.

        kv: ``layer -> (key, value)``, each ``[B, Hkv, T, D]`` post-RoPE on the pool's device
        (called once per layer, so only one layer's K/V need exist at a time). The cache then
        holds ``prompt_len`` tokens per sequence exactly as a prefill would have stored
        them. For benchmarks whose decode cost does not depend on the values (random K/V
        in place of a prefill too large to run).
        """
        if self._seen:
            raise ValueError("store_prompt_kv_: the cache must be empty")
        if batch_size < 1 or prompt_len < 1:
            raise ValueError(f"batch_size={batch_size}, prompt_len={prompt_len} must be >= 1")
        plan = self._make_plan(batch_size, prompt_len, None)
        want = (batch_size, self.pool.num_kv_heads, prompt_len, self.pool.head_dim)
        for layer in range(self.pool.num_layers):
            key, value = kv(layer)
            if tuple(key.shape) != want or tuple(value.shape) != want:
                raise ValueError(f"store_prompt_kv_: layer {layer} gave key/value "
                                 f"{tuple(key.shape)} / {tuple(value.shape)}, expected {want}")
            self._write(layer, key, value, plan)
