"""The reference extend with certificates (witcert.ref.extend, the spec of issue 19).

Claims: the output equals the fp32 reference extend within float tolerance; for every new
token and query head, cert >= TV between the exact-key softmax (prefix and new tokens, causal)
and the softmax of the reference's own logits (exact arithmetic, tests/fpexact.py); exact new
tokens carry only the arithmetic slack (an all-exact extend has a tiny certificate); flagged
prefix tokens and non-finite queries give +inf; bad scalars are refused.
"""

from __future__ import annotations

import pytest
import torch

import fpexact
from witcert.config import CertConfig, QuantConfig
from witcert.ref import attention as ref_attn
from witcert.ref.extend import extend_attention_cert
from witcert.ref.logits import logits_f32
from witcert.ref.pool import LayerKV, gather, write_
from witcert.ref.types import K_SIDE


def _case(*, Np, T, hq=4, hkv=2, D=64, bits=8, outliers=0, seed=0, q_scale=2.0):
    g = torch.Generator().manual_seed(seed)
    quant = QuantConfig(dither_bits=bits, outliers=outliers, seed=5)
    slots_n = max(Np, 1) + 4
    idx = None
    if outliers:
        idx = torch.stack([torch.arange(2 * outliers) for _ in range(hkv)])
    layer = LayerKV.allocate(num_slots=slots_n, num_kv_heads=hkv, head_dim=D, quant=quant, layer=2,
                             seed=9, epochs=torch.zeros(slots_n, dtype=torch.int64), k_outlier_idx=idx,
                             v_outlier_idx=idx)
    kp = (torch.randn(Np, hkv, D, generator=g) * torch.exp(torch.randn(1, hkv, D, generator=g))).half()
    vp = torch.randn(Np, hkv, D, generator=g).half()
    slots = torch.randperm(slots_n, generator=g)[:Np]
    if Np:
        write_(layer, kp, vp, slots=slots)
    q = torch.randn(T, hq, D, generator=g) * q_scale
    kn = torch.randn(T, hkv, D, generator=g).half()
    vn = torch.randn(T, hkv, D, generator=g).half()
    return layer, slots, kp, vp, q, kn, vn


def _exact_tv(layer, slots, kp, q, kn, res, *, sm, hq, hkv):
    """TV per (token, head) between the exact softmax and the softmax of the reference's logits."""
    T = q.shape[0]
    Np = slots.shape[0]
    kvh = torch.arange(hq) // (hq // hkv)
    kh, kpk = gather(layer, K_SIDE, slots)
    allk_exact = torch.cat([kp.float(), kn.float()])[:, kvh].transpose(0, 1)  # [Hq, N, D]
    allk_used = torch.cat([kh, kn.float()])[:, kvh].transpose(0, 1)
    out = torch.empty(T, hq, dtype=torch.float64)
    for t in range(T):
        mask = (torch.arange(Np + T) < Np + t + 1)[None].expand(hq, -1)
        z = fpexact.exact_shifted_logits(q[t], allk_exact, sm_scale=sm, mask=mask)
        lu, _, _ = logits_f32(q[t], allk_used, sm_scale=sm)
        out[t] = fpexact.tv(z, lu, res.cert[t], mask=mask)
    return out


@pytest.mark.parametrize("Np,T,bits,radius", [(0, 5, 8, "min"), (1, 3, 16, "det"), (37, 17, 8, "min"),
                                              (64, 1, 16, "prob")])
def test_extend_cert_is_sound_for_every_new_token_and_matches_the_fp32_extend(Np, T, bits, radius):
    layer, slots, kp, vp, q, kn, vn = _case(Np=Np, T=T, bits=bits, seed=Np + T)
    sm = 0.125
    res = extend_attention_cert(q, kn, vn, layer, slots, sm_scale=sm, cert=CertConfig(radius=radius),
                                delta_loc=1e-6)
    want = ref_attn.extend_attention(q, kn, vn, layer, slots, sm_scale=sm)
    torch.testing.assert_close(res.out, want, rtol=2e-5, atol=2e-5)
    assert res.cert.shape == (T, 4) and torch.isfinite(res.cert).all() and (res.cert >= 0).all()
    tv = _exact_tv(layer, slots, kp, q, kn, res, sm=sm, hq=4, hkv=2)
    assert (res.cert.double() >= tv).all(), (res.cert, tv)


def test_extend_over_an_empty_prefix_has_only_the_arithmetic_certificate():
    layer, slots, kp, vp, q, kn, vn = _case(Np=0, T=9, seed=3)
    res = extend_attention_cert(q, kn, vn, layer, slots, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-6)
    assert (res.cert > 0).all() and (res.cert < 1e-5).all()


def test_extend_cert_flags_bad_prefix_tokens_and_bad_queries_with_inf():
    layer, slots, kp, vp, q, kn, vn = _case(Np=20, T=4, seed=8)
    kbad = kp.clone()
    kbad[3, 1, 5] = float("nan")
    write_(layer, kbad, vp, slots=slots)
    q[2, 0, 0] = float("inf")
    res = extend_attention_cert(q, kn, vn, layer, slots, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-6)
    inf = torch.isinf(res.cert)
    assert inf[:, 2:].all() and not inf[:, :2][[0, 1, 3]].any() and inf[2, 0]
    assert torch.isfinite(res.out).all()


def test_extend_cert_with_outliers_is_sound():
    layer, slots, kp, vp, q, kn, vn = _case(Np=30, T=6, outliers=2, seed=11)
    res = extend_attention_cert(q, kn, vn, layer, slots, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-6)
    tv = _exact_tv(layer, slots, kp, q, kn, res, sm=0.125, hq=4, hkv=2)
    assert (res.cert.double() >= tv).all()


@pytest.mark.parametrize("sm", [-0.1, float("nan")])
def test_extend_cert_refuses_a_bad_scale(sm):
    layer, slots, kp, vp, q, kn, vn = _case(Np=4, T=2)
    with pytest.raises(ValueError, match="sm_scale"):
        extend_attention_cert(q, kn, vn, layer, slots, sm_scale=sm, cert=CertConfig(), delta_loc=1e-6)


def test_extend_cert_disabled_returns_no_bound():
    layer, slots, kp, vp, q, kn, vn = _case(Np=8, T=3)
    res = extend_attention_cert(q, kn, vn, layer, slots, sm_scale=0.125, cert=CertConfig(enabled=False))
    assert res.cert is None and res.radius_kind == "none"
