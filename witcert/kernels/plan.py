"""Tile and split plans of the decode kernel, made once per (device, geometry), never per launch.

A request's split count is a function of its own length only (``plan_splits``), so its
result never depends on what it is batched with; the grid is sized from the block table's
capacity. Tiles and warps come from the plan (measured on the H200, BENCHMARKS.md 4e);
the Triton interpreter gets small tiles so CPU contract tests stay fast.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import torch

from witcert.settings import EXTEND_WORKSPACE_MIB


@dataclass(frozen=True)
class DecodePlan:
    """impl: ``triton``, ``cuda`` (the CUDA C++ tensor-core split kernel, witcert/kernels/cuda;
    the Triton kernel serves what it does not, with one log line: D != 128, outliers, 24-bit
    dither, more than 8 query heads per KV head) or ``auto`` (the CUDA kernel where it serves
    the call, nvcc is there and builds it, else the Triton kernel: silently, or with one log
    line when the build fails);
    block_n: tokens per tile (0: 64 when the (head, group) rows fit 16, else 32; measured on
        the H200, BENCHMARKS.md 4e); num_warps, num_stages: Triton launch settings;
    min_tokens_per_split: a request of N tokens uses the smallest power of two S with
    N / S <= this many tokens per split, capped at max_splits;
    max_registers: a cap on registers per thread of the split kernel (Triton's maxnreg, CUDA's
        __launch_bounds__; 0: the source's default, which for the CUDA decode's warp pairs is
        128 registers; a cap trades spills for more resident warps);
    cuda_pairs: the CUDA decode's arrangement at 8 query heads per KV head, b = 16, groups of 32:
        ``auto`` (K / V warp pairs when the grid fits one CTA per SM, else one warp per tile
        stream; BENCHMARKS.md 4p), ``always`` or ``never``. Every choice gives the same bits."""

    impl: str = "triton"
    block_n: int = 0
    num_warps: int = 4
    num_stages: int = 2
    min_tokens_per_split: int = 512
    max_splits: int = 256
    max_registers: int = 0
    cuda_pairs: str = "auto"

    def __post_init__(self) -> None:
        if self.impl not in ("triton", "cuda", "auto"):
            raise ValueError(f"impl: {self.impl!r} must be 'triton', 'cuda' or 'auto'")
        if self.block_n and (self.block_n < 16 or self.block_n & (self.block_n - 1)):
            raise ValueError(f"block_n: {self.block_n} must be 0 (auto) or a power of two >= 16")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps: {self.num_warps} must be 1, 2, 4, 8 or 16")
        if self.num_stages < 1:
            raise ValueError(f"num_stages: {self.num_stages} must be >= 1")
        if self.min_tokens_per_split < 1 or self.max_splits < 1:
            raise ValueError("min_tokens_per_split and max_splits must be >= 1")
        if self.max_registers and not 24 <= self.max_registers <= 255:
            raise ValueError(f"max_registers: {self.max_registers} must be 0 (the compiler's choice) or in [24, 255]")
        if self.cuda_pairs not in ("auto", "always", "never"):
            raise ValueError(f"cuda_pairs: {self.cuda_pairs!r} must be 'auto', 'always' or 'never'")

    def replace(self, **kw) -> "DecodePlan":
        import dataclasses
        return dataclasses.replace(self, **kw)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints, b > 0: a grid's blocks on the host (``triton.cdiv`` is a
    ConstexprFunction, about 1.6 us a call from Python)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The least power of two >= n (0 for n <= 0, as ``triton.next_power_of_2``), on the host
    without its 1.6 us a call."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=256)
def _resolved(plan: "ExtendPlan", interpreter: bool, cuda_prefix: bool) -> "ExtendPlan":
    rows = 16 if interpreter else (64 if cuda_prefix else 32)
    return dataclasses.replace(plan, block_m=plan.block_m or rows, block_n=plan.block_n or (16 if interpreter else 32))


def interpreting() -> bool:
    """Whether Triton runs in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def decode_plan(device: str = "cuda") -> DecodePlan:
    """The default plan for ``device`` (cached): on a GPU the CUDA tensor-core kernel where it
    serves the call (``auto``) with 1024-token splits (measured on the H200 against 256 and
    512, BENCHMARKS.md 4h); the interpreter gets 16-token tiles and one warp (its cost is per
    program and op, not per element)."""
    if interpreting() or device == "cpu":
        return DecodePlan(block_n=16, num_warps=1, num_stages=1)
    props = torch.cuda.get_device_properties(torch.device(device))
    # enough programs to fill the GPU with (sequence, KV head, split) work without
    # depending on the batch: smaller splits on GPUs with more multiprocessors
    per_split = 1024 if props.multi_processor_count >= 100 else 2048
    return DecodePlan(impl="auto", min_tokens_per_split=per_split)


def tile_tokens(plan: DecodePlan, *, rows: int) -> int:
    """Tokens per tile of the Triton kernel for ``rows`` (head, group) rows (plan.block_n, or
    the measured rule when it is 0)."""
    if plan.block_n:
        return plan.block_n
    return 64 if rows <= 16 else 32


def plan_splits(max_seq_len: int, plan: DecodePlan | None = None) -> int:
    """Splits of a request of ``max_seq_len`` tokens (its length alone; the grid uses the
    block table's capacity): the smallest power of two S with ceil(N / S) <= the plan's
    tokens per split, capped at ``max_splits``."""
    plan = plan or DecodePlan()
    n = max(int(max_seq_len), 1)
    s = 1 << (cdiv(n, plan.min_tokens_per_split) - 1).bit_length()
    return min(s, plan.max_splits)


SPLIT_MIN_TILES = 8  # the fewest prefix tiles a split of the automatic rule attends (ExtendPlan.split_count)


@dataclass(frozen=True)
class ExtendPlan:
    """Tiles of the tensor-core extend kernel (``witcert.kernels.extend``): block_m rows
    (new token, query head) per program and block_n prefix / new tokens per tile (0: 32 on a
    GPU, the fastest of the variants measured on the H200 with the certificate on,
    BENCHMARKS.md 13, and block_m 64 where the CUDA kernel runs the prefix phase, 13u; 16 in
    the interpreter: ``resolve``), Triton launch settings.

    impl: who runs the prefix phase: ``auto`` (default: the CUDA C++ kernel
    ``witcert/kernels/cuda/extend.cu`` where it serves the call (a CUDA device of compute
    capability 9.0 or newer and nvcc, D 128, 8- or 16-bit dither, groups of 32-128 channels, no
    bypassed channels, at most 8 query heads per KV head), else the Triton kernel), ``cuda`` (the
    same, with one log line when it cannot) or ``triton``. The exact new tokens always run in the
    Triton kernel.
    max_registers: a cap on registers per thread of the CUDA kernel (0: the compiler's choice;
    a cap trades spills for more resident CTAs per SM); cuda_warps: its warps per CTA, 4 or 8
    (16 rows (new token, query head) each: more warps share each staged prefix tile); cuda_tile:
    its prefix tokens per tile, 32 or 64 (64 halves the per-tile work per token but stages two
    tiles of 47 KiB, so one CTA an SM). 0 (both defaults): ``prefix_build`` picks 64-token tiles
    at 8 warps where the grid at 4 warps would hold more CTAs than the GPU has SMs (1.01-1.07x
    with the certificate at 512 and 2,048 new tokens on an H100 and the H200), else 32-token
    tiles at 4 warps (short turns, 16-256 new tokens over 32,768: 1.38-1.42x faster so); 64 at 4 warps
    is 1.3x slower (BENCHMARKS.md 13ai). The builds round differently, within the same contract.
    workspace_mib: the most device memory the CUDA kernel's staged prefix tiles may take (MiB,
    default 256: 32,768 prefix tokens x 8 KV heads at b 16 fit in one pass; without a plan the
    extend reads ``WITCERT_EXTEND_WORKSPACE_MIB``, ``witcert.settings``); a longer prefix runs in
    chunks that carry the kernel's state from one to the next, bitwise the same results.
    prefix_chunk: the chunk's prefix tokens (a multiple of 32; 0: the largest the cap allows).
    prefix_splits: the CUDA prefix kernel's prefix split across CTAs (grid z), each split's state
    merged by the Triton kernel (PROOFS 5.4, "prefix splits"): 0 (default) ``split_count``'s
    rule, which splits only a grid too small to fill the GPU (short turns over a long prefix);
    N >= 1 that many (1: none), at most the prefix's tiles."""

    impl: str = "auto"
    block_m: int = 0
    block_n: int = 0
    num_warps: int = 4
    num_stages: int = 2
    max_registers: int = 0
    cuda_warps: int = 0
    cuda_tile: int = 0
    workspace_mib: int = EXTEND_WORKSPACE_MIB
    prefix_chunk: int = 0
    prefix_splits: int = 0

    def __post_init__(self) -> None:
        if self.workspace_mib < 1:
            raise ValueError(f"workspace_mib: {self.workspace_mib} must be >= 1")
        if self.prefix_chunk < 0 or self.prefix_chunk % 32:
            raise ValueError(f"prefix_chunk: {self.prefix_chunk} must be 0 (from workspace_mib) or a multiple of 32")
        if not 0 <= self.prefix_splits <= 65535:
            raise ValueError(f"prefix_splits: {self.prefix_splits} must be 0 (by the grid) or in [1, 65535]")
        if self.cuda_warps not in (0, 4, 8):
            raise ValueError(f"cuda_warps: {self.cuda_warps} must be 0 (by the grid), 4 or 8")
        if self.cuda_tile not in (0, 32, 64):
            raise ValueError(f"cuda_tile: {self.cuda_tile} must be 0 (64 at 8 warps, 32 at 4), 32 or 64")
        for name in ("block_m", "block_n"):
            v = getattr(self, name)
            if v and (v < 16 or v & (v - 1)):
                raise ValueError(f"{name}: {v} must be 0 (auto) or a power of two >= 16")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps: {self.num_warps} must be 1, 2, 4, 8 or 16")
        if self.num_stages < 1:
            raise ValueError(f"num_stages: {self.num_stages} must be >= 1")
        if self.impl not in ("triton", "cuda", "auto"):
            raise ValueError(f"impl: {self.impl!r} must be 'triton', 'cuda' or 'auto'")
        if self.max_registers and not 24 <= self.max_registers <= 255:
            raise ValueError(f"max_registers: {self.max_registers} must be 0 (the compiler's choice) or in [24, 255]")

    def prefix_build(self, *, ctas_at_4_warps: int, sms: int) -> tuple[int, int]:
        """(warps per CTA, prefix tokens per tile) of the CUDA prefix kernel for a call whose grid
        at 4 warps a CTA has ``ctas_at_4_warps`` CTAs, on a GPU of ``sms`` SMs: the plan's
        cuda_warps, or for 0 8 when that grid holds more CTAs than SMs (else 4); its cuda_tile, or
        for 0 64 at 8 warps and 32 at 4."""
        warps = self.cuda_warps or (8 if ctas_at_4_warps > sms else 4)
        return warps, self.cuda_tile or (64 if warps == 8 else 32)

    def split_count(self, *, ctas: int, warps: int, sms: int, tiles: int) -> int:
        """Prefix splits of the CUDA prefix kernel for a grid of ``ctas`` CTAs (blocks of new
        tokens x KV heads) of ``warps`` warps over a prefix of ``tiles`` tiles, on a GPU
        of ``sms`` SMs: the plan's prefix_splits, or for 0 as many as keep the split grid within
        one wave at 8 warps an SM (what both builds hold: two CTAs of 4 warps or one of 8), each
        split at least ``SPLIT_MIN_TILES`` tiles (its prologue, the query rows' split, and its
        share of the merge amortized); at most ``tiles``; then the fewest splits with the same
        tiles per split (none empty)."""
        if self.prefix_splits:
            s = self.prefix_splits
        else:
            s = min((sms * 8 // warps) // max(ctas, 1), tiles // SPLIT_MIN_TILES)
        s = max(1, min(s, tiles))
        return cdiv(tiles, cdiv(tiles, s))

    def resolve(self, *, interpreter: bool, cuda_prefix: bool = False) -> "ExtendPlan":
        """The plan with its automatic tiles filled in. block_m: 16 in the interpreter; on a GPU 64
        where the CUDA kernel runs the prefix phase (``cuda_prefix``: the Triton kernel then runs
        the exact new tokens only, 1.04-1.15x faster at 64 than at 32 on an H100, BENCHMARKS.md
        13u), else 32."""
        return _resolved(self, bool(interpreter), bool(cuda_prefix))  # frozen: one per plan, cached
