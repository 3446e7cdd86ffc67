"""Frozen configuration objects shared by the reference, the kernels and the integrations.

Every config validates itself in ``__post_init__`` and raises ``ValueError`` naming the
offending field, so a bad setting fails at construction, never in the middle of a step.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

# Compressors known to the reference (see witcert.ref.compressors).
TOKEN_METHODS = ("dither8", "rtn8", "rtn4", "sr8", "fp8", "fp8_scaled", "fp16")
BLOCK_METHODS = ("dither8_block", "kivi2", "kivi4")
METHODS = TOKEN_METHODS + BLOCK_METHODS

RADII = ("det", "prob", "min")
ALLOCATIONS = ("fixed", "anytime")


def _check(cond: bool, field: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{field}: {msg}")


@dataclass(frozen=True)
class QuantConfig:
    """How K and V are compressed.

    method: one of ``METHODS``. ``dither8`` (default) is subtractive-dither INT8 with a
        per-(token, group) fp16 scale; the only method with a probabilistic radius.
    group_size: channels per scale group (``G_c``); also the witness band.
    dither_bits: ``b`` in {8, 16, 24}; one Philox call (four 32-bit words) feeds
        16, 8 or 4 channels (b=24 uses the top 24 bits of each word). Default 8: half the
        Philox work of b=16 at the same median certificate within 0.2% (docs/MATH.md §2b).
    block_size: tokens per block for the per-block variants (``dither8_block``, KIVI keys).
    kivi_residual: recent tokens KIVI keeps in fp16.
    outliers: ``m``, RoPE pairs per (layer, kv head) kept exact (2m channels).
    seed: 64-bit Philox key; ``None`` means a fresh secret random seed per pool.
    philox_rounds: rounds of Philox4x32 behind the dither, 10 (Random123's default) or 7
        (Random123 reports 7 rounds pass BigCrush; FlashAttention-2's dropout uses 7).
        Part of the storage format: the writer and every reader use the same value.
    """

    method: str = "dither8"
    group_size: int = 32
    dither_bits: int = 8
    block_size: int = 256
    kivi_residual: int = 32
    outliers: int = 0
    seed: int | None = None
    philox_rounds: int = 10

    def __post_init__(self) -> None:
        _check(self.method in METHODS, "method", f"{self.method!r} not in {METHODS}")
        _check(self.group_size in (8, 16, 32, 64, 128), "group_size",
               f"{self.group_size} must be one of 8, 16, 32, 64, 128")
        _check(self.dither_bits in (8, 16, 24), "dither_bits",
               f"{self.dither_bits} must be 8, 16 or 24")
        _check(self.block_size > 0 and self.block_size % 16 == 0, "block_size",
               f"{self.block_size} must be a positive multiple of 16")
        _check(self.kivi_residual >= 0, "kivi_residual", "must be >= 0")
        _check(0 <= self.outliers <= 64, "outliers", f"{self.outliers} must be in [0, 64]")
        if self.seed is not None:
            _check(0 <= self.seed < 2**64, "seed", "must be a 64-bit unsigned integer")
        _check(self.philox_rounds in (7, 10), "philox_rounds",
               f"{self.philox_rounds} must be 10 (default) or 7")

    @property
    def is_dither(self) -> bool:
        return self.method in ("dither8", "dither8_block")

    @property
    def is_block(self) -> bool:
        return self.method in BLOCK_METHODS

    def replace(self, **kw) -> "QuantConfig":
        return dataclasses.replace(self, **kw)


DEFAULT_TAU = 0.2  # the coverage / gating threshold every default (CLI, report, sweep) uses


@dataclass(frozen=True)
class CertConfig:
    """How the certificate is computed and judged.

    radius: ``det`` (witness, docs/MATH.md §2a, valid for every query), ``prob`` (dither only,
        docs/MATH.md §2b), or ``min`` of both (dither only; falls back to ``det`` otherwise).
    delta: request-level failure probability ``delta_req`` of the probabilistic radius.
    allocation: ``fixed`` (delta_req / (L H T)) or ``anytime`` (6 delta / (pi^2 t^2) / (L H)).
    horizon: ``T`` for the fixed allocation (decode steps the budget covers).
    tau: threshold on ``cert`` for coverage and gating.
    enabled: compute the certificate at all.
    """

    radius: str = "min"
    delta: float = 1e-2
    allocation: str = "fixed"
    horizon: int = 256
    tau: float = DEFAULT_TAU
    enabled: bool = True

    def __post_init__(self) -> None:
        _check(self.radius in RADII, "radius", f"{self.radius!r} not in {RADII}")
        _check(0.0 < self.delta < 1.0, "delta", f"{self.delta} must be in (0, 1)")
        _check(self.allocation in ALLOCATIONS, "allocation",
               f"{self.allocation!r} not in {ALLOCATIONS}")
        _check(self.horizon >= 1, "horizon", "must be >= 1")
        _check(self.tau > 0.0 and math.isfinite(self.tau), "tau", "must be finite and > 0")

    def replace(self, **kw) -> "CertConfig":
        return dataclasses.replace(self, **kw)


@dataclass(frozen=True)
class CacheConfig:
    """Paged pool geometry.

    page_size: tokens per page (``P``), 1 or 16.
    num_pages: pages per layer (capacity = num_pages * page_size tokens).
    exact_backup: keep an exact copy of K/V on the host for repair.
    dither_key: ``slot`` (default: the dither of a token is keyed by its cache slot and the
        slot's epoch, fresh at every reuse) or ``position`` (keyed by the token's position
        in its sequence and the sequence's nonce: identical requests placed anywhere get
        identical dither, so identical answers; docs/MATH.md §6).
    """

    page_size: int = 16
    num_pages: int = 256
    exact_backup: bool = True
    dither_key: str = "slot"

    def __post_init__(self) -> None:
        _check(self.page_size in (1, 16), "page_size", f"{self.page_size} must be 1 or 16")
        _check(self.num_pages >= 1, "num_pages", "must be >= 1")
        _check(self.dither_key in ("slot", "position"), "dither_key",
               f"{self.dither_key!r} must be 'slot' (default) or 'position'")

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size


@dataclass(frozen=True)
class RepairPolicy:
    """What happens when ``cert > tau`` (gating).

    mode: ``off`` (observe only), ``block`` (page in exact blocks by contribution until
        ``cert <= tau``), ``head`` (whole-head fallback to exact).
    block_tokens: tokens per repair block.
    """

    mode: str = "off"
    block_tokens: int = 16

    def __post_init__(self) -> None:
        _check(self.mode in ("off", "block", "head"), "mode",
               f"{self.mode!r} not in ('off', 'block', 'head')")
        _check(self.block_tokens >= 1, "block_tokens", "must be >= 1")


PRESETS = {
    "default": (QuantConfig(), CertConfig()),
    "deterministic": (QuantConfig(), CertConfig(radius="det")),
    "fast8": (QuantConfig(dither_bits=8), CertConfig()),  # the same as default (b = 8); kept by name
    "dither16": (QuantConfig(dither_bits=16), CertConfig()),  # 16 random bits per dither value (the earlier default)
    "bypass8": (QuantConfig(outliers=8), CertConfig()),
}
