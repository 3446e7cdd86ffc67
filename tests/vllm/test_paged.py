"""The vLLM adapter's pure-torch parts against the reference (no vllm needed)."""

from __future__ import annotations

import pytest
import torch

from witcert.config import CertConfig, QuantConfig
from witcert.integrations.vllm.attend import anytime_delta, decode_batched
from witcert.integrations.vllm.paged import RecordLayout, layer_kv_view, slot_major
from witcert.ref.attention import decode_attention
from witcert.ref.cert import delta_local
from witcert.ref.compressors import get_compressor
from witcert.ref.pool import gather, write_
from witcert.ref.types import K_SIDE, V_SIDE

pytestmark = pytest.mark.vllm


def _pool(*, head_dim=64, hkv=3, blocks=8, page=16, layer=2, seed=7, quant=QuantConfig()):
    lay = RecordLayout.build(quant, head_dim)
    # vLLM's LBNHC: physical [N, P, H, C], handed to the backend as logical [N, H, P, C]
    kv = torch.zeros(blocks, page, hkv, lay.size, dtype=torch.int8).permute(0, 2, 1, 3)
    epochs = torch.zeros(blocks * page, dtype=torch.int64)
    return kv, layer_kv_view(kv, layout=lay, quant=quant, layer=layer, seed=seed, epochs=epochs,
                             head_dim=head_dim)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group_size", [16, 32, 64])
def test_record_size_is_twice_the_byte_account(head_dim, group_size):
    q = QuantConfig(group_size=group_size)
    lay = RecordLayout.build(q, head_dim)
    assert lay.size == 2 * get_compressor(q).bytes_per_token_head(head_dim)
    assert lay.size == 2 * (head_dim + 4 * head_dim // group_size)  # codes + fp16 scale + fp16 wit


def test_page_views_alias_vllm_page_bytes():
    kv, lkv = _pool()
    k, v = torch.randn(5, 3, 64), torch.randn(5, 3, 64)
    slots = torch.tensor([0, 15, 16, 77, 127])
    write_(lkv, k, v, slots=slots)
    # slot s lives in block s // P at token s % P of vLLM's logical [N, H, P, C] page
    flat = kv.permute(0, 2, 1, 3).reshape(-1, 3, kv.shape[-1])
    touched = (flat != 0).any(-1).any(-1).nonzero().flatten()
    assert touched.tolist() == slots.tolist()
    assert torch.equal(kv[77 // 16, :, 77 % 16, :64], lkv.k["codes"][77])


def test_head_major_layout_is_refused():
    kv = torch.zeros(8, 3, 16, 144, dtype=torch.int8)  # vLLM's LBHNC: [N, H, P, C] physical
    with pytest.raises(ValueError, match="LBNHC"):
        slot_major(kv)


@pytest.mark.parametrize("bits", [8, 16, 24])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_tokens", [1, 16, 97])
def test_page_views_read_back_bitwise_what_the_native_path_reads(bits, head_dim, num_tokens):
    """One dither for the plugin: the page views' reference read-back (the torch path, torch
    Philox) equals the C gather of the same bytes (the native path's own Philox), slot
    epochs anywhere in [0, 2^32)."""
    _native_or_skip()
    from witcert.native.decode import gather as native_gather

    g = torch.Generator().manual_seed(bits + num_tokens)
    _, lkv = _pool(head_dim=head_dim, quant=QuantConfig(dither_bits=bits), layer=65535,
                   seed=2**64 - 3)
    lkv.epochs.copy_(torch.randint(0, 2**32, lkv.epochs.shape, generator=g))
    slots = torch.randperm(lkv.num_slots, generator=g)[:num_tokens]
    k = torch.randn(num_tokens, 3, head_dim, generator=g) * 3
    write_(lkv, k, torch.randn(num_tokens, 3, head_dim, generator=g), slots=slots)
    for side in (K_SIDE, V_SIDE):
        assert torch.equal(gather(lkv, side, slots)[0], native_gather(lkv, side, slots))


@pytest.mark.parametrize("rounds", [10, 7])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_native_write_is_the_reference_write_for_every_dtype_and_rounds(dtype, rounds):
    """The plugin's two writers (C on the native path, the reference on the torch path)
    store the same bytes: model dtypes, Philox 10 / 7 rounds, a flagged token-head."""
    _native_or_skip()
    from witcert.native.write import write_ as native_write_

    x = torch.randn(33, 3, 64).to(dtype) * 4
    x[3, 1, 5] = float("nan")  # flagged token-head
    quant = QuantConfig(philox_rounds=rounds)
    (kv_a, a), (kv_b, b) = _pool(quant=quant), _pool(quant=quant)
    slots = torch.randperm(128)[:33]
    write_(a, x, -x, slots=slots)
    native_write_(b, x, -x, slots=slots)
    assert torch.equal(kv_a, kv_b)


def test_epoch_bump_changes_the_dither_of_a_reused_slot():
    _, lkv = _pool()
    x = torch.randn(1, 3, 64)
    slots = torch.tensor([9])
    write_(lkv, x, x, slots=slots)
    first = lkv.k["codes"][9].clone()
    lkv.epochs[slots] += 1
    write_(lkv, x, x, slots=slots)
    assert not torch.equal(first, lkv.k["codes"][9])
    xhat, _ = gather(lkv, K_SIDE, slots)
    assert (xhat - x).abs().max() < 0.1


@pytest.mark.parametrize("radius", ["det", "prob", "min"])
def test_batched_decode_matches_reference_decode_attention(radius):
    torch.manual_seed(0)
    _, lkv = _pool()
    write_(lkv, torch.randn(128, 3, 64) * 3, torch.randn(128, 3, 64), slots=torch.arange(128))
    bt = torch.tensor([[3, 1, 0, 2], [7, 6, 5, 4], [4, 0, 1, 2], [2, 3, 4, 5]], dtype=torch.int32)
    sl = torch.tensor([40, 17, 1, 64], dtype=torch.int32)  # 1, P+1, 4P: page edges
    q = torch.randn(4, 9, 64)
    q[1, 4, 0] = float("inf")
    cert = CertConfig(radius=radius, allocation="anytime")
    d = anytime_delta(cert, num_layers=30, num_q_heads=9, positions=sl)
    out, c = decode_batched(q, lkv, bt, sl, page_size=16, sm_scale=0.125, cert=cert, delta_loc=d)
    ref = decode_attention(q, lkv, bt, sl, page_size=16, sm_scale=0.125, cert=cert, delta_loc=d)
    torch.testing.assert_close(out, ref.out, atol=2e-6, rtol=1e-5)
    assert torch.isinf(c[1, 4]) and torch.isinf(ref.cert[1, 4])
    torch.testing.assert_close(c, ref.cert, atol=1e-7, rtol=1e-5)


def test_anytime_delta_is_the_reference_allocation_at_the_token_position():
    cert = CertConfig(allocation="anytime", delta=0.05)
    pos = torch.tensor([1, 7, 300])
    got = anytime_delta(cert, num_layers=30, num_q_heads=9, positions=pos)
    for p, g in zip(pos.tolist(), got.tolist()):
        want = delta_local(delta=0.05, num_layers=30, num_q_heads=9, allocation="anytime", step=p)
        assert g == pytest.approx(want, rel=1e-12)


def _native_or_skip():
    from witcert import native

    if not native.available():
        pytest.skip(f"native library unavailable: {native.reason()}")


@pytest.mark.parametrize("bits", [8, 16, 24])
def test_native_write_into_page_views_is_bitwise_the_reference_write(bits):
    _native_or_skip()
    from witcert.native.write import write_ as native_write_

    quant = QuantConfig(dither_bits=bits)
    kv_a, a = _pool(quant=quant)
    kv_b, b = _pool(quant=quant)
    b.epochs.copy_(a.epochs.random_(0, 2**32))
    k = (torch.randn(40, 3, 64) * 5).bfloat16()
    v = torch.randn(40, 3, 64).bfloat16()
    k[3, 1, 0] = float("nan")  # flagged token-head
    slots = torch.randperm(128)[:40]
    write_(a, k, v, slots=slots)
    native_write_(b, k, v, slots=slots)
    assert torch.equal(kv_a, kv_b)  # every byte of vLLM's pages, padding included


@pytest.mark.parametrize("radius", ["det", "prob", "min"])
def test_native_batched_decode_over_page_views_matches_the_torch_path(radius):
    _native_or_skip()
    torch.manual_seed(1)
    _, lkv = _pool()
    lkv.epochs.random_(0, 2**32)
    write_(lkv, torch.randn(128, 3, 64) * 3, torch.randn(128, 3, 64), slots=torch.arange(128))
    bt = torch.tensor([[3, 1, 0, 2], [7, 6, 5, 4], [4, 0, 1, 2], [2, 3, 4, 5]], dtype=torch.int32)
    sl = torch.tensor([40, 17, 1, 64], dtype=torch.int32)
    q = torch.randn(4, 9, 64).bfloat16()
    q[2, 7, 5] = float("nan")
    cert = CertConfig(radius=radius, allocation="anytime")
    d = anytime_delta(cert, num_layers=30, num_q_heads=9, positions=sl)
    kw = dict(page_size=16, sm_scale=0.125, cert=cert, delta_loc=d)
    out_n, c_n = decode_batched(q, lkv, bt, sl, **kw, native="on")
    out_t, c_t = decode_batched(q, lkv, bt, sl, **kw, native="off")
    torch.testing.assert_close(out_n, out_t, atol=2e-6, rtol=1e-5)
    assert torch.isinf(c_n[2, 7]) and torch.isinf(c_t[2, 7])
    torch.testing.assert_close(c_n, c_t, atol=1e-6, rtol=1e-5)


def test_native_setting_is_parsed_and_bad_values_are_refused(monkeypatch, tmp_path):
    from witcert.integrations.vllm import settings

    for k in [k for k in __import__("os").environ if k.startswith("WITCERT_VLLM")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("WITCERT_VLLM", "on")
    monkeypatch.setenv("WITCERT_VLLM_STATS_DIR", str(tmp_path))
    monkeypatch.delenv("WITCERT_BACKEND", raising=False)
    assert settings.load().native == "auto"
    for value, mode in (("auto", "auto"), ("", "auto"), ("on", "on"), ("1", "on"), ("OFF", "off"),
                        ("0", "off")):
        monkeypatch.setenv("WITCERT_VLLM_NATIVE", value)
        assert settings.load().native == mode
    monkeypatch.setenv("WITCERT_VLLM_NATIVE", "fast")
    with pytest.raises(ValueError, match="WITCERT_VLLM_NATIVE"):
        settings.load()
    # unset: the library-wide WITCERT_BACKEND decides; an explicit value wins over it
    monkeypatch.delenv("WITCERT_VLLM_NATIVE")
    for backend, mode in (("native", "on"), ("ref", "off"), ("auto", "auto"), ("triton", "auto")):
        monkeypatch.setenv("WITCERT_BACKEND", backend)
        assert settings.load().native == mode
    monkeypatch.setenv("WITCERT_VLLM_NATIVE", "on")
    assert settings.load().native == "on"
    monkeypatch.setenv("WITCERT_BACKEND", "gpu")
    monkeypatch.delenv("WITCERT_VLLM_NATIVE")
    with pytest.raises(ValueError, match="WITCERT_BACKEND"):
        settings.load()


def test_the_plugins_own_backend_switch_is_deprecated_with_one_warning(monkeypatch, tmp_path, caplog):
    """WITCERT_VLLM_NATIVE still works, and says once per value which WITCERT_BACKEND replaces it."""
    import logging

    from witcert.integrations.vllm import settings

    for k in [k for k in __import__("os").environ if k.startswith("WITCERT_VLLM")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("WITCERT_VLLM", "on")
    monkeypatch.setenv("WITCERT_VLLM_STATS_DIR", str(tmp_path))
    monkeypatch.delenv("WITCERT_BACKEND", raising=False)
    settings._warn_deprecated_native.cache_clear()
    with caplog.at_level(logging.WARNING, logger="witcert.vllm"):
        settings.load()  # unset: no warning
        assert not caplog.records
        for value in ("off", "on", "on"):
            monkeypatch.setenv("WITCERT_VLLM_NATIVE", value)
            assert settings.load().native == value
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 2, msgs  # one per value
    assert "deprecated" in msgs[0] and "WITCERT_BACKEND=ref" in msgs[0]
    assert "WITCERT_BACKEND=native" in msgs[1]


def _plugin_env(monkeypatch, tmp_path, **extra):
    for k in [k for k in __import__("os").environ if k.startswith("WITCERT_VLLM")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("WITCERT_VLLM", "on")
    monkeypatch.setenv("WITCERT_VLLM_STATS_DIR", str(tmp_path))
    for k, v in extra.items():
        monkeypatch.setenv(k, v)


def test_dither_key_setting_is_parsed_and_position_with_the_gate_is_refused(monkeypatch, tmp_path):
    from witcert.integrations.vllm import settings

    _plugin_env(monkeypatch, tmp_path)
    assert settings.load().dither_key == "slot"
    for value, key in (("slot", "slot"), ("", "slot"), ("position", "position"),
                       ("POSITION", "position")):
        monkeypatch.setenv("WITCERT_VLLM_DITHER_KEY", value)
        assert settings.load().dither_key == key
    monkeypatch.setenv("WITCERT_VLLM_DITHER_KEY", "token")
    with pytest.raises(ValueError, match="WITCERT_VLLM_DITHER_KEY='token'"):
        settings.load()
    monkeypatch.setenv("WITCERT_VLLM_DITHER_KEY", "position")
    for gate in ("on", "head"):
        monkeypatch.setenv("WITCERT_VLLM_GATE", gate)
        with pytest.raises(ValueError, match="WITCERT_VLLM_DITHER_KEY=position with "
                                             "WITCERT_VLLM_GATE.*slot key"):
            settings.load()


def test_token_positions_of_a_mixed_batch():
    from witcert.integrations.vllm.paged import token_positions

    # decode (seq 20), prefill of 5, decode (seq 9), a chunk of 3 over a 37-token prefix,
    # then 2 padding rows
    qsl = torch.tensor([0, 1, 6, 7, 10], dtype=torch.int32)
    sl = torch.tensor([20, 5, 9, 40], dtype=torch.int32)
    want = [19, 0, 1, 2, 3, 4, 8, 37, 38, 39, 0, 0]
    assert token_positions(qsl, sl, 12).tolist() == want
    assert token_positions(qsl[:1], sl[:0], 3).tolist() == [0, 0, 0]


@pytest.mark.parametrize("native", [True, False])
def test_position_key_write_stores_token_positions_and_the_nonce_for_a_mixed_batch(
        monkeypatch, tmp_path, native):
    """The backend's K/V write under WITCERT_VLLM_DITHER_KEY=position: each slot gets its
    token's position (decode rows, a prefill, a chunk over a prefix; padding skipped), the
    epochs stay the server nonce, and the pages are bitwise the reference write with those
    positions; the same tokens written at other slots give the same records."""
    pytest.importorskip("vllm")
    if native:
        _native_or_skip()
    from types import SimpleNamespace

    from witcert.integrations.vllm import backend as vb
    from witcert.integrations.vllm import settings
    from witcert.ref.pool import LayerKV

    _plugin_env(monkeypatch, tmp_path, WITCERT_VLLM_DITHER_KEY="position")
    s = settings.load()
    qsl = torch.tensor([0, 1, 6, 7, 10], dtype=torch.int32)
    sl = torch.tensor([20, 5, 9, 40], dtype=torch.int32)
    want = torch.tensor([19, 0, 1, 2, 3, 4, 8, 37, 38, 39])
    monkeypatch.setattr(vb, "_step_metadata",
                        lambda layer: SimpleNamespace(query_start_loc=qsl, seq_lens=sl))
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(12, 2, 64, generator=gen).bfloat16()
    v = torch.randn(12, 2, 64, generator=gen).bfloat16()
    records = []
    for perm_seed in (0, 1):
        rt = vb._Runtime.__new__(vb._Runtime)
        rt.settings, rt.head_dim, rt.native = s, 64, native
        rt.layout = RecordLayout.build(s.quant, 64)
        rt.seed, rt.epochs, rt.positions = 77, None, None
        rt.views, rt.exact, rt.copies = {}, {}, None
        rt._start_stats = lambda **kw: None
        monkeypatch.setattr(vb, "_RUNTIME", rt)
        kv = torch.zeros(8, 16, 2, rt.layout.size, dtype=torch.int8).permute(0, 2, 1, 3)
        slots = torch.randperm(128, generator=torch.Generator().manual_seed(perm_seed))[:12]
        slots[10:] = -1  # padding rows
        impl = SimpleNamespace(_layer_index=lambda layer: 0)
        vb.WitcertAttentionImpl.do_kv_cache_update(impl, SimpleNamespace(), k, v, kv, slots)
        live = slots[:10]
        assert torch.equal(rt.positions[live], want)
        assert bool((rt.epochs == settings.POSITION_NONCE).all())  # never bumped
        ref = LayerKV.allocate(num_slots=128, num_kv_heads=2, head_dim=64, quant=s.quant, layer=0,
                               seed=77, epochs=rt.epochs.clone(), positions=rt.positions.clone())
        write_(ref, k[:10], v[:10], slots=live)
        view = rt.views[0][1]
        assert view.positions is rt.positions
        for side in (K_SIDE, V_SIDE):
            for name, t in ref.storage(side).items():
                assert torch.equal(view.storage(side)[name][live], t[live]), (side, name)
        records.append([t[live] for side in (K_SIDE, V_SIDE) for t in view.storage(side).values()])
    assert all(torch.equal(a, b) for a, b in zip(*records))  # placement does not matter
