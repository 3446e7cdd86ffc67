"""The attention geometry of a transformers model: the one place it is read from a config."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionGeometry:
    """Layers, query heads, KV heads and head dim of a decoder's attention.

    ``of(model_or_config)`` reads them from a transformers model or (text) config:
    ``head_dim`` defaults to ``hidden_size // num_attention_heads`` and ``num_key_value_heads``
    to ``num_attention_heads`` when the config leaves them out."""

    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int

    @staticmethod
    def of(model_or_config) -> "AttentionGeometry":
        cfg = getattr(model_or_config, "config", model_or_config)
        if hasattr(cfg, "get_text_config"):
            cfg = cfg.get_text_config(decoder=True)
        hq = cfg.num_attention_heads
        return AttentionGeometry(num_layers=cfg.num_hidden_layers, num_q_heads=hq,
                                 num_kv_heads=getattr(cfg, "num_key_value_heads", None) or hq,
                                 head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // hq)
