"""decode.cu, extend.cu and write.cu compile for sm_90 in the configurations ``config_for`` serves, decode.cu
and write.cu without local memory (no spills, no stack), extend.cu with at most a few spilled bytes (it uses
all 255 registers; one configuration spills 8 bytes): checked with nvcc alone, so CI without a
GPU catches a kernel that would not build or would spill (the GPU machine runs their contract
tests, tests/test_kernels_decode.py and test_kernels_extend.py). Skipped when nvcc is not
installed."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # as the kernel tests: witcert.kernels' Triton functions in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import re  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402

from witcert.kernels import cuda as wc_cuda  # noqa: E402

# (query heads per KV head, group, dither bits, rounds): every head count, group, width and round count
CONFIGS = [(4, 32, 16, 10), (4, 32, 8, 10), (7, 32, 16, 10), (8, 32, 8, 7), (1, 64, 16, 10), (8, 64, 8, 10),
           (2, 128, 16, 7), (3, 128, 8, 10)]


@pytest.mark.parametrize("qg,group,bits,rounds,few", [c + (False,) for c in CONFIGS] + [(7, 32, 16, 10, True)])
def test_decode_cu_builds_for_sm90_without_local_memory(qg, group, bits, rounds, few, tmp_path):
    nvcc = wc_cuda._nvcc()
    if nvcc is None:
        pytest.skip("nvcc not installed")
    cfg = wc_cuda.config_for(qg=qg, d=128, bits=bits, group=group, outliers=0, rounds=rounds)
    assert cfg is not None, "config_for must serve this configuration"
    defines = wc_cuda.config_defines(**cfg, few_ctas=few)  # few: the build for small grids (pairs_for_grid)
    res = subprocess.run([nvcc, "-O3", "-c", "-arch=sm_90", "--std=c++17", "-Xptxas", "-v", *defines,
                          str(wc_cuda._SRC), "-o", str(tmp_path / "decode.o")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    info = res.stderr
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in info, info[-2000:]
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    assert regs <= 255


def test_config_for_refuses_what_the_kernel_does_not_serve():
    kw = dict(d=128, bits=16, group=32, outliers=0, rounds=10)
    assert wc_cuda.config_for(qg=8, **kw) == dict(qgp=8, group=32, bits=16, rounds=10)
    assert wc_cuda.config_for(qg=9, **kw) is None
    assert wc_cuda.config_for(**{**kw, "d": 64}, qg=4) is None
    assert wc_cuda.config_for(**{**kw, "bits": 24}, qg=4) is None
    assert wc_cuda.config_for(**{**kw, "outliers": 2}, qg=4) is None
    assert wc_cuda.config_for(**{**kw, "group": 16}, qg=4) is None


def test_a_plans_prefix_tile_reaches_the_extend_build():
    """A 64-token tile (ExtendPlan.prefix_build's at 8 warps) builds extend.cu with
    -DWC_TN=64; tile 0 (the source's 32) adds no flag, so a 32-token build's cache key is the one
    from before the option."""
    base = dict(qgp=4, group=32, bits=8, rounds=10)
    assert "-DWC_TN=64" in wc_cuda.config_defines(**base, tile=64)
    assert not any(f.startswith("-DWC_TN") for f in wc_cuda.config_defines(**base))


DEFAULT_EXTEND = dict(tile=64, warps=8)  # ExtendPlan.prefix_build's for grids of more CTAs than SMs (13ai)


@pytest.mark.parametrize("qg,group,bits,rounds,more,limit", [
    (4, 32, 16, 10, DEFAULT_EXTEND, 128), (8, 32, 8, 7, DEFAULT_EXTEND, 128), (1, 64, 16, 10, DEFAULT_EXTEND, 128),
    (3, 128, 8, 10, DEFAULT_EXTEND, 128), (4, 32, 8, 10, {}, 64)])
def test_extend_cu_builds_for_sm90_with_at_most_a_few_spilled_bytes(qg, group, bits, rounds, more, limit, tmp_path):
    """more: config_defines' other fields: the plan's build for large grids (64-token tiles at 8 warps,
    whose instances a call runs spill up to 116 bytes, the deterministic radius's most), and the
    source's own default (32-token tiles at 4 warps, ExtendPlan(cuda_warps=4)). limit: the instances
    a call runs (wc_extend_prefix<false, mode>); the instances with the debug outputs (<true, mode>:
    tests and audits) may spill up to 160 bytes (up to 144 at 64-token tiles)."""
    nvcc = wc_cuda._nvcc()
    if nvcc is None:
        pytest.skip("nvcc not installed")
    cfg = wc_cuda.config_for(qg=qg, d=128, bits=bits, group=group, outliers=0, rounds=rounds)
    defines = wc_cuda.config_defines(**cfg, **more)
    res = subprocess.run([nvcc, "-O3", "-c", "-arch=sm_90", "--std=c++17", "-Xptxas", "-v", *defines,
                          f"-I{wc_cuda._COMMON.parent}", str(wc_cuda._EXT_SRC), "-o", str(tmp_path / "extend.o")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    spills = {f: int(x) for f, x in re.findall(r"Function properties for (\S+)\s+\d+ bytes stack frame, (\d+) bytes "
                                               r"spill stores", res.stderr)}
    prefix = {f: x for f, x in spills.items() if "wc_extend_prefix" in f}
    assert len(prefix) == 6, spills  # <OUTS, radius mode>: 2 x 3
    for f, x in prefix.items():
        assert x <= (limit if "ILb0E" in f else 160), (f, x)
    assert max(x for f, x in spills.items() if f not in prefix) <= limit, spills


@pytest.mark.parametrize("group,bits,rounds", [(32, 16, 10), (64, 8, 7), (128, 16, 10)])
def test_write_cu_builds_for_sm90_without_local_memory(group, bits, rounds, tmp_path):
    nvcc = wc_cuda._nvcc()
    if nvcc is None:
        pytest.skip("nvcc not installed")
    defines = wc_cuda.config_defines(qgp=1, group=group, bits=bits, rounds=rounds)
    res = subprocess.run([nvcc, "-O3", "-c", "-arch=sm_90", "--std=c++17", "-Xptxas", "-v", *defines,
                          f"-I{wc_cuda._COMMON.parent}", str(wc_cuda._WRITE_SRC), "-o", str(tmp_path / "write.o")],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in res.stderr, res.stderr[-2000:]


def test_built_from_swaps_the_kernel_source_for_a_block_and_restores_it():
    """Same-run benchmarks and A/B checks build an earlier kernel inside ``built_from``; the
    package's source is back afterwards, also when the block raises."""
    from pathlib import Path

    package = wc_cuda.library
    with wc_cuda.built_from("prev/decode.cu"):
        assert wc_cuda.library.func is package
        assert wc_cuda.library.keywords == {"src": Path("prev/decode.cu")}
    assert wc_cuda.library is package
    with pytest.raises(KeyError):
        with wc_cuda.built_from("prev/extend.cu"):
            raise KeyError("inside")
    assert wc_cuda.library is package


def test_the_build_cache_key_covers_the_common_header_the_source_includes(tmp_path):
    """A same-run A/B of an earlier version that differs only in its ``common.cuh`` must build
    that version, not load the package's cached library (a key over the package's header gave
    both the same key, so an A/B compared the package with itself)."""
    from pathlib import Path

    pkg = Path(wc_cuda.__file__).with_name("extend.cu")
    flags = ["-O3", "-DWC_QGP=4"]
    (tmp_path / "extend.cu").write_bytes(pkg.read_bytes())
    assert wc_cuda.build_key(tmp_path / "extend.cu", flags) == wc_cuda.build_key(pkg, flags)  # no header beside it
    common = pkg.with_name("common.cuh").read_bytes()
    (tmp_path / "common.cuh").write_bytes(common)
    assert wc_cuda.build_key(tmp_path / "extend.cu", flags) == wc_cuda.build_key(pkg, flags)
    (tmp_path / "common.cuh").write_bytes(common.replace(b"1.000244140625f", b"1.00048828125f"))
    assert wc_cuda.build_key(tmp_path / "extend.cu", flags) != wc_cuda.build_key(pkg, flags)
    assert wc_cuda.build_key(pkg, flags) != wc_cuda.build_key(pkg, flags + ["-DWC_NW=8"])


@pytest.mark.parametrize("kind,mirror", [("decode", "Args"), ("write", "WriteArgs"), ("extend", "ExtArgs")])
def test_each_launch_struct_matches_its_ctypes_mirror(kind, mirror, tmp_path, monkeypatch):
    """The launchers pass one struct by pointer (``wc_*_launch``), mirrored field by field in
    ``witcert.kernels.cuda``: a field added on one side only would shift every later field. Each
    library, built for sm_90 and loaded without a GPU (its host functions only), says its struct's
    size, which must be the mirror's."""
    import ctypes

    if wc_cuda._nvcc() is None:
        pytest.skip("nvcc not installed")
    monkeypatch.setenv("WITCERT_CACHE", str(tmp_path))
    wc_cuda.library.cache_clear()
    try:
        lib = wc_cuda.library(qgp=4, group=32, bits=8, rounds=10, arch="90", kind=kind)
        assert getattr(lib, f"wc_{kind}_args_bytes")() == ctypes.sizeof(getattr(wc_cuda, mirror))
    finally:
        wc_cuda.library.cache_clear()  # the next test's builds land in its own cache


@pytest.mark.parametrize("more", [DEFAULT_EXTEND, {}])
def test_the_staged_keys_layout_meets_the_tile_loops_reads(more, tmp_path, monkeypatch):
    """extend.cu's staging pass stores each key row where the tile loop's ldmatrix rows (every chain,
    n-tile and lane) find the token and channels its B fragments need, and the stored rows fill the
    keys' bytes once each (wc_extend_key_layout_errors, host code of the library; no GPU)."""
    if wc_cuda._nvcc() is None:
        pytest.skip("nvcc not installed")
    monkeypatch.setenv("WITCERT_CACHE", str(tmp_path))
    wc_cuda.library.cache_clear()
    try:
        lib = wc_cuda.library(qgp=4, group=32, bits=8, rounds=10, arch="90", kind="extend", **more)
        assert lib.wc_extend_key_layout_errors() == 0
    finally:
        wc_cuda.library.cache_clear()
