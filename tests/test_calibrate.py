"""Outlier calibration (witcert.eval.calibrate) and the bypass it feeds into the pool."""

from __future__ import annotations

import json
import math

import pytest
import torch

from witcert.eval.calibrate import OutlierProfile, calibrate_from_kv, pair_magnitude
from witcert.config import CacheConfig, CertConfig, QuantConfig
from witcert.runtime.pool import PagedPool
from witcert.ref import pool as ref_pool
from witcert.ref.attention import decode_attention
from witcert.ref.types import K_SIDE

D, H, L = 64, 2, 2


def rope_keys(N, *, pair, radius, seed=0, half=None):
    """Keys [N, H, D] ~ N(0, 1) with RoPE pair ``pair`` of magnitude ``radius`` rotating
    with the position (its magnitude is position independent, its channels are not)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(N, H, D, generator=g)
    theta = 0.37 * torch.arange(N, dtype=torch.float32)
    rows = slice(None) if half is None else half
    k[rows, :, pair] = radius * torch.cos(theta[rows])[:, None]
    k[rows, :, pair + D // 2] = radius * torch.sin(theta[rows])[:, None]
    return k


def test_pair_magnitude_is_rotation_invariant():
    k = rope_keys(50, pair=5, radius=40.0)
    mag = pair_magnitude(k)
    torch.testing.assert_close(mag[:, :, 5], torch.full((50, H), 40.0))


def test_calibration_picks_the_injected_pair_and_reports_full_stability():
    keys = [rope_keys(200, pair=5 + i, radius=30.0, seed=i) for i in range(L)]
    vals = [torch.randn(200, H, D) for _ in range(L)]
    vals[1][:, :, 9] = 25.0
    prof = calibrate_from_kv(keys, vals, m=1)
    assert prof.k_pairs[:, :, 0].tolist() == [[5, 5], [6, 6]]
    assert prof.v_channels[1, :, 0].tolist() == [9, 9]
    assert prof.stability()["k_jaccard_mean"] == 1.0
    k_idx, v_idx = prof.outlier_idx()[1]
    assert k_idx.tolist() == [[6, 6 + D // 2]] * H and k_idx.dtype == torch.int64


def test_stability_drops_when_the_halves_disagree():
    k = rope_keys(200, pair=3, radius=30.0, half=slice(0, 100))
    k[100:, :, 11] = 30.0  # the second half has a different large pair
    prof = calibrate_from_kv([k], [torch.randn(200, H, D)], m=1)
    assert prof.k_jaccard == [[0.0, 0.0]]  # {3} vs {11}


def test_profile_json_round_trip_and_prefix_of_smaller_m(tmp_path):
    keys = [torch.randn(64, H, D) * torch.linspace(1, 3, D) for _ in range(L)]
    vals = [torch.randn(64, H, D) for _ in range(L)]
    prof = calibrate_from_kv(keys, vals, m=8)
    path = prof.save(tmp_path / "p.json")
    back = OutlierProfile.load(path)
    assert torch.equal(back.k_pairs, prof.k_pairs) and back.stability() == prof.stability()
    small = calibrate_from_kv(keys, vals, m=4)
    for (a, b), (c, d) in zip(back.outlier_idx(4), small.outlier_idx()):
        assert torch.equal(a, c) and torch.equal(b, d)
    assert back.outlier_idx(0) is None
    with pytest.raises(ValueError, match="at most m=8"):
        back.outlier_idx(9)
    with pytest.raises(ValueError, match="does not fit|profile is for"):
        back.check_geometry(num_layers=L, num_kv_heads=H, head_dim=128)
    bad = json.loads(path.read_text())
    bad["format"] = "other"
    with pytest.raises(ValueError, match="not a witcert-outlier-profile"):
        OutlierProfile.from_json(bad)


def _pool_with(keys, vals, *, profile, m):
    quant = QuantConfig(seed=3, outliers=m)
    pool = PagedPool(num_layers=1, num_kv_heads=H, head_dim=D, quant=quant,
                     cache=CacheConfig(page_size=16, num_pages=16),
                     outlier_idx=None if m == 0 else profile.outlier_idx(m)[:1])
    slots = pool.allocator.allocate(0, keys.shape[0])
    ref_pool.write_(pool.layers[0], keys, vals, slots=slots)
    return pool, slots


def test_bypass_of_a_huge_pair_drops_the_scale_and_improves_the_certificate():
    N = 96
    k = rope_keys(N, pair=7, radius=200.0).half().float()  # fp16-exact values
    v = torch.randn(N, H, D).half().float()
    prof = calibrate_from_kv([k], [v], m=1)
    assert prof.k_pairs[0, :, 0].tolist() == [7, 7]
    p0, slots = _pool_with(k, v, profile=prof, m=0)
    p1, _ = _pool_with(k, v, profile=prof, m=1)
    s0 = p0.layers[0].k["scales"][slots].float()
    s1 = p1.layers[0].k["scales"][slots].float()
    assert (s1 <= s0).all() and (s1.amax(0) < s0.amax(0) / 10).all()  # both groups held the pair
    khat, packed = ref_pool.gather(p1.layers[0], K_SIDE, slots)
    assert torch.equal(khat[:, :, [7, 7 + D // 2]], k[:, :, [7, 7 + D // 2]])  # stored exactly
    q = torch.randn(1, 4, D)
    bt, sl = p0.allocator.block_table([0]), p0.allocator.seq_lens([0])
    kw = dict(page_size=16, sm_scale=D ** -0.5, cert=CertConfig(), delta_loc=1e-6)
    c0 = decode_attention(q, p0.layers[0], bt, sl, **kw).cert
    c1 = decode_attention(q, p1.layers[0], bt, sl, **kw).cert
    assert (c1 < c0 / 5).all(), (c0, c1)


@pytest.mark.parametrize("m", [0, 4, 16])
def test_byte_accounting_includes_the_bypassed_channels_and_their_indices(m):
    G = 32
    prof = calibrate_from_kv([torch.randn(32, H, D)], [torch.randn(32, H, D)], m=16)
    pool = PagedPool(num_layers=1, num_kv_heads=H, head_dim=D, quant=QuantConfig(outliers=m, group_size=G),
                     cache=CacheConfig(page_size=16, num_pages=4),
                     outlier_idx=None if m == 0 else prof.outlier_idx(m)[:1])
    # codes int8 [D] + scales and witnesses fp16 [D/G] each + exact pairs fp16 [2m]
    assert pool.bytes_per_token_head() == D + 2 * 2 * (D // G) + 2 * 2 * m
    idx_bytes = 0 if m == 0 else 2 * H * 2 * m * 8  # k and v int64 [Hkv, 2m]
    assert pool.fixed_bytes() == idx_bytes
    tensors = [t for lkv in pool.layers for t in list(lkv.k.values()) + list(lkv.v.values())]
    assert pool.bytes_total() == sum(t.numel() * t.element_size() for t in tensors) + idx_bytes \
        + pool.epochs.numel() * 8


def test_calibrate_command_on_the_bundled_model(tmp_path):
    pytest.importorskip("transformers")
    from witcert.hf.model import bundled_gguf_path

    try:
        bundled_gguf_path()
    except FileNotFoundError:
        pytest.skip("bundled model not installed")
    from witcert.cli import main

    text = tmp_path / "t.txt"
    text.write_text("The rays of light are refracted by the prism into colours. " * 20)
    out = tmp_path / "prof.json"
    assert main(["calibrate", "--text-file", str(text), "--outliers", "4", "--out", str(out),
                 "--max-tokens", "96", "--window", "48"]) == 0
    prof = OutlierProfile.load(out)
    assert (prof.num_layers, prof.num_kv_heads, prof.head_dim, prof.m) == (30, 3, 64, 4)
    assert prof.tokens == 96
    s = prof.stability()
    assert 0.0 <= s["k_jaccard_min"] <= s["k_jaccard_mean"] <= 1.0 and not math.isnan(s["k_jaccard_mean"])


def test_stability_of_a_smaller_m_equals_a_calibration_for_that_m():
    g = torch.Generator().manual_seed(4)
    keys = [torch.randn(80, H, D, generator=g) * torch.rand(D, generator=g) * 4 for _ in range(L)]
    vals = [torch.randn(80, H, D, generator=g) for _ in range(L)]
    big, small = calibrate_from_kv(keys, vals, m=8), calibrate_from_kv(keys, vals, m=3)
    assert big.stability(3) == small.stability()


def test_pool_loads_a_profile_and_checks_its_geometry():
    prof = calibrate_from_kv([torch.randn(32, H, D) for _ in range(L)],
                             [torch.randn(32, H, D) for _ in range(L)], m=4)
    pool = PagedPool(num_layers=L, num_kv_heads=H, head_dim=D, quant=QuantConfig(outliers=2),
                     cache=CacheConfig(page_size=16, num_pages=2), outlier_profile=prof)
    for lkv, (k_idx, v_idx) in zip(pool.layers, prof.outlier_idx(2)):
        assert torch.equal(lkv.k_outlier_idx, k_idx) and torch.equal(lkv.v_outlier_idx, v_idx)
    with pytest.raises(ValueError, match="profile is for"):
        PagedPool(num_layers=L + 1, num_kv_heads=H, head_dim=D, quant=QuantConfig(outliers=2),
                  cache=CacheConfig(page_size=16, num_pages=2), outlier_profile=prof)
