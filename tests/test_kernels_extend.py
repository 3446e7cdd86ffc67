"""Contract: Triton extend (prefill over the compressed prefix) vs the reference extend.

Float tier: error against float64 on the stored prefix + exact new tokens is within 2x
the plain torch fp32 error of the reference. CPU: Triton interpreter, tiny shapes.
"""

from __future__ import annotations

import os

import torch

GPU = torch.cuda.is_available()
if not GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from cases import DEV, make_layer, random_kv  # noqa: E402

from witcert.kernels.extend import extend_attention  # noqa: E402
from witcert.kernels.write import write_kv_  # noqa: E402
from witcert.ref import attention as ref_attn  # noqa: E402
from witcert.ref.pool import gather  # noqa: E402
from witcert.ref.types import K_SIDE, V_SIDE  # noqa: E402

CASES = [  # (Np, T, Hq, Hkv, D, outliers, causal)
    (17, 5, 3, 1, 64, 0, True),
    (0, 20, 2, 2, 64, 1, True),
    (33, 3, 4, 2, 128, 0, False),
]
if GPU:
    CASES += [(np_, t, g * 2, 2, d, m, c) for np_ in (0, 1, 97, 1000) for t in (1, 16, 17, 130)
              for g in (1, 4, 7) for d in (64, 128) for m in (0, 2) for c in (True,)][::3]


def _float64(q, kh, vh, causal, sm):
    T, hq, _ = q.shape
    np_ = kh.shape[0] - T
    kvh = torch.arange(hq) // (hq // kh.shape[1])
    z = sm * torch.einsum("thd,nhd->htn", q.double().cpu(), kh.double().cpu()[:, kvh])
    if causal:
        j = torch.arange(kh.shape[0])
        z = z.masked_fill((j[None, :] - np_ > torch.arange(T)[:, None])[None], float("-inf"))
    return torch.einsum("htn,nhd->thd", torch.softmax(z, -1), vh.double().cpu()[:, kvh])


@pytest.mark.parametrize("np_,T,hq,hkv,d,outliers,causal", CASES)
def test_extend_kernel_within_2x_torch_fp32_error_of_float64(np_, T, hq, hkv, d, outliers, causal):
    gen = torch.Generator().manual_seed(np_ + T + d)
    layer = make_layer(hkv=hkv, d=d, num_slots=np_ + 8, outliers=outliers, gen=gen)
    slots = torch.randperm(np_ + 8, generator=gen)[:np_].to(DEV)
    if np_:
        kp, vp = random_kv(np_, hkv, d, gen=gen)
        write_kv_(layer, kp, vp, slots=slots)
    kn, vn = random_kv(T, hkv, d, gen=gen)
    q = torch.randn(T, hq, d, generator=gen).to(DEV)
    sm = d ** -0.5
    ker = extend_attention(q, kn, vn, layer, slots, sm_scale=sm, causal=causal)
    ref = ref_attn.extend_attention(q, kn, vn, layer, slots, sm_scale=sm, causal=causal)
    kh = torch.cat([gather(layer, K_SIDE, slots)[0], kn.float()])
    vh = torch.cat([gather(layer, V_SIDE, slots)[0], vn.float()])
    out64 = _float64(q, kh, vh, causal, sm)
    err_ref = (ref.double().cpu() - out64).abs().max().item()
    err_ker = (ker.double().cpu() - out64).abs().max().item()
    assert err_ker <= 2 * err_ref + 1e-6, f"extend error {err_ker:.3g} vs torch fp32 {err_ref:.3g}"


@pytest.mark.parametrize("Np,T,hq,hkv,d,outliers,radius", [(17, 5, 3, 1, 64, 0, "min"), (0, 9, 2, 2, 64, 1, "det"),
                                                           (33, 18, 4, 2, 128, 0, "prob")])
def test_extend_kernel_certificate_matches_the_reference_spec_and_is_sound(Np, T, hq, hkv, d, outliers, radius):
    """The kernel's certificate per (new token, head) is within its slack of the reference
    extend certificate and above the exact TV (exact keys vs the reference's logits)."""
    from witcert.config import CertConfig
    from witcert.ref.extend import extend_attention_cert
    gen = torch.Generator().manual_seed(Np + T)
    layer = make_layer(hkv=hkv, d=d, num_slots=Np + 8, outliers=outliers, gen=gen)
    kp, vp = random_kv(Np, hkv, d, gen=gen)
    slots = torch.randperm(Np + 8, generator=gen)[:Np].to(DEV)
    if Np:
        write_kv_(layer, kp, vp, slots=slots)
    q = (torch.randn(T, hq, d, generator=gen) * 2).to(DEV)
    kn, vn = random_kv(T, hkv, d, gen=gen)
    cert = CertConfig(radius=radius)
    ker = extend_attention(q, kn, vn, layer, slots, sm_scale=d ** -0.5, cert=cert, delta_loc=1e-6)
    ref = extend_attention_cert(q, kn, vn, layer, slots, sm_scale=d ** -0.5, cert=cert, delta_loc=1e-6)
    torch.testing.assert_close(ker.out, ref.out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ker.lse, ref.lse, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(ker.cert).all() and (ker.cert >= 0).all()
    # same formula with the kernel's own slack: its fp32 dots (any order, gamma_{D+2} times a
    # scale bound of sum |q k|) cost up to ~1% of a certificate or ~1e-3 where the certificate
    # is only arithmetic (a head attending exact new tokens), against the reference's float64 dots
    assert (ker.cert >= ref.cert * (1 - 1e-4)).all()
    assert (ker.cert <= ref.cert * 1.01 + 1e-3).all()


def test_extend_kernel_flags_bad_new_rows_and_queries_with_inf_and_stays_finite():
    from witcert.config import CertConfig
    gen = torch.Generator().manual_seed(4)
    layer = make_layer(hkv=2, d=64, num_slots=24, gen=gen)
    kp, vp = random_kv(16, 2, 64, gen=gen)
    slots = torch.arange(16, device=DEV)
    write_kv_(layer, kp, vp, slots=slots)
    q = torch.randn(5, 4, 64, generator=gen).to(DEV)
    kn, vn = random_kv(5, 2, 64, gen=gen)
    kn[2, 1, 7] = float("nan")
    q[4, 0, 3] = float("inf")
    ker = extend_attention(q, kn, vn, layer, slots, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-6)
    inf = torch.isinf(ker.cert).cpu()
    # token 2's K head 1 is bad: rows 2.. of query heads 2, 3 attend it (causal)
    assert inf[2:, 2:].all() and not inf[:2].any() and inf[4, 0]
    assert not inf[2:4, :2].any()
    assert torch.isfinite(ker.out).all()


def test_extend_kernel_takes_a_budget_per_new_token_like_the_reference():
    """delta_loc [T] (the engines' anytime budget at each token's position): each row's
    certificate is the one the reference gives that row's budget, bitwise the kernel's own
    run at that budget as a scalar; a budget of the wrong length is refused."""
    from witcert.config import CertConfig
    from witcert.ref.extend import extend_attention_cert
    gen = torch.Generator().manual_seed(11)
    layer = make_layer(hkv=2, d=64, num_slots=48, gen=gen)
    kp, vp = random_kv(40, 2, 64, gen=gen)
    slots = torch.randperm(48, generator=gen)[:40].to(DEV)
    write_kv_(layer, kp, vp, slots=slots)
    q = (torch.randn(6, 4, 64, generator=gen) * 2).to(DEV)
    kn, vn = random_kv(6, 2, 64, gen=gen)
    cert = CertConfig(radius="prob")
    dl = torch.tensor([1e-2, 1e-3, 1e-4, 1e-6, 1e-9, 1e-12], dtype=torch.float64)
    ker = extend_attention(q, kn, vn, layer, slots, sm_scale=0.125, cert=cert, delta_loc=dl)
    ref = extend_attention_cert(q, kn, vn, layer, slots, sm_scale=0.125, cert=cert, delta_loc=dl)
    kc, rc = ker.cert.cpu(), ref.cert.cpu()
    assert (kc >= rc * (1 - 1e-4)).all() and (kc <= rc * 1.01 + 1e-3).all()
    for t in range(6):  # row t equals the scalar-budget run at dl[t]
        one = extend_attention(q, kn, vn, layer, slots, sm_scale=0.125, cert=cert,
                               delta_loc=float(dl[t]))
        assert torch.equal(one.cert[t].cpu(), kc[t])
    with pytest.raises(ValueError, match="delta_loc"):
        extend_attention(q, kn, vn, layer, slots, sm_scale=0.125, cert=cert,
                         delta_loc=torch.full((5,), 1e-3))
