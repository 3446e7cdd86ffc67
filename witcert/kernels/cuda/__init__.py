"""The CUDA C++ kernels, built with nvcc on first use: the decode split kernel (``decode.cu``),
the extend's prefix phase (``extend.cu``) and the writer (``write.cu``); helpers shared by them
in ``common.cuh``.

Same pattern as the native CPU path: the library is compiled once per configuration
(scale group, dither bits, Philox rounds, query heads per KV head padded, GPU
architecture) into a cache folder keyed by the source's hash, then loaded with
ctypes; the launch goes to the caller's CUDA stream (so it is captured by CUDA graphs).
``available()`` / ``reason()`` say whether nvcc and a CUDA device are there;
``witcert.kernels.launch`` falls back to the Triton kernel otherwise (one log line).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from ctypes import c_float, c_int32, c_int64, c_uint32, c_void_p
from pathlib import Path

import torch

from witcert.kernels.plan import cdiv

log = logging.getLogger("witcert.kernels.cuda")
_SRC = Path(__file__).with_name("decode.cu")
_EXT_SRC = Path(__file__).with_name("extend.cu")
_WRITE_SRC = Path(__file__).with_name("write.cu")
_COMMON = Path(__file__).with_name("common.cuh")


class Args(ctypes.Structure):
    """``Args`` of decode.cu (field order = the C struct)."""

    _fields_ = [(n, c_void_p) for n in ("q", "kc", "vc", "ks", "vs", "kw", "vw", "epochs", "bt",
                                         "seq_lens", "delta", "pm", "pl", "pa", "pvw", "pvmax", "pu",
                                         "pacc", "radius", "logits")] + \
        [(n, c_int64) for n in ("sq_b", "sq_h", "bt_s0", "rad_n")] + \
        [(n, c_float) for n in ("sm", "delta_scalar", "bias_coef", "arith_gamma", "arith_abs")] + \
        [("key0", c_uint32), ("key1", c_uint32)] + \
        [(n, c_int32) for n in ("q_dtype", "Hq", "Hkv", "G", "P", "layer", "rounds", "cert",
                                "radius_mode", "num_splits_grid", "fixed_splits",
                                "min_tokens_per_split", "max_splits")] + [("positions", c_void_p)]


class WriteArgs(ctypes.Structure):
    """``WriteArgs`` of write.cu (field order = the C struct)."""

    _fields_ = [(n, c_void_p) for n in ("k", "v", "kc", "vc", "ks", "vs", "kw", "vw", "slots", "epochs",
                                         "positions")] + \
        [(n, c_int64) for n in ("sk_t", "sk_h", "sv_t", "sv_h", "num_rows")] + \
        [("key0", c_uint32), ("key1", c_uint32)] + \
        [(n, c_int32) for n in ("x_dtype", "Hkv", "layer")]


class ExtArgs(ctypes.Structure):
    """``ExtArgs`` of extend.cu (field order = the C struct)."""

    _fields_ = [(n, c_void_p) for n in ("q", "kc", "vc", "ks", "vs", "kw", "vw", "epochs", "positions",
                                         "prefix_slots", "delta", "om", "ol", "oa", "ou", "oacc", "logits",
                                         "radius")] + \
        [(n, c_int64) for n in ("sq_t", "sq_h", "rad_n")] + \
        [(n, c_float) for n in ("sm", "delta_scalar", "bias_coef", "arith_gamma", "arith_abs", "e_soft")] + \
        [("key0", c_uint32), ("key1", c_uint32)] + \
        [(n, c_int32) for n in ("q_dtype", "T", "Np", "Hq", "Hkv", "layer", "cert", "radius_mode")] + \
        [("work", c_void_p)] + \
        [("carry", c_void_p), ("tile0", c_int32), ("np_all", c_int32), ("carry_mode", c_int32)] + \
        [("n_splits", c_int32)]
    # work, then the chunks' fields, then the splits' last: an earlier extend.cu (same-run tools,
    # built_from) reads the fields before them


def cache_dir() -> Path:
    from witcert.settings import cache_root

    return cache_root() / "cuda"


@functools.lru_cache(maxsize=1)
def _nvcc() -> str | None:
    for cand in (os.environ.get("CUDA_HOME") and os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"),
                 shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.exists(cand):
            return cand
    return None


@functools.lru_cache(maxsize=1)
def reason() -> str | None:
    """Why the CUDA kernel cannot be used here (None if it can); asked once per process (it is
    on every decode call's path)."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if _nvcc() is None:
        return "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    return None


def available() -> bool:
    return reason() is None


def config_defines(*, qgp: int, group: int, bits: int, rounds: int, maxreg: int = 0, warps: int = 0,
                   few_ctas: bool = False, tile: int = 0) -> list[str]:
    """The preprocessor definitions of one configuration of decode.cu / extend.cu (warps: the
    extend's warps per CTA, 0 for its default; few_ctas: decode.cu's build for grids of at most
    one CTA per SM, ``pairs_for_grid``; tile: the extend's prefix tokens per tile, 0 for its
    default, EXTEND_TILE)."""
    return [f"-DWC_QGP={qgp}", f"-DWC_G={group}", f"-DWC_BITS={bits}", f"-DWC_ROUNDS={rounds}"] + \
        ([f"-DWC_MAXREG={maxreg}"] if maxreg else []) + ([f"-DWC_NW={warps}"] if warps else []) + \
        (["-DWC_FEW_CTAS"] if few_ctas else []) + ([f"-DWC_TN={tile}"] if tile else [])


def pairs_for_grid(*, qgp: int, group: int, bits: int, ctas: int, sms: int, mode: str = "auto") -> bool:
    """Whether a decode launch of ``ctas`` CTAs takes decode.cu's few-CTAs build (``few_ctas``):
    K / V warp pairs at 8 query heads per KV head, b = 16 and groups of 32, where the default
    build runs one warp per tile stream (the other configurations of groups of 32 are pairs in
    both builds). ``auto`` (``DecodePlan.cuda_pairs``): when the grid fits one CTA per SM, so
    each SM runs 8 warps instead of 4 (BENCHMARKS.md 4p: 1.26x at B1 Hq28 Hkv4 S32768; with more
    CTAs than SMs the one-warp kernel's two CTAs per SM win); ``always`` / ``never``. Both builds
    give the same bits, so this choice by grid size never changes a result."""
    if not (qgp == 8 and bits == 16 and group == 32) or mode == "never":
        return False
    return mode == "always" or ctas <= sms


def build_key(src: Path, flags: list[str]) -> str:
    """The cache key of one build: the source, the ``common.cuh`` it includes and the flags.
    ``#include "common.cuh"`` finds the header beside ``src`` first (another version's, under
    ``built_from``), the package's only where there is none, so the key hashes that one: two
    versions that differ only in their ``common.cuh`` are two builds."""
    common = src.with_name("common.cuh") if src.with_name("common.cuh").exists() else _COMMON
    text = src.read_bytes() + common.read_bytes()
    return hashlib.sha256(text + " ".join(flags).encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def library(*, qgp: int, group: int, bits: int, rounds: int, arch: str, maxreg: int = 0,
            src: Path | None = None, kind: str = "decode", warps: int = 0, few_ctas: bool = False,
            tile: int = 0) -> ctypes.CDLL:
    """Build (once) and load the library of one configuration (maxreg: a register cap per thread,
    0 for the compiler's choice; kind: ``decode`` or ``extend``, the kernel; src: its source,
    None for the package's, another version for same-run benchmarks; few_ctas: decode.cu's build
    for small grids, ``pairs_for_grid``; tile: the extend's prefix tile, 0 for its default).
    Raises RuntimeError with nvcc's output when the build fails."""
    if kind not in ("decode", "extend", "write"):
        raise ValueError(f"kind: {kind!r} must be 'decode', 'extend' or 'write'")
    if src is None:
        src = {"decode": _SRC, "extend": _EXT_SRC, "write": _WRITE_SRC}[kind]
    defines = config_defines(qgp=qgp, group=group, bits=bits, rounds=rounds, maxreg=maxreg, warps=warps,
                             few_ctas=few_ctas, tile=tile)
    flags = ["-O3", "-shared", "-Xcompiler", "-fPIC", f"-gencode=arch=compute_{arch},code=sm_{arch}",
             "--std=c++17", f"-I{_COMMON.parent}"] + defines
    out = cache_dir() / f"{kind}_{build_key(src, flags)}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"witcert: building the CUDA {kind} kernel ({' '.join(defines)}, sm_{arch})...",
              file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_out = Path(tmp) / out.name
            res = subprocess.run([_nvcc(), *flags, str(src), "-o", str(tmp_out)],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"witcert: nvcc failed to build {src.name}:\n{res.stderr[-4000:]}")
            os.replace(tmp_out, out)
    lib = ctypes.CDLL(str(out))
    if kind == "write":
        lib.wc_write_launch.argtypes = [ctypes.POINTER(WriteArgs), c_int32, c_void_p]
        lib.wc_write_launch.restype = c_int32
        if hasattr(lib, "wc_div_probe"):
            lib.wc_div_probe.argtypes = [c_void_p] * 4 + [c_int32, c_void_p]
            lib.wc_div_probe.restype = c_int32
    elif kind == "extend":
        lib.wc_extend_launch.argtypes = [ctypes.POINTER(ExtArgs), c_int32, c_int32, c_void_p]
        lib.wc_extend_launch.restype = c_int32
        if hasattr(lib, "wc_extend_workspace_bytes"):  # an earlier extend.cu (built_from) has no workspace
            lib.wc_extend_workspace_bytes.argtypes = [c_int32, c_int32]
            lib.wc_extend_workspace_bytes.restype = c_int64
        if hasattr(lib, "wc_extend_tile_tokens"):  # the build's prefix tile (WC_TN)
            lib.wc_extend_tile_tokens.argtypes = []
            lib.wc_extend_tile_tokens.restype = c_int32
        if hasattr(lib, "wc_tc_probe"):
            lib.wc_tc_probe.argtypes = [c_void_p, c_void_p, c_void_p, c_int32, c_void_p]
            lib.wc_tc_probe.restype = c_int32
        for probe in ("wc_expm1_probe", "wc_expm1_poly_probe"):
            if hasattr(lib, probe):
                getattr(lib, probe).argtypes = [c_void_p, c_void_p, c_int32, c_void_p]
                getattr(lib, probe).restype = c_int32
    else:
        lib.wc_decode_launch.argtypes = [ctypes.POINTER(Args), c_int32, c_int32, c_void_p]
        lib.wc_decode_launch.restype = c_int32
    # the builds' constants, each an int of no argument (an earlier source, built_from, may lack some:
    # the extend's chunks, the launch structs' sizes)
    for name in ("wc_write_rows_per_cta", "wc_extend_carry_floats", "wc_extend_cta_threads", "wc_decode_args_bytes",
                 "wc_write_args_bytes", "wc_extend_args_bytes"):
        if hasattr(lib, name):
            getattr(lib, name).argtypes = []
            getattr(lib, name).restype = c_int32
    return lib


@contextlib.contextmanager
def built_from(src: Path | str):
    """Within the block the launcher builds the CUDA kernels from ``src`` (another version of
    decode.cu or extend.cu, e.g. ``git show REV:...``) instead of the package's: same-run
    benchmarks and bitwise A/B checks against an earlier kernel. Restores the package's after."""
    global library
    now = library
    library = functools.partial(now, src=Path(src))
    try:
        yield
    finally:
        library = now


# tokens per warp tile of decode.cu (the merge kernel's rounding depth counts them)
TILE = 16
# extend.cu: prefix tokens per tile (each row's weights are rescaled once per tile); its rows
# (new token, query head) per CTA are 16 per warp. A build with larger tiles (ExtendPlan.cuda_tile
# 64) rescales less often, so counts made with 32 stay upper bounds; its chunks follow the
# library's own tile (wc_extend_tile_tokens)
EXTEND_TILE = 32


def extend_blocks(*, tokens: int, qgp: int, warps: int) -> int:
    """Blocks of new tokens of extend.cu's prefix grid (its x; y is the KV heads): a CTA of
    ``warps`` warps holds 16 rows (new token, query head; heads padded to ``qgp``) per warp."""
    return cdiv(tokens, 16 * warps // qgp)


def config_for(*, qg: int, d: int, bits: int, group: int, outliers: int, rounds: int) -> dict | None:
    """The library configuration serving these shapes, or None (the Triton kernel serves it):
    D = 128, 8- or 16-bit dither, no bypassed channels, groups of 32, 64 or 128 channels and
    at most 8 query heads per KV head."""
    if d != 128 or bits not in (8, 16) or outliers or group not in (32, 64, 128) or rounds not in (7, 10):
        return None
    qgp = 1 << (qg - 1).bit_length()
    if qgp > 8:
        return None
    return dict(qgp=qgp, group=group, bits=bits, rounds=rounds)
