"""Contract tests: Triton paged decode (split + merge) against the reference decode.

Tiers (docs/STYLE.md): float (out, LSE within 2x the plain torch fp32 error against
float64 on the stored values), certificate (kernel cert >= true TV in float64 from the
exact keys; equal to the reference cert to a small relative tolerance), and exact
agreement of the non-finite handling. CPU: Triton interpreter, tiny shapes.
"""

from __future__ import annotations

import os

import torch

GPU = torch.cuda.is_available()
if not GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from test_kernels_write import DEV, make_layer, random_kv  # noqa: E402

from witcert.config import CertConfig  # noqa: E402
from witcert.kernels.decode import decode_attention, plan_splits  # noqa: E402
from witcert.kernels.write import write_kv_  # noqa: E402
from witcert.ref import attention as ref_attn  # noqa: E402
from witcert.ref.cert import tv_distance  # noqa: E402
from witcert.ref.pool import gather  # noqa: E402
from witcert.ref.types import K_SIDE, V_SIDE  # noqa: E402


def make_decode_case(*, seq_lens, hq, hkv, d, page, bits=16, outliers=0, seed=0, device=DEV):
    """Pool filled by the Triton writer, shuffled pages, exact K/V kept per sequence.

    Returns (layer_kv, q f32 [B, Hq, D], block_table int32, seq_lens int32, exact list of
    (k [N, Hkv, D], v [N, Hkv, D]) per sequence).
    """
    gen = torch.Generator().manual_seed(seed)
    pages_per = [-(-n // page) for n in seq_lens]
    max_pages = max(pages_per)
    num_pages = sum(pages_per) + 1
    layer = make_layer(hkv=hkv, d=d, num_slots=num_pages * page, bits=bits, outliers=outliers,
                       gen=gen, device=device)
    perm = torch.randperm(num_pages, generator=gen)
    block_table = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    exact, used = [], 0
    for b, n in enumerate(seq_lens):
        block_table[b, :pages_per[b]] = perm[used:used + pages_per[b]].to(torch.int32)
        used += pages_per[b]
        k, v = random_kv(n, hkv, d, gen=gen, device=device)
        t = torch.arange(n)
        slots = (block_table[b, t // page].long() * page + t % page).to(device)
        write_kv_(layer, k, v, slots=slots)
        exact.append((k, v))
    q = (torch.randn(len(seq_lens), hq, d, generator=gen) * 2.0).to(device)
    return layer, q, block_table.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device), exact


def _stored(layer, block_table, seq_lens, page, b):
    n = int(seq_lens[b])
    slots = ref_attn.token_slots(block_table[b], n, page_size=page)
    return gather(layer, K_SIDE, slots)[0], gather(layer, V_SIDE, slots)[0]


CASES = [  # (seq_lens, Hq, Hkv, D, page, splits)
    ((1, 97), 4, 1, 64, 16, 1),
    ((15, 16, 17), 3, 1, 64, 16, 2),
    ((97, 5), 7, 1, 128, 1, 3),
    ((40,), 2, 2, 64, 1, 4),
]
if GPU:
    CASES += [((1, 15, 16, 17, 97, 1000, 4096), g * 2, 2, d, p, s)
              for g in (1, 3, 4, 7) for d in (64, 128) for p in (1, 16) for s in (1, 8)]


@pytest.mark.parametrize("seq_lens,hq,hkv,d,page,splits", CASES)
def test_decode_kernel_matches_float64_within_2x_torch_error_and_cert_is_sound(seq_lens, hq, hkv, d, page, splits):
    layer, q, bt, sl, exact = make_decode_case(seq_lens=seq_lens, hq=hq, hkv=hkv, d=d, page=page,
                                               seed=len(seq_lens) * 7 + hq + d)
    sm = d ** -0.5
    cert = CertConfig(radius="min")
    dl = 1e-6
    ker = decode_attention(q, layer, bt, sl, page_size=page, sm_scale=sm, cert=cert, delta_loc=dl,
                           num_splits=splits, return_radius=True)
    ref = ref_attn.decode_attention(q, layer, bt, sl, page_size=page, sm_scale=sm, cert=cert,
                                    delta_loc=dl, num_splits=splits, return_radius=True)
    for b in range(len(seq_lens)):
        kh, vh = _stored(layer, bt, sl, page, b)
        out64, p_hat = ref_attn.exact_attention(q[b], kh, vh, sm_scale=sm, return_probs=True)
        z64 = sm * torch.einsum("hd,nhd->hn", q[b].double(), kh.double()[:, torch.arange(hq) // (hq // hkv)])
        lse64 = torch.logsumexp(z64, -1)
        err_ref = (ref.out[b].double() - out64).abs().max().item()
        err_ker = (ker.out[b].double() - out64).abs().max().item()
        assert err_ker <= 2 * err_ref + 1e-6, f"b={b}: out error {err_ker:.3g} vs torch fp32 {err_ref:.3g}"
        lerr_ref = (ref.lse[b].double() - lse64).abs().max().item()
        lerr_ker = (ker.lse[b].double() - lse64).abs().max().item()
        # floor: 4 ulps of |lse| (torch can land within 0.5 ulp by luck on 1-token rows)
        floor = 4 * 2.0**-23 * lse64.abs().max().item()
        assert lerr_ker <= 2 * lerr_ref + floor, f"b={b}: lse error {lerr_ker:.3g} vs {lerr_ref:.3g}"
        # soundness: true TV between exact-key and stored-key softmax (float64)
        _, p_true = ref_attn.exact_attention(q[b], exact[b][0].float(), vh, sm_scale=sm, return_probs=True)
        tv = tv_distance(p_true, p_hat)
        assert (ker.cert[b].double() >= tv).all(), f"b={b}: cert {ker.cert[b]} below true TV {tv}"
    assert torch.isfinite(ker.cert).all()
    torch.testing.assert_close(ker.cert, ref.cert, rtol=2e-4, atol=2e-6)
    torch.testing.assert_close(ker.vbound, ref.vbound, rtol=2e-4, atol=1e-5)
    n = ref.radius.shape[-1]
    torch.testing.assert_close(ker.radius[..., :n], ref.radius, rtol=1e-5, atol=1e-7)
    assert (ker.radius[..., n:] == 0).all()


@pytest.mark.parametrize("radius", ["det", "prob"])
def test_decode_kernel_radius_modes_match_reference(radius):
    layer, q, bt, sl, _ = make_decode_case(seq_lens=(33, 9), hq=4, hkv=2, d=64, page=16, bits=8, seed=5)
    cert = CertConfig(radius=radius)
    kw = dict(page_size=16, sm_scale=0.125, cert=cert, delta_loc=torch.tensor([1e-5, 1e-3], device=DEV),
              num_splits=2)
    ker = decode_attention(q, layer, bt, sl, **kw)
    ref = ref_attn.decode_attention(q, layer, bt, sl, **kw)
    assert ker.radius_kind == radius
    torch.testing.assert_close(ker.cert, ref.cert, rtol=2e-4, atol=2e-6)


def test_decode_kernel_with_outlier_channels_matches_reference():
    layer, q, bt, sl, _ = make_decode_case(seq_lens=(21,), hq=2, hkv=1, d=64, page=16, outliers=2, seed=9)
    kw = dict(page_size=16, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-4, num_splits=1)
    ker = decode_attention(q, layer, bt, sl, **kw)
    ref = ref_attn.decode_attention(q, layer, bt, sl, **kw)
    torch.testing.assert_close(ker.out, ref.out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ker.cert, ref.cert, rtol=2e-4, atol=2e-6)


def test_decode_kernel_cert_off_returns_no_bound_and_the_same_output():
    layer, q, bt, sl, _ = make_decode_case(seq_lens=(17,), hq=4, hkv=2, d=64, page=16, seed=3)
    kw = dict(page_size=16, sm_scale=0.125, delta_loc=1e-4, num_splits=2)
    on = decode_attention(q, layer, bt, sl, cert=CertConfig(), **kw)
    off = decode_attention(q, layer, bt, sl, cert=CertConfig(enabled=False), **kw)
    assert off.cert is None and off.vbound is None and off.radius_kind == "none"
    assert torch.equal(on.out, off.out) and torch.equal(on.lse, off.lse)


def test_decode_kernel_nonfinite_inputs_give_inf_cert_for_affected_heads_only():
    layer, q, bt, sl, exact = make_decode_case(seq_lens=(12, 12, 12), hq=4, hkv=2, d=64, page=16, seed=4)
    # rewrite one token of sequence 1 with a NaN in K head 0, of sequence 2 with inf in V head 1
    for b, side, head in ((1, "k", 0), (2, "v", 1)):
        k, v = (x.clone() for x in exact[b])
        (k if side == "k" else v)[5, head, 3] = float("nan") if side == "k" else float("inf")
        slots = ref_attn.token_slots(bt[b], 12, page_size=16)
        write_kv_(layer, k, v, slots=slots)
    q[0, 2, 7] = float("inf")
    kw = dict(page_size=16, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-4, num_splits=2)
    ker = decode_attention(q, layer, bt, sl, **kw)
    ref = ref_attn.decode_attention(q, layer, bt, sl, **kw)
    expect_inf = torch.zeros(3, 4, dtype=torch.bool)
    expect_inf[0, 2] = True
    expect_inf[1, 0:2] = True  # KV head 0 serves query heads 0, 1
    expect_inf[2, 2:4] = True
    assert torch.equal(torch.isinf(ker.cert).cpu(), expect_inf)
    assert torch.equal(torch.isinf(ref.cert).cpu(), expect_inf)
    assert not torch.isnan(ker.cert).any() and not torch.isnan(ker.out).any()
    fin = ~expect_inf.to(DEV)
    torch.testing.assert_close(ker.cert[fin], ref.cert[fin], rtol=2e-4, atol=2e-6)
    torch.testing.assert_close(ker.out, ref.out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ker.vbound, ref.vbound, rtol=2e-4, atol=1e-5)


def test_planned_splits_depend_on_the_request_length_only():
    """num_splits=None: a request's result is bitwise the same alone or batched with longer ones."""
    assert plan_splits(1) == 1 and plan_splits(512) == 1 and plan_splits(513) == 2
    assert plan_splits(10**7) == 256
    layer, q, bt, sl, _ = make_decode_case(seq_lens=(1100, 30), hq=2, hkv=1, d=64, page=16, seed=6)
    kw = dict(page_size=16, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-4, num_splits=None)
    both = decode_attention(q, layer, bt, sl, **kw)
    alone = decode_attention(q[1:], layer, bt[1:, :2], sl[1:], **kw)
    assert torch.equal(both.out[1], alone.out[0]) and torch.equal(both.cert[1], alone.cert[0])


@pytest.mark.parametrize("fma_dot", [False, True])
def test_decode_kernel_fma_and_dot_paths_both_match_reference(fma_dot):
    """Both ways of forming the GQA group's products (register FMA, ``tl.dot``) meet the
    float tier and give the reference certificate."""
    layer, q, bt, sl, _ = make_decode_case(seq_lens=(37, 3), hq=6, hkv=2, d=64, page=16, seed=11)
    kw = dict(page_size=16, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-4, num_splits=2)
    ker = decode_attention(q, layer, bt, sl, fma_dot=fma_dot, **kw)
    ref = ref_attn.decode_attention(q, layer, bt, sl, **kw)
    torch.testing.assert_close(ker.out, ref.out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ker.lse, ref.lse, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ker.cert, ref.cert, rtol=2e-4, atol=2e-6)

