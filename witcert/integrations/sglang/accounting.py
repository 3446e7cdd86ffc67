"""Memory accounting: the per-token cell size SGLang sizes its KV pool with.

SGLang turns the memory left after weights into ``max_total_num_tokens = budget //
cell_size`` (``DefaultPoolConfigurator``). Stock MHA: ``cell = Hkv * (D + Dv) * L *
itemsize``. With witcert the cell is what ``WitcertMHATokenToKVPool`` really allocates per
slot row: every layer's packed K and V (``compressor.bytes_per_token_head``, K and V,
all KV heads) plus the pool-wide int64 slot epoch. The pool test checks this against the
tensors allocated, to the byte, so saved bytes become KV capacity and nothing is
over-committed. The exact host backup is host memory and is not in the device cell.
"""

from __future__ import annotations

from dataclasses import dataclass

from witcert.config import QuantConfig
from witcert.ref.compressors import get_compressor

EPOCH_BYTES = 8  # int64 epoch per slot row (witcert.runtime.slots.SlotAllocator.epochs)


def witcert_cell_size(*, num_layers: int, num_kv_heads: int, head_dim: int, quant: QuantConfig) -> int:
    """Device bytes of one slot row of the witcert pool: packed K and V of every layer
    and KV head, plus the epoch counter."""
    per_head_side = get_compressor(quant).bytes_per_token_head(head_dim)
    return num_layers * num_kv_heads * 2 * per_head_side + EPOCH_BYTES


def stock_cell_size(*, num_layers: int, num_kv_heads: int, head_dim: int, itemsize: int) -> int:
    """SGLang's MHA cell for K/V of ``itemsize`` bytes (its ``_compute_cell_size`` formula)."""
    return num_kv_heads * 2 * head_dim * num_layers * itemsize


@dataclass(frozen=True)
class CapacityReport:
    """Tokens of KV capacity with and without witcert for the same byte budget."""

    budget_bytes: int
    stock_cell: int
    witcert_cell: int

    @property
    def stock_tokens(self) -> int:
        return self.budget_bytes // self.stock_cell

    @property
    def witcert_tokens(self) -> int:
        return self.budget_bytes // self.witcert_cell

    @property
    def ratio(self) -> float:
        return self.witcert_tokens / max(self.stock_tokens, 1)

    def line(self) -> str:
        return (f"witcert KV capacity: {self.witcert_tokens} tokens ({self.witcert_cell} B/token) "
                f"vs stock {self.stock_tokens} tokens ({self.stock_cell} B/token) for "
                f"{self.budget_bytes} B: x{self.ratio:.3f}")
