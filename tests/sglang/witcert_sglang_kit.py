"""Drive witcert's SGLang backend and pool through SGLang's own attention test kit.

SGLang's kit (``sglang.test.kits.attention_unittest``) builds a real ``ReqToTokenPool``,
``ForwardBatch`` (bound to a KV plan), ``RadixAttention`` and the attention-backend
registry. Its ``MockModelRunner`` builds the stock ``MHATokenToKVPool``; the only
change here is that the runner's pool is rebuilt, with the same keyword arguments, as
``WitcertMHATokenToKVPool`` (what ``get_kv_pool_cls`` hands SGLang's configurator in a
server). Everything else (weights, page layouts, the prefix writes through the pool's
``set_kv_buffer``, the forward through ``RadixAttention`` and the registry's backend) is
the kit's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.plugins import load_plugins
from sglang.test.kits.attention_unittest.attention_methods import dense_attention as da

from witcert.integrations.sglang.pool import WitcertMHATokenToKVPool

# SGLang's own plugin loader: discovers witcert's ``sglang.srt.plugins`` entry point
# (pyproject.toml), runs ``register()`` and applies the hooks, as every server process does
load_plugins()

HEAD_DIM = 32  # witcert groups are 32 channels: D must be a multiple
MAX_CONTEXT = 64


@dataclass
class Built:
    fixture: da.DenseAttentionFixture
    pool: WitcertMHATokenToKVPool
    loc_fn: object


def case(name: str, *, decode: bool, heads: int, kv_heads: int, page_size: int,
         prefix_lens: tuple[int, ...], extend_lens: tuple[int, ...] = ()) -> da.DenseAttentionCase:
    return da.DenseAttentionCase(
        name=name, backend="witcert", forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND,
        num_heads=heads, num_kv_heads=kv_heads, page_size=page_size, prefix_lens=prefix_lens,
        extend_lens=extend_lens)


def build(c: da.DenseAttentionCase, *, dtype=torch.float32, head_dim: int = HEAD_DIM,
          hidden: int = 64, loc_layout: str = "shuffled_pages") -> Built:
    """The kit's ``build_dense_attention_fixture`` with the witcert pool in the runner."""
    seed = 2026 + len(c.name) + c.num_kv_heads
    torch.manual_seed(seed)
    model_config = da.TinyModelConfig(num_heads=c.num_heads, num_kv_heads=c.num_kv_heads,
                                      head_dim=head_dim, hidden_size=hidden, context_len=MAX_CONTEXT)
    runner = da.MockModelRunner(case=c, model_config=model_config, dtype=dtype, device="cpu",
                                max_context_len=MAX_CONTEXT, head_dim=head_dim)
    stock = runner.token_to_kv_pool
    runner.token_to_kv_pool = WitcertMHATokenToKVPool(
        size=stock.size, page_size=c.page_size, dtype=dtype, head_num=c.num_kv_heads,
        head_dim=head_dim, layer_num=1, device="cpu", enable_memory_saver=False,
        enable_alt_stream=False)
    runner.token_to_kv_pool_allocator.get_kvcache = lambda: runner.token_to_kv_pool
    backend = ATTENTION_BACKENDS[c.backend](runner)
    actual = da.ProjectedDenseAttention(hidden_size=hidden, num_heads=c.num_heads,
                                        num_kv_heads=c.num_kv_heads, head_dim=head_dim,
                                        dtype=dtype, device="cpu")
    reference = da.ReferenceDenseAttention(hidden_size=hidden, num_heads=c.num_heads,
                                           num_kv_heads=c.num_kv_heads, head_dim=head_dim,
                                           dtype=dtype, device="cpu")
    da._copy_dense_weights(actual, reference)
    prefix_hidden = [torch.randn(n, hidden, dtype=dtype) for n in c.prefix_lens]
    input_hidden = torch.randn(c.num_input_tokens, hidden, dtype=dtype)
    loc_fn = da.make_loc_fn(loc_layout, batch_size=c.batch_size, seq_lens=c.seq_lens,
                            prefix_lens=c.prefix_lens, page_size=c.page_size,
                            max_context_len=MAX_CONTEXT, seed=seed)
    batch = da._make_forward_batch(c, runner, max_context_len=MAX_CONTEXT, device="cpu", loc_fn=loc_fn)
    with torch.no_grad():
        da._populate_prefix_kv(actual, c, runner, prefix_hidden, max_context_len=MAX_CONTEXT,
                               loc_fn=loc_fn)
    fx = da.DenseAttentionFixture(case=c, runner=runner, backend=backend, actual_module=actual,
                                  reference_module=reference, forward_batch=batch,
                                  prefix_hidden=prefix_hidden, input_hidden=input_hidden)
    return Built(fixture=fx, pool=runner.token_to_kv_pool, loc_fn=loc_fn)


def run(b: Built) -> torch.Tensor:
    """The kit's eager run: ``init_forward_metadata`` then the module through RadixAttention."""
    return da.run_dense_fixture_eager(b.fixture)


def kit_expected(b: Built) -> torch.Tensor:
    """The kit's own reference (exact K/V, fp32 softmax), projected through o_proj."""
    with torch.no_grad():
        return da.expected_dense_fixture_output(b.fixture)
