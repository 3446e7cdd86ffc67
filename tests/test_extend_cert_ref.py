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


# ---- pool-read extend (new_from_pool=True): the consistent reads of the position key ----

def _pool_read_case(*, P, T, hq, hkv, key="slot", bits=8, seed=0, flag_at=()):
    """A pool holding P + T tokens (prefix then the step's new tokens, already written) at
    shuffled slots; flag_at: token indices whose K is written non-finite (flagged)."""
    from extend_cases import make_batch
    batch = make_batch(prefix_lens=(P,), new_lens=(T,), hq=hq, hkv=hkv, d=64, page=16,
                       bits=bits, seed=seed, key=key, pool_read=True)
    if flag_at:
        k, v = batch.exact_prefix[0]
        k = k.clone()
        for t in flag_at:
            k[t, 0, 3] = float("nan")
        write_(batch.layer, k, v, slots=batch.prefix_slots(0))
    return batch


@pytest.mark.parametrize("P,T,hq,hkv,key,radius", [
    (0, 1, 3, 1, "slot", "min"), (0, 7, 4, 4, "position", "prob"), (19, 5, 8, 2, "slot", "det"),
    (33, 140, 6, 2, "position", "min")])  # T > ROW_CHUNK: several chunks
def test_pool_read_extend_row_j_is_the_decode_of_one_query_over_the_first_p_plus_j_plus_1_tokens(
        P, T, hq, hkv, key, radius):
    batch = _pool_read_case(P=P, T=T, hq=hq, hkv=hkv, key=key, seed=P + T)
    cert = CertConfig(radius=radius)
    sm = 0.125
    slots = batch.prefix_slots(0)
    dl = torch.logspace(-9, -3, T, dtype=torch.float64)
    res = extend_attention_cert(batch.q[:T], None, None, batch.layer, slots, sm_scale=sm, cert=cert,
                                delta_loc=dl, new_from_pool=True)
    assert res.out.shape == (T, hq, 64) and res.cert.shape == (T, hq) and res.lse.shape == (T, hq)
    for j in ([0, T // 2, T - 1] if T > 8 else range(T)):
        n = P + j + 1
        dec = ref_attn.decode_attention(batch.q[j:j + 1], batch.layer, slots.to(torch.int32)[None],
                                        torch.tensor([n], dtype=torch.int32), page_size=1,
                                        sm_scale=sm, cert=cert, delta_loc=float(dl[j]))
        torch.testing.assert_close(res.out[j], dec.out[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(res.lse[j], dec.lse[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(res.cert[j], dec.cert[0], rtol=1e-5, atol=1e-12)


def test_pool_read_extend_does_not_depend_on_the_split_into_steps_and_is_sound():
    """The same 40 pool tokens read as one step (P=0, T=40), as a prefix hit (P=24, T=16), or
    as two chunks: every row bitwise equal; cert >= the exact TV of every row."""
    batch = _pool_read_case(P=24, T=16, hq=6, hkv=2, key="position", seed=3, flag_at=(37,))
    cert = CertConfig(radius="min")
    slots, N = batch.prefix_slots(0), 40
    q = torch.randn(N, 6, 64, generator=torch.Generator().manual_seed(1)) * 2
    dl = torch.logspace(-8, -4, N, dtype=torch.float64)

    def run(lo, hi):
        return extend_attention_cert(q[lo:hi], None, None, batch.layer, slots[:hi], sm_scale=0.125,
                                     cert=cert, delta_loc=dl[lo:hi], new_from_pool=True)

    whole = run(0, N)
    for cuts in ([0, 24, 40], [0, 9, 10, 40], [0, 39, 40]):
        parts = [run(a, b) for a, b in zip(cuts, cuts[1:])]
        for f in ("out", "lse", "cert"):
            assert torch.equal(torch.cat([getattr(p, f) for p in parts]), getattr(whole, f)), (cuts, f)
    # the flagged token 37 makes rows 37.. of KV head 0 (query heads 0..2) +inf, no earlier row
    assert torch.isinf(whole.cert[37:, :3]).all() and torch.isfinite(whole.cert[:37]).all()
    assert torch.isfinite(whole.cert[:, 3:]).all() and torch.isfinite(whole.out).all()
    # soundness against the exact keys as written (rows before the flagged token)
    kh, _ = gather(batch.layer, K_SIDE, slots)
    kvh = torch.arange(6) // 3
    k_exact = batch.exact_prefix[0][0].float()[:, kvh].transpose(0, 1)
    k_used = kh[:, kvh].transpose(0, 1)
    for t in range(0, 37, 4):
        mask = (torch.arange(N) <= t)[None].expand(6, -1)
        z = fpexact.exact_shifted_logits(q[t], k_exact, sm_scale=0.125, mask=mask)
        lu, _, _ = logits_f32(q[t], k_used, sm_scale=0.125)
        assert (whole.cert[t].double() >= fpexact.tv(z, lu, whole.cert[t], mask=mask)).all(), t


def test_pool_read_extend_refuses_a_pool_without_the_new_tokens_and_non_causal():
    batch = _pool_read_case(P=0, T=4, hq=4, hkv=2)
    cert = CertConfig(radius="det")
    with pytest.raises(ValueError, match="new_from_pool"):
        extend_attention_cert(batch.q[:4], None, None, batch.layer, batch.prefix_slots(0)[:3],
                              sm_scale=0.125, cert=cert, new_from_pool=True)
    with pytest.raises(ValueError, match="causal"):
        extend_attention_cert(batch.q[:4], None, None, batch.layer, batch.prefix_slots(0),
                              sm_scale=0.125, cert=cert, new_from_pool=True, causal=False)
