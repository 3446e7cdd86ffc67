"""Contract tests: the native C decode / write (witcert.native) against the reference.

Tiers (docs/STYLE.md): bitwise (Philox dither, dequantized K/V, written codes / scales /
witnesses), floating point (out within 2x the plain torch fp32 error against float64 on
the stored values), certificate (cert >= true TV in float64 from the exact K/V written,
and within 1e-5 rel / 1e-6 abs of the torch ``decode_batched`` cert), and exact agreement
of the non-finite handling. Skipped with the reason when the library cannot be built.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys

import pytest
import torch

from witcert import native
from witcert.config import CertConfig, QuantConfig
from witcert.integrations.vllm.attend import anytime_delta, decode_batched
from witcert.native import decode as nd
from witcert.native import write as nw
from witcert.ref import attention as ref_attn
from witcert.ref.cert import tv_distance
from witcert.ref.philox import dither
from witcert.ref.pool import LayerKV, gather, write_
from witcert.ref.types import K_SIDE, V_SIDE

from cases import DECODE_SHAPES, SEED, make_case, outlier_indices, random_positions  # noqa: F401
PORTABLE = ("-DWC_NO_CLONES",)  # no AVX2 clone, no intrinsics: the plain-C build


@pytest.fixture(autouse=True, scope="module")
def _needs_native():
    if not native.available():
        pytest.skip(f"native library unavailable: {native.reason()}")


def _stored(lkv, bt, sl, page, b):
    slots = ref_attn.token_slots(bt[b], int(sl[b]), page_size=page)
    return gather(lkv, K_SIDE, slots)[0], gather(lkv, V_SIDE, slots)[0]


def _check_float_and_cert_tiers(lkv, q, bt, sl, exact, *, page, radius, delta_loc, sm):
    cert = CertConfig(radius=radius)
    kw = dict(page_size=page, sm_scale=sm, cert=cert, delta_loc=delta_loc)
    out_n, c_n = decode_batched(q, lkv, bt, sl, **kw, native="on")
    out_t, c_t = decode_batched(q, lkv, bt, sl, **kw, native="off")
    for b in range(q.shape[0]):
        kh, vh = _stored(lkv, bt, sl, page, b)
        out64, p_hat = ref_attn.exact_attention(q[b], kh, vh, sm_scale=sm, return_probs=True)
        err_t = (out_t[b].double() - out64).abs().max().item()
        err_n = (out_n[b].double() - out64).abs().max().item()
        floor = 2 * 2.0**-24 * out64.abs().max().item()  # 2 ulps: a 1-token row is exact in both
        assert err_n <= 2 * err_t + floor, f"b={b}: out error {err_n:.3g} vs torch fp32 {err_t:.3g}"
        _, p_true = ref_attn.exact_attention(q[b], exact[b][0].float(), vh, sm_scale=sm,
                                             return_probs=True)
        tv = tv_distance(p_true, p_hat)
        assert (c_n[b].double() >= tv).all(), f"b={b}: cert {c_n[b]} below true TV {tv}"
    assert torch.isfinite(c_n).all()
    torch.testing.assert_close(c_n, c_t, rtol=1e-5, atol=1e-6)
    return out_n, c_n


CASES = DECODE_SHAPES  # (seq_lens, Hq, Hkv, D, P), tests/cases.py


@pytest.mark.parametrize("key", ["slot", "position"])
@pytest.mark.parametrize("bits", [8, 16, 24])
@pytest.mark.parametrize("radius", ["det", "prob", "min"])
@pytest.mark.parametrize("seq_lens,hq,hkv,d,page", CASES)
def test_native_decode_within_2x_torch_error_and_cert_matches_reference_and_is_sound(
        seq_lens, hq, hkv, d, page, radius, bits, key):
    lkv, q, bt, sl, exact = make_case(seq_lens=seq_lens, hq=hq, hkv=hkv, d=d, page=page,
                                      bits=bits, seed=len(seq_lens) * 7 + hq + d + bits, key=key)
    # anytime budget: per-sequence delta_loc from the token position
    dl = anytime_delta(CertConfig(allocation="anytime"), num_layers=30, num_q_heads=hq,
                       positions=sl)
    _check_float_and_cert_tiers(lkv, q, bt, sl, exact, page=page, radius=radius, delta_loc=dl,
                                sm=d ** -0.5)


@pytest.mark.parametrize("group", [8, 16, 64])
def test_native_decode_other_group_sizes_and_random_deltas(group):
    lkv, q, bt, sl, exact = make_case(seq_lens=(40, 3), hq=6, hkv=2, d=64, page=16, group=group,
                                      seed=group)
    dl = torch.tensor([1e-9, 0.3], dtype=torch.float64)
    _check_float_and_cert_tiers(lkv, q, bt, sl, exact, page=16, radius="min", delta_loc=dl,
                                sm=0.125)


def test_nonfinite_query_head_gets_inf_cert_and_finite_output_like_the_reference():
    lkv, q, bt, sl, _ = make_case(seq_lens=(17, 40), hq=6, hkv=2, d=64, page=16, seed=3)
    q[0, 4, 7] = float("inf")
    q[1, 0, 0] = float("nan")
    kw = dict(page_size=16, sm_scale=0.125, cert=CertConfig(),
              delta_loc=torch.full((2,), 1e-6, dtype=torch.float64))
    out_n, c_n = decode_batched(q, lkv, bt, sl, **kw, native="on")
    out_t, c_t = decode_batched(q, lkv, bt, sl, **kw, native="off")
    bad = torch.zeros(2, 6, dtype=torch.bool)
    bad[0, 4] = bad[1, 0] = True
    assert torch.isinf(c_n[bad]).all() and torch.isfinite(c_n[~bad]).all()
    assert torch.isfinite(out_n).all()
    torch.testing.assert_close(out_n, out_t, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(c_n[~bad], c_t[~bad], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("side", [K_SIDE, V_SIDE])
def test_flagged_token_gives_inf_cert_on_its_kv_group_only(side):
    lkv, q, bt, sl, _ = make_case(seq_lens=(20, 33), hq=6, hkv=2, d=64, page=16, seed=4)
    # rewrite token 5 of sequence 1 with a NaN on KV head 1 (the reference flags it)
    slot = ref_attn.token_slots(bt[1], 33, page_size=16)[5:6]
    k, v = torch.randn(1, 2, 64), torch.randn(1, 2, 64)
    (k if side == K_SIDE else v)[0, 1, 3] = float("nan")
    write_(lkv, k, v, slots=slot)
    assert torch.isinf(lkv.storage(side)["wit"][slot, 1].float()).all()
    kw = dict(page_size=16, sm_scale=0.125, cert=CertConfig(),
              delta_loc=torch.full((2,), 1e-6, dtype=torch.float64))
    out_n, c_n = decode_batched(q, lkv, bt, sl, **kw, native="on")
    out_t, c_t = decode_batched(q, lkv, bt, sl, **kw, native="off")
    assert torch.isinf(c_n[1, 3:]).all() and torch.isinf(c_t[1, 3:]).all()  # query heads of KV head 1
    assert torch.isfinite(c_n[0]).all() and torch.isfinite(c_n[1, :3]).all()
    torch.testing.assert_close(c_n[torch.isfinite(c_n)], c_t[torch.isfinite(c_t)], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_n, out_t, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("flags", [(), PORTABLE])
def test_fp16_conversion_is_torchs_on_every_bit_pattern(flags):
    """wc_h2f (the scales, witnesses, outlier values and fp16 exact rows of every C path): all
    65,536 fp16 patterns convert to torch's float32 bitwise (zeros, subnormals, normals, inf);
    NaN patterns stay NaN."""
    import ctypes

    fn = native.lib(extra_flags=flags).wc_h2f_probe
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    fn.restype = ctypes.c_int32
    h = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    out = torch.empty(65536, dtype=torch.float32)
    assert fn(h.data_ptr(), 65536, out.data_ptr()) == 0
    want = h.view(torch.float16).float()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(out), nan)
    assert torch.equal(out[~nan].view(torch.int32), want[~nan].view(torch.int32))


def test_threads_and_the_portable_build_give_the_same_bits():
    lkv, q, bt, sl, _ = make_case(seq_lens=(1, 67, 300, 16), hq=8, hkv=2, d=128, page=16, seed=6)
    kw = dict(page_size=16, sm_scale=128 ** -0.5, radius="min",
              delta_loc=torch.tensor([1e-3, 1e-5, 1e-7, 0.5], dtype=torch.float64))
    one = nd.decode_attention(q, lkv, bt, sl, **kw)
    three = nd.decode_attention(q, lkv, bt, sl, **kw, num_threads=3)
    plain = nd.decode_attention(q, lkv, bt, sl, **kw, _extra_flags=PORTABLE)
    for other in (three, plain):
        assert torch.equal(one[0], other[0]) and torch.equal(one[1], other[1])


@pytest.mark.parametrize("bits", [8, 16, 24])
@pytest.mark.parametrize("flags", [(), PORTABLE])
def test_dither_is_bitwise_the_reference_philox(bits, flags):
    gen = torch.Generator().manual_seed(bits)
    slots = torch.randint(0, 2**32, (257,), generator=gen, dtype=torch.int64)
    slots[:3] = torch.tensor([0, 1, 2**32 - 1])
    epochs = torch.randint(0, 2**32, (257,), generator=gen, dtype=torch.int64)
    epochs[:2] = torch.tensor([0, 2**32 - 1])
    for layer, seed, side, d in ((0, 0, K_SIDE, 64), (65535, 2**64 - 1, V_SIDE, 128),
                                 (17, SEED, V_SIDE, 72)):  # 72: a partial last chunk (b=8, 24)
        heads = 5
        want = dither(seed=seed, layer=layer, kv_heads=torch.arange(heads), side=side, slots=slots,
                      epochs=epochs, head_dim=d, bits=bits)
        got = nd.dither(seed=seed, layer=layer, num_kv_heads=heads, side=side, slots=slots,
                        epochs=epochs, head_dim=d, bits=bits, extra_flags=flags)
        assert torch.equal(got, want), f"layer {layer} d {d}: {(got != want).sum()} values differ"


@pytest.mark.parametrize("key", ["slot", "position"])
@pytest.mark.parametrize("bits", [8, 16, 24])
@pytest.mark.parametrize("d,group", [(64, 32), (128, 16), (64, 8)])
def test_dequantized_kv_is_bitwise_the_reference_gather(bits, d, group, key):
    lkv, _, bt, sl, _ = make_case(seq_lens=(97, 300), hq=4, hkv=4, d=d, page=16, bits=bits,
                                  group=group, seed=bits + d, key=key)
    k = torch.randn(1, 4, d)
    k[0, 2, 1] = float("inf")  # one flagged token-head: reads 0 in both
    write_(lkv, k, k, slots=torch.tensor([3]))
    slots = torch.randperm(lkv.num_slots)
    for side in (K_SIDE, V_SIDE):
        for flags in ((), PORTABLE):
            got = nd.gather(lkv, side, slots, extra_flags=flags)
            assert torch.equal(got, gather(lkv, side, slots)[0])


def _pools_equal(a: LayerKV, b: LayerKV) -> None:
    for side in (K_SIDE, V_SIDE):
        for name, t in a.storage(side).items():
            u = b.storage(side)[name]
            assert torch.equal(t, u), f"side {side} {name}: {(t != u).sum()} elements differ"


@pytest.mark.parametrize("key", ["slot", "position"])
@pytest.mark.parametrize("bits", [8, 16, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_native_write_is_bitwise_the_reference_write(bits, dtype, key):
    gen = torch.Generator().manual_seed(bits)
    T, H, D = 1500, 3, 64
    epochs = torch.randint(0, 2**32, (4096,), generator=gen, dtype=torch.int64)
    positions = random_positions(4096, gen) if key == "position" else None
    mk = lambda: LayerKV.allocate(num_slots=4096, num_kv_heads=H, head_dim=D,  # noqa: E731
                                  quant=QuantConfig(dither_bits=bits), layer=9, seed=SEED,
                                  epochs=epochs, positions=positions)
    a, b = mk(), mk()
    mag = torch.logspace(-9, 6 if dtype != torch.float16 else 4, T)[:, None, None]
    k = (torch.randn(T, H, D, generator=gen) * mag).to(dtype)
    v = torch.randn(T, H, D, generator=gen).to(dtype)
    k[5, 1, 3] = float("nan")
    v[7, 2, 0] = float("-inf")
    k[9] = 0.0  # all-zero rows: floor scale 2^-14, codes and witnesses 0
    if dtype != torch.float16:
        v[11, 0, 2] = 1e7  # scale overflows fp16: flagged
    slots = torch.randperm(4096, generator=gen)[:T]
    write_(a, k, v, slots=slots)
    nw.write_(b, k, v, slots=slots)
    _pools_equal(a, b)
    assert torch.isinf(b.storage(K_SIDE)["scales"][slots[5], 1].float()).all()


def test_native_write_refuses_bad_slots_without_writing():
    lkv = LayerKV.allocate(num_slots=64, num_kv_heads=2, head_dim=64, quant=QuantConfig(),
                           layer=0, seed=1, epochs=torch.zeros(64, dtype=torch.int64))
    x = torch.randn(2, 2, 64)
    for bad in ([3, 3], [1, 64], [-1, 2]):
        with pytest.raises(ValueError, match="slot"):
            nw.write_(lkv, x, x, slots=torch.tensor(bad))
    assert not lkv.k["codes"].any() and not lkv.v["scales"].any()


def test_position_outside_32_bits_raises_on_write_gather_and_decode():
    lkv, q, bt, sl, _ = make_case(seq_lens=(20,), hq=2, hkv=1, d=64, page=16, seed=8,
                                  key="position")
    slots = ref_attn.token_slots(bt[0], 20, page_size=16)
    for bad in (2**32, -1):
        lkv.positions[slots[4]] = bad
        x = torch.randn(1, 1, 64)
        with pytest.raises(ValueError, match="position outside"):
            nw.write_(lkv, x, x, slots=slots[4:5])
        with pytest.raises(ValueError, match="position outside"):
            nd.gather(lkv, K_SIDE, slots)
        with pytest.raises(ValueError, match="position outside"):
            nd.decode_attention(q, lkv, bt, sl, page_size=16, sm_scale=0.125, radius="det",
                                delta_loc=torch.full((1,), 1e-3, dtype=torch.float64))


def test_block_table_outside_the_pool_raises_instead_of_reading_out_of_bounds():
    lkv, q, bt, sl, _ = make_case(seq_lens=(20,), hq=2, hkv=1, d=64, page=16, seed=8)
    bt[0, 1] = 10_000
    with pytest.raises(ValueError, match="slot outside"):
        nd.decode_attention(q, lkv, bt, sl, page_size=16, sm_scale=0.125, radius="det",
                            delta_loc=torch.full((1,), 1e-3, dtype=torch.float64))


def test_unavailable_native_falls_back_with_one_warning_and_on_raises(monkeypatch, tmp_path, caplog):
    lkv, q, bt, sl, _ = make_case(seq_lens=(5, 9), hq=4, hkv=2, d=64, page=16, seed=9)
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setattr(native, "_WARNED", set())
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path))
    assert not native.available() and "gcc not found" in native.reason()
    kw = dict(page_size=16, sm_scale=0.125, cert=CertConfig(),
              delta_loc=torch.full((2,), 1e-4, dtype=torch.float64))
    with caplog.at_level(logging.WARNING, logger="witcert.native"):
        a = decode_batched(q, lkv, bt, sl, **kw)
        b = decode_batched(q, lkv, bt, sl, **kw)
    assert len([r for r in caplog.records if "native CPU decode unavailable" in r.message]) == 1
    off = decode_batched(q, lkv, bt, sl, **kw, native="off")
    assert torch.equal(a[0], off[0]) and torch.equal(b[1], off[1])
    with pytest.raises(RuntimeError, match="gcc not found"):
        decode_batched(q, lkv, bt, sl, **kw, native="on")


def test_concurrent_first_builds_share_one_cached_library(tmp_path):
    env = dict(os.environ, **{native.ENV_CACHE: str(tmp_path)})
    code = "import witcert.native as n, sys; sys.exit(0 if n.available() else 1)"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(2)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    files = sorted(f.name for f in tmp_path.iterdir())
    assert len(files) == 1 and files[0].endswith(".so"), files  # no temporary left behind


def test_cache_key_changes_with_the_flags(tmp_path, monkeypatch):
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path))
    a, b = native.build(), native.build(extra_flags=PORTABLE)
    assert a != b and a.parent == b.parent == tmp_path
    assert native.build() == a  # cached: no rebuild


def test_anytime_delta_from_a_list_is_the_tensor_computation_bit_for_bit():
    cert = CertConfig(allocation="anytime", delta=0.05)
    pos = [1, 2, 7, 300, 65535, 2**20 + 3]
    t = anytime_delta(cert, num_layers=30, num_q_heads=9, positions=torch.tensor(pos))
    assert torch.equal(anytime_delta(cert, num_layers=30, num_q_heads=9, positions=pos), t)
    assert math.isclose(float(t[0]), 6 * 0.05 / math.pi**2 / 270, rel_tol=1e-15)


def test_key_with_overflowed_witness_and_finite_scale_gets_inf_cert_on_both_paths():
    """A group of +-8e6 has a finite fp16 scale (63264) but a witness above 65504 (+inf):
    the key is read as 0, so its radius must be +inf (a finite u_prob would certify a
    logit the key no longer has: the true TV below is 0.04)."""
    lkv = LayerKV.allocate(num_slots=16, num_kv_heads=1, head_dim=64, quant=QuantConfig(),
                           layer=0, seed=3, epochs=torch.zeros(16, dtype=torch.int64))
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(16, 1, 64, generator=gen), torch.randn(16, 1, 64, generator=gen)
    k[5, 0, :32] = torch.linspace(-8e6, 8e6, 32)
    write_(lkv, k, v, slots=torch.arange(16))
    assert torch.isfinite(lkv.k["scales"][5].float()).all() and torch.isinf(lkv.k["wit"][5, 0, 0])
    q = torch.zeros(1, 1, 64)
    q[0, 0, 0] = 1e-6  # exact logit of token 5: 0.125 * 1e-6 * -8e6 = -1; zeroed key: 0
    bt, sl = torch.tensor([[0]], dtype=torch.int32), torch.tensor([16], dtype=torch.int32)
    kw = dict(page_size=16, sm_scale=0.125, cert=CertConfig(radius="min"),
              delta_loc=torch.tensor([1e-3], dtype=torch.float64))
    for mode in ("on", "off"):
        out, c = decode_batched(q, lkv, bt, sl, **kw, native=mode)
        assert torch.isinf(c).all() and torch.isfinite(out).all(), mode
    kh = gather(lkv, K_SIDE, torch.arange(16))[0]
    kh[5] = 0.0  # what both paths attend
    _, p_hat = ref_attn.exact_attention(q[0], kh, v, sm_scale=0.125, return_probs=True)
    _, p_true = ref_attn.exact_attention(q[0], k, v, sm_scale=0.125, return_probs=True)
    assert tv_distance(p_true, p_hat).item() > 0.03


def _overlay_case(*, dtype, seed, seq_lens=(1, 17, 67, 40), hq=6, hkv=2, d=64, page=16):
    """make_case plus a gate ExactCopy holding the written values: about 40% of the batch's
    (slot, KV head) entries live, about 20% more flagged at a stale epoch with their exact
    copy overwritten by garbage (any use of a stale entry shows). Returns (lkv, q, bt, sl,
    exact values per sequence, the ExactCopy, live bool [num_slots, Hkv])."""
    from witcert.integrations.vllm.gate import ExactCopy

    lkv, q, bt, sl, exact = make_case(seq_lens=seq_lens, hq=hq, hkv=hkv, d=d, page=page,
                                      seed=seed, dtype=dtype)
    ex = ExactCopy(num_slots=lkv.num_slots, num_kv_heads=hkv, head_dim=d, dtype=dtype,
                   epochs=lkv.epochs)
    slots = torch.cat([ref_attn.token_slots(bt[b], n, page_size=page)
                       for b, n in enumerate(seq_lens)])
    for b, n in enumerate(seq_lens):
        ex.write_(ref_attn.token_slots(bt[b], n, page_size=page), *exact[b])
    gen = torch.Generator().manual_seed(seed + 1)
    r = torch.rand(slots.numel(), hkv, generator=gen)
    si, hi = (r < 0.4).nonzero(as_tuple=True)
    ex.mark_(slots[si], hi)
    si, hi = (r > 0.8).nonzero(as_tuple=True)
    ex.exact[slots[si], hi] = True
    ex.exact_epoch[slots[si], hi] = lkv.epochs[slots[si]] ^ 1  # stale
    ex.k[slots[si], hi] = torch.full((d,), 40.0, dtype=dtype)
    ex.v[slots[si], hi] = torch.full((d,), -40.0, dtype=dtype)
    return lkv, q, bt, sl, exact, ex, ex.live(torch.arange(lkv.num_slots))


def _torch_gated_first_pass(q, lkv, ex, bt, sl, *, page, sm, radius, delta_loc):
    """decode_gated's first pass (_terms, the live overlay, _attend): tau so large that
    nothing fires, the torch path."""
    from witcert.config import RepairPolicy
    from witcert.integrations.vllm.attend import decode_gated

    before = ex.exact.clone()
    o, c, ev = decode_gated(q, lkv, ex, bt, sl, page_size=page, sm_scale=sm,
                            cert=CertConfig(radius=radius, tau=1e30), delta_loc=delta_loc,
                            repair=RepairPolicy(mode="block"), native="off")
    assert ev.fired == 0 and torch.equal(ex.exact, before)
    return o, c


def test_exact_overlay_without_live_entries_is_bitwise_no_overlay():
    lkv, q, bt, sl, _, ex, _ = _overlay_case(dtype=torch.bfloat16, seed=21)
    ex.exact &= ex.exact_epoch != lkv.epochs[:, None]  # keep only the stale flags
    assert bool(ex.exact.any()) and not bool(ex.live(torch.arange(lkv.num_slots)).any())
    kw = dict(page_size=16, sm_scale=0.125, radius="min",
              delta_loc=torch.tensor([1e-3, 1e-5, 1e-7, 0.5], dtype=torch.float64))
    plain = nd.decode_attention_full(q, lkv, bt, sl, **kw)
    over = nd.decode_attention_full(q, lkv, bt, sl, **kw, exact=ex)
    for a, b in zip(plain, over):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("radius", ["det", "prob", "min"])
def test_exact_overlay_matches_the_torch_gated_first_pass_and_is_sound(dtype, radius):
    seq_lens, page, sm = (1, 17, 67, 40), 16, 0.125
    lkv, q, bt, sl, exact, ex, live = _overlay_case(dtype=dtype, seed=22, seq_lens=seq_lens)
    assert bool(live.any())
    dl = anytime_delta(CertConfig(allocation="anytime"), num_layers=30, num_q_heads=6,
                       positions=sl)
    out_n, c_n = nd.decode_attention(q, lkv, bt, sl, page_size=page, sm_scale=sm, radius=radius,
                                     delta_loc=dl, exact=ex, num_threads=2)
    out_t, c_t = _torch_gated_first_pass(q, lkv, ex, bt, sl, page=page, sm=sm, radius=radius,
                                         delta_loc=dl)
    assert torch.isfinite(c_n).all()
    torch.testing.assert_close(out_n, out_t, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(c_n, c_t, rtol=1e-5, atol=1e-6)
    plain_o, plain_c = nd.decode_attention(q, lkv, bt, sl, page_size=page, sm_scale=sm,
                                           radius=radius, delta_loc=dl)
    assert not torch.equal(out_n[1:], plain_o[1:]) and bool((c_n <= plain_c).all())
    for b, n in enumerate(seq_lens):
        slots = ref_attn.token_slots(bt[b], n, page_size=page)
        kh, vh = _stored(lkv, bt, sl, page, b)
        lv = live[slots][..., None]
        kx, vx = exact[b][0].float(), exact[b][1].float()
        kmix, vmix = torch.where(lv, kx, kh), torch.where(lv, vx, vh)
        out64, p_hat = ref_attn.exact_attention(q[b], kmix, vmix, sm_scale=sm, return_probs=True)
        torch.testing.assert_close(out_n[b].double(), out64, rtol=1e-5, atol=2e-6)
        _, p_true = ref_attn.exact_attention(q[b], kx, vx, sm_scale=sm, return_probs=True)
        tv = tv_distance(p_true, p_hat)
        assert (c_n[b].double() >= tv).all(), f"b={b}: cert {c_n[b]} below true TV {tv}"


def test_exact_overlay_all_live_gives_only_the_arithmetic_cert_and_exact_attention():
    lkv, q, bt, sl, exact, ex, _ = _overlay_case(dtype=torch.float16, seed=23)
    for b, n in enumerate((1, 17, 67, 40)):  # undo the stale garbage
        ex.write_(ref_attn.token_slots(bt[b], n, page_size=16), *exact[b])
    ex.mark_(torch.arange(lkv.num_slots).repeat_interleave(2),
             torch.arange(2).repeat(lkv.num_slots))
    # a flagged stored token (NaN written) that is live exact reads the exact values
    slot = ref_attn.token_slots(bt[2], 67, page_size=16)[5:6]
    k, v = exact[2][0][5:6].clone(), exact[2][1][5:6].clone()
    k[0, 1, 3] = float("nan")
    write_(lkv, k, v, slots=slot)
    assert torch.isinf(lkv.storage(K_SIDE)["wit"][slot, 1].float()).all()
    out_n, c_n = nd.decode_attention(q, lkv, bt, sl, page_size=16, sm_scale=0.125, radius="min",
                                     delta_loc=torch.full((4,), 1e-6, dtype=torch.float64),
                                     exact=ex)
    # exact entries: no compression radius, only the float64 arithmetic slack (PROOFS 5)
    assert bool(((c_n > 0) & (c_n < 1e-9)).all())
    for b, n in enumerate((1, 17, 67, 40)):
        out64 = ref_attn.exact_attention(q[b], exact[b][0].float(), exact[b][1].float(),
                                         sm_scale=0.125)
        torch.testing.assert_close(out_n[b].double(), out64, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("side,val", [("v", "nan"), ("v", "inf"), ("k", "nan"), ("k", "inf")])
def test_a_live_exact_entry_holding_a_non_finite_value_gets_the_spec_s_bounds(side, val):
    """A live exact entry whose copy holds NaN / inf (the gate never marks one: reachable by marking
    it directly): the C decode's certificate and vbound are the reference's (+inf vbound for a NaN
    value, where the C decode's running maximum used to skip the NaN norm: an audit's finding)."""
    from witcert.runtime.exact import ExactCopy
    gen = torch.Generator().manual_seed(0)
    S, D = 16, 64
    layer = LayerKV.allocate(num_slots=S, num_kv_heads=1, head_dim=D, quant=QuantConfig(), layer=1, seed=7,
                             epochs=torch.zeros(S, dtype=torch.int64))
    k, v = torch.randn(S, 1, D, generator=gen), torch.randn(S, 1, D, generator=gen)
    write_(layer, k, v, slots=torch.arange(S))
    copy = ExactCopy(num_slots=S, num_kv_heads=1, head_dim=D, dtype=torch.float32, epochs=layer.epochs)
    copy.write_(torch.arange(S), k, v)
    getattr(copy, side)[4, 0, 7] = float(val)
    copy.mark_(torch.tensor([4]), 0)
    q = torch.randn(1, 2, D, generator=gen)
    bt, sl = torch.arange(S, dtype=torch.int32)[None], torch.tensor([S], dtype=torch.int32)
    _, _, c, vb = nd.decode_attention_full(q, layer, bt, sl, page_size=1, sm_scale=D ** -0.5, radius="det",
                                           delta_loc=None, exact=copy)
    ref = ref_attn.decode_attention(q, layer, bt, sl, page_size=1, sm_scale=D ** -0.5, cert=CertConfig(radius="det"),
                                    delta_loc=1e-6, exact=copy.batch_entries(bt, sl, page_size=1))
    assert torch.equal(torch.isinf(c), torch.isinf(ref.cert)) and torch.equal(torch.isinf(vb), torch.isinf(ref.vbound))
    assert not torch.isnan(c).any() and not torch.isnan(vb).any()
    if side == "v":
        assert torch.isinf(vb).all()


def test_exact_overlay_of_the_wrong_kind_is_refused():
    lkv, q, bt, sl, _, ex, _ = _overlay_case(dtype=torch.bfloat16, seed=24)
    kw = dict(page_size=16, sm_scale=0.125, radius="det",
              delta_loc=torch.full((4,), 1e-6, dtype=torch.float64))
    good = ex.k
    strided = good.transpose(0, 1).contiguous().transpose(0, 1)  # right shape, not contiguous
    for bad, what in ((good.to(torch.float64), "'k'"), (strided, "'k'"), (good[:-1], "'k'")):
        ex.k = bad
        assert nd.exact_unsupported(ex, lkv) is not None
        with pytest.raises(ValueError, match=what):
            nd.decode_attention(q, lkv, bt, sl, **kw, exact=ex)
    ex.k = good
    ex.v = good.to(torch.float16)
    with pytest.raises(ValueError, match="'v'"):
        nd.decode_attention(q, lkv, bt, sl, **kw, exact=ex)
    ex.v = good.clone()
    ex.exact_epoch = ex.exact_epoch.to(torch.int32)
    with pytest.raises(ValueError, match="exact_epoch"):
        nd.decode_attention(q, lkv, bt, sl, **kw, exact=ex)
    with pytest.raises(ValueError, match="lacks"):
        nd.decode_attention(q, lkv, bt, sl, **kw, exact=object())


# ---- outlier bypass (m > 0) -------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 16, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_native_write_with_outliers_is_bitwise_the_reference_write(bits, dtype):
    """codes / scales / wit / outl bitwise, including a massive fp16-exact 60000 in a bypassed
    channel, bypassed values fp16 cannot hold (bf16 / fp32 input: the token-head is flagged),
    a NaN in a bypassed channel and a group whose channels are all bypassed."""
    gen = torch.Generator().manual_seed(bits + 3)
    T, H, D, m = 600, 3, 64, 4
    kidx = outlier_indices(hkv=H, d=D, m=m, seed=bits)
    vidx = kidx.clone()
    vidx[1] = torch.arange(2 * m)  # V head 1: all 8 channels of its first group bypassed (G 8)
    epochs = torch.randint(0, 2**32, (2048,), generator=gen, dtype=torch.int64)
    mk = lambda: LayerKV.allocate(  # noqa: E731
        num_slots=2048, num_kv_heads=H, head_dim=D, layer=9, seed=SEED, epochs=epochs,
        quant=QuantConfig(dither_bits=bits, outliers=m, group_size=8), k_outlier_idx=kidx,
        v_outlier_idx=vidx)
    a, b = mk(), mk()
    mag = torch.logspace(-6, 4, T)[:, None, None]
    k = (torch.randn(T, H, D, generator=gen) * mag).to(dtype)
    v = torch.randn(T, H, D, generator=gen).to(dtype)
    small = torch.randint(-8, 9, (10, H, 2 * m), generator=gen).to(dtype)
    k[:10, torch.arange(H)[:, None], kidx] = small  # exact in every dtype: rows not flagged
    k[:, 0, kidx[0, 0]] = 60000.0  # fp16-exact (bf16 rounds it to 59904): stored exactly
    k[4, 2, kidx[2, 1]] = float("nan")
    k[6, 1, kidx[1, 2]] = 1.0 + 2.0**-12  # not an fp16 value (fp32 input only)
    slots = torch.randperm(2048, generator=gen)[:T]
    write_(a, k, v, slots=slots)
    nw.write_(b, k, v, slots=slots)
    _pools_equal(a, b)
    assert float(b.k["outl"][slots[0], 0, 0]) == float(k[0, 0, kidx[0, 0]]) >= 59904.0
    assert float(b.k["scales"][slots[0], 0].float().max()) == 2.0**-14  # the floor: ignored
    assert torch.isinf(b.k["scales"][slots[4], 2].float()).all()
    if dtype == torch.float32:
        assert torch.isinf(b.k["wit"][slots[6], 1].float()).all()


@pytest.mark.parametrize("bits", [8, 16, 24])
def test_dequantized_kv_with_outliers_is_bitwise_the_reference_gather(bits):
    lkv, _, _, _, _ = make_case(seq_lens=(97, 150), hq=4, hkv=2, d=64, page=16, bits=bits,
                                outliers=4, massive=True, dtype=torch.float16, seed=bits)
    k = torch.randn(1, 2, 64)
    k[0, 1, int(lkv.k_outlier_idx[1, 0])] = float("inf")  # a flagged token-head reads 0
    write_(lkv, k, k, slots=torch.tensor([3]))
    slots = torch.randperm(lkv.num_slots)
    for side in (K_SIDE, V_SIDE):
        for flags in ((), PORTABLE):
            assert torch.equal(nd.gather(lkv, side, slots, extra_flags=flags),
                               gather(lkv, side, slots)[0])


@pytest.mark.parametrize("radius", ["det", "prob", "min"])
@pytest.mark.parametrize("massive", [False, True])
def test_native_decode_with_outliers_is_sound_against_the_exact_tv(radius, massive):
    """cert >= TV(softmax of the exact logits, softmax of the logits the C code used), the
    exact side in double-double (tests/fpexact.py); massive values sit in bypassed channels,
    where the C code reads the fp16 value exactly and bounds |q_c| |outl_c| in S_t."""
    import fpexact

    seq_lens, hq, hkv, d, page = (1, 17, 67, 40), 6, 2, 64, 16
    lkv, q, bt, sl, exact = make_case(seq_lens=seq_lens, hq=hq, hkv=hkv, d=d, page=page,
                                      outliers=4, massive=massive, dtype=torch.float16,
                                      seed=31 + massive)
    dl = torch.full((4,), 1e-5, dtype=torch.float64)
    dbg = {}
    _, _, c, _ = nd.decode_attention_full(q, lkv, bt, sl, page_size=page, sm_scale=0.125,
                                          radius=radius, delta_loc=dl, debug=dbg)
    assert torch.isfinite(c).all()
    kvh = torch.arange(hq) // (hq // hkv)
    for b, n in enumerate(seq_lens):
        z = fpexact.exact_shifted_logits(q[b], exact[b][0].float()[:, kvh].transpose(0, 1),
                                         sm_scale=0.125)
        tv = fpexact.tv(z, dbg["logits"][b, :, :n], c[b].double())
        assert (c[b].double() >= tv).all(), f"b={b}: cert {c[b]} below the exact TV {tv}"
        # the debug outputs: the row's entries set, NaN past its seq_len (written by C)
        assert not dbg["logits"][b, :, :n].isnan().any() and dbg["logits"][b, :, n:].isnan().all()
        assert not dbg["radius"][b, :, :n].isnan().any() and dbg["radius"][b, :, n:].isnan().all()
    if massive:  # the same keys with the massive channel at 0: the radii differ only by the
        # arithmetic slack of |q_c| |outl_c| (~1e-14 relative, then the f32 round-up): bypass
        # costs no compression radius (unbypassed, 60000 would set its group scale to ~474)
        calm = LayerKV.allocate(num_slots=lkv.num_slots, num_kv_heads=hkv, head_dim=d,
                                quant=lkv.quant, layer=lkv.layer, seed=SEED, epochs=lkv.epochs,
                                k_outlier_idx=lkv.k_outlier_idx, v_outlier_idx=lkv.v_outlier_idx)
        for b, n in enumerate(seq_lens):
            k = exact[b][0].clone()
            k[:, torch.arange(hkv), lkv.k_outlier_idx[:, 0]] = 0.0
            write_(calm, k, exact[b][1], slots=ref_attn.token_slots(bt[b], n, page_size=page))
        dbg2 = {}
        nd.decode_attention_full(q, calm, bt, sl, page_size=page, sm_scale=0.125, radius=radius,
                                 delta_loc=dl, debug=dbg2)
        live = ~torch.isnan(dbg["radius"])
        u1, u0 = dbg["radius"][live].double(), dbg2["radius"][live].double()
        assert torch.equal(live, ~torch.isnan(dbg2["radius"]))
        assert ((u1 - u0).abs() <= 2.0**-22 * u0).all() and bool((u1 >= u0).all())  # f32 ulps


def test_c_constants_match_the_python_ones():
    """The C code's copies of the rounding-model constants equal the Python ones they name
    (C cannot import them; the build would silently keep a stale value)."""
    import re
    from pathlib import Path

    from witcert.ref.cert import FP_BIAS_SLACK
    from witcert.ref.witness import WITNESS_SLACK

    src = Path(nd.__file__).with_name("common.h").read_text()
    write_src = Path(nd.__file__).with_name("write.c").read_text()
    bias = re.search(r"#define WC_DITHER_BIAS_SLACK (\S+)", src).group(1)
    assert float.fromhex(bias) == FP_BIAS_SLACK, (bias, FP_BIAS_SLACK.hex())
    wit = re.search(r"#define WC_WITNESS_SLACK \(1\.0 \+ (\S+)\)", write_src).group(1)
    # the C macro is 1 + wit: compare the increments (1 + x rounds away small differences)
    assert float.fromhex(wit) == WITNESS_SLACK - 1.0, (wit, (WITNESS_SLACK - 1.0).hex())


def test_a_kv_head_selection_decodes_those_items_with_the_bits_of_the_full_call():
    """``kv_heads`` (the gate's re-decode of the KV heads its repair changed): the selected
    (sequence, KV head) items give out, lse, cert, vbound and the debug logits / radii of the
    full call bit for bit (the others are left unset)."""
    lkv, q, bt, sl, _ = make_case(seq_lens=(1, 67, 300, 16), hq=6, hkv=3, d=64, page=16, seed=8)
    kw = dict(page_size=16, sm_scale=0.125, radius="min",
              delta_loc=torch.tensor([1e-3, 1e-5, 1e-7, 0.5], dtype=torch.float64))
    dbg_full, dbg_sel = {}, {}
    full = nd.decode_attention_full(q, lkv, bt, sl, **kw, debug=dbg_full)
    sel = torch.tensor([[True, False, False], [False, True, True], [False, False, False],
                        [True, True, True]])
    part = nd.decode_attention_full(q, lkv, bt, sl, **kw, debug=dbg_sel, kv_heads=sel)
    rows = sel.repeat_interleave(2, dim=1)  # [B, Hq]: query heads of the selected KV heads
    for a, b in zip(full, part):
        assert torch.equal(a[rows], b[rows])
    for key in ("logits", "radius"):
        for i, n in enumerate(sl.tolist()):
            assert torch.equal(dbg_full[key][i, rows[i], :n], dbg_sel[key][i, rows[i], :n])


@pytest.mark.parametrize("tau", [0.0, 0.2, float("inf")])
def test_debug_rows_of_the_fired_heads_only_keep_every_output_and_those_rows(tau):
    """``debug_tau`` (the gate's first pass: the C repair reads the fired heads' terms only):
    out, lse, cert and vbound are the full call's bit for bit, and every query head whose
    certificate is >= ``debug_threshold(tau)`` (every head that fires at tau, in f32 or float64)
    has the full call's debug logits and radii, NaN past its seq_len included. tau 0: every
    head; inf: none (the buffers are left as allocated)."""
    lkv, q, bt, sl, _ = make_case(seq_lens=(1, 67, 300, 16), hq=6, hkv=3, d=64, page=16, seed=8)
    q[2, 4, 5] = float("nan")  # a non-finite query head: cert +inf, radii +inf
    kw = dict(page_size=16, sm_scale=0.125, radius="min",
              delta_loc=torch.tensor([1e-3, 1e-5, 1e-7, 0.5], dtype=torch.float64))
    dbg_full, dbg_sel = {}, {}
    full = nd.decode_attention_full(q, lkv, bt, sl, **kw, debug=dbg_full)
    thr = nd.debug_threshold(tau)
    part = nd.decode_attention_full(q, lkv, bt, sl, **kw, debug=dbg_sel, debug_tau=thr)
    for a, b in zip(full, part):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    cert = full[2]
    rows = cert.double() >= thr
    assert not (cert > tau)[~rows].any()  # every head that fires is written
    assert rows.all() if tau == 0.0 else (~rows).any()  # (and at 0.2 / inf some are not)
    for key in ("logits", "radius"):
        a, b = dbg_full[key][rows], dbg_sel[key][rows]
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def test_debug_threshold_keeps_every_head_that_fires_in_either_precision():
    import math
    for tau in (0.2, 0.1, 1e-7, 0.5, 3.0):
        thr = nd.debug_threshold(tau)
        t32 = float(torch.tensor(tau, dtype=torch.float32))
        assert thr < tau and thr < t32 and thr > min(tau, t32) - 1e-12 * max(tau, 1.0)
        assert math.isfinite(thr)
