"""The witcert pool's byte account, its slot/epoch keyed writes, and the plugin's hooks.

Cell size: what SGLang divides its KV budget by must be exactly what the pool allocates
per slot row, for witcert and (as a check of the comparison) for the stock pool.
Hooks: off unless ``--attention-backend witcert``; on, they hand SGLang witcert's pool
class and cell size.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("sglang", reason="SGLang is not installed here: run scripts/setup_sglang_env.sh")

import torch  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402
from sglang.srt.runtime_context import get_context  # noqa: E402

import witcert_sglang_kit as kit  # noqa: E402
import witcert.integrations.sglang as plugin  # noqa: E402
from witcert.config import PRESETS  # noqa: E402
from witcert.integrations.sglang.accounting import (CapacityReport, stock_cell_size,  # noqa: E402
                                                    witcert_cell_size)
from witcert.integrations.sglang.pool import WitcertMHATokenToKVPool  # noqa: E402
from witcert.ref.pool import gather  # noqa: E402
from witcert.ref.types import K_SIDE  # noqa: E402


def _pool_kwargs(*, size=200, page_size=16, heads=3, head_dim=64, layers=4, dtype=torch.float16):
    return dict(size=size, page_size=page_size, dtype=dtype, head_num=heads, head_dim=head_dim,
                layer_num=layers, device="cpu", enable_memory_saver=False, enable_alt_stream=False)


def _tensor_bytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


@pytest.mark.parametrize("page_size", [1, 16])
def test_cell_size_is_exact_to_the_byte(page_size):
    kw = _pool_kwargs(size=16 * 13, page_size=page_size)
    pool = WitcertMHATokenToKVPool(**kw)
    rows = pool.witcert.num_slots
    assert rows == kw["size"] + page_size
    cell = witcert_cell_size(num_layers=4, num_kv_heads=3, head_dim=64, quant=PRESETS["default"][0])
    # dither8, D=64, G=32: 64 codes + 2 fp16 scales + 2 fp16 witnesses = 72 B per head and side
    assert cell == 4 * 3 * 2 * 72 + 8 == pool.witcert_cell_size
    every = [t for lkv in pool.witcert.layers for t in (*lkv.k.values(), *lkv.v.values())]
    assert _tensor_bytes(every) + _tensor_bytes([pool.witcert.epochs]) == rows * cell
    assert pool.witcert_device_bytes() == rows * cell == sum(pool.get_kv_size_bytes())
    stock = MHATokenToKVPool(**kw)
    assert sum(stock.get_kv_size_bytes()) == rows * stock_cell_size(
        num_layers=4, num_kv_heads=3, head_dim=64, itemsize=2)


def test_capacity_report_same_budget():
    r = CapacityReport(budget_bytes=10**9, stock_cell=stock_cell_size(
        num_layers=30, num_kv_heads=3, head_dim=64, itemsize=2), witcert_cell=witcert_cell_size(
        num_layers=30, num_kv_heads=3, head_dim=64, quant=PRESETS["default"][0]))
    assert (r.stock_cell, r.witcert_cell) == (23040, 12968)
    assert r.stock_tokens == 10**9 // 23040 and r.witcert_tokens == 10**9 // 12968
    assert r.ratio == (10**9 // 12968) / (10**9 // 23040)  # about 1.777x the tokens


def test_write_keys_dither_by_slot_and_epoch():
    """A rewrite of a slot (SGLang reallocating it) bumps its epoch: a new dither stream,
    and the stored value still dequantizes within the witness of the exact one."""
    pool = WitcertMHATokenToKVPool(**_pool_kwargs(size=32, page_size=1, layers=1, head_dim=32,
                                                  dtype=torch.float32))
    layer = SimpleNamespace(layer_id=0)
    k = torch.randn(2, 3, 32)
    slots = torch.tensor([5, 9])
    codes = []
    for _ in range(2):
        pool.set_kv_buffer(layer, slots, k, k)
        codes.append(pool.layer_kv(0).k["codes"][slots].clone())
        assert torch.equal(pool.witcert.backup.k[0][slots], k)  # exact host copy
    assert pool.witcert.epochs[slots].tolist() == [2, 2]
    assert not torch.equal(codes[0], codes[1])
    xhat, packed = gather(pool.layer_kv(0), K_SIDE, slots)
    err = (xhat - k).view(2, 3, 1, 32).norm(dim=-1)
    assert (err <= packed["wit"].float()).all()


@pytest.fixture
def hooks_applied():
    # witcert_sglang_kit ran SGLang's load_plugins(): the entry point registered the hooks
    assert plugin.POOL_CLS_TARGET in HookRegistry._patched
    assert plugin.CELL_SIZE_TARGET in HookRegistry._patched
    yield


def _kvc(dtype=torch.float16):
    mc = kit.da.TinyModelConfig(num_heads=9, num_kv_heads=3, head_dim=64, hidden_size=576,
                                context_len=128)
    return SimpleNamespace(model_config=mc, kv_cache_dtype=dtype, use_mla_backend=False,
                           server_args=SimpleNamespace(enable_hisparse=False,
                                                       enable_dsa_cache_layer_split=False),
                           is_draft_worker=False)


@pytest.mark.parametrize("backend", ["triton", "witcert"])
def test_hooks_inert_unless_witcert_selected(hooks_applied, backend):
    from sglang.srt.platforms import current_platform

    with get_context().override_server_args(attention_backend=backend):
        cls = current_platform.get_kv_pool_cls(kind="mha")
        conf = DefaultPoolConfigurator.__new__(DefaultPoolConfigurator)  # the method only
        conf.kv_cache_dtype_str = "auto"
        cell = DefaultPoolConfigurator._compute_cell_size(conf, _kvc(), 30)
    if backend == "witcert":
        assert cls is WitcertMHATokenToKVPool
        assert cell == 12968 and conf.witcert_stock_cell_size == 23040
    else:
        assert cls is None  # SGLang's in-tree MHATokenToKVPool
        assert cell == 23040

