"""``witcert.runtime.dispatch.extend_attention``: the certified dispatch and the plain one.

Without ``cert`` it still returns the f32 output tensor (callers keep working); with ``cert``
an ``ExtendOut``: on CPU dither8 pools without outliers from the native C extend (bitwise the
direct C call), under ``WITCERT_BACKEND=ref`` or for an outlier pool from the reference spec
(bitwise ``extend_attention_cert``), on CUDA (forced here through the Triton interpreter)
from the Triton extend; a missing budget for the prob / min radius is refused.
"""

from __future__ import annotations

import dataclasses
import os

import torch

if not torch.cuda.is_available():  # the Triton route runs in the interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from extend_cases import make_batch  # noqa: E402
from witcert import native  # noqa: E402
from witcert.runtime import dispatch as backend
from witcert.config import CertConfig, QuantConfig  # noqa: E402
from witcert.native.extend import extend_one  # noqa: E402
from witcert.ref import attention as ref_attn  # noqa: E402
from witcert.ref.extend import ExtendOut, extend_attention_cert  # noqa: E402
from witcert.ref.pool import LayerKV, write_  # noqa: E402


@pytest.fixture
def case():
    b = make_batch(prefix_lens=(23,), new_lens=(7,), hq=4, hkv=2, d=64, page=16, seed=12)
    r = b.rows(0)
    return b.q[r], b.k_new[r], b.v_new[r], b.layer, b.prefix_slots(0)


def _same(a: ExtendOut, b: ExtendOut) -> None:
    assert a.radius_kind == b.radius_kind
    for x, y in ((a.out, b.out), (a.lse, b.lse), (a.cert, b.cert)):
        assert (x is None and y is None) or torch.equal(x, y)


def test_without_cert_the_backend_returns_the_plain_output_tensor(case, monkeypatch):
    monkeypatch.delenv("WITCERT_BACKEND", raising=False)
    q, k, v, lkv, slots = case
    out = backend.extend_attention(q, k, v, lkv, slots, sm_scale=0.125)
    assert isinstance(out, torch.Tensor)
    assert torch.equal(out, ref_attn.extend_attention(q, k, v, lkv, slots, sm_scale=0.125))


def test_with_cert_on_cpu_the_backend_runs_the_native_extend(case, monkeypatch):
    if not native.available():
        pytest.skip(f"native library unavailable: {native.reason()}")
    monkeypatch.delenv("WITCERT_BACKEND", raising=False)
    q, k, v, lkv, slots = case
    cert = CertConfig(radius="min")
    dl = torch.logspace(-8, -3, 7, dtype=torch.float64)
    got = backend.extend_attention(q, k, v, lkv, slots, sm_scale=0.125, cert=cert, delta_loc=dl)
    assert isinstance(got, ExtendOut) and got.cert.shape == (7, 4)
    _same(got, extend_one(q, k, v, lkv, slots, sm_scale=0.125, cert=cert, delta_loc=dl,
                          num_threads=backend._native_threads()))


@pytest.mark.parametrize("enabled", [True, False])
def test_with_cert_under_the_ref_backend_it_is_the_reference_spec(case, monkeypatch, enabled):
    monkeypatch.setenv("WITCERT_BACKEND", "ref")
    q, k, v, lkv, slots = case
    cert = CertConfig(radius="prob", enabled=enabled)
    got = backend.extend_attention(q, k, v, lkv, slots, sm_scale=0.125, cert=cert, delta_loc=1e-5)
    _same(got, extend_attention_cert(q, k, v, lkv, slots, sm_scale=0.125, cert=cert, delta_loc=1e-5))


def test_an_outlier_pool_gets_the_reference_spec(monkeypatch):
    monkeypatch.delenv("WITCERT_BACKEND", raising=False)
    g = torch.Generator().manual_seed(1)
    idx = torch.stack([torch.arange(4) for _ in range(2)])
    lkv = LayerKV.allocate(num_slots=24, num_kv_heads=2, head_dim=64, quant=QuantConfig(outliers=2),
                           layer=0, seed=3, epochs=torch.zeros(24, dtype=torch.int64),
                           k_outlier_idx=idx, v_outlier_idx=idx)
    slots = torch.arange(20)
    write_(lkv, torch.randn(20, 2, 64, generator=g), torch.randn(20, 2, 64, generator=g), slots=slots)
    q, k, v = torch.randn(5, 4, 64, generator=g), torch.randn(5, 2, 64, generator=g), \
        torch.randn(5, 2, 64, generator=g)
    cert = CertConfig(radius="min")
    got = backend.extend_attention(q, k, v, lkv, slots, sm_scale=0.125, cert=cert, delta_loc=1e-6)
    _same(got, extend_attention_cert(q, k, v, lkv, slots, sm_scale=0.125, cert=cert, delta_loc=1e-6))


def test_a_probabilistic_radius_without_a_budget_is_refused(case):
    q, k, v, lkv, slots = case
    with pytest.raises(ValueError, match="delta_loc"):
        backend.extend_attention(q, k, v, lkv, slots, sm_scale=0.125, cert=CertConfig(radius="min"))


def test_with_cert_under_the_triton_backend_it_is_the_triton_extend(case, monkeypatch):
    """The CUDA route (CUDA tensors on a GPU, else CPU tensors through the interpreter): the
    Triton extend with its certificate, bitwise the direct kernel call, the per-token budget
    passed on."""
    pytest.importorskip("triton")
    monkeypatch.setenv("WITCERT_BACKEND", "triton")
    from witcert.kernels.extend import extend_attention as triton_extend
    q, k, v, lkv, slots = case
    if torch.cuda.is_available():  # the real route: CUDA tensors
        q, k, v, slots = (t.cuda() for t in (q, k, v, slots))
        lkv = dataclasses.replace(lkv, k={n: t.cuda() for n, t in lkv.k.items()},
                                  v={n: t.cuda() for n, t in lkv.v.items()}, epochs=lkv.epochs.cuda())
    cert = CertConfig(radius="min")
    dl = torch.logspace(-8, -3, 7, dtype=torch.float64)
    got = backend.extend_attention(q, k, v, lkv, slots, sm_scale=0.125, cert=cert, delta_loc=dl)
    assert isinstance(got, ExtendOut) and got.cert.shape == (7, 4)
    _same(got, triton_extend(q, k, v, lkv, slots, sm_scale=0.125, cert=cert, delta_loc=dl))
