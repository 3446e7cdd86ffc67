"""The capacity figures the plugin reports: KV bytes per token, tokens held, gate copy memory.

Computed from the model shape, vLLM's block pool and the settings only (no tensors), so the
API-server process reports them from start-up (``stat_logger``), before any worker has
written a snapshot, and the worker writes the same dict with its snapshot.

- ``witcert_bytes_per_token``: the page record of every layer and KV head (K and V);
  ``witcert_capacity_tokens``: the slots of vLLM's pool (blocks x block size).
- ``baseline_bytes_per_token``: vLLM's own cache in the model dtype;
  ``baseline_capacity_tokens``: what that cache holds in the memory of witcert's pages.
- With the gate: ``exact_copy_bytes``: the most memory the exact copy holds at once (K/V
  rows within the ``WITCERT_VLLM_GATE_COPY`` bound plus the flags of every slot);
  ``exact_copy_capacity_tokens``: tokens that can hold a copy at once;
  ``memory_bytes``: pages + exact copy; ``baseline_capacity_tokens_same_memory``: what
  vLLM's own cache holds in that total memory (the fair comparison with the gate on; equal
  to ``baseline_capacity_tokens`` without the gate).
"""

from __future__ import annotations

from witcert.integrations.vllm.copystore import CopyGeometry
from witcert.integrations.vllm.paged import RecordLayout
from witcert.integrations.vllm.settings import Settings


def copy_geometry(s: Settings, *, num_layers: int, num_kv_heads: int, head_dim: int,
                  itemsize: int, num_blocks: int, block_size: int) -> CopyGeometry:
    return CopyGeometry(num_layers=num_layers, num_blocks=num_blocks, block_size=block_size,
                        num_kv_heads=num_kv_heads, head_dim=head_dim, itemsize=itemsize,
                        budget_bytes=s.gate_copy_bytes)


def capacity_info(s: Settings, *, num_layers: int, num_kv_heads: int, head_dim: int,
                  model_dtype: str, itemsize: int, num_blocks: int, block_size: int) -> dict:
    """The static facts of one worker's pool (JSON-able dict; keys in the module doc)."""
    wc = num_layers * num_kv_heads * RecordLayout.build(s.quant, head_dim).size
    base = num_layers * num_kv_heads * 2 * head_dim * itemsize
    slots = num_blocks * block_size
    pool_bytes = slots * wc
    info = {"preset": s.preset, "method": s.quant.method, "radius": s.cert.radius,
            "allocation": s.cert.allocation, "delta": s.cert.delta, "tau": s.cert.tau,
            "dither_bits": s.quant.dither_bits, "group_size": s.quant.group_size,
            "num_blocks": num_blocks, "block_size": block_size, "model_dtype": model_dtype,
            "witcert_bytes_per_token": wc, "baseline_bytes_per_token": base,
            "witcert_capacity_tokens": slots, "baseline_capacity_tokens": pool_bytes // base,
            "kv_pool_bytes": pool_bytes, "gate": s.repair.mode,
            "gate_block_tokens": s.repair.block_tokens, "exact_copy_bytes_per_token": 0,
            "exact_copy_bytes": 0, "exact_copy_capacity_tokens": 0,
            "exact_copy_bound_bytes": None, "memory_bytes": pool_bytes,
            "baseline_capacity_tokens_same_memory": pool_bytes // base}
    if s.gate:
        g = copy_geometry(s, num_layers=num_layers, num_kv_heads=num_kv_heads,
                          head_dim=head_dim, itemsize=itemsize, num_blocks=num_blocks,
                          block_size=block_size)
        total = pool_bytes + g.total_bytes
        info.update(exact_copy_bytes_per_token=g.full_bytes_per_token,
                    exact_copy_bytes=g.total_bytes, exact_copy_capacity_tokens=g.capacity_tokens,
                    exact_copy_bound_bytes=s.gate_copy_bytes, memory_bytes=total,
                    baseline_capacity_tokens_same_memory=total // base)
    return info
