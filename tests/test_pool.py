"""PagedPool: byte accounting to the byte, capacity errors before any overwrite, epochs."""

from __future__ import annotations

import pytest
import torch

from witcert.config import CacheConfig, QuantConfig
from witcert.runtime.pool import PagedPool
from witcert.ref.philox import dither
from witcert.ref.pool import gather, write_
from witcert.ref.types import K_SIDE, V_SIDE
from witcert.runtime.slots import CapacityError

L, HKV, D = 3, 2, 64


def _pool(quant=QuantConfig(seed=7), pages=4, page_size=16, backup=True, outlier_idx=None):
    return PagedPool(num_layers=L, num_kv_heads=HKV, head_dim=D, quant=quant,
                     cache=CacheConfig(page_size=page_size, num_pages=pages, exact_backup=backup),
                     outlier_idx=outlier_idx)


def _device_tensors(pool: PagedPool) -> list[torch.Tensor]:
    out = [pool.epochs]
    for lkv in pool.layers:
        out += list(lkv.k.values()) + list(lkv.v.values())
        out += [t for t in (lkv.k_outlier_idx, lkv.v_outlier_idx) if t is not None]
    return out


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _outliers(m: int):
    # RoPE pair j = channels (j, j + D/2) in HF's rotate_half layout
    idx = torch.tensor([j for j in range(m)] + [j + D // 2 for j in range(m)], dtype=torch.int64)
    one = idx.expand(HKV, 2 * m).clone()
    return [(one, one.clone()) for _ in range(L)]


@pytest.mark.parametrize("quant, per_side", [
    # codes D int8 + scales D/G fp16 + witness D/G fp16
    (QuantConfig(seed=1), 64 + 2 * 2 + 2 * 2),
    (QuantConfig(seed=1, group_size=16), 64 + 4 * 2 + 4 * 2),
    (QuantConfig(method="rtn8", seed=1), 64 + 2 * 2 + 2 * 2),
    (QuantConfig(method="rtn4", seed=1), 32 + 2 * 2 + 2 * 2),
    (QuantConfig(method="fp8", seed=1), 64 + 2 * 2),
    (QuantConfig(method="fp16", seed=1), 128 + 2 * 2),
])
def test_bytes_match_the_allocated_tensors_to_the_byte(quant, per_side):
    pool = _pool(quant=quant, pages=5)
    assert pool.bytes_per_token_head(K_SIDE) == pool.bytes_per_token_head(V_SIDE) == per_side
    assert pool.bytes_per_token_layer() == HKV * 2 * per_side
    assert pool.fp16_bytes_per_token_layer() == HKV * 2 * D * 2
    assert pool.bytes_total() == _nbytes(_device_tensors(pool))
    assert pool.bytes_total() == pool.num_slots * pool.bytes_per_slot() + pool.fixed_bytes()
    assert pool.fixed_bytes() == 0
    per_token = sum(_nbytes(list(lkv.k.values()) + list(lkv.v.values())) for lkv in pool.layers)
    assert per_token == pool.num_slots * L * pool.bytes_per_token_layer()
    assert pool.backup_bytes() == _nbytes(pool.backup.k + pool.backup.v) == 2 * L * pool.num_slots * HKV * D * 2
    rep = pool.bytes_report()
    assert rep["bytes_per_token"] == L * HKV * 2 * per_side
    assert rep["saved_fraction"] == pytest.approx(1 - per_side / (2 * D))


def test_outlier_bytes_counted():
    m = 2
    pool = _pool(quant=QuantConfig(seed=1, outliers=m), outlier_idx=_outliers(m))
    assert pool.bytes_per_token_head(K_SIDE) == 64 + 4 + 4 + 2 * m * 2
    assert pool.fixed_bytes() == L * 2 * HKV * 2 * m * 8  # int64 indices, K and V
    assert pool.bytes_total() == _nbytes(_device_tensors(pool))


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("outliers", [0, 2])
def test_capacity_is_exact_at_the_byte_boundary(page_size, outliers):
    q = QuantConfig(seed=1, outliers=outliers)
    idx = _outliers(outliers) if outliers else None
    for pages in (1, 3, 10):
        budget = _pool(quant=q, pages=pages, page_size=page_size, outlier_idx=idx).bytes_total()
        probe = _pool(quant=q, pages=1, page_size=page_size, outlier_idx=idx)
        assert probe.capacity_tokens(budget) == pages * page_size
        assert probe.capacity_tokens(budget - 1) == (pages - 1) * page_size
        # fp16: 2 sides * Hkv * D * 2 bytes per layer and token
        assert probe.fp16_capacity_tokens(budget) == budget // (L * HKV * D * 4)
    assert probe.capacity_tokens(budget) > probe.fp16_capacity_tokens(budget)


def test_capacity_error_is_raised_before_any_overwrite():
    pool = _pool(pages=2)
    lkv = pool.layers[0]
    alloc = pool.allocator
    a, b = alloc.new_seq_id(), alloc.new_seq_id()
    x = torch.randn(30, HKV, D)
    slots = alloc.allocate(a, 30)
    write_(lkv, x, x, slots=slots)
    snapshot = [t.clone() for t in _device_tensors(pool)]
    with pytest.raises(CapacityError):
        alloc.allocate(b, 3)  # 2 slots left in page 1 of seq a's; seq b needs a page
    for before, now in zip(snapshot, _device_tensors(pool)):
        assert torch.equal(before, now)
    xhat, _ = gather(lkv, K_SIDE, slots)
    assert (xhat - x).abs().max() < x.abs().max() / 100  # still seq a's data


def test_reused_slot_gets_a_new_epoch_and_a_new_dither():
    pool = _pool(pages=1, page_size=16)
    lkv, alloc = pool.layers[1], pool.allocator
    a = alloc.new_seq_id()
    s_a = alloc.allocate(a, 16)
    x = torch.randn(16, HKV, D)
    write_(lkv, x, x, slots=s_a)
    codes_a = lkv.k["codes"].clone()
    alloc.free(a)
    b = alloc.new_seq_id()
    s_b = alloc.allocate(b, 16)
    assert torch.equal(s_a, s_b)
    assert (pool.epochs[s_b] == 1).all()
    write_(lkv, x, x, slots=s_b)  # same data, same slots, new epoch
    assert not torch.equal(codes_a, lkv.k["codes"]), "the dither was reused"
    heads = torch.arange(HKV)
    xi0 = dither(seed=pool.seed, layer=1, kv_heads=heads, side=K_SIDE, slots=s_b,
                 epochs=torch.zeros(16, dtype=torch.int64), head_dim=D, bits=16)
    xi1 = dither(seed=pool.seed, layer=1, kv_heads=heads, side=K_SIDE, slots=s_b,
                 epochs=pool.epochs[s_b], head_dim=D, bits=16)
    assert (xi0 != xi1).float().mean() > 0.99
    xhat, packed = gather(lkv, K_SIDE, s_b)  # the read side sees the new epoch
    err = torch.linalg.vector_norm((xhat - x).reshape(16, HKV, 2, 32), dim=-1)
    assert (err <= packed["wit"].float()).all()


def test_seed_is_secret_unless_set():
    assert _pool(quant=QuantConfig()).seed != _pool(quant=QuantConfig()).seed
    assert _pool(quant=QuantConfig(seed=5)).seed == 5
    p = _pool(quant=QuantConfig(seed=5))
    assert all(lkv.seed == 5 for lkv in p.layers)
    assert all(lkv.epochs is p.epochs for lkv in p.layers)


def test_exact_backup_holds_the_written_values():
    pool = _pool(pages=2)
    slots = pool.allocator.allocate(pool.allocator.new_seq_id(), 5)
    k, v = torch.randn(5, HKV, D), torch.randn(5, HKV, D)
    pool.backup_write_(2, k, v, slots_host=slots.cpu())
    assert torch.equal(pool.backup.k[2][slots], k.half())
    assert torch.equal(pool.backup.v[2][slots], v.half())
    assert _pool(backup=False).backup_bytes() == 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(head_dim=48), "group_size"),
    (dict(quant=QuantConfig(method="kivi2")), "block-granular"),
    (dict(quant=QuantConfig(outliers=2)), "outlier_idx"),
    (dict(num_layers=0), "num_layers"),
])
def test_wrong_configs_fail_at_construction(kwargs, match):
    base = dict(num_layers=L, num_kv_heads=HKV, head_dim=D, quant=QuantConfig(),
                cache=CacheConfig(num_pages=1))
    with pytest.raises(ValueError, match=match):
        PagedPool(**{**base, **kwargs})
