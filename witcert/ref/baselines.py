"""Baseline KV compressors behind the one ``Compressor`` interface (docs/DESIGN.md).

None of these has a probabilistic radius: every one stores a deterministic witness
``wit`` fp16 [.., D/G] (docs/MATH.md §2a) computed at write time against the exact input, so
the certificate is sound for all of them; what differs is how large it is.

- ``RTN``      rtn8 / rtn4: symmetric round-to-nearest, fp16 scale per (token, group).
- ``StochasticRounding8`` sr8: unbiased stochastic rounding driven by the Philox dither
  stream. The negative control: its error is unbiased but NOT uniform (it is a
  two-point law whose spread depends on x), so it earns no probabilistic radius.
- ``FP8``      fp8 (raw saturating cast) / fp8_scaled (fp16 scale per (token, group)).
- ``KIVI``     kivi2 / kivi4: keys per channel over token blocks, values per token,
  recent tokens exact in fp16 (block granularity: encodes a whole sequence).
- ``FP16``     fp16 passthrough (the uncompressed reference point).

Shared conventions (same as dither8): a token-head whose input has any non-finite
value, or whose stored scale overflows fp16, is *bad*: it stores codes 0, scales +inf
(where the method has scales), witness +inf in every band, and decodes to 0.
Sub-byte codes are packed little-end first: channel ``c`` sits in byte ``c // (8/b)``
at bit ``b * (c % (8/b))`` (4-bit: even channel in the low nibble).
Outlier bypass is a dither8 feature; these methods reject a non-empty ``outlier_idx``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

import torch

from witcert.config import QuantConfig
from witcert.ref.fp import FP16_MIN_NORMAL, fp16_round_up
from witcert.ref.philox import dither
from witcert.ref.types import K_SIDE, V_SIDE, EncodeCtx
from witcert.ref.witness import group_witness

FP8_MAX = 448.0  # largest finite float8_e4m3fn
_INF = float("inf")

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]


# ----------------------------------------------------------------------------- helpers

def _prepare(x: torch.Tensor, ctx: EncodeCtx, *, group_size: int, name: str,
             bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate ``x`` [T, H, D]; return (x fp32 with bad rows zeroed, bad bool [T, H])."""
    if x.dim() != 3 or not x.is_floating_point():
        raise ValueError(f"{name}: x must be a float [T, H, D] tensor, got {x.dtype} {tuple(x.shape)}")
    D = x.shape[-1]
    if D % group_size != 0:
        raise ValueError(f"{name}: group_size {group_size} must divide head_dim {D}")
    if D % (8 // bits) != 0:
        raise ValueError(f"{name}: head_dim {D} must be a multiple of {8 // bits}")
    if ctx.outlier_idx is not None and ctx.outlier_idx.numel() > 0:
        raise ValueError(f"{name}: outlier bypass is only implemented for dither8")
    x32 = x.to(torch.float32)
    bad = ~torch.isfinite(x32).all(dim=-1)
    return torch.where(bad[..., None], torch.zeros((), dtype=x32.dtype, device=x.device), x32), bad


def _bands(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """[.., D] -> [.., D/G, G] view for per-group reductions."""
    return x.reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)


def _symmetric_scale(xs: torch.Tensor, bad: torch.Tensor, *, qmax: float,
                     group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp16 scale ``fp16_round_up(amax / qmax)`` floored at 2^-14, [T, H, D/G]; updates bad.

    A scale that overflows fp16 marks the token-head bad; bad rows get scale +inf.
    """
    amax = _bands(xs, group_size).abs().amax(dim=-1)
    # divide by a tensor: on CUDA ``t / python_float`` multiplies by a reciprocal (not IEEE)
    s = fp16_round_up(amax / torch.full_like(amax, qmax)).clamp(min=FP16_MIN_NORMAL)
    bad = bad | torch.isinf(s).any(dim=-1)
    return torch.where(bad[..., None], torch.full_like(s, _INF), s), bad


def _per_channel(s: torch.Tensor, group_size: int) -> torch.Tensor:
    """[.., D/G] group values -> fp32 [.., D] (each repeated over its G channels)."""
    return s.to(torch.float32).repeat_interleave(group_size, dim=-1)


def _zero_rows(xhat: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return torch.where(rows[..., None], torch.zeros((), dtype=xhat.dtype, device=xhat.device), xhat)


def _dequant_sym(v: torch.Tensor, s: torch.Tensor, group_size: int) -> torch.Tensor:
    """``v * float(s)`` per channel, f32 [T, H, D]; a row with any infinite scale -> 0."""
    bad = torch.isinf(s).any(dim=-1)
    s = torch.where(bad[..., None], torch.zeros((), dtype=s.dtype, device=s.device), s)
    return _zero_rows(v.to(torch.float32) * _per_channel(s, group_size), bad)


def _witness(x: torch.Tensor, xhat: torch.Tensor, bad: torch.Tensor, group_size: int) -> torch.Tensor:
    w = group_witness(x, xhat, group_size=group_size)
    return torch.where(bad[..., None], torch.full_like(w, _INF), w)


def pack_bits(u: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes in [0, 2^bits) [.., D] -> uint8 [.., D * bits / 8] (bits in 2, 4, 8)."""
    per = 8 // bits
    shifts = torch.arange(per, device=u.device, dtype=torch.int32) * bits
    u = u.to(torch.int32).reshape(*u.shape[:-1], u.shape[-1] // per, per)
    return (u << shifts).sum(dim=-1).to(torch.uint8)


def unpack_bits(p: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of ``pack_bits``: uint8 [.., D * bits / 8] -> int32 [.., D]."""
    per = 8 // bits
    shifts = torch.arange(per, device=p.device, dtype=torch.int32) * bits
    u = (p.to(torch.int32)[..., None] >> shifts) & ((1 << bits) - 1)
    return u.flatten(-2)


def packed_bytes(packed: dict[str, torch.Tensor]) -> int:
    """Bytes actually stored by an ``encode`` result (sum over its tensors)."""
    return sum(t.numel() * t.element_size() for t in packed.values())


def _spec_bytes(spec: Spec) -> int:
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in spec.values())


# ----------------------------------------------------------------------------- RTN, SR8

@dataclass(frozen=True)
class RTN:
    """Symmetric round-to-nearest (``rtn8``, ``rtn4``) per (token, group of G channels).

    ``s = fp16_round_up(amax / qmax)`` (qmax 127 or 7), floored at 2^-14; codes
    ``n = round_half_even(x / float(s))`` with the stored fp16 scale, clamped to
    [-qmax, qmax]; ``xhat = float(n) * float(s)``, so ``|xhat - x| <= s / 2``.
    Stored per (slot, head): rtn8 ``codes int8 [D]``; rtn4 ``codes uint8 [D/2]``
    (offset-8 nibbles ``n + 8``); ``scales fp16 [D/G]``; ``wit fp16 [D/G]``.
    Bytes per token-head: rtn8 ``D + 4 D/G``, rtn4 ``D/2 + 4 D/G`` (D=128, G=32: 144, 80).
    """

    bits: int = 8
    group_size: int = 32
    granularity: ClassVar[str] = "token"
    has_prob_radius: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"bits: {self.bits} must be 4 or 8")
        if self.group_size <= 0:
            raise ValueError(f"group_size: {self.group_size} must be > 0")

    @property
    def name(self) -> str:
        return f"rtn{self.bits}"

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1

    def storage_spec(self, num_kv_heads: int, head_dim: int) -> Spec:
        ng = head_dim // self.group_size
        codes = ((head_dim,), torch.int8) if self.bits == 8 else ((head_dim // 2,), torch.uint8)
        return {"codes": codes, "scales": ((ng,), torch.float16), "wit": ((ng,), torch.float16)}

    def bytes_per_token_head(self, head_dim: int) -> int:
        return _spec_bytes(self.storage_spec(1, head_dim))

    def _round(self, y: torch.Tensor, ctx: EncodeCtx) -> torch.Tensor:
        return torch.round(y)

    def encode(self, x: torch.Tensor, *, ctx: EncodeCtx) -> dict[str, torch.Tensor]:
        """x float [T, H, D] -> {codes, scales fp16 [T, H, D/G], wit fp16 [T, H, D/G]}."""
        G = self.group_size
        xs, bad = _prepare(x, ctx, group_size=G, name=self.name, bits=self.bits)
        s, bad = _symmetric_scale(xs, bad, qmax=float(self.qmax), group_size=G)
        # x / inf = 0 on bad rows, so their codes are 0
        n = self._round(xs / _per_channel(s, G), ctx).clamp(-self.qmax, self.qmax)
        codes = n.to(torch.int8) if self.bits == 8 else pack_bits(n.to(torch.int32) + 8, 4)
        packed = {"codes": codes, "scales": s}
        packed["wit"] = _witness(x, self.decode(packed, ctx=ctx), bad, G)
        return packed

    def decode(self, packed: dict[str, torch.Tensor], *, ctx: EncodeCtx) -> torch.Tensor:
        """-> f32 [T, H, D]; a token-head with an infinite scale decodes to 0."""
        codes = packed["codes"]
        n = codes if self.bits == 8 else unpack_bits(codes, 4) - 8
        return _dequant_sym(n, packed["scales"], self.group_size)


@dataclass(frozen=True)
class StochasticRounding8(RTN):
    """Unbiased stochastic rounding to int8 (``sr8``): the negative control.

    Scale as rtn8 (``amax / 127`` rounded up). With ``u = xi + 1/2 = (r + 1/2) / 2^b``
    from the Philox dither stream of the same (slot, layer, kv_head, side, chunk, epoch)
    counter (``witcert.ref.philox.dither``, b = ``dither_bits``): ``n = floor(x / s + u)``,
    NOT subtracted at read time: ``xhat = n s``. So ``E[xhat] = x`` up to ``2^-(b+1) s``,
    but for fixed x the error is the two-point law ``{(1-f) s, -f s}`` (``f`` the
    fractional part of ``x / s``), ranging over (-s, s) and x-dependent: not the
    uniform, x-independent error that gives dither8 its probabilistic radius.
    Storage is identical to rtn8 (D=128, G=32: 144 B).
    """

    bits: int = 8
    group_size: int = 32
    dither_bits: int = QuantConfig.dither_bits

    def __post_init__(self) -> None:
        if self.bits != 8:
            raise ValueError(f"bits: sr8 is 8-bit, got {self.bits}")
        if self.dither_bits not in (8, 16, 24):
            raise ValueError(f"dither_bits: {self.dither_bits} must be 8, 16 or 24")
        super().__post_init__()

    @property
    def name(self) -> str:
        return "sr8"

    def _round(self, y: torch.Tensor, ctx: EncodeCtx) -> torch.Tensor:
        xi = dither(seed=ctx.seed, layer=ctx.layer, kv_heads=ctx.kv_heads, side=ctx.side,
                    slots=ctx.slots, epochs=ctx.epochs, head_dim=y.shape[-1], bits=self.dither_bits)
        return torch.floor(y + (xi.to(y.device) + 0.5))  # xi + 1/2 is exact in fp32


# ----------------------------------------------------------------------------- FP8, FP16

@dataclass(frozen=True)
class FP8:
    """float8_e4m3fn storage (``fp8`` raw, ``fp8_scaled``), codes kept as uint8 bit patterns.

    Raw: ``code = fp8(clamp(x, -448, 448))``, round-to-nearest-even. The cast SATURATES:
    |x| > 448 is stored as +-448 (done explicitly, not left to the torch cast, which
    turned overflow into NaN in older versions); the witness records the full error.
    Scaled: ``s = fp16_round_up(amax / 448)`` per (token, group), floored at 2^-14;
    ``code = fp8(clamp(x / float(s), -448, 448))``, ``xhat = float(code) * float(s)``.
    Stored: ``codes uint8 [D]``, (scaled only) ``scales fp16 [D/G]``, ``wit fp16 [D/G]``.
    Bytes per token-head: fp8 ``D + 2 D/G``, fp8_scaled ``D + 4 D/G`` (D=128, G=32: 136, 144).
    """

    scaled: bool = False
    group_size: int = 32
    granularity: ClassVar[str] = "token"
    has_prob_radius: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.group_size <= 0:
            raise ValueError(f"group_size: {self.group_size} must be > 0")

    @property
    def name(self) -> str:
        return "fp8_scaled" if self.scaled else "fp8"

    def storage_spec(self, num_kv_heads: int, head_dim: int) -> Spec:
        ng = head_dim // self.group_size
        spec: Spec = {"codes": ((head_dim,), torch.uint8)}
        if self.scaled:
            spec["scales"] = ((ng,), torch.float16)
        spec["wit"] = ((ng,), torch.float16)
        return spec

    def bytes_per_token_head(self, head_dim: int) -> int:
        return _spec_bytes(self.storage_spec(1, head_dim))

    def encode(self, x: torch.Tensor, *, ctx: EncodeCtx) -> dict[str, torch.Tensor]:
        """x float [T, H, D] -> {codes uint8 [T, H, D], (scales fp16 [T, H, D/G]), wit}."""
        G = self.group_size
        xs, bad = _prepare(x, ctx, group_size=G, name=self.name)
        packed: dict[str, torch.Tensor] = {}
        if self.scaled:
            s, bad = _symmetric_scale(xs, bad, qmax=FP8_MAX, group_size=G)
            xs = _zero_rows(xs / _per_channel(s, G), bad)
            packed["scales"] = s
        codes = xs.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
        packed["codes"] = codes
        packed["wit"] = _witness(x, self.decode(packed, ctx=ctx), bad, G)
        return {k: packed[k] for k in self.storage_spec(1, x.shape[-1])}

    def decode(self, packed: dict[str, torch.Tensor], *, ctx: EncodeCtx) -> torch.Tensor:
        """-> f32 [T, H, D]; bad rows have codes 0 (and, scaled, an infinite scale) -> 0."""
        v = packed["codes"].view(torch.float8_e4m3fn).to(torch.float32)
        return _dequant_sym(v, packed["scales"], self.group_size) if self.scaled else v


@dataclass(frozen=True)
class FP16:
    """fp16 passthrough (``fp16``): ``values fp16 [D]`` plus ``wit fp16 [D/G]``.

    The witness is that of the fp16 rounding: 0 for fp16 inputs. An fp32 input that
    overflows fp16 makes its token-head bad (stored 0, witness +inf).
    Bytes per token-head ``2 D + 2 D/G`` (D=128, G=32: 264).
    """

    group_size: int = 32
    name: ClassVar[str] = "fp16"
    granularity: ClassVar[str] = "token"
    has_prob_radius: ClassVar[bool] = False

    def storage_spec(self, num_kv_heads: int, head_dim: int) -> Spec:
        return {"values": ((head_dim,), torch.float16),
                "wit": ((head_dim // self.group_size,), torch.float16)}

    def bytes_per_token_head(self, head_dim: int) -> int:
        return _spec_bytes(self.storage_spec(1, head_dim))

    def encode(self, x: torch.Tensor, *, ctx: EncodeCtx) -> dict[str, torch.Tensor]:
        xs, bad = _prepare(x, ctx, group_size=self.group_size, name=self.name)
        h = xs.to(torch.float16)
        bad = bad | ~torch.isfinite(h).all(dim=-1)
        h = _zero_rows(h, bad)
        return {"values": h, "wit": _witness(x, h.to(torch.float32), bad, self.group_size)}

    def decode(self, packed: dict[str, torch.Tensor], *, ctx: EncodeCtx) -> torch.Tensor:
        return packed["values"].to(torch.float32)


# ----------------------------------------------------------------------------- KIVI

def _asym_params(lo: torch.Tensor, hi: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric (min, scale) in fp16: min rounded DOWN, ``(hi - min) / levels`` rounded UP
    (floored at 2^-14), so every x in [lo, hi] maps into [0, levels] before clamping."""
    mn = -fp16_round_up(-lo)
    span = hi - mn.to(torch.float32)
    s = fp16_round_up(span / torch.full_like(span, levels)).clamp(min=FP16_MIN_NORMAL)
    return mn, s


@dataclass(frozen=True)
class KIVI:
    """KIVI-style asymmetric quantization (``kivi2``, ``kivi4``), block granularity.

    Encodes a whole sequence x [T, H, D] of one side (``ctx.side``):
    - keys (K): per channel over blocks of ``block`` tokens: ``kmin``/``kscale`` fp16
      [T_q / block, H, D]; the quantized prefix ``T_q`` is the largest whole number of
      blocks leaving at least ``residual`` tokens, so the fp16 tail has
      ``residual .. residual + block - 1`` tokens;
    - values (V): per token, per group of G channels: ``vmin``/``vscale`` fp16 [T_q, H, D/G],
      ``T_q = T - residual``;
    - ``codes uint8 [T_q, H, D * bits / 8]`` (packed, unsigned ``n`` in [0, 2^bits - 1]),
      ``exact fp16 [T - T_q, H, D]`` (the recent tokens), ``wit fp16 [T, H, D/G]``
      (0 on the exact tail for fp16 inputs).
    ``min = fp16_round_down(min x)``, ``scale = fp16_round_up((max x - min) / (2^bits - 1))``,
    ``n = round((x - min) / scale)``, ``xhat = n * scale + min`` (fp32, mul then add).
    Bad token-heads are left out of the key block min/max. A token-head whose witness
    is +inf (bad input, or fp16 overflow of a parameter, which poisons its whole block)
    decodes to 0.
    Storage per quantized token-head (``bytes_per_token``), amortising the key block
    parameters: K ``D b/8 + 2 D/G + 4 D/block``, V ``D b/8 + 6 D/G``; each exact-tail
    token costs ``2 D + 2 D/G``. D=128, G=32, block=256: kivi4 K 74, V 88; kivi2 K 42, V 56.
    """

    bits: int = 4
    group_size: int = 32
    residual: int = 32
    block: int = 256
    granularity: ClassVar[str] = "block"
    has_prob_radius: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.bits not in (2, 4):
            raise ValueError(f"bits: {self.bits} must be 2 or 4")
        if self.group_size <= 0:
            raise ValueError(f"group_size: {self.group_size} must be > 0")
        if self.residual < 0:
            raise ValueError(f"residual: {self.residual} must be >= 0")
        if self.block <= 0:
            raise ValueError(f"block: {self.block} must be > 0")

    @property
    def name(self) -> str:
        return f"kivi{self.bits}"

    def storage_spec(self, num_kv_heads: int, head_dim: int) -> Spec:
        """Tail shape per row. Rows are tokens, except ``kmin``/``kscale`` (one row per
        key block) and ``exact`` (one row per fp16 tail token); K stores no ``v*``, V no
        ``k*``. Use ``bytes_per_token`` / ``storage_bytes`` for costs, not this sum."""
        D, ng = head_dim, head_dim // self.group_size
        return {"codes": ((D * self.bits // 8,), torch.uint8),
                "kmin": ((D,), torch.float16), "kscale": ((D,), torch.float16),
                "vmin": ((ng,), torch.float16), "vscale": ((ng,), torch.float16),
                "exact": ((D,), torch.float16), "wit": ((ng,), torch.float16)}

    def num_quantized(self, num_tokens: int, side: int) -> int:
        rest = max(num_tokens - self.residual, 0)
        return rest - rest % self.block if side == K_SIDE else rest

    def bytes_per_token(self, head_dim: int, side: int) -> Fraction:
        """Exact amortised bytes per quantized token-head of one side."""
        D, ng = head_dim, head_dim // self.group_size
        if side == K_SIDE:
            return Fraction(D * self.bits, 8) + 2 * ng + Fraction(4 * D, self.block)
        return Fraction(D * self.bits, 8) + 6 * ng

    def storage_bytes(self, num_tokens: int, head_dim: int, *, side: int) -> int:
        """Exact bytes ``encode`` stores for one head of a ``num_tokens`` sequence."""
        D, ng = head_dim, head_dim // self.group_size
        nq = self.num_quantized(num_tokens, side)
        tail = (num_tokens - nq) * (2 * D + 2 * ng)
        if side == K_SIDE:
            return nq * (D * self.bits // 8 + 2 * ng) + (nq // self.block) * 4 * D + tail
        return nq * (D * self.bits // 8 + 6 * ng) + tail

    def bytes_per_token_head(self, head_dim: int) -> int:
        """Mean of the K and V amortised costs, rounded up (exact-tail tokens excluded)."""
        mean = (self.bytes_per_token(head_dim, K_SIDE) + self.bytes_per_token(head_dim, V_SIDE)) / 2
        return -((-mean.numerator) // mean.denominator)

    def encode(self, x: torch.Tensor, *, ctx: EncodeCtx) -> dict[str, torch.Tensor]:
        """x float [T, H, D] (one side, whole sequence) -> packed dict (see class doc)."""
        G, side = self.group_size, ctx.side
        if side not in (K_SIDE, V_SIDE):
            raise ValueError(f"{self.name}: ctx.side must be K_SIDE or V_SIDE, got {side}")
        xs, bad = _prepare(x, ctx, group_size=G, name=self.name, bits=self.bits)
        T, H, D = xs.shape
        nq, levels = self.num_quantized(T, side), (1 << self.bits) - 1
        xq = xs[:nq]
        if side == K_SIDE:
            xb = xq.reshape(nq // self.block, self.block, H, D)
            ok = ~bad[:nq].reshape(nq // self.block, self.block, H, 1)
            lo = torch.where(ok, xb, _INF).amin(dim=1)
            hi = torch.where(ok, xb, -_INF).amax(dim=1)
            empty = lo > hi  # every token of the block bad
            mn, s = _asym_params(lo.masked_fill(empty, 0.0), hi.masked_fill(empty, 0.0), levels)
            packed = {"kmin": mn, "kscale": s}
        else:
            mn, s = _asym_params(_bands(xq, G).amin(dim=-1), _bands(xq, G).amax(dim=-1), levels)
            packed = {"vmin": mn, "vscale": s}
        mnc, sc = self._expand(packed, side)
        n = torch.nan_to_num(torch.round((xq - mnc) / sc).clamp(0, levels), nan=0.0)
        n = _zero_rows(n, bad[:nq])
        packed["codes"] = pack_bits(n, self.bits)
        packed["exact"] = _zero_rows(xs[nq:].to(torch.float16), bad[nq:])
        xhat = self._dequantize(packed, side)
        packed["wit"] = _witness(x, xhat, bad | ~torch.isfinite(xhat).all(dim=-1), G)
        return packed

    def decode(self, packed: dict[str, torch.Tensor], *, ctx: EncodeCtx) -> torch.Tensor:
        """-> f32 [T, H, D]: dequantized prefix, then the fp16 tail; +inf-witness rows -> 0."""
        xhat = self._dequantize(packed, ctx.side)
        return _zero_rows(xhat, torch.isinf(packed["wit"]).any(dim=-1))

    def _expand(self, packed: dict[str, torch.Tensor], side: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-element fp32 (min, scale) [T_q, H, D]."""
        if side == K_SIDE:
            return (packed["kmin"].to(torch.float32).repeat_interleave(self.block, dim=0),
                    packed["kscale"].to(torch.float32).repeat_interleave(self.block, dim=0))
        return _per_channel(packed["vmin"], self.group_size), _per_channel(packed["vscale"], self.group_size)

    def _dequantize(self, packed: dict[str, torch.Tensor], side: int) -> torch.Tensor:
        mnc, sc = self._expand(packed, side)
        xq = unpack_bits(packed["codes"], self.bits).to(torch.float32) * sc + mnc
        return torch.cat([xq, packed["exact"].to(torch.float32)], dim=0)
