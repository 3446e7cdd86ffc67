"""Contract tests: Triton paged decode (split + merge) against the reference decode.

Tiers (docs/STYLE.md, docs/PROOFS.md section 5):
- float: out and LSE against float64 attention on the stored values, within 2x the error of
  fp16 SDPA emulated on the same values (q, k^, v^ rounded to fp16, fp32 logits, weights
  rounded to fp16): the kernel's p.v runs on fp16 tensor cores;
- arithmetic slack: the logit the kernel used is within (its radius - the compression
  radius) of ``sm q.k^`` computed exactly;
- certificate: kernel cert >= TV between the exact-key softmax and the softmax of the
  kernel's own logits (exact arithmetic, tests/fpexact.py), and within a small relative
  tolerance of the reference certificate (same formula, the kernel's own slack);
- exact agreement of the non-finite handling (which heads get +inf).
CPU: Triton interpreter, tiny shapes; the GPU machine runs the full matrix.
"""

from __future__ import annotations

import os

import torch

GPU = torch.cuda.is_available()
if not GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

import fpexact  # noqa: E402
from cases import DECODE_SHAPES, DEV, compression_radius, make_layer, random_kv  # noqa: E402

from witcert.config import CertConfig  # noqa: E402
from witcert.kernels.decode import decode_attention  # noqa: E402
from witcert.kernels.plan import DecodePlan, decode_plan, plan_splits  # noqa: E402

IMPLS = ["triton", "cuda"] if GPU else ["triton"]


def plan_for(impl: str) -> DecodePlan:
    return decode_plan("cuda:0" if GPU else "cpu").replace(impl=impl)


def dim_for(impl: str) -> int:
    """Head dim of the small cases: 128 for the CUDA kernel (the only D it serves), else 64."""
    return 128 if impl == "cuda" else 64
from witcert.kernels.write import write_kv_  # noqa: E402
from witcert.ref import attention as ref_attn  # noqa: E402
from witcert.ref.pool import gather  # noqa: E402
from witcert.ref.types import K_SIDE, V_SIDE  # noqa: E402


def make_decode_case(*, seq_lens, hq, hkv, d, page, bits=16, outliers=0, seed=0, device=DEV,
                     rounds=10, q_dtype=torch.float32, group=32):
    """Pool filled by the Triton writer, shuffled pages, exact K/V kept per sequence.

    Returns (layer_kv, q [B, Hq, D] in q_dtype, block_table int32, seq_lens int32, exact list of
    (k [N, Hkv, D], v [N, Hkv, D]) per sequence).
    """
    gen = torch.Generator().manual_seed(seed)
    pages_per = [-(-n // page) for n in seq_lens]
    max_pages = max(pages_per)
    num_pages = sum(pages_per) + 1
    layer = make_layer(hkv=hkv, d=d, num_slots=num_pages * page, bits=bits, outliers=outliers,
                       gen=gen, device=device, rounds=rounds, group=group)
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
    q = (torch.randn(len(seq_lens), hq, d, generator=gen) * 2.0).to(q_dtype).to(device)
    return layer, q, block_table.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device), exact


def stored(layer, block_table, seq_lens, page, b):
    n = int(seq_lens[b])
    slots = ref_attn.token_slots(block_table[b], n, page_size=page)
    return gather(layer, K_SIDE, slots)[0], gather(layer, V_SIDE, slots)[0], slots


def check_tiers(layer, q, bt, sl, exact, *, page, sm, cert, dl, splits, ker, ref, dbg):
    hq, hkv = q.shape[1], layer.num_kv_heads
    kvh = torch.arange(hq, device=q.device) // (hq // hkv)
    for b in range(q.shape[0]):
        n = int(sl[b])
        kh, vh, slots = stored(layer, bt, sl, page, b)
        err16, out64 = fpexact.fp16_sdpa_error(q[b], kh, vh, sm_scale=sm)
        err_ker = (ker.out[b].cpu().double() - out64).abs().max().item()
        assert err_ker <= 2 * err16 + 1e-6, f"b={b}: out error {err_ker:.3g} vs fp16 SDPA {err16:.3g}"
        l_used = dbg["logits"][b, :, :n].cpu()
        z_exact_stored = fpexact.exact_shifted_logits(q[b].float().cpu(), kh[:, kvh].transpose(0, 1).cpu(),
                                                      sm_scale=sm)
        # lse: the kernel's logits within its slack, then one fp32 softmax
        lse64 = torch.logsumexp(l_used.double(), -1)
        assert ((ker.lse[b].cpu().double() - lse64).abs() <= 1e-5 * (1 + lse64.abs())).all()
        # arithmetic slack: |l_used - sm q.k^| <= whole radius - compression radius
        uq = compression_radius(q[b], layer, slots, sm_scale=sm, cert=cert, delta_loc=dl).cpu()
        shift = l_used.double().amax(-1, keepdim=True)
        err_l = ((l_used.double() - shift) - z_exact_stored).abs()
        # the shift itself: exact max vs used max differ by at most the largest slack
        slack = ker.radius[b, :, :n].cpu().double() - uq
        assert (slack > 0).all()
        assert (err_l <= 2 * slack.amax(-1, keepdim=True) + slack).all(), "logit outside the slack"
        # soundness: TV(exact keys, the kernel's logits) <= cert
        z_exact = fpexact.exact_shifted_logits(q[b].float().cpu(), exact[b][0].float()[:, kvh].transpose(0, 1).cpu(),
                                               sm_scale=sm)
        tv = fpexact.tv(z_exact, l_used, ker.cert[b].cpu())
        assert (ker.cert[b].cpu().double() >= tv).all(), f"b={b}: cert {ker.cert[b]} below TV {tv}"
    assert torch.isfinite(ker.cert).all() and (ker.cert >= 0).all()
    torch.testing.assert_close(ker.cert, ref.cert, rtol=5e-3, atol=5e-5)
    # the kernel bounds ||v^_t|| by its scales (127.5 sqrt(G sum_g s_g^2)): a larger, still sound vbound
    assert (ker.vbound >= ref.vbound * (1 - 1e-5)).all() and (ker.vbound <= 4 * ref.vbound + 1e-4).all()
    n = ref.radius.shape[-1]
    torch.testing.assert_close(ker.radius[..., :n], ref.radius, rtol=5e-3, atol=5e-5)
    assert (ker.radius[..., n:] == 0).all()


def decode_meets_every_tier(layer, q, bt, sl, exact, *, sm, plan, splits=2, page=16, dl=1e-6,
                            cert=CertConfig(radius="min")):
    """Decode with the kernel (``plan``) and the reference, then ``check_tiers``."""
    dbg = {}
    kw = dict(page_size=page, sm_scale=sm, cert=cert, delta_loc=dl, num_splits=splits, return_radius=True)
    ker = decode_attention(q, layer, bt, sl, debug=dbg, plan=plan, **kw)
    ref = ref_attn.decode_attention(q, layer, bt, sl, **kw)
    check_tiers(layer, q, bt, sl, exact, page=page, sm=sm, cert=cert, dl=dl, splits=splits, ker=ker, ref=ref,
                dbg=dbg)


# (seq_lens, Hq, Hkv, D, page, splits, bits): the shared shapes (tests/cases.py), one split
# count and dither width each; GQA 7 and full sizes on the GPU below
CASES = [(*shape, splits, bits) for shape, splits, bits in zip(DECODE_SHAPES, (1, 2, 3, 4), (16, 8, 16, 24))]
CASES += [((97, 5), 7, 1, 128, 1, 3, 16)]
if GPU:
    CASES += [((1, 15, 16, 17, 97, 1000, 4096), g * 2, 2, d, p, s, bits)
              for g in (1, 4, 7) for d in (64, 128) for p, s in ((1, 8), (16, 1)) for bits in (8, 16)]
    CASES += [((1, 33, 4096, 20000), 32, 8, 128, 16, None, 8)]  # planned splits, GPU shape


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("seq_lens,hq,hkv,d,page,splits,bits", CASES)
def test_decode_kernel_float_tier_slack_and_sound_certificate(seq_lens, hq, hkv, d, page, splits, bits, impl):
    layer, q, bt, sl, exact = make_decode_case(seq_lens=seq_lens, hq=hq, hkv=hkv, d=d, page=page, bits=bits,
                                               seed=len(seq_lens) * 7 + hq + d)
    sm = d ** -0.5
    cert = CertConfig(radius="min")
    dl = 1e-6
    dbg = {}
    ker = decode_attention(q, layer, bt, sl, page_size=page, sm_scale=sm, cert=cert, delta_loc=dl,
                           num_splits=splits, return_radius=True, debug=dbg, plan=plan_for(impl))
    ref = ref_attn.decode_attention(q, layer, bt, sl, page_size=page, sm_scale=sm, cert=cert,
                                    delta_loc=dl, num_splits=splits or 1, return_radius=True)
    check_tiers(layer, q, bt, sl, exact, page=page, sm=sm, cert=cert, dl=dl, splits=splits, ker=ker,
                ref=ref, dbg=dbg)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("group,bits,hq", [(64, 16, 16), (64, 8, 4), (128, 16, 2), (128, 8, 16)])
def test_decode_kernel_groups_of_64_and_128_meet_every_tier(group, bits, hq, impl):
    layer, q, bt, sl, exact = make_decode_case(seq_lens=(1, 40, 300), hq=hq, hkv=2, d=128, page=16,
                                               bits=bits, seed=group + bits + hq, group=group)
    decode_meets_every_tier(layer, q, bt, sl, exact, sm=0.1, plan=plan_for(impl))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
def test_decode_kernel_narrow_queries_two_or_three_digits(q_dtype, impl):
    """bf16 queries use 2 digits, fp16 3: both meet every tier."""
    layer, q, bt, sl, exact = make_decode_case(seq_lens=(33, 8), hq=4, hkv=2, d=dim_for(impl), page=16, bits=8,
                                               seed=21, q_dtype=q_dtype)
    decode_meets_every_tier(layer, q, bt, sl, exact, sm=0.125, plan=plan_for(impl))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("radius", ["det", "prob"])
def test_decode_kernel_radius_modes_match_reference(radius, impl):
    layer, q, bt, sl, _ = make_decode_case(seq_lens=(33, 9), hq=4, hkv=2, d=dim_for(impl), page=16, bits=8, seed=5)
    cert = CertConfig(radius=radius)
    kw = dict(page_size=16, sm_scale=0.125, cert=cert, delta_loc=torch.tensor([1e-5, 1e-3], device=DEV),
              num_splits=2)
    ker = decode_attention(q, layer, bt, sl, plan=plan_for(impl), **kw)
    ref = ref_attn.decode_attention(q, layer, bt, sl, **kw)
    assert ker.radius_kind == radius
    torch.testing.assert_close(ker.cert, ref.cert, rtol=5e-3, atol=5e-5)


@pytest.mark.parametrize("rounds", [7, 10])
def test_decode_kernel_with_outlier_channels_meets_every_tier(rounds):
    layer, q, bt, sl, exact = make_decode_case(seq_lens=(21, 5), hq=2, hkv=1, d=64, page=16, outliers=2, seed=9,
                                               rounds=rounds)
    decode_meets_every_tier(layer, q, bt, sl, exact, sm=0.125, plan=None, splits=1, dl=1e-4, cert=CertConfig())


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_kernel_cert_off_returns_no_bound_and_the_same_output(impl):
    layer, q, bt, sl, _ = make_decode_case(seq_lens=(17,), hq=4, hkv=2, d=dim_for(impl), page=16, seed=3)
    kw = dict(page_size=16, sm_scale=0.125, delta_loc=1e-4, num_splits=2, plan=plan_for(impl))
    on = decode_attention(q, layer, bt, sl, cert=CertConfig(), **kw)
    off = decode_attention(q, layer, bt, sl, cert=CertConfig(enabled=False), **kw)
    assert off.cert is None and off.vbound is None and off.radius_kind == "none"
    assert torch.equal(on.out, off.out) and torch.equal(on.lse, off.lse)


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_kernel_nonfinite_inputs_give_inf_cert_for_affected_heads_only(impl):
    layer, q, bt, sl, exact = make_decode_case(seq_lens=(12, 12, 12), hq=4, hkv=2, d=dim_for(impl), page=16, seed=4)
    # rewrite one token of sequence 1 with a NaN in K head 0, of sequence 2 with inf in V head 1
    for b, side, head in ((1, "k", 0), (2, "v", 1)):
        k, v = (x.clone() for x in exact[b])
        (k if side == "k" else v)[5, head, 3] = float("nan") if side == "k" else float("inf")
        slots = ref_attn.token_slots(bt[b], 12, page_size=16)
        write_kv_(layer, k, v, slots=slots)
    q[0, 2, 7] = float("inf")
    kw = dict(page_size=16, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-4, num_splits=2)
    ker = decode_attention(q, layer, bt, sl, plan=plan_for(impl), **kw)
    ref = ref_attn.decode_attention(q, layer, bt, sl, **kw)
    expect_inf = torch.zeros(3, 4, dtype=torch.bool)
    expect_inf[0, 2] = True
    expect_inf[1, 0:2] = True  # KV head 0 serves query heads 0, 1
    expect_inf[2, 2:4] = True
    assert torch.equal(torch.isinf(ker.cert).cpu(), expect_inf)
    assert torch.equal(torch.isinf(ref.cert).cpu(), expect_inf)
    assert not torch.isnan(ker.cert).any() and not torch.isnan(ker.out).any()
    fin = ~expect_inf.to(DEV)
    torch.testing.assert_close(ker.cert[fin], ref.cert[fin], rtol=5e-3, atol=5e-5)
    torch.testing.assert_close(ker.out, ref.out, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("impl", IMPLS)
def test_planned_splits_depend_on_the_request_length_only(impl):
    """num_splits=None: a request's result is bitwise the same alone or batched with longer ones."""
    plan = DecodePlan(impl=impl, block_n=16, num_warps=1, num_stages=1)
    assert plan_splits(1, plan) == 1 and plan_splits(512, plan) == 1 and plan_splits(513, plan) == 2
    assert plan_splits(10**7, plan) == 256
    layer, q, bt, sl, _ = make_decode_case(seq_lens=(1100, 30), hq=2, hkv=1, d=dim_for(impl), page=16, seed=6)
    kw = dict(page_size=16, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-4, num_splits=None, plan=plan)
    both = decode_attention(q, layer, bt, sl, **kw)
    alone = decode_attention(q[1:], layer, bt[1:, :2], sl[1:], **kw)
    assert torch.equal(both.out[1], alone.out[0]) and torch.equal(both.cert[1], alone.cert[0])


@pytest.mark.skipif(not GPU, reason="the CUDA decode kernel needs a GPU")
@pytest.mark.parametrize("seq_lens,hq,hkv,radius,q_dtype", [
    ((3000,), 28, 4, "min", torch.bfloat16), ((1, 17, 1500), 16, 2, "prob", torch.float16),
    ((5000, 200), 8, 1, "det", torch.float32), ((2500,), 64, 8, None, torch.bfloat16)])
def test_cuda_decode_pairs_at_eight_heads_per_kv_head_give_the_one_warp_bits(seq_lens, hq, hkv, radius, q_dtype):
    """8 query heads per KV head (GQA 5-8), b = 16, groups of 32: the build for small grids (K / V warp
    pairs, ``DecodePlan.cuda_pairs``) gives bitwise the outputs, lse, certificates, value bounds,
    radii and logits of the one-warp kernel, so choosing it by grid size keeps every result
    batch-invariant; ``auto`` takes it for these small grids."""
    from witcert.kernels import cuda as wc_cuda
    from witcert.kernels.launch import _sm_count
    layer, q, bt, sl, _ = make_decode_case(seq_lens=seq_lens, hq=hq, hkv=hkv, d=128, page=16, seed=len(seq_lens) + hq,
                                           q_dtype=q_dtype)
    if len(seq_lens) == 1:
        q[0, 1, 5] = 3.0e4  # a huge query entry: large logits through both arrangements
    cert = CertConfig(radius=radius) if radius else CertConfig(enabled=False)
    base = decode_plan("cuda:0").replace(impl="cuda")
    assert wc_cuda.pairs_for_grid(qgp=8, group=32, bits=16, ctas=len(seq_lens) * hkv * 8, sms=_sm_count(q.device))
    runs = {}
    for mode in ("never", "always", "auto"):
        dbg = {}
        runs[mode] = (decode_attention(q, layer, bt, sl, page_size=16, sm_scale=128 ** -0.5, cert=cert, delta_loc=1e-5,
                                       num_splits=None, return_radius=True, plan=base.replace(cuda_pairs=mode),
                                       debug=dbg), dbg)
    one, dbg1 = runs["never"]
    for mode in ("always", "auto"):
        got, dbg = runs[mode]
        for name in ("out", "lse", "cert", "vbound", "radius"):
            a, b = getattr(one, name), getattr(got, name)
            assert (a is None) == (b is None), name
            if a is not None:
                torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=f"{mode}: {name}")
        torch.testing.assert_close(dbg1["logits"], dbg["logits"], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("sm", [-0.125, 0.0, float("inf"), float("nan")])
def test_decode_kernel_rejects_a_scale_that_is_not_finite_and_positive(sm):
    layer, q, bt, sl, _ = make_decode_case(seq_lens=(3,), hq=2, hkv=1, d=64, page=16, seed=1)
    with pytest.raises(ValueError, match="sm_scale"):
        decode_attention(q, layer, bt, sl, page_size=16, sm_scale=sm, cert=CertConfig(), delta_loc=1e-4)
