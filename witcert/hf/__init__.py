"""HF transformers integration. Nothing is registered at import: call ``register()``."""
