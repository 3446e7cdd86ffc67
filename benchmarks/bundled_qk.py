"""The bundled model's query and key projections over real text, for the CPU studies of the
certificate's terms (root_amgm_study.py, tile_cert_study.py)."""

from __future__ import annotations

import torch


def bundled_qk(tokens: int) -> tuple[object, dict[str, torch.Tensor]]:
    """(config, projections) of the bundled model (SmolLM2-135M) run once over the first ``tokens``
    tokens of CPython's pydoc topics: ``projections["q{i}"]`` / ``["k{i}"]`` layer i's q_proj /
    k_proj outputs [1, N, H * D] (before RoPE)."""
    from witcert.hf.model import load_model
    from witcert.report.texts import docs_text

    model, tok = load_model()
    ids = tok(docs_text(), return_tensors="pt").input_ids[:, :tokens]
    caps: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(model.model.layers):
        for side in "qk":
            getattr(layer.self_attn, f"{side}_proj").register_forward_hook(
                lambda mod, inp, out, key=f"{side}{i}": caps.__setitem__(key, out.detach()))
    with torch.no_grad():
        model(ids)
    return model.config, caps
