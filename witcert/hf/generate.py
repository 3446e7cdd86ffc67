"""Greedy generation through ``model.generate`` with a ``WitCertCache``.

``generate`` builds a pool sized for the request (unless a ``CacheConfig`` is given),
switches the model to the ``"witcert"`` attention for the call, streams text if asked,
and returns the texts with the certificate summary and the byte accounting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from witcert.config import CacheConfig, CertConfig, QuantConfig
from witcert.hf.attention import ATTN_NAME, register
from witcert.hf.cache import WitCertCache


@dataclass
class GenerationResult:
    """texts: decoded new text per prompt; token_ids: new token ids per prompt.

    cert_summary: ``CertLog.summary()`` (None when certificates are disabled);
    cache_stats: ``WitCertCache.stats()``; bytes: ``PagedPool.bytes_report()``;
    prompt_tokens: real (unpadded) prompt tokens per prompt; seconds: wall time of
    ``model.generate``; tokens_per_second: new tokens (all prompts) / seconds.
    """

    texts: list[str]
    token_ids: list[list[int]]
    cert_summary: dict | None
    cache_stats: dict
    bytes: dict
    prompt_tokens: list[int]
    seconds: float
    tokens_per_second: float
    cert_log: object | None = None


class _TextStreamer:
    """transformers streamer protocol (``put``/``end``) for one sequence: decodes the
    whole generated suffix each step and emits only the new characters (so multi-token
    characters come out whole)."""

    def __init__(self, tokenizer, emit: Callable[[str], None]):
        self.tokenizer, self.emit = tokenizer, emit
        self.ids: list[int] = []
        self.sent = 0
        self.skip_prompt = True

    def put(self, value: torch.Tensor) -> None:
        if self.skip_prompt:  # the first call carries the prompt
            self.skip_prompt = False
            return
        self.ids.extend(value.reshape(-1).tolist())
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # incomplete UTF-8 sequence: wait for the next token
            return
        self.emit(text[self.sent:])
        self.sent = len(text)

    def end(self) -> None:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if len(text) > self.sent:
            self.emit(text[self.sent:])
        self.sent = len(text)


def format_prompts(tokenizer, prompts: list[str], *, chat: bool) -> list[str]:
    """Wrap each prompt as one user turn with the tokenizer's chat template (if it has one)."""
    if not chat or not getattr(tokenizer, "chat_template", None):
        return list(prompts)
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                          add_generation_prompt=True) for p in prompts]


def pool_for(prompt_tokens: list[int], max_new_tokens: int, *, page_size: int,
             exact_backup: bool = True) -> CacheConfig:
    """The smallest ``CacheConfig`` holding every prompt plus ``max_new_tokens`` each."""
    pages = sum(-(-(n + max_new_tokens) // page_size) for n in prompt_tokens)
    return CacheConfig(page_size=page_size, num_pages=max(1, pages), exact_backup=exact_backup)


def generate(model, tokenizer, prompts: list[str], *, max_new_tokens: int,
             quant: QuantConfig = QuantConfig(), cert: CertConfig = CertConfig(),
             cache_cfg: CacheConfig | None = None, stream: Callable[[str], None] | None = None,
             chat: bool = True, outlier_idx=None, observer=None,
             page_size: int = 16, repair=None) -> GenerationResult:
    """Greedy decoding of ``prompts`` (left-padded batch) with certified compressed KV.

    cache_cfg None: a pool just large enough, pages of ``page_size``. With the fixed risk
    allocation the horizon is set to ``max_new_tokens`` (every decode step is covered).
    stream: called with text pieces of the single prompt as they are generated.
    repair: None, or a ``RepairPolicy``: gate every certificate at ``cert.tau`` and repair
        from the exact backup (``cache_stats["gate"]`` holds the gate's counters).
    """
    if not prompts:
        raise ValueError("prompts must not be empty")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: {max_new_tokens} must be >= 1")
    if stream is not None and len(prompts) != 1:
        raise ValueError("stream= needs exactly one prompt")
    register()
    texts_in = format_prompts(tokenizer, prompts, chat=chat)
    tokenizer.padding_side = "left"
    enc = tokenizer(texts_in, return_tensors="pt", padding=True, add_special_tokens=False)
    enc = {k: v.to(model.device) for k, v in enc.items()}
    prompt_tokens = enc["attention_mask"].sum(1).tolist()
    if cache_cfg is None:
        cache_cfg = pool_for(prompt_tokens, max_new_tokens, page_size=page_size)
    if cert.allocation == "fixed":
        cert = cert.replace(horizon=max_new_tokens)
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTN_NAME)
    try:
        cache = WitCertCache.from_model(model, quant=quant, cache=cache_cfg, cert=cert,
                                        outlier_idx=outlier_idx, observer=observer, repair=repair)
        streamer = None if stream is None else _TextStreamer(tokenizer, stream)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 streamer=streamer, pad_token_id=tokenizer.pad_token_id,
                                 **{cache_kwarg(model): cache})
        seconds = time.perf_counter() - t0
    finally:
        model.set_attn_implementation(previous)
    new = out[:, enc["input_ids"].shape[1]:]
    eos = _eos_ids(model, tokenizer)
    token_ids = [_strip_after_eos(row.tolist(), eos) for row in new]
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in token_ids]
    summary = cache.cert_log.summary() if cache.cert_log is not None else None
    stats = cache.stats()
    report = cache.pool.bytes_report()
    cache.reset()
    n_new = sum(len(ids) for ids in token_ids)
    return GenerationResult(texts=texts, token_ids=token_ids, cert_summary=summary,
                            cache_stats=stats, bytes=report, prompt_tokens=prompt_tokens,
                            seconds=seconds, tokens_per_second=n_new / seconds if seconds else 0.0,
                            cert_log=cache.cert_log)


def cache_kwarg(model) -> str:
    """Name of the cache argument: ``cache`` (transformers >= 5.2x) or ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _eos_ids(model, tokenizer) -> set[int]:
    ids = model.generation_config.eos_token_id
    ids = set(ids if isinstance(ids, list) else [] if ids is None else [ids])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _strip_after_eos(ids: list[int], eos: set[int]) -> list[int]:
    """Generated ids up to and including the first EOS (generate pads after it)."""
    for i, t in enumerate(ids):
        if t in eos:
            return ids[:i + 1]
    return ids
