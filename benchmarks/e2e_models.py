"""Architectures, random-weight models, byte accounting and step timing for bench_e2e_gpu.py.

A model's cost does not depend on its weights' values, so the benchmark builds public
architecture shapes with random bf16 weights (no download): the generated text is
meaningless, the time and memory are real.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass

import torch

GIB = 1024 ** 3


@dataclass(frozen=True)
class Arch:
    """A decoder shape: ``family`` llama or qwen2 (q/k/v biases), RoPE base ``rope_theta``."""

    name: str
    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float

    def __post_init__(self) -> None:
        if self.family not in ("llama", "qwen2"):
            raise ValueError(f"family: {self.family!r} must be 'llama' or 'qwen2'")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads: {self.heads} is not a multiple of kv_heads={self.kv_heads}")

    @property
    def params(self) -> int:
        """Parameter count (embedding and LM head untied)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * (q + 2 * kv) + q * self.hidden
        if self.family == "qwen2":
            attn += q + 2 * kv
        layer = attn + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.layers * layer + 2 * self.vocab * self.hidden + self.hidden

    @property
    def fp16_bytes_per_token(self) -> int:
        """K and V of one token in every layer at 2 bytes per value (HF caches, bf16)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    def prefill_flops(self, batch: int, tokens: int) -> float:
        """Forward FLOPs of a causal prefill: 2 x params per token plus the attention."""
        attn = 2 * 2 * self.layers * self.heads * self.head_dim * tokens * tokens / 2
        return batch * (2.0 * self.params * tokens + attn)

    def prefill_activation_bytes(self, batch: int, tokens: int) -> int:
        """Peak transient activations of a one-forward prefill (generous: MLP intermediates
        and q/k/v of one layer, a few hidden-state copies, the last token's logits)."""
        n = batch * tokens
        per_tok = (6 * self.hidden + 3 * self.intermediate
                   + 2 * (self.heads + 2 * self.kv_heads) * self.head_dim) * 2
        return n * per_tok + batch * self.vocab * 4

    def hf_config(self, *, max_positions: int):
        """The transformers config of this shape (works with transformers 5.17 and 5.2x)."""
        from transformers import LlamaConfig, Qwen2Config

        common = dict(vocab_size=self.vocab, hidden_size=self.hidden,
                      intermediate_size=self.intermediate, num_hidden_layers=self.layers,
                      num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
                      max_position_embeddings=max_positions, rms_norm_eps=1e-5,
                      rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
        if self.family == "llama":
            return LlamaConfig(head_dim=self.head_dim, **common)
        return Qwen2Config(use_sliding_window=False, **common)


ARCHS = {a.name: a for a in (
    # Llama-3-8B: 32 layers, 32 query / 8 KV heads (GQA 4), D 128
    Arch("llama3-8b", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 500000.0),
    # Qwen2-7B: 28 layers, 28 query / 4 KV heads (GQA 7), D 128, q/k/v biases
    Arch("qwen2-7b", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, 1000000.0),
    # --quick: the same code path in seconds on a CPU
    Arch("tiny-llama", "llama", 2, 256, 4, 2, 64, 512, 1024, 10000.0),
)}


def build_model(arch: Arch, *, device: torch.device, dtype: torch.dtype, seed: int,
                max_positions: int):
    """A random-weight causal LM of ``arch`` built directly on ``device`` (eval mode)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(arch.hf_config(max_positions=max_positions),
                                                 dtype=dtype)
    return model.eval()


def witcert_pool_accounting(arch: Arch, quant) -> dict:
    """Device bytes of a witcert pool of this shape, from the compressor's storage spec
    (a one-page ``PagedPool`` on the CPU answers for any size: the layout is linear)."""
    from witcert.config import CacheConfig
    from witcert.runtime.pool import PagedPool

    pool = PagedPool(num_layers=arch.layers, num_kv_heads=arch.kv_heads, head_dim=arch.head_dim,
                     quant=quant, cache=CacheConfig(page_size=16, num_pages=1, exact_backup=False))
    return {"bytes_per_slot": pool.bytes_per_slot(), "fixed_bytes": pool.fixed_bytes(),
            "page_size": pool.page_size,
            "bytes_per_token_head_side": pool.bytes_per_token_head(),
            "fp16_bytes_per_token": arch.fp16_bytes_per_token}


def pool_bytes(acct: dict, *, pages: int) -> int:
    return pages * acct["page_size"] * acct["bytes_per_slot"] + acct["fixed_bytes"]


def cleanup() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / GIB


def time_steps(step, n: int, device: torch.device) -> dict:
    """Run ``step()`` n times; per-step milliseconds from CUDA events (GPU timeline, so
    host launch gaps count) or ``perf_counter`` on the CPU. Returns median, mean (wall
    clock over all steps, synchronised at both ends) and every step."""
    sync(device)
    t0 = time.perf_counter()
    if device.type == "cuda":
        marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                 for _ in range(n)]
        for start, end in marks:
            start.record()
            step()
            end.record()
        sync(device)
        ms = [s.elapsed_time(e) for s, e in marks]
    else:
        ms = []
        for _ in range(n):
            t = time.perf_counter()
            step()
            ms.append((time.perf_counter() - t) * 1e3)
    wall = (time.perf_counter() - t0) * 1e3 / n
    return {"ms_per_step": statistics.median(ms), "ms_per_step_wall_mean": wall,
            "ms_steps": [round(x, 3) for x in ms]}


def timed(fn, device: torch.device):
    """(result of fn(), seconds), synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0
