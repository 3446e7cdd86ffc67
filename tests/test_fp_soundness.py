"""Soundness under floating point (docs/PROOFS.md section 5), as properties.

For adversarial inputs (tests/soundness_cases.py: logits from 1e-3 to 1e9, witnesses at
rounding edges, tiny and huge queries, massive bypassed channels, fp16-edge scales,
overflowing logits, long peaked contexts), every compressor and radius a path serves, the
certificate of every (sequence, query head) is >= 0, never NaN, >= the exact TV between the
exact-key softmax and the softmax of the logits the path used (or +inf where an exact key is
not finite), and the output is never NaN. Hypothesis draws (family, config, seed);
derandomized so CI is reproducible. benchmarks/soundness_sweep.py runs the same check at
>= 1e5 certificates per path (BENCHMARKS.md section 8).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from soundness_cases import FAMILIES, check_case, configs  # noqa: E402

SETTINGS = dict(derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(path, family, idx, seed, **shape):
    quant, cert = configs(path)[idx % len(configs(path))]
    if family == "massive_bypass" and not quant.outliers and path != "ref":
        quant = quant.replace(outliers=2) if path == "triton" else quant
    st_ = check_case(path, family, quant, cert, gen=torch.Generator().manual_seed(seed), **shape)
    assert st_["violations"] == 0, (family, quant, cert, st_["examples"])
    assert st_["nan"] == 0 and st_["negative"] == 0 and st_["nan_out"] == 0, st_


@settings(max_examples=25, **SETTINGS)
@given(family=st.sampled_from(FAMILIES), idx=st.integers(0, 20), seed=st.integers(0, 2**31))
def test_reference_certificates_are_sound_on_adversarial_inputs(family, idx, seed):
    _check("ref", family, idx, seed, B=4, N=12)


@settings(max_examples=60, **SETTINGS)
@given(family=st.sampled_from(FAMILIES), idx=st.integers(0, 20), seed=st.integers(0, 2**31))
def test_native_certificates_are_sound_on_adversarial_inputs(family, idx, seed):
    from witcert import native
    if not native.available():
        pytest.skip(f"native library unavailable: {native.reason()}")
    _check("native", family, idx, seed, B=8, N=16)


@settings(max_examples=6, **SETTINGS)
@given(family=st.sampled_from(FAMILIES), idx=st.integers(0, 20), seed=st.integers(0, 2**31))
def test_triton_certificates_are_sound_on_adversarial_inputs(family, idx, seed):
    pytest.importorskip("triton")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    _check("triton", family, idx, seed, B=4, N=12, device=dev)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA C++ kernel needs a CUDA device")
@settings(max_examples=12, **SETTINGS)
@given(family=st.sampled_from(FAMILIES), idx=st.integers(0, 20), seed=st.integers(0, 2**31))
def test_cuda_certificates_are_sound_on_adversarial_inputs(family, idx, seed):
    """The CUDA tensor-core decode (D = 128, the shapes it serves: GQA 2, groups of 32)."""
    from witcert.kernels import cuda as wc_cuda
    if not wc_cuda.available():
        pytest.skip(wc_cuda.reason())
    _check("cuda", family, idx, seed, B=4, N=12, device="cuda", D=128)


@pytest.mark.parametrize("path", ["ref", "native"])
def test_finite_query_whose_logits_overflow_gives_inf_certificate_and_finite_output(path):
    from witcert.config import CertConfig, QuantConfig
    if path == "native":
        from witcert import native
        if not native.available():
            pytest.skip(native.reason())
    st_ = check_case(path, "overflow", QuantConfig(seed=3), CertConfig(radius="det"),
                     gen=torch.Generator().manual_seed(1), B=4, N=8)
    assert st_["inf"] == st_["certs"] and st_["nan_out"] == 0 and st_["nan"] == 0


@pytest.mark.parametrize("sm", [1e287, 1e300])
def test_native_logits_that_overflow_float64_give_inf_certificates_and_finite_outputs(sm):
    """The C paths keep float64 logits: with finite inputs and a huge (but finite, accepted) scale,
    sm q.k passes DBL_MAX. The logit used is then finite (+-DBL_MAX), its radius +inf, the
    certificate +inf and the output finite, in the decode and in both extend arithmetics, as in the
    reference (whose fp32 logits overflow first). Found by an adversarial audit: NaN before."""
    from witcert import native
    if not native.available():
        pytest.skip(native.reason())
    from witcert.config import CertConfig, QuantConfig
    from witcert.native import extend as native_extend
    from witcert.native.decode import decode_attention_full
    from witcert.ref import attention as ref_attention
    from witcert.ref.pool import LayerKV, write_
    N, D, T = 20, 64, 3
    gen = torch.Generator().manual_seed(0)
    layer = LayerKV.allocate(num_slots=N, num_kv_heads=1, head_dim=D, quant=QuantConfig(seed=7), layer=1,
                             seed=1234567, epochs=torch.zeros(N, dtype=torch.int64))
    k = (torch.rand(N, 1, D, generator=gen) + 0.5).half().float()
    write_(layer, k, k, slots=torch.arange(N))
    bt = torch.arange(N, dtype=torch.int32).view(1, N)
    sl = torch.tensor([N], dtype=torch.int32)
    q = torch.full((1, 1, D), 1e20)
    q[0, 0, :8] = -1e20  # some logits overflow to +inf, others stay below
    for radius in ("det", "min"):
        dbg = {}
        out, lse, cert, vb = decode_attention_full(q, layer, bt, sl, page_size=1, sm_scale=sm, radius=radius,
                                                   delta_loc=torch.tensor([1e-6], dtype=torch.float64), debug=dbg)
        ref = ref_attention.decode_attention(q, layer, bt, sl, page_size=1, sm_scale=sm,
                                             cert=CertConfig(radius=radius), delta_loc=1e-6)
        assert torch.isinf(cert).all() and torch.isinf(ref.cert).all()
        assert torch.isfinite(out).all() and torch.isfinite(ref.out).all() and not torch.isnan(lse).any()
        assert torch.isfinite(dbg["logits"]).all() and torch.isinf(dbg["radius"]).any()
    kn = (torch.rand(T, 1, D, generator=gen) + 0.5).half().float()
    for arith in ("f32", "f64"):
        out, lse, cert = native_extend.extend_attention(
            torch.full((T, 1, D), 1e20), kn, kn, layer, q_start=[0], q_len=[T], prefix_len=[N], block_table=bt,
            page_size=1, sm_scale=sm, radius="det", delta_loc=None, arith=arith)
        assert torch.isinf(cert).all() and torch.isfinite(out).all() and not torch.isnan(lse).any(), arith


@settings(max_examples=12, **SETTINGS)
@given(family=st.sampled_from(FAMILIES), idx=st.integers(0, 20), seed=st.integers(0, 2**31),
       path=st.sampled_from(["triton", "triton_fp16", "triton_bf16"]))
def test_triton_extend_certificates_are_sound_on_adversarial_inputs(family, idx, seed, path):
    """The tensor-core extend: every (new token, head) over a compressed prefix + exact new tokens;
    the family's values as given (fp32 q: the new tokens' fp32 dots) or rounded to fp16 / bf16
    (the new tokens' q.k on tensor cores; bf16's in fp32 under the interpreter)."""
    pytest.importorskip("triton")
    from soundness_extend_cases import check_extend_case
    quant, cert = configs("triton")[idx % len(configs("triton"))]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    st_ = check_extend_case(path, family, quant, cert, gen=torch.Generator().manual_seed(seed), device=dev)
    assert st_["violations"] == 0, (family, quant, cert, st_["examples"])
    assert st_["nan"] == 0 and st_["negative"] == 0 and st_["nan_out"] == 0, st_


@settings(max_examples=40, **SETTINGS)
@given(family=st.sampled_from([f for f in FAMILIES if f != "massive_bypass"]),
       idx=st.integers(0, 20), seed=st.integers(0, 2**31),
       path=st.sampled_from(["native", "native_f64"]))
def test_native_extend_certificates_are_sound_on_adversarial_inputs(family, idx, seed, path):
    """The C extend (fp32 dots, its default, and float64): every (new token, head) over a
    compressed prefix + exact new tokens. It serves pools without outlier bypass (so not the
    massive_bypass family, whose point is the bypassed channel)."""
    from witcert import native
    if not native.available():
        pytest.skip(f"native library unavailable: {native.reason()}")
    from soundness_extend_cases import check_extend_case
    pairs = [(qc, c) for qc, c in configs("native") if not qc.outliers]
    quant, cert = pairs[idx % len(pairs)]
    st_ = check_extend_case(path, family, quant, cert, gen=torch.Generator().manual_seed(seed))
    assert st_["violations"] == 0, (family, quant, cert, st_["examples"])
    assert st_["nan"] == 0 and st_["negative"] == 0 and st_["nan_out"] == 0, st_
