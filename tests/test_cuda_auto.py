"""The default plan ``auto`` on CUDA: the CUDA kernel where it serves the call and builds, else the
Triton kernel (a build failure is logged once and never retried); an explicit ``cuda`` plan
raises the build error. Runs on CPU with the CUDA checks stubbed (what is under test is the
choice, not the kernel)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # as the kernel tests: witcert.kernels' Triton functions in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import logging  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402

from witcert.kernels import cuda as wc_cuda  # noqa: E402
from witcert.kernels import launch  # noqa: E402
from witcert.kernels.plan import DecodePlan  # noqa: E402


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(wc_cuda, "reason", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    launch._builds.cache_clear()
    launch._arch.cache_clear()
    calls = []

    def failing_library(**cfg):
        calls.append(cfg)
        raise RuntimeError("witcert: nvcc failed to build decode.cu:\nnvcc fatal   : Unsupported gpu architecture 'compute_90'")

    monkeypatch.setattr(wc_cuda, "library", failing_library)
    monkeypatch.setattr(launch, "_sm_count", lambda device: 132)
    q = SimpleNamespace(is_cuda=True, dtype=torch.bfloat16, device="cuda:0", shape=(16, 32, 128))  # [T, Hq, D]
    side = lambda: dict(codes=torch.zeros(64, 8, 128, dtype=torch.int8),  # noqa: E731
                        scales=torch.zeros(64, 8, 4, dtype=torch.float16), wit=torch.zeros(64, 8, 4, dtype=torch.float16))
    layer = SimpleNamespace(quant=SimpleNamespace(philox_rounds=10), epochs=torch.zeros(2, dtype=torch.int64),
                            num_slots=64, num_kv_heads=8, k=side(), v=side())
    yield q, layer, calls
    launch._builds.cache_clear()
    launch._arch.cache_clear()


def config(plan, q, layer, **kw):
    args = dict(qg=4, d=128, bits=16, G=32, km2=0, vm2=0) | kw
    return launch._cuda_config(plan, q, layer, **args)


def test_auto_falls_back_to_triton_once_when_the_kernel_does_not_build(fake_cuda, caplog):
    q, layer, calls = fake_cuda
    with caplog.at_level(logging.WARNING, logger="witcert.kernels"):
        assert config(DecodePlan(impl="auto"), q, layer) is None
        assert config(DecodePlan(impl="auto"), q, layer) is None
    assert len(calls) == 1, "a failed build is not retried"
    assert sum("did not build" in r.message for r in caplog.records) == 1
    assert "Unsupported gpu architecture" in caplog.records[0].getMessage()


def test_explicit_cuda_returns_the_configuration_and_triton_plans_never_use_it(fake_cuda):
    q, layer, calls = fake_cuda
    cfg = config(DecodePlan(impl="cuda"), q, layer)
    assert cfg == dict(qgp=4, group=32, bits=16, rounds=10, arch="90", maxreg=0, kind="decode")
    assert calls == [], "an explicit plan builds at launch, where a failure raises"
    assert config(DecodePlan(impl="triton"), q, layer) is None


def test_auto_leaves_unserved_shapes_to_triton_silently(fake_cuda, caplog):
    q, layer, _ = fake_cuda
    with caplog.at_level(logging.WARNING, logger="witcert.kernels"):
        assert config(DecodePlan(impl="auto"), q, layer, d=64) is None
        assert config(DecodePlan(impl="auto"), q, layer, qg=16) is None
    assert not caplog.records


def test_storage_views_at_odd_offsets_go_to_triton(fake_cuda):
    q, layer, _ = fake_cuda
    assert config(DecodePlan(impl="cuda"), q, layer) is not None
    layer.v = dict(layer.v, codes=torch.zeros(64 * 8 * 128 + 8, dtype=torch.int8)[8:].view(64, 8, 128))
    assert config(DecodePlan(impl="cuda"), q, layer) is None


def test_the_decode_pairs_at_eight_heads_per_kv_head_are_chosen_by_grid_size():
    """pairs_for_grid: only 8 query heads per KV head, b = 16, groups of 32 have a second build;
    ``auto`` takes it when the grid fits one CTA per SM; a bad mode is a one-line ValueError."""
    rule = lambda **kw: wc_cuda.pairs_for_grid(**(dict(qgp=8, group=32, bits=16, sms=132) | kw))  # noqa: E731
    assert rule(ctas=128) and rule(ctas=132) and not rule(ctas=133)
    assert rule(ctas=10_000, mode="always") and not rule(ctas=1, mode="never")
    for other in (dict(qgp=4), dict(bits=8), dict(group=64)):
        assert not rule(ctas=1, **other) and not rule(ctas=1, mode="always", **other)
    assert DecodePlan().cuda_pairs == "auto"
    with pytest.raises(ValueError, match="cuda_pairs"):
        DecodePlan(cuda_pairs="sometimes")


def test_the_cuda_extend_needs_compute_capability_9_and_the_decode_does_not(fake_cuda, monkeypatch, caplog):
    """extend.cu's staged tiles land by bulk copies (cp.async.bulk, sm_90): below compute capability
    9.0 the Triton kernel serves the extend's prefix (one log line for an explicit ``cuda`` plan),
    while the decode is still served there."""
    from witcert.kernels.plan import ExtendPlan

    q, layer, _ = fake_cuda
    assert config(ExtendPlan(impl="cuda"), q, layer, kind="extend")["arch"] == "90"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    launch._arch.cache_clear()
    with caplog.at_level(logging.WARNING, logger="witcert.kernels"):
        assert config(ExtendPlan(impl="cuda"), q, layer, kind="extend") is None
    assert any("compute capability 9.0" in r.getMessage() for r in caplog.records)
    assert config(DecodePlan(impl="cuda"), q, layer)["arch"] == "80"


def test_the_extend_build_follows_the_grid(fake_cuda):
    """The extend's default plan takes 64-token tiles at 8 warps where its grid at 4 warps (64
    rows a CTA, x 8 KV heads) holds more CTAs than the 132 SMs, else the source's 32-token tiles
    (tile 0: no flag) at 4 warps (ExtendPlan.prefix_build, BENCHMARKS.md 13ai)."""
    from witcert.kernels.plan import ExtendPlan

    q, layer, _ = fake_cuda
    pick = lambda t, plan=ExtendPlan(impl="cuda"): {  # noqa: E731
        k: v for k, v in config(plan, SimpleNamespace(**vars(q) | dict(shape=(t, 32, 128))), layer,
                                kind="extend").items() if k in ("warps", "tile")}
    assert pick(512) == dict(warps=8, tile=64)  # 32 blocks of 16 tokens x 8 KV heads = 256 CTAs
    assert pick(16) == pick(256) == dict(warps=4, tile=0)  # 8 and 128 CTAs
    assert pick(257) == dict(warps=8, tile=64)  # 136 CTAs
    assert pick(16, ExtendPlan(impl="cuda", cuda_warps=8)) == dict(warps=8, tile=64)
