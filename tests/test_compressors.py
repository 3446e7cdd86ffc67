"""The compressor registry (witcert.ref.compressors) over every method in config.METHODS."""

from __future__ import annotations

import math

import pytest
import torch

from witcert.config import BLOCK_METHODS, METHODS, TOKEN_METHODS, QuantConfig
from witcert.ref.compressors import bytes_per_token_head, compress_roundtrip, get_compressor
from witcert.ref.types import K_SIDE, V_SIDE, EncodeCtx

# bytes per token-head of one side at D=128, G=32, m=0 (token methods: exact storage)
TOKEN_BYTES_D128_G32 = {"dither8": 128 + 8 + 8, "rtn8": 128 + 8 + 8, "rtn4": 64 + 8 + 8,
                        "sr8": 128 + 8 + 8, "fp8": 128 + 8, "fp8_scaled": 128 + 8 + 8,
                        "fp16": 256 + 8}

# (T, H, D, G)
SHAPES = [(1, 1, 64, 32), (97, 2, 128, 32), (300, 1, 64, 16)]


def kv_like(T: int, H: int, D: int, *, seed: int = 0) -> torch.Tensor:
    """fp16 [T, H, D] with a few large channels (outlier-like), as real keys have."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, D, generator=g)
    x[..., torch.randperm(D, generator=g)[: max(2, D // 32)]] *= 12.0
    return x.half()


@pytest.mark.parametrize("method", METHODS)
def test_registry_builds_every_method_under_its_own_name(method):
    comp = get_compressor(QuantConfig(method=method))
    assert comp.name == method
    assert comp.granularity == ("block" if method in BLOCK_METHODS else "token")
    assert comp.has_prob_radius == (method in ("dither8", "dither8_block"))


def test_registry_error_names_the_unknown_method():
    cfg = QuantConfig()
    object.__setattr__(cfg, "method", "int3_magic")  # bypass config validation on purpose
    with pytest.raises(ValueError, match="int3_magic"):
        get_compressor(cfg)


@pytest.mark.parametrize("method", [m for m in METHODS if not m.startswith("dither8")])
def test_outlier_bypass_on_a_baseline_is_refused_naming_the_method(method):
    with pytest.raises(ValueError, match=method):
        get_compressor(QuantConfig(method=method, outliers=4))


@pytest.mark.parametrize("method", TOKEN_METHODS)
def test_bytes_per_token_head_is_the_storage_spec_sum_and_the_documented_cost(method):
    quant = QuantConfig(method=method, group_size=32)
    spec = get_compressor(quant).storage_spec(4, 128)
    spec_sum = sum(math.prod(shape) * torch.empty((), dtype=dt).element_size()
                   for shape, dt in spec.values())
    assert bytes_per_token_head(quant, 128) == spec_sum == TOKEN_BYTES_D128_G32[method]
    assert spec["wit"] == ((4,), torch.float16)


@pytest.mark.parametrize("method", TOKEN_METHODS)
def test_token_method_encode_stores_exactly_its_storage_spec(method):
    quant = QuantConfig(method=method, group_size=16)
    comp = get_compressor(quant)
    packed = comp.encode(kv_like(7, 3, 64), ctx=EncodeCtx.simple(num_tokens=7, num_heads=3, seed=5))
    spec = comp.storage_spec(3, 64)
    assert set(packed) == set(spec)
    for name, (tail, dtype) in spec.items():
        assert packed[name].shape == (7, 3, *tail) and packed[name].dtype == dtype, name


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("side", [K_SIDE, V_SIDE])
def test_compress_roundtrip_witness_bounds_true_error_for_every_method(method, shape, side):
    T, H, D, G = shape
    quant = QuantConfig(method=method, group_size=G, block_size=32, kivi_residual=8)
    x = kv_like(T, H, D, seed=T)
    ctx = EncodeCtx.simple(num_tokens=T, num_heads=H, side=side, seed=77, layer=3)
    xhat, wit = compress_roundtrip(x, quant=quant, ctx=ctx)
    assert xhat.shape == (T, H, D) and xhat.dtype == torch.float32
    assert wit.shape == (T, H, D // G) and wit.dtype == torch.float16
    err = (xhat.double() - x.double()).view(T, H, D // G, G).norm(dim=-1)
    assert torch.isfinite(wit).all() and (wit.double() >= err).all()
    # and it is what encode/decode give by hand
    comp = get_compressor(quant)
    packed = comp.encode(x, ctx=ctx)
    assert torch.equal(comp.decode(packed, ctx=ctx), xhat) and torch.equal(packed["wit"], wit)


@pytest.mark.parametrize("method", METHODS)
def test_nonfinite_token_head_gets_inf_witness_through_the_registry(method):
    T, H, D = 40, 2, 64
    x = kv_like(T, H, D, seed=4)
    x[3, 1, 9] = float("nan")
    x[20, 0, 0] = -float("inf")
    quant = QuantConfig(method=method, block_size=16, kivi_residual=8)
    _, wit = compress_roundtrip(x, quant=quant, ctx=EncodeCtx.simple(num_tokens=T, num_heads=H))
    assert torch.isinf(wit[3, 1]).all() and torch.isinf(wit[20, 0]).all()
    assert torch.isfinite(wit[5, 0]).all() and torch.isfinite(wit[20, 1]).all()


def test_witness_ranks_methods_by_precision():
    """fp16 is exact; the 8-bit methods sit far below rtn4 and kivi2 on the same keys."""
    T, H, D = 8 + 64, 2, 128
    x = kv_like(T, H, D, seed=9)
    ctx = EncodeCtx.simple(num_tokens=T, num_heads=H)
    mean_w = {m: compress_roundtrip(x, quant=QuantConfig(method=m, block_size=16, kivi_residual=8),
                                    ctx=ctx)[1][:64].double().mean().item() for m in METHODS}
    assert mean_w["fp16"] == 0
    eight_bit = max(mean_w[m] for m in ("dither8", "rtn8", "sr8"))
    assert 4 * eight_bit < mean_w["rtn4"] < mean_w["kivi2"]
    assert mean_w["kivi4"] < mean_w["kivi2"]
