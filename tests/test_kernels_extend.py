"""Contract: Triton extend (prefill over the compressed prefix, tensor cores) vs the reference.

Tiers (as the decode kernel's, tests/test_kernels_decode.py):
- float: out against float64 attention on the stored prefix + exact new tokens, within 2x the
  error of fp16 SDPA emulated on the same values (the kernel's p.v runs on fp16 tensor cores);
- certificate: cert >= TV between the exact-key softmax and the softmax of the kernel's own
  logits (exact arithmetic, tests/fpexact.py) for every (new token, query head), and close to
  the reference certificate (same formula, the kernel's own slack).
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
from cases import DEV, compression_radius, extend_visible, fake_extend_library, make_layer, random_kv  # noqa: E402

from witcert.kernels.extend import extend_attention  # noqa: E402
from witcert.kernels.write import write_kv_  # noqa: E402
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


def check_sound(q, layer, slots, kp, kn, ker, logits, *, sm, causal):
    """cert >= TV(softmax of the exact keys, softmax of the kernel's logits), every row."""
    T, hq, _ = q.shape
    kvh = torch.arange(hq) // (hq // layer.num_kv_heads)
    k_exact = torch.cat([kp.float().cpu(), kn.float().cpu()])[:, kvh].transpose(0, 1)  # [Hq, N, D]
    vis = extend_visible(slots.shape[0], T, causal)
    step = max(1, 4096 // (hq * k_exact.shape[1]))  # rows per batch of the exact check
    for t0 in range(0, T, step):
        t1 = min(T, t0 + step)
        mask = vis[t0:t1, None, :].expand(t1 - t0, hq, -1)
        z = fpexact.exact_shifted_logits(q[t0:t1].float().cpu(), k_exact.expand(t1 - t0, -1, -1, -1),
                                         sm_scale=sm, mask=mask)
        cert = ker.cert[t0:t1].cpu()
        tv = fpexact.tv(z, logits[t0:t1].cpu(), cert, mask=mask)
        assert (cert.double() >= tv).all(), f"rows {t0}..{t1}: cert {cert} below TV {tv}"


@pytest.mark.parametrize("np_,T,hq,hkv,d,outliers,causal", CASES)
def test_extend_kernel_float_tier_and_sound_certificate(np_, T, hq, hkv, d, outliers, causal):
    from witcert.config import CertConfig
    gen = torch.Generator().manual_seed(np_ + T + d)
    layer = make_layer(hkv=hkv, d=d, num_slots=np_ + 8, outliers=outliers, gen=gen)
    slots = torch.randperm(np_ + 8, generator=gen)[:np_].to(DEV)
    kp, vp = random_kv(np_, hkv, d, gen=gen)
    if np_:
        write_kv_(layer, kp, vp, slots=slots)
    kn, vn = random_kv(T, hkv, d, gen=gen)
    q = torch.randn(T, hq, d, generator=gen).to(DEV)
    sm = d ** -0.5
    dbg = {}
    ker = extend_attention(q, kn, vn, layer, slots, sm_scale=sm, causal=causal, cert=CertConfig(),
                           delta_loc=1e-6, debug=dbg)
    plain = extend_attention(q, kn, vn, layer, slots, sm_scale=sm, causal=causal)
    assert torch.equal(plain, ker.out)  # the certificate does not change the output
    kh = torch.cat([gather(layer, K_SIDE, slots)[0].cpu(), kn.float().cpu()])
    vh = torch.cat([gather(layer, V_SIDE, slots)[0].cpu(), vn.float().cpu()])
    err16, out64 = fpexact.fp16_sdpa_error(q, kh, vh, sm_scale=sm, visible=extend_visible(np_, T, causal))
    err_ker = (ker.out.double().cpu() - out64).abs().max().item()
    assert err_ker <= 2 * err16 + 1e-6, f"extend error {err_ker:.3g} vs fp16 SDPA {err16:.3g}"
    lse64 = torch.logsumexp(dbg["logits"].double().cpu(), -1)
    assert ((ker.lse.cpu().double() - lse64).abs() <= 1e-5 * (1 + lse64.abs())).all()
    assert torch.isfinite(ker.cert).all() and (ker.cert >= 0).all()
    check_sound(q, layer, slots, kp, kn, ker, dbg["logits"], sm=sm, causal=causal)


@pytest.mark.parametrize("Np,T,hq,hkv,d,outliers,radius", [(17, 5, 3, 1, 64, 0, "min"), (0, 9, 2, 2, 64, 1, "det"),
                                                           (33, 18, 4, 2, 128, 0, "prob")])
def test_extend_kernel_certificate_matches_the_reference_spec_and_is_sound(Np, T, hq, hkv, d, outliers, radius):
    """The kernel's certificate per (new token, head) is within its slack of the reference
    extend certificate and above the exact TV (exact keys vs the kernel's own logits)."""
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
    dbg = {}
    ker = extend_attention(q, kn, vn, layer, slots, sm_scale=d ** -0.5, cert=cert, delta_loc=1e-6, debug=dbg)
    check_sound(q, layer, slots, kp, kn, ker, dbg["logits"], sm=d ** -0.5, causal=True)
    ref = extend_attention_cert(q, kn, vn, layer, slots, sm_scale=d ** -0.5, cert=cert, delta_loc=1e-6)
    # the lse within 1e-5 of the reference's; where the CUDA prefix kernel served, also within the
    # row's largest arithmetic slack (its radius less its compression radius: the fp16 route moves a
    # prefix logit by at most that, and fp32 queries round to fp16 on it, PROOFS 5.4)
    tol = torch.zeros(T, hq, dtype=torch.float64)
    if dbg["impl"] == "cuda":
        for t in range(T):
            uq = compression_radius(q[t], layer, slots, sm_scale=d ** -0.5, cert=cert, delta_loc=1e-6).cpu()
            tol[t] = (dbg["radius"][t].cpu().double()[:, :Np] - uq).amax(-1)
    rlse = ref.lse.cpu().double()
    dlse = (ker.lse.cpu().double() - rlse).abs()
    assert (dlse <= tol + 1e-5 * (1 + rlse.abs())).all(), f"lse off by {dlse.max().item():.3g}"
    assert torch.isfinite(ker.cert).all() and (ker.cert >= 0).all()
    # same formula with the kernel's own slack: exact integer dots on the prefix in the Triton
    # kernel (a slack of ~1e-6 relative), fp32 dots on the exact new tokens (gamma_{D+2} times
    # sum |q k|, ~1e-3 where the certificate is only arithmetic), against the reference's float64
    # dots; where the CUDA prefix kernel served, its fp16 route's slack on top (PROOFS 5.4, "the
    # CUDA extend's fp16 keys": about 5-8% of the radius for fp16 / bf16 queries, most of it the key's
    # rounding to fp16, and 15-18% for fp32; tests/test_extend_f16_keys.py)
    route = (0.30 if q.dtype == torch.float32 else 0.12) if dbg["impl"] == "cuda" else 0.0
    ratio = (ker.cert / ref.cert.clamp(min=1e-30)).max().item()
    assert (ker.cert >= ref.cert * (1 - 1e-3)).all(), f"below the reference: {ratio:.4g}"
    assert (ker.cert <= ref.cert * (1.01 + route) + 1e-3).all(), f"{dbg['impl']}: {ratio:.4g} of the reference"


@pytest.mark.parametrize("radius,dtype", [("det", torch.float32), ("min", torch.float32), ("min", torch.float16),
                                          ("det", torch.bfloat16)])
def test_extend_kernel_logits_stay_within_the_arithmetic_slack(radius, dtype):
    """|l_used - sm q.k^| <= the token's radius minus its compression radius, for every
    (new token, head, prefix token) (logits ~1e3, where the fp32 combination's rounding is far
    above the fixed softmax term), and |l_used - sm q.k| <= the radius on the exact new tokens.
    ``dtype``: q's and the new keys'; fp16 / bf16 take the tensor-core dots (``NEW_TC``), fp32 the
    ``ieee`` dots."""
    from witcert.config import CertConfig
    from witcert.ref.arith import tc_dot_slack
    gen = torch.Generator().manual_seed(5)
    np_, T, hq, hkv, d = 40, 6, 4, 2, 64
    layer = make_layer(hkv=hkv, d=d, num_slots=48, gen=gen)
    kp, vp = random_kv(np_, hkv, d, gen=gen)
    slots = torch.randperm(48, generator=gen)[:np_].to(DEV)
    write_kv_(layer, kp, vp, slots=slots)
    kn, vn = random_kv(T, hkv, d, gen=gen, dtype=torch.float16 if dtype == torch.float32 else dtype)
    q = (torch.randn(T, hq, d, generator=gen) * 50).to(DEV).to(dtype)
    sm, cert, dbg = d ** -0.5, CertConfig(radius=radius), {}
    extend_attention(q, kn, vn, layer, slots, sm_scale=sm, cert=cert, delta_loc=1e-6, debug=dbg)
    kvh = torch.arange(hq) // (hq // hkv)
    kh = gather(layer, K_SIDE, slots)[0].cpu()[:, kvh].transpose(0, 1)  # [Hq, Np, D], stored values
    kx = kn.float().cpu()[:, kvh].transpose(0, 1)
    for t in range(T):
        used = dbg["logits"][t].cpu().double()
        rad = dbg["radius"][t].cpu().double()
        uq = compression_radius(q[t], layer, slots, sm_scale=sm, cert=cert, delta_loc=1e-6).cpu()
        slack = rad[:, :np_] - uq
        assert (slack > 0).all()
        # both sides shifted by their own max: the shifts differ by at most the largest slack
        z = fpexact.exact_shifted_logits(q[t].float().cpu(), kh, sm_scale=sm)
        err = ((used[:, :np_] - used[:, :np_].amax(-1, keepdim=True)) - z).abs()
        assert (err <= 2 * slack.amax(-1, keepdim=True) + slack).all(), "prefix logit outside the slack"
        zn = fpexact.exact_shifted_logits(q[t].float().cpu(), kx[:, :t + 1], sm_scale=sm)
        un = used[:, np_:np_ + t + 1]
        errn = ((un - un.amax(-1, keepdim=True)) - zn).abs()
        rn = rad[:, np_:np_ + t + 1]
        assert (errn <= 2 * rn.amax(-1, keepdim=True) + rn).all(), "new-token logit outside the slack"
        # one radius per row for its exact new tokens (PROOFS 5.4), at least the slack bound of
        # its longest live key: g sm ||q|| max_j ||k_j||, g = gamma_{D+2}(u) (u = 2^-24) for the
        # ieee dots, the signed accumulation model's for the tensor-core dots
        assert (rn == rn[:, :1]).all(), "the new tokens of a row share one radius"
        tc = dbg["new_dot"] == "tc"
        assert tc == (dtype == torch.float16 or (dtype == torch.bfloat16 and GPU))
        g = tc_dot_slack(d, sm)[0] if tc else (d + 2) * 2.0**-24 / (1 - (d + 2) * 2.0**-24)
        kmax = kx[:, :t + 1].double().norm(dim=-1).amax(-1)
        assert (rn[:, 0] >= g * sm * q[t].double().cpu().norm(dim=-1) * kmax).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_extend_kernel_flags_bad_new_rows_and_queries_with_inf_and_stays_finite(dtype):
    """A non-finite new key flags every row that attends it (cert +inf) and reads as 0, with or
    without the certificate (the flag comes from the key's float64 squared norm in the stats
    pass, ``_new_key_stats``, either way); ``dtype``: q's and the new keys' (fp16: the
    tensor-core q.k)."""
    from witcert.config import CertConfig
    gen = torch.Generator().manual_seed(4)
    layer = make_layer(hkv=2, d=64, num_slots=24, gen=gen)
    kp, vp = random_kv(16, 2, 64, gen=gen)
    slots = torch.arange(16, device=DEV)
    write_kv_(layer, kp, vp, slots=slots)
    q = torch.randn(5, 4, 64, generator=gen).to(DEV).to(dtype)
    kn, vn = random_kv(6, 2, 64, gen=gen, dtype=torch.float16 if dtype == torch.float32 else dtype)
    kn, vn = kn[:5].clone(), vn[:5].clone()
    kn[2, 1, 7] = float("nan")
    kn[3, 0, 5] = float("-inf")
    q[4, 0, 3] = float("inf")
    ker = extend_attention(q, kn, vn, layer, slots, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-6)
    inf = torch.isinf(ker.cert).cpu()
    # token 2's K head 1 is bad: rows 2.. of query heads 2, 3 attend it (causal); token 3's K
    # head 0: rows 3.. of query heads 0, 1
    assert inf[2:, 2:].all() and not inf[:2].any() and inf[3:, :2].all()
    assert not inf[2, :2].any()
    assert torch.isfinite(ker.out).all()
    plain = extend_attention(q, kn, vn, layer, slots, sm_scale=0.125)  # no certificate: the same flags
    assert torch.equal(plain, ker.out)


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


CUDA_CASES = [  # (Np, T, Hq, Hkv, group, bits, radius, q dtype): the CUDA prefix phase (extend.cu)
    (1, 1, 8, 2, 32, 16, "min", torch.float16), (31, 17, 32, 8, 32, 16, "min", torch.float16),
    (97, 130, 28, 4, 32, 16, "prob", torch.bfloat16), (1000, 16, 8, 8, 64, 8, "det", torch.float32),
    (333, 65, 16, 4, 128, 8, "min", torch.float16), (64, 40, 6, 3, 32, 16, "min", torch.float32),
]


@pytest.mark.skipif(not GPU, reason="the CUDA extend kernel needs a GPU")
@pytest.mark.parametrize("np_,T,hq,hkv,group,bits,radius,dtype", CUDA_CASES)
def test_cuda_extend_prefix_is_sound_and_agrees_with_the_triton_kernel(np_, T, hq, hkv, group, bits, radius, dtype):
    """extend.cu runs the prefix phase (``impl``) and meets the same contract as the Triton
    kernel: float tier, lse, cert >= TV against the exact keys, the prefix logits within the
    arithmetic slack; its certificates and outputs agree with the Triton kernel's."""
    cuda_prefix_against_triton(np_, T, hq, hkv, group, bits, radius, dtype)


@pytest.mark.skipif(not GPU, reason="the CUDA extend kernel needs a GPU")
@pytest.mark.parametrize("np_,T,hq,hkv,group,bits,radius,dtype", [CUDA_CASES[1], CUDA_CASES[2], CUDA_CASES[3]])
def test_cuda_extend_prefix_with_groups_of_very_different_scales(np_, T, hq, hkv, group, bits, radius, dtype):
    """Keys whose groups differ by up to 2^12 in scale per token (one group large, the others down
    to 2^-12 of it, and the large group moving between tokens; the fp16 keys apply each group's
    scale after its chains' dots, PROOFS 5.4) meet the same contract, each logit within the
    kernel's own slack of the exact one."""
    cuda_prefix_against_triton(np_, T, hq, hkv, group, bits, radius, dtype, spread=True)


@pytest.mark.skipif(not GPU, reason="the CUDA extend kernel needs a GPU")
@pytest.mark.parametrize("np_,T,hq,hkv,group,bits,radius,dtype", [CUDA_CASES[1], CUDA_CASES[2], CUDA_CASES[4]])
@pytest.mark.parametrize("tile,warps", [(64, 8), (64, 4), (32, 8)])
def test_cuda_extend_prefix_other_builds_meet_the_same_contract(np_, T, hq, hkv, group, bits, radius, dtype, tile,
                                                               warps):
    """The builds besides the one the default plan takes for these small grids (32-token tiles at
    4 warps, ExtendPlan.prefix_build): 64-token tiles at 8 warps (the default for grids of more
    CTAs than SMs, BENCHMARKS.md 13ai) or 4, 32 at 8, each meets the same contract: float tier,
    lse, cert >= TV, the logits within the slack, and agreement with the Triton kernel."""
    cuda_prefix_against_triton(np_, T, hq, hkv, group, bits, radius, dtype, plan_kw=dict(cuda_tile=tile, cuda_warps=warps))


@pytest.mark.skipif(not GPU, reason="the CUDA extend kernel needs a GPU")
@pytest.mark.parametrize("np_,T,hq,hkv,group,bits,radius,dtype", [CUDA_CASES[2], CUDA_CASES[3], CUDA_CASES[4]])
@pytest.mark.parametrize("splits", [2, 3, 7])
def test_cuda_extend_prefix_in_splits_meets_the_same_contract(np_, T, hq, hkv, group, bits, radius, dtype, splits):
    """The prefix split across CTAs (``ExtendPlan.prefix_splits``), each split's state merged by
    the Triton kernel (PROOFS 5.4, "prefix splits"), meets the same contract: float tier, lse,
    cert >= TV, the logits within the slack, agreement with the Triton kernel; the logits are
    bitwise those of one split (a token's logit does not depend on the split that attends it),
    each radius that of one split plus the softmax allowance of S more rescales (E_soft: at
    most (S + 1) 2^-21 more, one fp32 rounding beside)."""
    from witcert.kernels.plan import ExtendPlan
    ker, dbg = cuda_prefix_against_triton(np_, T, hq, hkv, group, bits, radius, dtype,
                                          plan_kw=dict(prefix_splits=splits))
    tiles = -(-np_ // 32)
    assert dbg["prefix_splits"] == ExtendPlan(prefix_splits=splits).split_count(ctas=1, warps=4, sms=1, tiles=tiles) > 1
    one, dbg1 = cuda_prefix_against_triton(np_, T, hq, hkv, group, bits, radius, dtype, plan_kw=dict(prefix_splits=1))
    assert dbg1["prefix_splits"] == 1
    torch.testing.assert_close(dbg["logits"], dbg1["logits"], rtol=0, atol=0, equal_nan=True)
    seen = dbg1["radius"] > 0
    assert torch.equal(seen, dbg["radius"] > 0)
    r, r1 = dbg["radius"][seen], dbg1["radius"][seen]
    fin = torch.isfinite(r1)
    assert torch.equal(fin, torch.isfinite(r))
    grow = r[fin] - r1[fin]
    assert (grow >= 0).all() and (grow <= (dbg["prefix_splits"] + 1) * 2.0 ** -21 + 2.0 ** -22 * r1[fin]).all()
    torch.testing.assert_close(ker.lse, one.lse, rtol=1e-5, atol=1e-5)
    # the certificates: radii up by at most delta = (S + 1) 2^-21 move sum p expm1(u) by about
    # delta sum p e^u = delta (1 + sum p expm1(u)) <= 2 delta where the certificate is at most 1
    # (allowed: 2.5 delta), plus the merge's rounding (call 138: 4 one-tile splits moved
    # certificates near 1e-3 by 0.24%)
    kc, oc = ker.cert.clamp(max=1.0), one.cert.clamp(max=1.0)
    rise = 2.5 * (dbg["prefix_splits"] + 1) * 2.0 ** -21
    assert (kc <= oc * 1.001 + rise).all() and (oc <= kc * 1.001 + 1e-6).all()


def cuda_prefix_against_triton(np_, T, hq, hkv, group, bits, radius, dtype, *, spread=False, plan_kw=None):
    """The checks of the tests above; ``spread``: each prefix token's groups scaled by 2^-12 .. 1 (a
    random group of each token at 1); ``plan_kw``: more fields of the CUDA run's ExtendPlan.
    Returns the CUDA run's result and debug dict."""
    from witcert.config import CertConfig
    from witcert.kernels.plan import ExtendPlan
    gen = torch.Generator().manual_seed(np_ + T + group)
    d = 128
    layer = make_layer(hkv=hkv, d=d, num_slots=np_ + 8, bits=bits, group=group, gen=gen)
    slots = torch.randperm(np_ + 8, generator=gen)[:np_].to(DEV)
    kp, vp = random_kv(np_, hkv, d, gen=gen)
    if spread:
        ng = d // group
        f = 2.0 ** -torch.randint(0, 13, (np_, hkv, ng), generator=gen).float()
        f.scatter_(-1, torch.randint(0, ng, (np_, hkv, 1), generator=gen), 1.0)
        kp = (kp.float().cpu() * f.repeat_interleave(group, -1) * 8).to(kp.dtype).to(DEV)
    write_kv_(layer, kp, vp, slots=slots)
    kn, vn = random_kv(T, hkv, d, gen=gen)
    q = (torch.randn(T, hq, d, generator=gen) * 3).to(DEV).to(dtype)
    sm, cert = d ** -0.5, CertConfig(radius=radius)
    outs = {}
    for impl in ("cuda", "triton"):
        dbg = {}
        ker = extend_attention(q, kn, vn, layer, slots, sm_scale=sm, cert=cert, delta_loc=1e-6, debug=dbg,
                               plan=ExtendPlan(impl=impl, **(plan_kw or {}) if impl == "cuda" else {}))
        assert dbg["impl"] == impl
        outs[impl] = (ker, dbg)
    ker, dbg = outs["cuda"]
    tri, tdbg = outs["triton"]
    assert torch.isfinite(ker.cert).all() and (ker.cert >= 0).all() and torch.isfinite(ker.out).all()
    check_sound(q.float(), layer, slots, kp, kn, ker, dbg["logits"], sm=sm, causal=True)
    kh = torch.cat([gather(layer, K_SIDE, slots)[0].cpu(), kn.float().cpu()])
    vh = torch.cat([gather(layer, V_SIDE, slots)[0].cpu(), vn.float().cpu()])
    err16, out64 = fpexact.fp16_sdpa_error(q.float(), kh, vh, sm_scale=sm, visible=extend_visible(np_, T, True))
    err_ker = (ker.out.double().cpu() - out64).abs().max().item()
    assert err_ker <= 2 * err16 + 1e-6, f"extend error {err_ker:.3g} vs fp16 SDPA {err16:.3g}"
    # the prefix logits within the slack of the Triton kernel's logits (both within it of the
    # exact ones; the CUDA kernel's q.k runs on fp16 tensor cores, PROOFS 5.4)
    live = torch.isfinite(tdbg["logits"])
    assert torch.equal(live, torch.isfinite(dbg["logits"]))
    diff = torch.where(live, (dbg["logits"] - tdbg["logits"]).abs(), 0.0)
    assert (diff[live] <= 2 * tdbg["radius"][live] + 1e-6).all()
    # lse is 1-Lipschitz in the max norm of its logits: the two kernels' lse differ by at most
    # their logits' largest difference in the row, plus the fp32 rounding of the two sums
    dlse = (ker.lse.cpu() - tri.lse.cpu()).abs()
    assert (dlse <= diff.amax(-1).cpu() + 1e-5 * (1 + tri.lse.cpu().abs())).all(), "lse beyond its logits"
    # the certificates agree wherever they bound anything (TV <= 1; above 1 a small difference of
    # the two slacks is amplified without limit, call 81): the CUDA kernel's within 1% below the
    # Triton kernel's and above it by at most its fp16 route's slack (PROOFS 5.4, "the CUDA
    # extend's fp16 keys": about 5-8% of the radius for fp16 and bf16 queries, most of it the key's
    # rounding to fp16, and 15-18% for fp32 ones, whose rounding to fp16 joins the slack;
    # tests/test_extend_f16_keys.py)
    kc, tc = ker.cert.clamp(max=1.0), tri.cert.clamp(max=1.0)
    route = 0.30 if dtype == torch.float32 else 0.12
    assert (kc <= tc * (1.01 + route) + 1e-5).all() and (tc <= kc * 1.01 + 1e-5).all()
    # the prefix logits within their slack of the exact logits of the stored keys
    kvh = torch.arange(hq) // (hq // hkv)
    kst = gather(layer, K_SIDE, slots)[0].cpu()[:, kvh].transpose(0, 1)
    for t in range(0, T, max(1, T // 4)):
        uq = compression_radius(q[t].float(), layer, slots, sm_scale=sm, cert=cert, delta_loc=1e-6).cpu()
        used = dbg["logits"][t].cpu().double()[:, :np_]
        slack = dbg["radius"][t].cpu().double()[:, :np_] - uq
        assert (slack > 0).all()
        z = fpexact.exact_shifted_logits(q[t].float().cpu(), kst, sm_scale=sm)
        err = ((used - used.amax(-1, keepdim=True)) - z).abs()
        assert (err <= 2 * slack.amax(-1, keepdim=True) + slack).all(), "prefix logit outside the slack"
    return ker, dbg


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """x (fp32) with its low 13 significand bits cleared: a tf32 value."""
    return (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


@pytest.mark.skipif(not GPU, reason="the tensor-core probe needs a GPU")
def test_the_radius_sums_on_tensor_cores_meet_their_accumulation_model():
    """The CUDA kernels form each radius from three sums of non-negative products on tensor cores: two
    chained mma m16n8k8 (tf32 inputs, fp32 accumulators from zero), the rows' entries as a high and a
    low tf32 piece times the same token entries in the decode, one mma of the rows' entries rounded up
    to tf32 in the extend (a third of the problems here: the second mma's A all 0; PROOFS 5.4, "the
    radius on tensor cores"). Their soundness rests on one property of the hardware, checked here
    through the same instructions (``wc_tc_probe``): when every product is 0 or a normal fp32 number
    (the inputs are tf32, so the products are exact), the result is at least the exact sum of the 16
    products times 1 - 2^-17. Adversarial families (the second mma's A: low pieces 2^-11 to 2^-21 of the
    first's, or a family of its own): exponents spread over 2^+-40, one dominant product with the others
    just past its alignment edge (truncation's worst case), full significands that carry, the kernels'
    smallest entries (rows >= 2^-50, tokens >= 2^-69), their widest range, and half of the entries 0."""
    import ctypes

    from witcert.kernels import cuda as wc_cuda
    from witcert.kernels.launch import _arch

    lib = wc_cuda.library(qgp=4, group=32, bits=16, rounds=10, arch=_arch(torch.device("cuda")), kind="extend")
    gen = torch.Generator().manual_seed(20261203)
    n = 8192
    mant = lambda *shape: 1.0 + torch.rand(*shape, generator=gen)  # noqa: E731
    p2 = lambda lo, hi, *shape: torch.exp2(torch.randint(lo, hi, shape, generator=gen).float())  # noqa: E731
    top = 2.0 - 2.0 ** -10  # the largest tf32 significand
    edge_b = torch.full((n, 8, 8), top) * p2(-26, -19, n, 8, 8) * mant(n, 8, 8)
    edge_b[:, 0, :] = top
    families = {
        "spread": (mant(n, 16, 8) * p2(-40, 40, n, 16, 8), mant(n, 8, 8) * p2(-40, 40, n, 8, 8)),
        "alignment edge": (torch.full((n, 16, 8), top), edge_b),
        "carries": (top - mant(n, 16, 8) * 2.0 ** -9, top - mant(n, 8, 8) * 2.0 ** -9),
        "smallest": (mant(n, 16, 8) * 2.0 ** -50, mant(n, 8, 8) * 2.0 ** -69),
        "widest": (mant(n, 16, 8) * p2(-50, 41, n, 16, 8), mant(n, 8, 8) * p2(-69, 33, n, 8, 8)),
        "zeros": (mant(n, 16, 8) * (torch.rand(n, 16, 8, generator=gen) < 0.5),
                  mant(n, 8, 8) * p2(-30, 30, n, 8, 8) * (torch.rand(n, 8, 8, generator=gen) < 0.5)),
    }
    worst = {}
    for name, (a, b) in families.items():
        lo = a * torch.exp2(-torch.randint(11, 22, a.shape, generator=gen).float()) * mant(*a.shape)
        a2 = torch.where(torch.rand(n, 1, 1, generator=gen) < 0.5, lo, a.flip(0))
        a2 = torch.where(a2 < 2.0 ** -50, 0.0, a2)  # the kernels' low pieces: 0 or >= 2^-49
        a2 = torch.where(torch.rand(n, 1, 1, generator=gen) < 1.0 / 3.0, 0.0, a2)  # one mma's 8 products (the extend)
        a, a2, b = _tf32(a.float()), _tf32(a2.float()), _tf32(b.float())
        ad, bd = torch.cat([a, a2]).to("cuda"), b.to("cuda")
        c = torch.empty(n, 16, 8, device="cuda")
        rc = lib.wc_tc_probe(ctypes.c_void_p(ad.data_ptr()), ctypes.c_void_p(bd.data_ptr()),
                             ctypes.c_void_p(c.data_ptr()), n, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        assert rc == 0
        exact = a.double() @ b.double() + a2.double() @ b.double()  # exact products, 16 terms: float64 within 2^-49
        got = c.cpu().double()
        pos = exact > 0
        assert (got[~pos] == 0).all(), name
        deficit = ((exact - got) / exact)[pos]
        worst[name] = (deficit.max().item(), (-deficit).max().item())
        assert deficit.max().item() <= 2.0 ** -17, f"{name}: the sum lost {deficit.max().item():.3g} of its value"
    print({k: (f"{v[0]:.3g} below", f"{v[1]:.3g} above") for k, v in worst.items()})


@pytest.mark.skipif(not GPU, reason="the CUDA extend kernel needs a GPU")
def test_cuda_extend_prefix_flags_bad_prefix_tokens_and_queries():
    """A flagged prefix token (its scale +inf) gives every row that sees it cert = +inf and reads
    as 0; a query head with a non-finite entry gets +inf; everything else stays finite."""
    from witcert.config import CertConfig
    from witcert.kernels.plan import ExtendPlan
    gen = torch.Generator().manual_seed(9)
    layer = make_layer(hkv=2, d=128, num_slots=80, gen=gen)
    kp, vp = random_kv(70, 2, 128, gen=gen)
    slots = torch.arange(70, device=DEV)
    write_kv_(layer, kp, vp, slots=slots)
    q = torch.randn(9, 8, 128, generator=gen).to(DEV)
    kn, vn = random_kv(9, 2, 128, gen=gen)
    q[4, 5, 3] = float("nan")
    dbg = {}
    ker = extend_attention(q, kn, vn, layer, slots, sm_scale=0.1, cert=CertConfig(), delta_loc=1e-6, debug=dbg,
                           plan=ExtendPlan(impl="cuda"))
    assert dbg["impl"] == "cuda"
    inf = torch.isinf(ker.cert).cpu()
    assert inf.sum() == 1 and inf[4, 5]
    layer.k["scales"][33, 1, 2] = float("inf")  # slot 33's key, KV head 1: query heads 4..7
    ker = extend_attention(q, kn, vn, layer, slots, sm_scale=0.1, cert=CertConfig(), delta_loc=1e-6,
                           plan=ExtendPlan(impl="cuda"))
    inf = torch.isinf(ker.cert).cpu()
    assert inf[:, 4:].all() and not inf[:, :4].any()
    assert torch.isfinite(ker.out).all() and torch.isfinite(ker.lse).all()


def test_extend_plan_refuses_an_unknown_impl():
    from witcert.kernels.plan import ExtendPlan
    with pytest.raises(ValueError, match="impl"):
        ExtendPlan(impl="cudnn")


def test_extend_plan_rows_a_program_depend_on_who_runs_the_prefix():
    """block_m 0 (auto): 16 in the interpreter, 64 on a GPU behind the CUDA prefix phase (the Triton
    kernel then runs the exact new tokens only; BENCHMARKS.md 13u), else 32; a block_m asked for stays."""
    from witcert.kernels.plan import ExtendPlan
    assert ExtendPlan().resolve(interpreter=True, cuda_prefix=True).block_m == 16
    assert ExtendPlan().resolve(interpreter=False).block_m == 32
    assert ExtendPlan().resolve(interpreter=False, cuda_prefix=True).block_m == 64
    assert ExtendPlan(block_m=32).resolve(interpreter=False, cuda_prefix=True).block_m == 32
    assert ExtendPlan().resolve(interpreter=False, cuda_prefix=True).block_n == 32


def test_the_plans_prefix_build_is_64_token_tiles_at_8_warps_where_the_grid_passes_the_sms():
    """ExtendPlan.prefix_build: by default 64-token tiles at 8 warps where the grid at 4 warps
    holds more CTAs than SMs (512 new tokens x 4 heads x 8 KV heads: 256 CTAs), else 32 at 4 (a
    short turn, 16 new tokens: 8 CTAs; BENCHMARKS.md 13ai); what a plan asks for stays."""
    from witcert.kernels.plan import ExtendPlan
    assert ExtendPlan().prefix_build(ctas_at_4_warps=256, sms=132) == (8, 64)
    assert ExtendPlan().prefix_build(ctas_at_4_warps=132, sms=132) == (4, 32)
    assert ExtendPlan().prefix_build(ctas_at_4_warps=8, sms=132) == (4, 32)
    assert ExtendPlan(cuda_warps=4).prefix_build(ctas_at_4_warps=256, sms=132) == (4, 32)
    assert ExtendPlan(cuda_warps=8).prefix_build(ctas_at_4_warps=8, sms=132) == (8, 64)
    assert ExtendPlan(cuda_tile=32).prefix_build(ctas_at_4_warps=256, sms=132) == (8, 32)
    assert ExtendPlan(cuda_warps=4, cuda_tile=64).prefix_build(ctas_at_4_warps=256, sms=132) == (4, 64)


@pytest.mark.parametrize("kw,match", [(dict(workspace_mib=0), "workspace_mib"), (dict(prefix_chunk=50), "prefix_chunk"),
                                      (dict(prefix_chunk=-32), "prefix_chunk"), (dict(cuda_tile=48), "cuda_tile"),
                                      (dict(cuda_warps=6), "cuda_warps"), (dict(prefix_splits=-1), "prefix_splits"),
                                      (dict(prefix_splits=65536), "prefix_splits")])
def test_extend_plan_refuses_a_bad_workspace_cap_or_chunk(kw, match):
    from witcert.kernels.plan import ExtendPlan
    with pytest.raises(ValueError, match=match):
        ExtendPlan(**kw)


def test_the_prefix_splits_fill_one_wave_of_a_small_grid():
    """ExtendPlan.split_count: by default as many splits as keep the grid within one wave at 8 warps
    an SM, each at least SPLIT_MIN_TILES tiles, then the fewest with the same tiles per split; a
    grid that fills the GPU is not split; a plan's count is kept, at most the tiles, none empty."""
    from witcert.kernels.plan import SPLIT_MIN_TILES, ExtendPlan
    auto = ExtendPlan()
    assert SPLIT_MIN_TILES == 8
    assert auto.split_count(ctas=8, warps=4, sms=132, tiles=1024) == 32  # 33 wanted: 32 tiles each
    assert auto.split_count(ctas=64, warps=4, sms=132, tiles=1024) == 4
    assert auto.split_count(ctas=8, warps=8, sms=132, tiles=1024) == 16
    assert auto.split_count(ctas=256, warps=4, sms=132, tiles=128) == 1  # 4096 + 512: fills the GPU
    assert auto.split_count(ctas=128, warps=8, sms=132, tiles=64) == 1
    assert auto.split_count(ctas=8, warps=4, sms=132, tiles=20) == 2  # at least 8 tiles a split
    assert auto.split_count(ctas=8, warps=4, sms=132, tiles=15) == 1
    assert ExtendPlan(prefix_splits=3).split_count(ctas=256, warps=4, sms=132, tiles=1000) == 3
    assert ExtendPlan(prefix_splits=7).split_count(ctas=8, warps=4, sms=132, tiles=4) == 4
    assert ExtendPlan(prefix_splits=6).split_count(ctas=8, warps=4, sms=132, tiles=10) == 5  # 2 each, none empty
    assert ExtendPlan(prefix_splits=1).split_count(ctas=1, warps=4, sms=132, tiles=1000) == 1


@pytest.mark.parametrize("splits,chunk,want", [(0, 0, 4), (3, 0, 3), (0, 96, 4), (5, 64, 5)])
def test_the_cuda_prefix_launcher_splits_and_chunks_as_the_plan_says(splits, chunk, want, monkeypatch):
    """_cuda_prefix (the launcher of extend.cu) without a GPU, its library faked: each launch gets
    the plan's split count (``split_count`` of its grid: 8 CTAs of a 16-token turn on 132 SMs, 32
    tiles, by default 32 // SPLIT_MIN_TILES = 4), the same in every chunk; the states come back as
    S blocks; the radii's E_soft counts the merge's rescales (``split_rescales``); the fp16 keys'
    coefficient (``f16keys.dot_coef``, PROOFS 5.4) reaches the kernel."""
    import types

    import witcert.kernels.cuda as wc_cuda
    import witcert.kernels.extend as wext
    import witcert.kernels.launch as wlaunch
    from witcert.kernels.plan import ExtendPlan
    launches = []

    def launch(ref, grid_x, grid_y, stream):
        a = ref._obj
        launches.append(dict(n_splits=a.n_splits, Np=a.Np, tile0=a.tile0, np_all=a.np_all, carry_mode=a.carry_mode,
                             e_soft=a.e_soft, c_acc=a.arith_gamma, grid=(grid_x, grid_y)))
        return 0

    lib = fake_extend_library(launch)
    monkeypatch.setattr(wc_cuda, "library", lambda **cfg: lib)
    monkeypatch.setattr(wlaunch, "_sm_count", lambda dev: 132)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: types.SimpleNamespace(cuda_stream=0))
    gen = torch.Generator().manual_seed(3)
    np_, T, hq, hkv, d = 1000, 16, 32, 8, 128
    layer = make_layer(hkv=hkv, d=d, num_slots=np_ + 8, gen=gen)
    q = torch.randn(T, hq, d, generator=gen).to(DEV)
    plan = ExtendPlan(prefix_splits=splits, prefix_chunk=chunk)
    state = wext._cuda_prefix(dict(qgp=4, warps=4), q=q, layer_kv=layer, prefix_slots=torch.arange(np_, device=DEV),
                              sm_scale=0.1, cert=None, delta_t=None, delta_s=1e-6, soft_tiles=40,
                              bits=16, logits=None, radius=None, plan=plan)
    assert plan.split_count(ctas=8, warps=4, sms=132, tiles=-(-np_ // 32)) == want
    assert [x.shape for x in state] == [(want, T, hq)] * 4 + [(want, T, hq, d)]
    assert {x["n_splits"] for x in launches} == {want}
    assert sum(x["Np"] for x in launches) == np_ and len(launches) == (-(-np_ // chunk) if chunk else 1)
    assert [x["tile0"] for x in launches] == [c // 32 for c in range(0, np_, chunk or np_)]
    assert {x["np_all"] for x in launches} == {np_}
    assert all(x["grid"] == (1, hkv) for x in launches)
    if chunk:
        assert launches[0]["carry_mode"] == 2 and launches[-1]["carry_mode"] == 1
    assert launches[0]["e_soft"] == pytest.approx(wext._e_soft(40 + wext.split_rescales(want)), rel=0)
    assert wext.split_rescales(1) == 0 and wext.split_rescales(want) == want
    from witcert.kernels.f16keys import dot_coef
    assert all(x["c_acc"] == pytest.approx(dot_coef(), rel=1e-7) for x in launches)  # the fp16 route's coefficient


def test_the_prefix_runs_in_chunks_of_whole_tiles_of_the_build():
    """prefix_chunk_tokens: a plan's chunk rounded down to whole tiles of the kernel's build (at
    least one: a 64-token build takes 96 as 64, 32 as 64), else as many whole tiles as the cap
    holds (at least one), never more than the prefix."""
    from witcert.kernels.extend import prefix_chunk_tokens
    kw = dict(workspace_mib=256, tile_bytes=8 * 24336)
    assert prefix_chunk_tokens(n_p=1000, tile=32, prefix_chunk=96, **kw) == 96
    assert prefix_chunk_tokens(n_p=1000, tile=64, prefix_chunk=96, **kw) == 64
    assert prefix_chunk_tokens(n_p=1000, tile=64, prefix_chunk=32, **kw) == 64
    assert prefix_chunk_tokens(n_p=40, tile=32, prefix_chunk=64, **kw) == 40
    assert prefix_chunk_tokens(n_p=10 ** 6, tile=32, prefix_chunk=0, **kw) == 32 * ((256 << 20) // (8 * 24336))
    assert prefix_chunk_tokens(n_p=10 ** 6, tile=64, prefix_chunk=0, workspace_mib=1, tile_bytes=2 << 20) == 64
    assert prefix_chunk_tokens(n_p=5000, tile=32, prefix_chunk=0, **kw) == 5000


def test_the_workspace_cap_comes_from_the_environment_without_a_plan(monkeypatch):
    """WITCERT_EXTEND_WORKSPACE_MIB sets the cap of the default plan; a bad value is a one-line
    ValueError naming the variable, from the setting and from an extend call that reads it."""
    from witcert.config import CertConfig
    from witcert.settings import ENV_EXTEND_WORKSPACE_MIB, EXTEND_WORKSPACE_MIB, extend_workspace_mib
    monkeypatch.delenv(ENV_EXTEND_WORKSPACE_MIB, raising=False)
    assert extend_workspace_mib() == EXTEND_WORKSPACE_MIB
    monkeypatch.setenv(ENV_EXTEND_WORKSPACE_MIB, " 64 ")
    assert extend_workspace_mib() == 64
    gen = torch.Generator().manual_seed(5)
    layer = make_layer(hkv=1, d=64, num_slots=8, gen=gen)
    slots = torch.arange(4, device=DEV)
    kp, vp = random_kv(4, 1, 64, gen=gen)
    write_kv_(layer, kp, vp, slots=slots)
    kn, vn = random_kv(2, 1, 64, gen=gen)
    q = torch.randn(2, 2, 64, generator=gen).to(DEV)
    extend_attention(q, kn, vn, layer, slots, sm_scale=0.125, cert=CertConfig())
    for bad in ("0", "-3", "lots", "1.5"):
        monkeypatch.setenv(ENV_EXTEND_WORKSPACE_MIB, bad)
        with pytest.raises(ValueError, match=ENV_EXTEND_WORKSPACE_MIB):
            extend_workspace_mib()
        with pytest.raises(ValueError, match=ENV_EXTEND_WORKSPACE_MIB):
            extend_attention(q, kn, vn, layer, slots, sm_scale=0.125, cert=CertConfig())


CHUNK_CASES = [  # (Np, T, Hq, Hkv, group, bits, radius, q dtype, the plan's chunk fields)
    (1000, 130, 28, 4, 32, 16, "prob", torch.bfloat16, dict(prefix_chunk=64)),
    (1000, 17, 32, 8, 64, 8, "det", torch.float16, dict(workspace_mib=1)),
    (333, 65, 16, 4, 128, 8, "min", torch.float16, dict(prefix_chunk=32)),
    (97, 16, 8, 2, 32, 16, "min", torch.float32, dict(prefix_chunk=96)),
    (64, 40, 6, 3, 32, 16, None, torch.float16, dict(prefix_chunk=32)),
    # the build with 64-token tiles at 8 warps (the default for grids of more CTAs than SMs): its
    # chunks are whole 64-token tiles (96 runs as 64)
    (1000, 130, 28, 4, 32, 16, "prob", torch.bfloat16, dict(prefix_chunk=96, cuda_warps=8)),
    (333, 65, 16, 4, 128, 8, "min", torch.float16, dict(workspace_mib=1, cuda_warps=8)),
    # the prefix split across CTAs: each split attends the same tiles however the prefix is chunked
    (1000, 130, 28, 4, 32, 16, "prob", torch.bfloat16, dict(prefix_chunk=64, prefix_splits=5)),
    (1000, 17, 32, 8, 64, 8, "det", torch.float16, dict(prefix_chunk=96, prefix_splits=3, cuda_warps=8)),
]


@pytest.mark.skipif(not GPU, reason="the CUDA extend kernel needs a GPU")
@pytest.mark.parametrize("np_,T,hq,hkv,group,bits,radius,dtype,chunks", CHUNK_CASES)
def test_cuda_extend_prefix_in_chunks_is_bitwise_one_pass(np_, T, hq, hkv, group, bits, radius, dtype, chunks):
    """A prefix run in chunks (a workspace cap or a chunk length), each carrying the kernel's state
    to the next, gives bitwise the outputs, lse, certificates, logits and radii of one pass;
    a flagged prefix token (an infinite key scale) stays +inf across the chunks."""
    from witcert.config import CertConfig
    from witcert.kernels.plan import ExtendPlan
    gen = torch.Generator().manual_seed(np_ + T + group + 7)
    d = 128
    layer = make_layer(hkv=hkv, d=d, num_slots=np_ + 8, bits=bits, group=group, gen=gen)
    slots = torch.randperm(np_ + 8, generator=gen)[:np_].to(DEV)
    kp, vp = random_kv(np_, hkv, d, gen=gen)
    write_kv_(layer, kp, vp, slots=slots)
    if np_ > 40:
        layer.k["scales"][int(slots[40]), 0, 0] = float("inf")  # KV head 0's rows: +inf certificates
    kn, vn = random_kv(T, hkv, d, gen=gen)
    q = (torch.randn(T, hq, d, generator=gen) * 3).to(DEV).to(dtype)
    cert = CertConfig(radius=radius) if radius else None
    runs = []
    # both runs: the same build and splits
    build = {k: v for k, v in chunks.items() if k in ("cuda_tile", "cuda_warps", "prefix_splits")}
    for plan in (ExtendPlan(impl="cuda", **build), ExtendPlan(impl="cuda", **chunks)):
        dbg = {}
        got = extend_attention(q, kn, vn, layer, slots, sm_scale=d ** -0.5, cert=cert, delta_loc=1e-6,
                               debug=dbg, plan=plan)
        assert dbg["impl"] == "cuda"
        runs.append((got, dbg))
    (one, d1), (many, d2) = runs
    if cert is None:
        assert torch.equal(one, many)
        torch.testing.assert_close(d1["logits"], d2["logits"], rtol=0, atol=0, equal_nan=True)
        return
    for name in ("out", "lse", "cert"):
        torch.testing.assert_close(getattr(one, name), getattr(many, name), rtol=0, atol=0, equal_nan=True)
    for name in ("logits", "radius"):
        torch.testing.assert_close(d1[name], d2[name], rtol=0, atol=0, equal_nan=True)
    if np_ > 40:
        assert torch.isinf(many.cert[:, : hq // hkv]).all() and torch.isfinite(many.cert[:, hq // hkv:]).all()


@pytest.mark.skipif(not GPU, reason="the CUDA extend kernel needs a GPU")
def test_cuda_extend_without_a_plan_takes_the_environments_workspace_cap(monkeypatch):
    """WITCERT_EXTEND_WORKSPACE_MIB reaches the CUDA prefix phase of a call without a plan (HF
    chunked prefill, the engines): with a 1 MiB cap the prefix runs in the chunks an explicit
    ExtendPlan(workspace_mib=1) takes, and bitwise what one pass computes."""
    from witcert.config import CertConfig
    from witcert.kernels.plan import ExtendPlan
    from witcert.settings import ENV_EXTEND_WORKSPACE_MIB
    gen = torch.Generator().manual_seed(41)
    np_, T, hq, hkv, d = 1500, 24, 32, 8, 128
    layer = make_layer(hkv=hkv, d=d, num_slots=np_ + 8, bits=16, group=32, gen=gen)
    slots = torch.randperm(np_ + 8, generator=gen)[:np_].to(DEV)
    kp, vp = random_kv(np_, hkv, d, gen=gen)
    write_kv_(layer, kp, vp, slots=slots)
    kn, vn = random_kv(T, hkv, d, gen=gen)
    q = (torch.randn(T, hq, d, generator=gen) * 3).to(DEV).to(torch.bfloat16)
    runs = {}
    for name, env, plan in (("one pass", None, ExtendPlan(impl="cuda")), ("plan", None, ExtendPlan(workspace_mib=1)),
                            ("env", "1", None)):
        if env is None:
            monkeypatch.delenv(ENV_EXTEND_WORKSPACE_MIB, raising=False)
        else:
            monkeypatch.setenv(ENV_EXTEND_WORKSPACE_MIB, env)
        dbg = {}
        got = extend_attention(q, kn, vn, layer, slots, sm_scale=d ** -0.5, cert=CertConfig(radius="min"),
                               delta_loc=1e-6, debug=dbg, plan=plan)
        assert dbg["impl"] == "cuda"
        runs[name] = (got, dbg)
    assert runs["one pass"][1]["prefix_chunks"] == [np_]
    assert len(runs["env"][1]["prefix_chunks"]) > 1
    assert runs["env"][1]["prefix_chunks"] == runs["plan"][1]["prefix_chunks"]
    for name in ("plan", "env"):
        got, dbg = runs[name]
        for field in ("out", "lse", "cert"):
            torch.testing.assert_close(getattr(got, field), getattr(runs["one pass"][0], field), rtol=0, atol=0)
        torch.testing.assert_close(dbg["radius"], runs["one pass"][1]["radius"], rtol=0, atol=0)


@pytest.mark.parametrize("np_,T,hq,hkv,radius,splits", [(40, 9, 4, 2, "min", 1), (17, 20, 3, 1, "det", 1),
                                                        (40, 9, 4, 2, "min", 3), (17, 20, 3, 1, "prob", 5)])
def test_the_triton_kernel_continues_from_a_prefix_state_like_the_reference(np_, T, hq, hkv, radius, splits,
                                                                            monkeypatch):
    """The path the CUDA prefix phase takes, checked without a GPU: the prefix state (max, sum,
    certificate sum, largest radius, output sum) computed here from the reference's own logits and
    radii, one state per prefix split (``splits`` contiguous parts of the prefix, each with its own
    max, as extend.cu's splits leave them: the Triton kernel merges them), handed to the Triton
    kernel as extend.cu would hand it (``HAS_INIT``); the result must be
    the reference extend's within the kernels' tiers (the exact new tokens' fp32 slack; their
    p.v in fp16: weights and values / r each rounded to fp16, with r <= max(2 max |v|, 1) after a
    prefix state (r starts at 1), so the output moves by at most (2^-11 + 2^-10) max(max |v|, 1/2)
    plus the accumulation's rounding: 2^-9 max(max |v|, 1/2) allowed, v the new tokens' values)."""
    import witcert.kernels.extend as wext
    import witcert.kernels.launch as wlaunch
    from witcert.config import CertConfig
    from witcert.ref.extend import extend_attention_cert
    from witcert.ref.logits import logits_and_radii
    gen = torch.Generator().manual_seed(np_ + T)
    d = 64
    layer = make_layer(hkv=hkv, d=d, num_slots=np_ + 8, gen=gen)
    kp, vp = random_kv(np_, hkv, d, gen=gen)
    slots = torch.randperm(np_ + 8, generator=gen)[:np_].to(DEV)
    write_kv_(layer, kp, vp, slots=slots)
    q = torch.randn(T, hq, d, generator=gen).to(DEV)
    kn, vn = random_kv(T, hkv, d, gen=gen)
    sm, cert = d ** -0.5, CertConfig(radius=radius)
    calls = []

    def prefix_state(cfg, *, q, layer_kv, prefix_slots, sm_scale, cert, **_):
        calls.append(cfg)
        kvh = torch.arange(hq) // (hq // hkv)
        per_head = lambda t: t[:, kvh].transpose(0, 1)  # noqa: E731
        kh, kpar = gather(layer_kv, K_SIDE, prefix_slots)
        vh, _ = gather(layer_kv, V_SIDE, prefix_slots)
        z, u = logits_and_radii(q.float(), per_head(kh)[None], sm_scale=sm_scale, cert=cert,
                                wit=per_head(kpar["wit"])[None], scales=per_head(kpar["scales"])[None],
                                flagged=torch.zeros(T, hq, np_, dtype=torch.bool, device=q.device),
                                group_size=layer_kv.quant.group_size, bits=layer_kv.quant.dither_bits,
                                n_tokens=np_, delta_loc=1e-6, has_prob=True)
        states = []
        for part in torch.arange(np_).chunk(splits):  # one state per split, each over its own tokens
            z64, up = z[..., part].double(), u[..., part].double()
            m = z64.amax(-1)
            p = torch.exp(z64 - m[..., None])
            acc = torch.einsum("thn,hnd->thd", p, per_head(vh)[:, part].double())
            a = (p * torch.expm1(up)).sum(-1)
            states.append((m, p.sum(-1), a, up.amax(-1), acc))
        # extend.cu's layouts: [S, T, Hq] and [S, T, Hq, D]
        return tuple(torch.stack([st[i] for st in states]).float().contiguous() for i in range(5))

    monkeypatch.setattr(wlaunch, "_cuda_config",
                        lambda *a, kind="decode", **k: dict(qgp=4, warps=4, kind=kind) if kind == "extend" else None)
    monkeypatch.setattr(wext, "_cuda_prefix", prefix_state)
    dbg = {}
    ker = extend_attention(q, kn, vn, layer, slots, sm_scale=sm, cert=cert, delta_loc=1e-6, debug=dbg)
    assert calls and dbg["impl"] == "cuda" and dbg["prefix_splits"] == splits
    ref = extend_attention_cert(q, kn, vn, layer, slots, sm_scale=sm, cert=cert, delta_loc=1e-6)
    torch.testing.assert_close(ker.out, ref.out, rtol=0.0, atol=2.0**-9 * max(vn.abs().max().item(), 0.5))
    torch.testing.assert_close(ker.lse, ref.lse, rtol=1e-5, atol=1e-5)
    assert (ker.cert >= ref.cert * (1 - 1e-3)).all() and (ker.cert <= ref.cert * 1.01 + 1e-3).all()
