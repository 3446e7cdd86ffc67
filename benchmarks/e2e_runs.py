"""The measured methods of bench_e2e_gpu.py, one (model, batch, context) cell at a time.

Baselines (transformers' own sdpa attention): ``sdpa-dynamic`` (DynamicCache, eager),
``sdpa-static`` (StaticCache, eager), ``sdpa-static-compiled`` (StaticCache under
``torch.compile(mode="reduce-overhead")``), ``sdpa-dynamic-compiled`` (reported as not
supported while transformers marks DynamicCache not compileable). witcert: one filled
``WitCertCache`` serves ``witcert-graph`` (``CapturedDecoder``: each decode step a
CUDA-graph replay; eager static steps without CUDA), ``witcert-graph-nocert`` (the same,
certificates off), ``witcert-eager`` and ``witcert-eager-nocert`` (per-forward planning,
as ``model.generate`` runs it). Each method decodes ``warmup`` untimed steps, then
``steps`` timed ones, greedily. A prompt of at most ``prefill_max_tokens`` (batch x
context) is prefilled for real (time to first token); a larger one would not fit its
activations next to the KV cache in one forward, so the cache is filled with random K/V
of the same shape instead (the decode cost does not depend on the values).
"""

from __future__ import annotations

import inspect
import time
import traceback
from dataclasses import dataclass, field

import torch

from e2e_models import Arch, cleanup, peak_gib, pool_bytes, reset_peak, time_steps, timed

HF_METHODS = ("sdpa-dynamic", "sdpa-dynamic-compiled", "sdpa-static", "sdpa-static-compiled")
WC_METHODS = ("witcert-graph", "witcert-graph-nocert", "witcert-eager", "witcert-eager-nocert")
METHODS = HF_METHODS + WC_METHODS
CERT_HORIZON = 4096  # fixed risk allocation over more steps than any run decodes


@dataclass(frozen=True)
class Cell:
    arch: Arch
    batch: int
    context: int
    methods: tuple[str, ...] = METHODS
    tag: str = ""


@dataclass
class RunCtx:
    """What every method of every cell shares."""

    model: object
    arch: Arch
    device: torch.device
    dtype: torch.dtype
    steps: int
    warmup: int
    prefill_max_tokens: int
    seed: int
    acct: dict                      # witcert_pool_accounting of this arch
    hooks: object                   # .gate(cell, method, need_bytes=, prefill=) -> reason | None; .done(result)
    gen: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.gen = torch.Generator(device=self.device).manual_seed(self.seed)
        params = inspect.signature(self.model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.keep = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

    @property
    def extra(self) -> int:
        """Tokens decoded on top of the context by the four methods sharing one cache."""
        return 4 * (self.warmup + 2 + self.steps) + 16

    def real_prefill(self, cell: Cell) -> bool:
        return cell.batch * cell.context <= self.prefill_max_tokens

    def rand_kv(self, batch: int, tokens: int):
        a = self.arch
        shape = (batch, a.kv_heads, tokens, a.head_dim)

        def kv(layer: int):
            return (torch.randn(shape, generator=self.gen, device=self.device, dtype=self.dtype),
                    torch.randn(shape, generator=self.gen, device=self.device, dtype=self.dtype))
        return kv

    def rand_tokens(self, batch: int, tokens: int, *, gen: torch.Generator | None = None) -> torch.Tensor:
        return torch.randint(0, self.arch.vocab, (batch, tokens), generator=gen or self.gen,
                             device=self.device)

    def prompt(self, cell: Cell) -> torch.Tensor:
        """The cell's prompt, int64 [B, context]: the same tokens for every method."""
        gen = torch.Generator(device=self.device).manual_seed(
            self.seed * 1_000_003 + cell.batch * 1_048_583 + cell.context)
        return self.rand_tokens(cell.batch, cell.context, gen=gen)


class Feed:
    """Greedy decode inputs: ``tok`` int64 [B, 1], ``pos`` int64 [B, 1]."""

    def __init__(self, tok: torch.Tensor, pos: int | torch.Tensor):
        self.tok = tok.reshape(-1, 1)
        self.pos = pos.reshape(-1, 1) if isinstance(pos, torch.Tensor) else torch.full_like(self.tok, pos)

    def stepper(self, rc: RunCtx, fn, cache):
        kw = {rc.cache_kw: cache, "use_cache": True}

        def step():
            out = fn(input_ids=self.tok, position_ids=self.pos, **kw)
            self.tok = out.logits[:, -1].argmax(-1, keepdim=True)
            self.pos = self.pos + 1
        return step


def attempt(rc: RunCtx, cell: Cell, method: str, *, need_bytes: int, prefill: bool, body):
    """Gate (time budget, memory), run ``body() -> dict``, report; None unless it ran OK."""
    base = dict(arch=cell.arch.name, batch=cell.batch, context=cell.context, method=method, tag=cell.tag)
    reason = rc.hooks.gate(cell, method, need_bytes=need_bytes, prefill=prefill)
    if reason:
        rc.hooks.done({**base, "status": "skipped", "reason": reason})
        return None
    t0 = time.perf_counter()
    try:
        res = {**base, "status": "ok", **body()}
    except Exception as exc:  # reported per cell; the benchmark goes on
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        res = {**base, "status": "failed", "reason": f"{type(exc).__name__}: {first}"}
        traceback.print_exc(limit=4)
        cleanup()
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    rc.hooks.done(res)
    return res if res["status"] == "ok" else None


def _prefill(rc: RunCtx, cache, cell: Cell) -> dict:
    """One-forward prefill of random prompt tokens: first tokens, time to first token, peak."""
    ids = rc.prompt(cell)
    pos = torch.arange(cell.context, device=rc.device).expand(cell.batch, -1)
    reset_peak(rc.device)
    with torch.no_grad():
        tok, secs = timed(lambda: rc.model(input_ids=ids, position_ids=pos, use_cache=True,
                                           **{rc.cache_kw: cache}, **rc.keep).logits[:, -1].argmax(-1),
                          rc.device)
    return dict(tok=tok, ttft_s=round(secs, 4), prefill="measured", peak_prefill_gib=peak_gib(rc.device))


def _fill(rc: RunCtx, cell: Cell, store) -> dict:
    """Random K/V instead of a prefill (``store(kv_fn)``); first tokens random."""
    store(rc.rand_kv(cell.batch, cell.context))
    why = f"batch x context > {rc.prefill_max_tokens} tokens" if not rc.real_prefill(cell) \
        else "no sdpa-dynamic prefill to copy"
    return dict(tok=rc.rand_tokens(cell.batch, 1)[:, 0], ttft_s=None, prefill=f"random K/V ({why})",
                peak_prefill_gib=None)


def _fill_hf(cache, kv, layers: int) -> None:
    for i in range(layers):
        cache.update(*kv(i), i)


def _decode(rc: RunCtx, cell: Cell, step, warmup: int) -> dict:
    with torch.no_grad():
        for _ in range(warmup):
            step()
        reset_peak(rc.device)
        t = time_steps(step, rc.steps, rc.device)
    t["tokens_per_s"] = cell.batch * 1e3 / t["ms_per_step"]
    t["peak_decode_gib"] = peak_gib(rc.device)
    t["steps"] = rc.steps
    return t


def _prefill_fields(p: dict) -> dict:
    return {k: p[k] for k in ("ttft_s", "prefill", "peak_prefill_gib")}


# ---- transformers baselines ----------------------------------------------------------------
def run_hf(rc: RunCtx, cell: Cell, *, compiled: bool) -> None:
    """The eager baselines (``compiled=False``) or the compiled ones: compilation takes
    minutes, so the benchmark runs them last in a cell, after witcert."""
    wanted = [m for m in HF_METHODS if m in cell.methods and m.endswith("compiled") == compiled]
    if not wanted:
        return
    rc.model.set_attn_implementation("sdpa")
    held: dict = {}  # the DynamicCache and its prefill, then the StaticCache
    if "sdpa-dynamic" in wanted:
        _hf_dynamic(rc, cell, held)
    if "sdpa-dynamic-compiled" in wanted:
        _skip(rc, cell, "sdpa-dynamic-compiled", _dynamic_compile_why_not(rc))
    for method in [m for m in ("sdpa-static", "sdpa-static-compiled") if m in wanted]:
        if method.endswith("compiled") and rc.device.type != "cuda":
            _skip(rc, cell, method, "needs CUDA (reduce-overhead mode records CUDA graphs)")
        elif not _hf_static(rc, cell, held, compiled=method.endswith("compiled")):
            held.pop("static", None)
    held.clear()
    cleanup()


def _skip(rc: RunCtx, cell: Cell, method: str, reason: str) -> None:
    rc.hooks.done(dict(arch=cell.arch.name, batch=cell.batch, context=cell.context, method=method,
                       tag=cell.tag, status="skipped", reason=reason))


def _dynamic_compile_why_not(rc: RunCtx) -> str:
    from transformers import DynamicCache

    if not getattr(DynamicCache, "is_compileable", False):
        return "not supported by transformers: DynamicCache.is_compileable is False"
    if rc.device.type != "cuda":
        return "needs CUDA (reduce-overhead mode records CUDA graphs)"
    return "not attempted: its growing shapes would re-record a CUDA graph every step"


def _hf_dynamic(rc: RunCtx, cell: Cell, held: dict) -> None:
    from transformers import DynamicCache

    a, B, N = rc.arch, cell.batch, cell.context
    kv_ctx = B * N * a.fp16_bytes_per_token
    layer_kv = kv_ctx // a.layers
    fill_temp = a.prefill_activation_bytes(B, N) if rc.real_prefill(cell) else 2 * layer_kv

    def body():
        cache = DynamicCache(config=rc.model.config)
        if rc.real_prefill(cell):
            p = _prefill(rc, cache, cell)
        else:
            p = _fill(rc, cell, lambda kv: _fill_hf(cache, kv, a.layers))
        held["dyn"], held["prefill"] = cache, p
        step = Feed(p["tok"], N).stepper(rc, rc.model, cache)
        return dict(_decode(rc, cell, step, rc.warmup), kv_bytes=kv_ctx, **_prefill_fields(p))
    # each decode step concatenates one more token onto a copy of every layer's K/V
    attempt(rc, cell, "sdpa-dynamic", need_bytes=kv_ctx + 2 * layer_kv + fill_temp, prefill=True,
            body=body)


def _hf_static(rc: RunCtx, cell: Cell, held: dict, *, compiled: bool) -> bool:
    """sdpa over a StaticCache holding the sdpa-dynamic prompt's K/V (copied) or random K/V."""
    from transformers import StaticCache

    a, B, N = rc.arch, cell.batch, cell.context
    max_len = N + rc.extra
    kv_ctx, kv_static = B * N * a.fp16_bytes_per_token, B * max_len * a.fp16_bytes_per_token
    # eager sdpa with the StaticCache mask repeats K/V to every query head, one layer at a time
    repeat_temp = 2 * B * max_len * a.heads * a.head_dim * 2
    first = "static" not in held
    fill = 0 if "dyn" in held else 2 * kv_ctx // a.layers
    need = (kv_static + fill if first else 0) + repeat_temp * (2 if compiled else 1)

    def body():
        if "static" not in held:
            cache = StaticCache(config=rc.model.config, max_cache_len=max_len)
            dyn = held.pop("dyn", None)
            if dyn is not None:  # the same prompt's K/V, copied from the DynamicCache
                for i, layer in enumerate(dyn.layers):
                    cache.update(layer.keys[:, :, :N], layer.values[:, :, :N], i)
                p = dict(held["prefill"])
                p["prefill"] += " (sdpa-dynamic's prefill, copied)"
                del dyn, layer
                cleanup()
            else:
                p = _fill(rc, cell, lambda kv: _fill_hf(cache, kv, a.layers))
            held.update(static=cache, static_prefill=p, feed=Feed(p["tok"], N))
        cache, feed = held["static"], held["feed"]
        fields = dict(kv_bytes=kv_ctx, kv_bytes_allocated=kv_static, **_prefill_fields(held["static_prefill"]))
        if compiled:
            return dict(_decode_compiled(rc, cell, feed, cache), **fields)
        return dict(_decode(rc, cell, feed.stepper(rc, rc.model, cache), rc.warmup), **fields)
    method = "sdpa-static-compiled" if compiled else "sdpa-static"
    return attempt(rc, cell, method, need_bytes=need, prefill=first, body=body) is not None


def _decode_compiled(rc: RunCtx, cell: Cell, feed: Feed, cache) -> dict:
    compiled = torch.compile(rc.model.forward, mode="reduce-overhead", fullgraph=True, dynamic=False)

    def fn(**kw):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(**kw)
    step = feed.stepper(rc, fn, cache)
    try:
        with torch.no_grad():
            _, compile_s = timed(step, rc.device)  # trace + compile + first run
        t = _decode(rc, cell, step, max(rc.warmup, 2))  # then CUDA-graph warm-up and recording
        t["compile_s"] = round(compile_s, 2)
        return t
    finally:
        del compiled, fn, step
        torch._dynamo.reset()
        cleanup()


# ---- witcert -------------------------------------------------------------------------------
def run_witcert(rc: RunCtx, cell: Cell) -> None:
    import witcert.hf
    from witcert.config import CacheConfig, CertConfig, QuantConfig
    from witcert.hf.cache import WitCertCache

    wanted = [m for m in WC_METHODS if m in cell.methods]
    if not wanted:
        return
    witcert.hf.register()
    rc.model.set_attn_implementation("witcert")
    a, B, N = rc.arch, cell.batch, cell.context
    P = rc.acct["page_size"]
    pages = B * -(-(N + rc.extra) // P)
    kv_pool = pool_bytes(rc.acct, pages=pages)
    kv_ctx = B * -(-N // P) * P * rc.acct["bytes_per_slot"]
    real = rc.real_prefill(cell)
    # prefill: activations, plus the transposed K/V copies and checks of the writes
    fill_temp = (a.prefill_activation_bytes(B, N) + 6 * B * N * a.kv_heads * a.head_dim * 2) if real \
        else B * N * a.fp16_bytes_per_token // a.layers
    partials = 2 * B * a.heads * 256 * (a.head_dim + 8) * 4  # split-KV partials of one layer
    held: dict = {}

    def prepare():
        cache = WitCertCache.from_model(
            rc.model, quant=QuantConfig(seed=rc.seed), cert=CertConfig(horizon=CERT_HORIZON),
            cache=CacheConfig(page_size=P, num_pages=pages, exact_backup=False))
        if real:
            p = _prefill(rc, cache, cell)
        else:
            p = _fill(rc, cell, lambda kv: cache.store_prompt_kv_(kv, batch_size=B, prompt_len=N))
        held.update(cache=cache, prefill=p, feed=Feed(p["tok"], N))

    for method in wanted:
        first = "cache" not in held
        need = (kv_pool + fill_temp if first else 0) + partials

        def body(method=method):
            if "cache" not in held:
                prepare()
            cache, feed = held["cache"], held["feed"]
            cert = CertConfig(enabled=False) if method.endswith("nocert") else CertConfig(horizon=CERT_HORIZON)
            cache.set_cert(cert)
            before = cache.cert_log.summary()
            if method.startswith("witcert-graph"):
                t = _decode_graph(rc, cell, cache, feed)
            else:
                t = _decode(rc, cell, feed.stepper(rc, rc.model, cache), rc.warmup)
            after = cache.cert_log.summary()
            t.update(kv_bytes=kv_ctx, kv_bytes_allocated=cache.pool.bytes_total(),
                     **_prefill_fields(held["prefill"]), **_cert_delta(before, after, cert.enabled))
            if cert.enabled:
                steps = after["steps"] - before["steps"]
                t["cert_complete"] = t["cert_records"] == steps * a.layers * a.heads * B
            return t
        if attempt(rc, cell, method, need_bytes=need, prefill=first, body=body) is None:
            held.clear()  # a failed step may leave the cache mid-step: the next method refills
            cleanup()
    held.clear()
    cleanup()


def _decode_graph(rc: RunCtx, cell: Cell, cache, feed: Feed) -> dict:
    from witcert.hf.graph import CapturedDecoder

    use_graph = rc.device.type == "cuda"
    dec = CapturedDecoder(rc.model, cache, capacity=cell.context + rc.extra, use_graph=use_graph)
    dec.start(feed.tok[:, 0], feed.pos[:, 0])
    try:
        # on CUDA: the first step runs eagerly (kernel compilation), the second is captured
        t = _decode(rc, cell, dec.step, max(rc.warmup, 3) if use_graph else rc.warmup)
        t.update(graph=use_graph, graph_replays=dec.replays, graph_captures=dec.captures)
        if not use_graph:
            t["note"] = "no CUDA: the static steps ran eagerly"
        feed.tok, feed.pos = dec.next_tokens[:, None].clone(), dec.positions[:, None].clone()
        return t
    finally:
        dec.close()


def _cert_delta(before: dict, after: dict, enabled: bool) -> dict:
    if not enabled:
        return {"cert": "off"}
    n = after["records"] - before["records"]
    covered = after["covered"] - before["covered"]
    return {"cert": "on", "cert_records": n, "cert_invalid": after["invalid"] - before["invalid"],
            "cert_overflow": after["overflow"] - before["overflow"],
            "cert_coverage": covered / n if n else None}

