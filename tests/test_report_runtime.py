"""The report's runtime-path soundness check (``witcert.report.runtime``) on tiny synthetic layers.

The check writes exact K/V into a pool, decodes every step through the path the runtime
dispatch picks (native C for a dither8 pool without outliers on CPU, the torch reference
with outliers) and compares each certificate with the exact TV of the path's own logits.
These tests pin that it finds the right path, that it counts a certificate pushed below the
TV (or NaN) as a violation, and that its rows line up with the engine's record order.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # the Triton case runs in the interpreter (as tests/test_kernels_*)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from witcert import native
from witcert.config import CertConfig, QuantConfig
from witcert.ref.pool import gather
from witcert.ref.types import K_SIDE
from witcert.report import runtime
from witcert.report.engine import Captured

N, T, HKV, HQ, D = 40, 5, 2, 4, 64
SM = D ** -0.5
CERT = CertConfig(radius="min")


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(N, HKV, D, generator=g).half()
    v = torch.randn(N, HKV, D, generator=g).half()
    q = torch.randn(T, HQ, D, generator=g) * 1.5
    return k, v, q


def _outliers(m: int):
    idx = torch.arange(2 * m, dtype=torch.int64).expand(HKV, -1).contiguous()
    return idx, idx


def _check(k, v, q, *, m: int = 0, device="cpu"):
    oi = _outliers(m) if m else None
    return runtime.check_layer(k=k, v=v, q=q, sm=SM, quant=QuantConfig(outliers=m, seed=5), layer=2,
                               outlier_idx=oi, cert=CERT, delta_loc=1e-5, device=device)


def test_runtime_check_runs_native_on_cpu_and_its_certificates_hold():
    if not native.available():
        pytest.skip(f"native path unavailable: {native.reason()}")
    k, v, q = _case()
    r = _check(k, v, q)
    assert r["path"] == "native" and r["why"] is None
    assert r["cert"].shape == r["tv"].shape == (T, HQ)
    assert bool(torch.isfinite(r["cert"]).all()) and bool((r["tv"] > 0).all())
    assert int(runtime.violations(r["cert"], r["tv"], r["no_exact"]).sum()) == 0


def test_runtime_check_runs_native_with_outliers_and_its_certificates_hold():
    if not native.available():
        pytest.skip(f"native path unavailable: {native.reason()}")
    k, v, q = _case(1)
    r = _check(k, v, q, m=2)
    assert r["path"] == "native" and r["why"] is None
    assert int(runtime.violations(r["cert"], r["tv"], r["no_exact"]).sum()) == 0


def test_runtime_check_runs_the_reference_when_the_dispatch_picks_it_and_says_why(monkeypatch):
    monkeypatch.setenv("WITCERT_BACKEND", "ref")
    k, v, q = _case(1)
    r = _check(k, v, q, m=2)
    assert r["path"] == "reference" and r["why"] == "the backend dispatch chose it"
    assert int(runtime.violations(r["cert"], r["tv"], r["no_exact"]).sum()) == 0


def test_runtime_check_runs_the_triton_kernel_when_the_dispatch_picks_it(monkeypatch):
    """WITCERT_BACKEND=triton (the kernels compiled on a GPU, in the interpreter on a CPU):
    the kernel's own certificates and logits are checked, outliers included."""
    pytest.importorskip("triton")
    monkeypatch.setenv("WITCERT_BACKEND", "triton")
    k, v, q = _case(3)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for m in (0, 2):
        r = _check(k[:24], v[:24], q[:3], m=m, device=dev)
        assert r["path"] == "triton" and r["why"] is None
        assert bool(torch.isfinite(r["cert"]).all())
        assert int(runtime.violations(r["cert"], r["tv"], r["no_exact"]).sum()) == 0


@pytest.mark.parametrize("m", [0, 2])
def test_runtime_check_counts_injected_violations(monkeypatch, m):
    """A certificate set to 0, to NaN, or to 1e-9 below its exact TV is a violation each."""
    k, v, q = _case(2)
    clean = _check(k, v, q, m=m)
    real = runtime.run_path

    def tampered(*args, **kw):
        c, used = real(*args, **kw)
        c = c.clone()
        c[0, 0] = 0.0
        c[1, 2] = float("nan")
        c[3, 1] = clean["tv"][3, 1] * (1 - 1e-9)
        return c, used

    monkeypatch.setattr(runtime, "run_path", tampered)
    r = _check(k, v, q, m=m)
    bad = runtime.violations(r["cert"], r["tv"], r["no_exact"])
    assert int(bad.sum()) == 3
    assert bool(bad[0, 0]) and bool(bad[1, 2]) and bool(bad[3, 1])


def test_runtime_unit_rows_follow_engine_order_and_match_float64_tv():
    """Flat rows are (layer, head, step), the engine's order; each TV agrees with a plain
    float64 TV of the same stored keys (the exact one differs by rounding only)."""
    caps, pk, pv = [], [], []
    P = N - T
    for layer in range(2):
        k, v, q = _case(10 + layer)
        pk.append(k[:P])
        pv.append(v[:P])
        caps.append(Captured(q, k[P:], v[P:], SM))
    quant = QuantConfig(seed=5)
    unit = runtime.runtime_unit(caps, pk, pv, quant=quant, radius="min", delta=1e-2, outlier_idx=None)
    assert unit["cert"].shape == (2 * HQ * T,) and unit["radius"] == "min"
    assert unit["device"] == "cpu" and unit["path"] in ("native", "reference")
    kvh = torch.arange(HQ) // (HQ // HKV)
    want = []
    for layer in range(2):
        k = torch.cat([pk[layer], caps[layer].k_new])
        pool = runtime.make_pool(quant, num_tokens=N, num_kv_heads=HKV, head_dim=D, layer=layer,
                                 outlier_idx=None, device="cpu")
        from witcert.runtime import dispatch as backend
        backend.write_kv_(pool, k, torch.cat([pv[layer], caps[layer].v_new]),
                          slots=torch.arange(N, dtype=torch.int64))
        khat = gather(pool, K_SIDE, torch.arange(N, dtype=torch.int64))[0]
        tv = torch.empty(HQ, T, dtype=torch.float64)
        for i in range(T):
            n = P + i + 1
            q64 = caps[layer].q[i].double()
            z = SM * torch.einsum("hd,hnd->hn", q64, k[:n, kvh].transpose(0, 1).double())
            zh = SM * torch.einsum("hd,hnd->hn", q64, khat[:n, kvh].transpose(0, 1).double())
            tv[:, i] = 0.5 * (torch.softmax(z, -1) - torch.softmax(zh, -1)).abs().sum(-1)
        want.append(tv.reshape(-1))
    torch.testing.assert_close(unit["tv"], torch.cat(want), rtol=1e-4, atol=1e-9)


def _fake(cert, tv, e_cert, e_tv):
    unit = {"cert": cert, "tv": tv, "no_exact": torch.zeros_like(cert, dtype=torch.bool),
            "path": "native", "why": None, "device": "cpu", "radius": "min", "seconds": 0.0}
    return unit, {"tv": e_tv, "certs": {"min": e_cert}}


def test_runtime_rows_count_over_domains_and_pair_with_engine():
    tv = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    a = _fake(tv * 2, tv, tv * 2, tv)
    b = _fake(torch.tensor([0.05, float("nan"), float("inf")], dtype=torch.float64), tv, tv * 2, tv)
    rows = runtime.runtime_rows({"docs": {"witcert-m0": a[0]}, "code": {"witcert-m0": b[0]}},
                                {"docs": {"witcert-m0": a[1]}, "code": {"witcert-m0": b[1]}})
    row = rows["witcert-m0"]
    assert row["checked"] == 6 and row["violations"] == 2  # 0.05 < 0.1 and the NaN
    assert row["nan"] == 1 and row["inf"] == 1 and row["negative"] == 0
    assert row["engine"]["violations"] == 0 and row["engine"]["tight_median"] == pytest.approx(2.0)
    assert row["engine"]["checked"] == 6 and row["engine"]["nan"] == row["engine"]["inf"] == 0
    short = _fake(tv[:2], tv[:2], tv, tv)
    with pytest.raises(ValueError, match="engine rows"):
        runtime.runtime_rows({"docs": {"witcert-m0": short[0]}}, {"docs": {"witcert-m0": short[1]}})
