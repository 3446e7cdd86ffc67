"""HF transformers integration. Nothing is registered at import: call ``register()``.

    import witcert.hf
    witcert.hf.register()                      # adds "witcert" to transformers' registries
    model, tok = witcert.hf.load_model()       # bundled SmolLM2 (converted once) or a path
    model.set_attn_implementation("witcert")
    cache = witcert.hf.WitCertCache.from_model(model, quant=..., cache=..., cert=...)
    model.generate(**inputs, past_key_values=cache)

    from witcert.hf.generate import generate   # the same in one call, with a summary
"""

from __future__ import annotations


def register() -> None:
    """Register the ``"witcert"`` attention and mask functions with transformers."""
    from witcert.hf.attention import register as _register

    _register()


def __getattr__(name: str):
    # Lazy re-exports: importing witcert.hf must not import transformers.
    # (``generate`` is not re-exported: the name is taken by the submodule.)
    if name in ("load_model", "ensure_local_model", "bundled_gguf_path", "check_supported",
                "UnsupportedModelError"):
        from witcert.hf import model

        return getattr(model, name)
    if name == "WitCertCache":
        from witcert.hf.cache import WitCertCache

        return WitCertCache
    raise AttributeError(f"module 'witcert.hf' has no attribute {name!r}")
