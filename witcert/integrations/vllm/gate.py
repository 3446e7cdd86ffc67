"""In-engine gating for the vLLM plugin: the exact copy and the gate's counters.

With ``WITCERT_VLLM_GATE`` on, the worker keeps per layer a ``witcert.runtime.exact.ExactCopy``
(the exact-entry layout the HF gate and the native C decode share): K and V in the model
dtype, ``[num_slots, Hkv, D]`` per side, written for the same slots as the witcert pages,
plus a bool ``[num_slots, Hkv]`` of entries made exact by a repair and the slot epoch at
which they were made exact. An entry is live only while the slot's epoch is unchanged (a
rewrite of the slot bumps the epoch and also clears the entry), so a freed and reused
slot never reads a stale exact value.

The repair itself is the library's one gate (``witcert.runtime.repair_rows.RowCtx``, the HF
cache's), called from ``attend.decode_gated`` on either decode path (the fused C decode or
the reference, both through ``witcert.runtime.dispatch``). This module keeps the plugin's
counters (``GateEvents``) and their helpers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from witcert.runtime.exact import ExactCopy  # noqa: F401  (the one exact-entry layout, re-exported)
from witcert.runtime.repair_rows import count_blocks  # noqa: F401  (re-exported)


@dataclass
class GateEvents:
    """Counters of one or more gated decode batches (summed with ``add_``).

    fired: (sequence, query head) certificates > tau before this step's repair (query
    heads with a non-finite query are not gated: their cert is +inf whatever the KV);
    repaired: fired heads with cert <= tau after it; blocks/tokens: (block, KV head) and
    (token, KV head) entries newly made exact; fallbacks: whole-KV-head repairs (``head``);
    raw_covered: certificates <= tau before repair (all heads of the batch);
    before_*/after_*: sum and max of the finite certificates of the fired heads."""

    fired: int = 0
    repaired: int = 0
    blocks: int = 0
    tokens: int = 0
    fallbacks: int = 0
    raw_covered: int = 0
    before_sum: float = 0.0
    before_max: float = 0.0
    after_sum: float = 0.0
    after_max: float = 0.0

    def add_(self, o: "GateEvents") -> None:
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(o, f.name)
            setattr(self, f.name, max(a, b) if f.name.endswith("_max") else a + b)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def finite_sum_max(x: torch.Tensor) -> tuple[float, float]:
    """(sum, max) of the finite entries of x; (0, 0) when there are none."""
    x = x[torch.isfinite(x)]
    return (float(x.sum()), float(x.max())) if x.numel() else (0.0, 0.0)
