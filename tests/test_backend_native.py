"""Contract tests: ``witcert.runtime.dispatch`` on CPU tensors through the native C path.

``backend.decode_attention`` (native) against ``witcert.ref.attention.decode_attention``
(one split) on multi-sequence pools: out within the float tier (2x the plain torch fp32
error against float64 on the stored values), lse within 1e-5, cert within 1e-5 rel /
1e-6 abs of the reference and >= the true TV, vbound >= the true ||o - o^|| and within
1e-5 rel of the reference; the disabled certificate, the radius fallback, non-finite
queries, flagged tokens, the write path and ``WITCERT_BACKEND`` parsing.
"""

from __future__ import annotations

import logging

import pytest
import torch

from cases import DECODE_SHAPES, SEED, make_case
from test_native_decode import _pools_equal, _stored
from witcert import native
from witcert.runtime import dispatch as backend
from witcert.config import CertConfig, QuantConfig
from witcert.ref import attention as ref_attn
from witcert.ref.cert import tv_distance
from witcert.ref.pool import LayerKV, write_
from witcert.ref.types import K_SIDE, V_SIDE


@pytest.fixture(autouse=True)
def _needs_native(monkeypatch):
    if not native.available():
        pytest.skip(f"native library unavailable: {native.reason()}")
    monkeypatch.delenv("WITCERT_BACKEND", raising=False)


def _both(q, lkv, bt, sl, *, page, sm, cert, delta_loc, **extra):
    kw = dict(page_size=page, sm_scale=sm, cert=cert, delta_loc=delta_loc)
    assert backend.backend_for(q, lkv) == "native"
    got = backend.decode_attention(q, lkv, bt, sl, **kw, **extra)
    ref = ref_attn.decode_attention(q, lkv, bt, sl, **kw, num_splits=1, **extra)
    return got, ref


CASES = DECODE_SHAPES[:3]  # (seq_lens, Hq, Hkv, D, P), tests/cases.py


def _check_against_reference(lkv, q, bt, sl, exact, *, page, radius, fp32_logit_slack=False):
    """backend (native) vs the reference: the float tier, sound cert and vbound, and cert /
    vbound / lse agreement. fp32_logit_slack: the logits are large (massive values), so the
    reference's own fp32 rounding of each logit (a relative 2^-24, which it adds to its
    radii and which moves its softmax) is allowed on top of the usual tolerances."""
    d = q.shape[-1]
    sm = d ** -0.5
    B = q.shape[0]
    dl = torch.logspace(-6, -2, B, dtype=torch.float32)  # as the HF cache passes it: f32 [B]
    got, ref = _both(q, lkv, bt, sl, page=page, sm=sm, cert=CertConfig(radius=radius), delta_loc=dl)
    assert got.radius is None and got.radius_kind == ref.radius_kind == radius
    for t in (got.out, got.lse, got.cert, got.vbound):
        assert t.dtype == torch.float32 and torch.isfinite(t).all()
    for b in range(B):
        kh, vh = _stored(lkv, bt, sl, page, b)
        out64, p_hat = ref_attn.exact_attention(q[b], kh, vh, sm_scale=sm, return_probs=True)
        err_r = (ref.out[b].double() - out64).abs().max().item()
        err_n = (got.out[b].double() - out64).abs().max().item()
        floor = 2 * 2.0**-24 * out64.abs().max().item()
        assert err_n <= 2 * err_r + floor, f"b={b}: out error {err_n:.3g} vs torch fp32 {err_r:.3g}"
        k_ex, v_ex = exact[b][0].float(), exact[b][1].float()
        o_true, p_true = ref_attn.exact_attention(q[b], k_ex, v_ex, sm_scale=sm, return_probs=True)
        tv = tv_distance(p_true, p_hat)
        assert (got.cert[b].double() >= tv).all(), f"b={b}: cert {got.cert[b]} below true TV {tv}"
        verr = torch.linalg.vector_norm(o_true - out64, dim=-1)
        assert (got.vbound[b].double() >= verr).all(), f"b={b}: vbound {got.vbound[b]} < {verr}"
    slack = vslack = 0.0
    if fp32_logit_slack:  # |l| 2^-24 per logit, in the radius and in the softmax weights
        kvh = torch.arange(q.shape[1]) // (q.shape[1] // lkv.num_kv_heads)
        zmax = vmax = 0.0
        for b in range(B):
            kh, vh = _stored(lkv, bt, sl, page, b)
            z = sm * torch.einsum("hd,nhd->hn", q[b].double(), kh.double()[:, kvh])
            zmax = max(zmax, float(z.abs().max()))
            vmax = max(vmax, float(torch.linalg.vector_norm(vh.double(), dim=-1).max()))
        slack = 4 * 2.0**-24 * zmax
        vslack = 2 * slack * (1 + float(ref.cert.max())) * vmax * 1.01  # vbound = 2 cert vmax + ...
    torch.testing.assert_close(got.lse, ref.lse, rtol=0, atol=1e-5 + slack)
    cd = (got.cert.double() - ref.cert.double()).abs()
    assert (cd <= 1e-5 * ref.cert.double() + 1e-6 + slack * (1 + ref.cert.double())).all(), \
        f"cert {got.cert} vs reference {ref.cert} (logit slack {slack:.3g})"
    torch.testing.assert_close(got.vbound, ref.vbound, rtol=1e-5, atol=1e-6 + vslack)
    return got, ref


@pytest.mark.parametrize("radius", ["det", "prob", "min"])
@pytest.mark.parametrize("seq_lens,hq,hkv,d,page", CASES)
def test_native_backend_decode_matches_the_reference_and_its_bounds_are_sound(
        seq_lens, hq, hkv, d, page, radius):
    lkv, q, bt, sl, exact = make_case(seq_lens=seq_lens, hq=hq, hkv=hkv, d=d, page=page,
                                      seed=len(seq_lens) * 5 + hq + d)
    _check_against_reference(lkv, q, bt, sl, exact, page=page, radius=radius)


@pytest.mark.parametrize("massive", [False, True])
@pytest.mark.parametrize("radius", ["det", "prob", "min"])
@pytest.mark.parametrize("seq_lens,hq,hkv,d,page", [CASES[0], CASES[2]])
def test_native_backend_decode_with_outliers_matches_the_reference_and_is_sound(
        seq_lens, hq, hkv, d, page, radius, massive):
    """m = 4 bypassed pairs per head (fp16 K/V, so every bypassed value is exact), with and
    without massive values (+-60000 in a bypassed K channel, +-3000 in a V one)."""
    lkv, q, bt, sl, exact = make_case(seq_lens=seq_lens, hq=hq, hkv=hkv, d=d, page=page,
                                      seed=len(seq_lens) * 5 + hq + d, outliers=4,
                                      massive=massive, dtype=torch.float16)
    assert backend.backend_for(q, lkv) == "native"
    _check_against_reference(lkv, q, bt, sl, exact, page=page, radius=radius,
                             fp32_logit_slack=massive)


def test_outlier_token_head_flagged_at_write_reads_zero_with_inf_radius_like_the_reference():
    """A bypassed value fp16 cannot hold (an fp32 input) flags its token-head: both paths
    read it as 0 with radius +inf, so exactly the query heads of that KV head get +inf."""
    lkv, q, bt, sl, _ = make_case(seq_lens=(20, 33), hq=6, hkv=2, d=64, page=16, seed=41,
                                  outliers=4, dtype=torch.float16)
    slot = ref_attn.token_slots(bt[1], 33, page_size=16)[5:6]
    k = torch.randn(1, 2, 64).half().float()
    k[0, 1, int(lkv.k_outlier_idx[1, 2])] = 1.0 + 2.0**-12  # not an fp16 value
    write_(lkv, k, k.clone(), slots=slot)
    assert torch.isinf(lkv.k["scales"][slot, 1].float()).all() and not lkv.k["outl"][slot, 1].any()
    got, ref = _both(q, lkv, bt, sl, page=16, sm=0.125, cert=CertConfig(), delta_loc=1e-6)
    for c in (got.cert, ref.cert):
        assert torch.isposinf(c[1, 3:]).all() and torch.isfinite(c[0]).all() \
            and torch.isfinite(c[1, :3]).all()
    torch.testing.assert_close(got.cert, ref.cert, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.out, ref.out, rtol=1e-5, atol=2e-6)


def test_delta_loc_as_float_or_tensor_gives_the_same_bits():
    lkv, q, bt, sl, _ = make_case(seq_lens=(5, 40, 17), hq=4, hkv=2, d=64, page=16, seed=11)
    kw = dict(page_size=16, sm_scale=0.125, cert=CertConfig(radius="prob"))
    a = backend.decode_attention(q, lkv, bt, sl, **kw, delta_loc=1e-4)
    b = backend.decode_attention(q, lkv, bt, sl, **kw, delta_loc=torch.full((3,), 1e-4, dtype=torch.float64))
    c = backend.decode_attention(q, lkv, bt, sl, **kw, delta_loc=torch.tensor(1e-4, dtype=torch.float64))
    for x in (b, c):
        assert torch.equal(a.out, x.out) and torch.equal(a.cert, x.cert)
        assert torch.equal(a.vbound, x.vbound)
    with pytest.raises(ValueError, match="delta_loc"):
        backend.decode_attention(q, lkv, bt, sl, **kw, delta_loc=torch.full((2,), 1e-4))


@pytest.mark.parametrize("bad", [
    dict(delta_loc=0.0), dict(delta_loc=1.5), dict(delta_loc=float("nan")),
    dict(delta_loc=torch.tensor([1e-4, 1.0, 1e-4], dtype=torch.float64)),
    dict(sm_scale=-0.125), dict(seq_lens=torch.tensor([5, 0, 17], dtype=torch.int32)),
    dict(seq_lens=torch.tensor([5, 999, 17], dtype=torch.int32)),
])
def test_bad_values_fail_on_the_native_path_with_the_references_message(bad):
    """The native dispatch leaves the budget's range to C and sm_scale to its launcher;
    a bad value still fails with the reference's one-line message."""
    lkv, q, bt, sl, _ = make_case(seq_lens=(5, 40, 17), hq=4, hkv=2, d=64, page=16, seed=11)
    kw = dict(q=q, layer_kv=lkv, block_table=bt, seq_lens=sl, page_size=16, sm_scale=0.125,
              cert=CertConfig(radius="min"), delta_loc=1e-4)
    kw.update(bad)
    with pytest.raises(ValueError) as ref:
        ref_attn.decode_attention(**kw)
    assert backend.backend_for(q, lkv) == "native"
    with pytest.raises(ValueError) as got:
        backend.decode_attention(**kw)
    assert str(got.value) == str(ref.value)


def test_disabled_certificate_gives_none_and_the_same_output():
    lkv, q, bt, sl, _ = make_case(seq_lens=(3, 70), hq=4, hkv=2, d=64, page=16, seed=12)
    kw = dict(page=16, sm=0.125, delta_loc=1e-3)
    off, ref_off = _both(q, lkv, bt, sl, cert=CertConfig(enabled=False), **kw)
    on, _ = _both(q, lkv, bt, sl, cert=CertConfig(), **kw)
    assert off.cert is None and off.vbound is None and off.radius is None
    assert off.radius_kind == ref_off.radius_kind == "none"
    assert torch.equal(off.out, on.out) and torch.equal(off.lse, on.lse)
    torch.testing.assert_close(off.lse, ref_off.lse, rtol=0, atol=1e-5)


def test_return_radius_runs_the_reference():
    lkv, q, bt, sl, _ = make_case(seq_lens=(3, 70), hq=4, hkv=2, d=64, page=16, seed=13)
    got, ref = _both(q, lkv, bt, sl, page=16, sm=0.125, cert=CertConfig(), delta_loc=1e-3,
                     return_radius=True)
    assert got.radius is not None
    for name in ("out", "lse", "cert", "vbound", "radius"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), name


def test_nonfinite_query_head_gets_inf_cert_and_vbound_like_the_reference():
    lkv, q, bt, sl, _ = make_case(seq_lens=(17, 40), hq=6, hkv=2, d=64, page=16, seed=3)
    q[0, 4, 7] = float("inf")
    q[1, 0, 0] = float("nan")
    got, ref = _both(q, lkv, bt, sl, page=16, sm=0.125, cert=CertConfig(), delta_loc=1e-6)
    bad = torch.zeros(2, 6, dtype=torch.bool)
    bad[0, 4] = bad[1, 0] = True
    for t in (got.cert, got.vbound, ref.cert, ref.vbound):
        assert torch.isposinf(t[bad]).all() and torch.isfinite(t[~bad]).all()
    assert torch.isfinite(got.out).all() and torch.isfinite(got.lse).all()
    torch.testing.assert_close(got.out, ref.out, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(got.lse, ref.lse, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.cert[~bad], ref.cert[~bad], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.vbound[~bad], ref.vbound[~bad], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("side", [K_SIDE, V_SIDE])
def test_flagged_token_gives_the_reference_infinities(side):
    lkv, q, bt, sl, _ = make_case(seq_lens=(20, 33), hq=6, hkv=2, d=64, page=16, seed=4)
    slot = ref_attn.token_slots(bt[1], 33, page_size=16)[5:6]
    k, v = torch.randn(1, 2, 64), torch.randn(1, 2, 64)
    (k if side == K_SIDE else v)[0, 1, 3] = float("nan")
    write_(lkv, k, v, slots=slot)
    got, ref = _both(q, lkv, bt, sl, page=16, sm=0.125, cert=CertConfig(), delta_loc=1e-6)
    assert torch.isposinf(got.cert[1, 3:]).all() and torch.isposinf(ref.cert[1, 3:]).all()
    assert torch.isfinite(got.cert[0]).all() and torch.isfinite(got.cert[1, :3]).all()
    # a flagged V token has an infinite witness: vbound +inf; a flagged K token only
    # makes cert +inf, and vbound = 2 vmax + sum p ||w^v|| stays finite
    assert bool(torch.isposinf(got.vbound[1, 3:]).all()) == (side == V_SIDE)
    torch.testing.assert_close(got.cert, ref.cert, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.vbound, ref.vbound, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.out, ref.out, rtol=1e-5, atol=2e-6)
    torch.testing.assert_close(got.lse, ref.lse, rtol=0, atol=1e-5)


def test_native_backend_write_is_bitwise_the_reference_write():
    gen = torch.Generator().manual_seed(1)
    epochs = torch.randint(0, 2**32, (256,), generator=gen, dtype=torch.int64)

    def mk():
        return LayerKV.allocate(num_slots=256, num_kv_heads=2, head_dim=64, quant=QuantConfig(),
                                layer=3, seed=SEED, epochs=epochs)

    a, b = mk(), mk()
    k, v = torch.randn(40, 2, 64, generator=gen), torch.randn(40, 2, 64, generator=gen)
    k[3, 1, 5] = float("nan")
    slots = torch.randperm(256, generator=gen)[:40]
    assert backend.backend_for(k, b) == "native"
    write_(a, k, v, slots=slots)
    backend.write_kv_(b, k, v, slots=slots)
    _pools_equal(a, b)
    # float64 is not a C input dtype: the reference gets the call and refuses it as before
    with pytest.raises(TypeError, match="fp32"):
        backend.write_kv_(mk(), k.double(), v.double(), slots=slots)


def _rtn8_pool():
    return LayerKV.allocate(num_slots=64, num_kv_heads=2, head_dim=64,
                            quant=QuantConfig(method="rtn8"), layer=0, seed=1,
                            epochs=torch.zeros(64, dtype=torch.int64))


def test_witcert_backend_parsing(monkeypatch):
    lkv, q, bt, sl, _ = make_case(seq_lens=(5, 20), hq=2, hkv=1, d=64, page=16, seed=14)
    for value, want in (("", "native"), ("auto", "native"), (" Native ", "native"),
                        ("ref", "ref"), ("REF", "ref")):
        monkeypatch.setenv("WITCERT_BACKEND", value)
        assert backend.backend_for(q, lkv) == want, value
    monkeypatch.setenv("WITCERT_BACKEND", "bogus")
    with pytest.raises(ValueError, match="native"):
        backend.backend_for(q, lkv)
    rtn = _rtn8_pool()
    monkeypatch.setenv("WITCERT_BACKEND", "auto")
    assert backend.backend_for(q, rtn) == "ref"
    monkeypatch.setenv("WITCERT_BACKEND", "native")
    with pytest.raises(RuntimeError, match="WITCERT_BACKEND=native"):
        backend.backend_for(q, rtn)
    monkeypatch.setenv("WITCERT_BACKEND", "ref")  # ref really runs the reference
    kw = dict(page_size=16, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-3)
    got = backend.decode_attention(q, lkv, bt, sl, **kw)
    ref = ref_attn.decode_attention(q, lkv, bt, sl, **kw)
    for name in ("out", "lse", "cert", "vbound"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), name


def test_auto_falls_back_to_the_reference_with_one_log_line_when_unavailable(
        monkeypatch, tmp_path, caplog):
    lkv, q, bt, sl, _ = make_case(seq_lens=(5, 9), hq=4, hkv=2, d=64, page=16, seed=9)
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setattr(native, "_WARNED", set())
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path))
    kw = dict(page_size=16, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-4)
    with caplog.at_level(logging.WARNING, logger="witcert.native"):
        for _ in range(3):
            assert backend.backend_for(q, lkv) == "ref"
            got = backend.decode_attention(q, lkv, bt, sl, **kw)
    assert len([r for r in caplog.records if "native CPU decode unavailable" in r.message]) == 1
    ref = ref_attn.decode_attention(q, lkv, bt, sl, **kw)
    assert torch.equal(got.out, ref.out) and torch.equal(got.cert, ref.cert)
    monkeypatch.setenv("WITCERT_BACKEND", "native")
    with pytest.raises(RuntimeError, match="gcc not found"):
        backend.decode_attention(q, lkv, bt, sl, **kw)


def test_the_triton_backend_on_cpu_tensors_without_the_interpreter_says_so_in_one_line(monkeypatch):
    """WITCERT_BACKEND=triton with CPU tensors: without TRITON_INTERPRET the compiled kernels
    cannot read them (Triton's own error is a launcher traceback); the dispatch says what to
    do instead. With the interpreter on, the same call picks Triton."""
    pytest.importorskip("triton")
    lkv, q, _, _, _ = make_case(seq_lens=(5,), hq=2, hkv=1, d=64, page=16, seed=3)
    monkeypatch.setenv("WITCERT_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="WITCERT_BACKEND=triton but the tensors are on the CPU") as e:
        backend.backend_for(q, lkv)
    assert "\n" not in str(e.value) and "TRITON_INTERPRET=1" in str(e.value)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert backend.backend_for(q, lkv) == "triton"
