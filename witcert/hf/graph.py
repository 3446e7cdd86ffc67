"""Greedy decoding through transformers with a ``WitCertCache``, one CUDA graph per step.

``CapturedDecoder`` runs the prefill as usual (per-forward planning), switches the
cache to static decode (``WitCertCache.begin_static_decode_``) and then, per token:
host planning into preallocated device tensors (``static_step_``), the model's whole
one-token forward (embedding, every layer's write + certified decode attention +
certificate logging, LM head, argmax) replayed from a CUDA graph, and host bookkeeping
(``finish_static_step_``). Nothing in a step waits for the device.

The first step of each certificate configuration runs eagerly on a side stream (it
compiles the Triton kernels); the next one is captured and replayed, and every later one
is a replay. The configuration decides which kernels run (certificate on or off,
``radius``; the fixed risk allocation falls back to ``det`` past its horizon), so each
gets its own graph. With ``use_graph=False`` every step runs the same code eagerly
(CPU, or the reference for a replay).
"""

from __future__ import annotations

import inspect

import torch

from witcert.hf.generate import cache_kwarg


class CapturedDecoder:
    """Greedy decode steps of ``model`` over ``cache``, replayed from CUDA graphs.

    model: a transformers causal LM using the ``"witcert"`` attention (``model.eval()``).
    cache: its ``WitCertCache``, empty (``prefill``) or filled (``start``); no repair
        gate and no observer.
    capacity: most tokens (prompt included) any sequence will hold; sizes the static
        block table.
    use_graph: capture and replay CUDA graphs (needs the model on CUDA); False runs every
        step eagerly through the same static path. None: True on CUDA.

    After each ``step()``, ``logits`` (``[B, V]``, model dtype) holds that step's logits
    and ``next_tokens`` (int64 ``[B]``) its greedy tokens; both are overwritten by the
    next step. ``eager_steps``, ``captures`` and ``replays`` count what ran.
    """

    def __init__(self, model, cache, *, capacity: int, use_graph: bool | None = None):
        device = next(model.parameters()).device
        if use_graph is None:
            use_graph = device.type == "cuda"
        if use_graph and device.type != "cuda":
            raise ValueError(f"use_graph=True needs the model on a CUDA device, it is on {device}")
        if cache.pool.device != device:
            raise ValueError(f"the cache's pool is on {cache.pool.device}, the model on {device}")
        if capacity < 2:
            raise ValueError(f"capacity: {capacity} must be >= 2 (a prompt token and a new one)")
        self.model, self.cache, self.capacity = model, cache, capacity
        self.use_graph, self.device = use_graph, device
        params = inspect.signature(model.forward).parameters
        self._kw = {cache_kwarg(model): cache, "use_cache": True}
        self._keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._warm: set[tuple] = set()
        self._pool = None  # one CUDA graph memory pool shared by this decoder's graphs
        self._tok = self._pos = self.logits = self.next_tokens = None
        self.eager_steps = self.captures = self.replays = 0

    # ---- setup ---------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run the prompt (int64 ``[B, T]``, left-padded with ``attention_mask`` 1/0 ``[B, T]``
        or unpadded with None) through the model and the cache; returns the first greedy
        tokens int64 ``[B]`` (on the device) and starts static decode."""
        if self.cache.get_seq_length() != 0:
            raise ValueError("prefill: the cache is not empty (use start() after your own prefill)")
        T = input_ids.shape[1]
        if T >= self.capacity:
            raise ValueError(f"capacity: {self.capacity} tokens leave no room after a {T}-token prompt")
        if attention_mask is None:
            pos = torch.arange(T, device=input_ids.device).expand(input_ids.shape[0], T)
            real = torch.full((input_ids.shape[0],), T, dtype=torch.int64, device=input_ids.device)
        else:  # as transformers' generate: positions count real tokens only
            mask = attention_mask.to(torch.int64)
            pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
            real = mask.sum(-1)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos,
                         **self._kw, **self._keep)
        first = out.logits[:, -1].argmax(-1)
        self.start(first, real)
        return first

    def start(self, next_tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """Begin static decode on a cache the caller filled: ``next_tokens`` int64 ``[B]``
        are fed to the first step at RoPE ``positions`` int64 ``[B]`` (device tensors)."""
        B = next_tokens.shape[0]
        if positions.shape != (B,):
            raise ValueError(f"positions must be [B={B}], got {tuple(positions.shape)}")
        self.cache.begin_static_decode_(capacity=self.capacity)
        self._tok = next_tokens.reshape(B, 1).to(device=self.device, dtype=torch.int64).clone()
        self._pos = positions.reshape(B, 1).to(device=self.device, dtype=torch.int64).clone()
        self.next_tokens = torch.zeros(B, dtype=torch.int64, device=self.device)
        self.logits = None

    @property
    def positions(self) -> torch.Tensor:
        """RoPE positions int64 ``[B]`` of the tokens the next step feeds (a view)."""
        if self._pos is None:
            raise RuntimeError("positions: call prefill() or start() first")
        return self._pos[:, 0]

    # ---- one token -----------------------------------------------------------------------
    def _body(self) -> None:
        """The captured region: one forward of the static inputs into the static outputs."""
        out = self.model(input_ids=self._tok, position_ids=self._pos, **self._kw, **self._keep)
        logits = out.logits[:, -1]
        if self.logits is None or self.logits.shape != logits.shape or self.logits.dtype != logits.dtype:
            self.logits = torch.empty_like(logits)
        self.logits.copy_(logits)
        self.next_tokens.copy_(logits.argmax(-1))

    def _run_on_side_stream(self) -> None:
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._body()
        torch.cuda.current_stream(self.device).wait_stream(side)

    def _capture(self) -> torch.cuda.CUDAGraph:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._body()
        self.captures += 1
        return graph

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """Decode one token for every sequence; returns a copy of the greedy tokens int64 ``[B]``
        (device). No host-device synchronisation once the step's graph exists."""
        if self._tok is None:
            raise RuntimeError("step: call prefill() or start() first")
        self.cache.static_step_()
        cert = self.cache.static_cert
        key = (cert.enabled, cert.radius)
        if not self.use_graph:
            self._body()
            self.eager_steps += 1
        elif key in self._graphs:
            self._graphs[key].replay()
            self.replays += 1
        elif key in self._warm:
            self._graphs[key] = self._capture()
            self._graphs[key].replay()  # capturing records the work, replaying does it
            self.replays += 1
        else:  # first step of this configuration: compile and warm up outside a capture
            self._run_on_side_stream()
            self._warm.add(key)
            self.eager_steps += 1
        self.cache.finish_static_step_()
        self._tok.copy_(self.next_tokens[:, None])
        self._pos += 1
        return self.next_tokens.clone()

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                 max_new_tokens: int) -> torch.Tensor:
        """Prefill, then ``max_new_tokens - 1`` steps: the greedy tokens int64 ``[B, max_new_tokens]``
        on the device (the first from the prefill)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: {max_new_tokens} must be >= 1")
        toks = [self.prefill(input_ids, attention_mask)]
        for _ in range(max_new_tokens - 1):
            toks.append(self.step())
        return torch.stack(toks, dim=1)

    def close(self) -> None:
        """Drop the graphs and leave static decode (the cache stays usable)."""
        self._graphs.clear()
        self._warm.clear()
        self._pool = None
        if self.cache.static_active:
            self.cache.end_static_decode_()
        self._tok = self._pos = None
