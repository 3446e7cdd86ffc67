"""Queries and exact new-token keys / values in float64 are refused by every attention path that
certifies (one-line TypeError naming the argument, ``witcert.ref.validate.check_attention_dtypes``).

Every path computes from fp32 values, so a float64 input would be rounded to fp32 outside the
certificate: an adversarial audit found extend certificates far below the exact TV with float64
new-token keys (an exact new token's radius covers only the arithmetic; 7e-9 against a TV of
1e-3). The pool's writer already refused float64 for the same reason. The Triton paths run in
the interpreter on CPU.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from cases import DEV, make_layer, random_kv  # noqa: E402

from witcert.config import CertConfig  # noqa: E402
from witcert.ref.pool import write_  # noqa: E402

D, HQ, HKV, N, T = 64, 4, 2, 6, 3


def _pool(device):
    gen = torch.Generator().manual_seed(3)
    layer = make_layer(hkv=HKV, d=D, num_slots=16, gen=gen, device=device)
    k, v = random_kv(N, HKV, D, gen=gen, device=device)
    write_(layer, k, v, slots=torch.arange(N, device=device))
    bt = torch.arange(16, dtype=torch.int32, device=device).view(1, 16)
    sl = torch.tensor([N], dtype=torch.int32, device=device)
    return layer, bt, sl


def _decoders():
    from witcert.kernels.decode import decode_attention as triton_decode
    from witcert.native.decode import decode_attention_full
    from witcert.ref.attention import decode_attention as ref_decode
    from witcert.runtime.dispatch import decode_attention as dispatch_decode
    kw = dict(page_size=1, sm_scale=0.125)
    return {
        "ref": lambda q, lay, bt, sl: ref_decode(q, lay, bt, sl, **kw, cert=CertConfig(), delta_loc=1e-6),
        "native": lambda q, lay, bt, sl: decode_attention_full(q, lay, bt, sl, **kw, radius="min",
                                                               delta_loc=torch.tensor([1e-6], dtype=torch.float64)),
        "triton": lambda q, lay, bt, sl: triton_decode(q, lay, bt, sl, **kw, cert=CertConfig(), delta_loc=1e-6),
        "dispatch": lambda q, lay, bt, sl: dispatch_decode(q, lay, bt, sl, **kw, cert=CertConfig(), delta_loc=1e-6),
    }


@pytest.mark.parametrize("path", ["ref", "native", "triton", "dispatch"])
def test_every_decode_path_refuses_a_float64_query(path):
    if path == "native":
        from witcert import native
        if not native.available():
            pytest.skip(native.reason())
    dev = "cpu" if path in ("ref", "native") else DEV
    layer, bt, sl = _pool(dev)
    q = torch.randn(1, HQ, D, dtype=torch.float64, device=dev)
    with pytest.raises(TypeError, match=r"^q must be fp32, fp16 or bf16, got torch.float64"):
        _decoders()[path](q, layer, bt, sl)
    _decoders()[path](q.float(), layer, bt, sl)  # the same call in fp32 runs


@pytest.mark.parametrize("path", ["ref", "native", "triton", "dispatch"])
@pytest.mark.parametrize("bad", ["q", "k_new", "v_new"])
def test_every_certified_extend_refuses_float64_queries_and_new_tokens(path, bad):
    from witcert.kernels.extend import extend_attention as triton_extend
    from witcert.ref.extend import extend_attention_cert
    from witcert.runtime.dispatch import extend_attention as dispatch_extend
    if path == "native":
        from witcert import native
        if not native.available():
            pytest.skip(native.reason())
        from witcert.native import extend as native_extend
    dev = "cpu" if path in ("ref", "native", "dispatch") else DEV
    layer, _, _ = _pool(dev)
    gen = torch.Generator().manual_seed(4)
    args = dict(q=torch.randn(T, HQ, D, generator=gen).to(dev), k_new=torch.randn(T, HKV, D, generator=gen).to(dev),
                v_new=torch.randn(T, HKV, D, generator=gen).to(dev))
    prefix = torch.arange(N, device=dev)

    def run(a):
        if path == "ref":
            return extend_attention_cert(a["q"], a["k_new"], a["v_new"], layer, prefix, sm_scale=0.125,
                                         cert=CertConfig(), delta_loc=1e-6)
        if path == "dispatch":
            return dispatch_extend(a["q"], a["k_new"], a["v_new"], layer, prefix, sm_scale=0.125, cert=CertConfig(),
                                   delta_loc=1e-6)
        if path == "triton":
            return triton_extend(a["q"], a["k_new"], a["v_new"], layer, prefix, sm_scale=0.125, cert=CertConfig(),
                                 delta_loc=1e-6)
        return native_extend.extend_attention(a["q"], a["k_new"], a["v_new"], layer, q_start=[0], q_len=[T],
                                              prefix_len=[N], block_table=prefix.to(torch.int32).view(1, N),
                                              page_size=1, sm_scale=0.125, radius="det", delta_loc=None)

    with pytest.raises(TypeError, match=rf"^{bad} must be fp32, fp16 or bf16, got torch.float64"):
        run(dict(args, **{bad: args[bad].double()}))
    run(args)


@pytest.mark.parametrize("sm", [6.25e-35, 1e-38, 2.0 ** -64 * 0.75])
def test_every_path_refuses_a_scale_below_the_kernels_normal_range(sm):
    """sm_scale below 2^-64 is refused (one-line ValueError) on every path: the kernels' fp32 row
    factor (2^-(b+8) sm) 2^e would start subnormal (an audit found certificates of 5e-4 against an
    exact TV of 1e-2 at sm = 6.25e-35, b = 24)."""
    from witcert import native
    from witcert.kernels.decode import decode_attention as triton_decode
    from witcert.native.decode import decode_attention_full
    from witcert.ref.attention import decode_attention as ref_decode
    from witcert.runtime.dispatch import decode_attention as dispatch_decode
    kw = dict(page_size=1, sm_scale=sm, cert=CertConfig(), delta_loc=1e-6)
    calls = {"ref": (ref_decode, kw, "cpu"), "triton": (triton_decode, kw, DEV), "dispatch": (dispatch_decode, kw, "cpu")}
    if native.available():
        calls["native"] = (decode_attention_full, dict(page_size=1, sm_scale=sm, radius="det", delta_loc=None), "cpu")
    for path, (fn, args, dev) in calls.items():
        layer, bt, sl = _pool(dev)
        with pytest.raises(ValueError, match=r"^sm_scale: .* must be a finite number >= 2\^-64"):
            fn(torch.randn(1, HQ, D, device=dev), layer, bt, sl, **args)


@pytest.mark.parametrize("bits", [8, 16, 24])
@pytest.mark.parametrize("kernel", ["decode", "extend"])
def test_the_kernels_certificates_bound_the_exact_tv_at_the_smallest_scale(kernel, bits):
    """At sm_scale = 2^-64 with queries near 1e37 (logits of order 1) and keys on the dequantization
    grid (witness 0: the certificate is the arithmetic's slack alone), the Triton decode's and
    extend's certificates are >= the exact TV (Fractions, then mpmath at 60 digits) of the logits
    they used. Below the bound this failed (the audit's reproducer, now refused)."""
    from fractions import Fraction

    import mpmath

    from witcert.config import QuantConfig
    from witcert.ref.pool import LayerKV, gather
    from witcert.ref.types import K_SIDE
    sm, n = 2.0 ** -64, 8
    gen = torch.Generator().manual_seed(bits)
    layer = LayerKV.allocate(num_slots=n, num_kv_heads=1, head_dim=D, quant=QuantConfig(dither_bits=bits, seed=5),
                             layer=1, seed=5, epochs=torch.zeros(n, dtype=torch.int64, device=DEV), device=DEV)
    slots = torch.arange(n, device=DEV)
    k = (torch.randn(n, 1, D, generator=gen) * (5.0 / (sm * 1e37 * D ** 0.5))).to(DEV)
    for _ in range(4):  # onto the dequantization grid
        write_(layer, k, k, slots=slots)
        k = gather(layer, K_SIDE, slots)[0].clone()
    write_(layer, k, k, slots=slots)
    q = (torch.randn(1, 1, D, generator=gen) * 1e37).to(DEV)
    dbg = {}
    if kernel == "decode":
        from witcert.kernels.decode import decode_attention
        r = decode_attention(q, layer, torch.arange(n, dtype=torch.int32, device=DEV)[None],
                             torch.tensor([n], dtype=torch.int32, device=DEV), page_size=1, sm_scale=sm,
                             cert=CertConfig(radius="det"), delta_loc=1e-6, num_splits=1, debug=dbg)
        keys = k[:, 0]
    else:
        from witcert.kernels.extend import extend_attention
        kn = torch.zeros(1, 1, D, device=DEV)
        r = extend_attention(q, kn, kn.clone(), layer, slots, sm_scale=sm, causal=True,
                             cert=CertConfig(radius="det"), delta_loc=1e-6, debug=dbg)
        keys = torch.cat([k[:, 0], kn[:, 0]])
    used = dbg["logits"][0, 0].double().cpu().tolist()
    mpmath.mp.dps = 60
    qf = [Fraction(float(x)) for x in q[0, 0].double().cpu()]
    z = [Fraction(sm) * sum((a * Fraction(float(b)) for a, b in zip(qf, row.double().cpu())), Fraction(0))
         for row in keys]
    zm, um = max(z), max(used)
    ez = [mpmath.exp(mpmath.mpf((x - zm).numerator) / (x - zm).denominator) for x in z]
    eu = [mpmath.exp(mpmath.mpf(u - um)) for u in used]
    tv = sum(abs(a / sum(ez) - b / sum(eu)) for a, b in zip(ez, eu)) / 2
    assert max(abs(float(x)) for x in z) > 1.0, "the case must have logits of order 1"
    assert float(r.cert[0, 0]) >= float(tv), (float(r.cert[0, 0]), float(tv))


@pytest.mark.parametrize("method", ["dither8", "rtn8", "fp8", "fp16"])
def test_the_writers_and_the_exact_copy_refuse_float64_rows(method):
    """A float64 row written to the pool (any compressor) or to the exact copy is refused: an audit
    found the baselines' float64 witness underflowing to 0 (rows of 1e-200: witness 0, error 2.8e-200)."""
    from witcert.config import QuantConfig
    from witcert.ref.pool import LayerKV
    from witcert.runtime.exact import ExactCopy
    layer = LayerKV.allocate(num_slots=2, num_kv_heads=1, head_dim=8, quant=QuantConfig(method=method, group_size=8),
                             layer=0, seed=1, epochs=torch.zeros(2, dtype=torch.int64))
    x = torch.full((1, 1, 8), 1e-200, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^k must be fp32, fp16 or bf16, got torch.float64"):
        write_(layer, x, x.float(), slots=torch.tensor([0]))
    with pytest.raises(TypeError, match=r"^v must be fp32, fp16 or bf16, got torch.float64"):
        write_(layer, x.float(), x, slots=torch.tensor([0]))
    write_(layer, x.float(), x.float(), slots=torch.tensor([0]))
    copy = ExactCopy(num_slots=2, num_kv_heads=1, head_dim=8, dtype=torch.float32, epochs=layer.epochs)
    with pytest.raises(TypeError, match=r"^k must be fp32"):
        copy.write_(torch.tensor([0]), x, x)
    copy.write_(torch.tensor([0]), x.float(), x.float())


def test_the_triton_writer_refuses_float64_rows():
    from witcert.kernels.write import write_kv_
    layer = make_layer(hkv=HKV, d=D, num_slots=4, gen=torch.Generator().manual_seed(1), device=DEV)
    x = torch.randn(1, HKV, D, dtype=torch.float64, device=DEV)
    with pytest.raises(TypeError, match=r"^k must be fp32, fp16 or bf16, got torch.float64"):
        write_kv_(layer, x, x.float(), slots=torch.tensor([0], device=DEV))
