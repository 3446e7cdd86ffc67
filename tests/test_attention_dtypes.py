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
