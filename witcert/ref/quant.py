"""Subtractive-dither INT8 (docs/MATH.md §3, DESIGN "Dithered INT8"): token and block granularity.

All arithmetic is fp32 IEEE round-to-nearest, one operation at a time, in the order
DESIGN.md fixes, so the Triton write/decode kernels can match these tensors bit for bit.
Stages are exposed (``dither8_scales`` -> ``dither8_y`` -> ``quantize_dither8`` and
``dequantize_dither8``) so a kernel can be compared stage by stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from witcert.config import QuantConfig
from witcert.ref.fp import FP16_MIN_NORMAL, fp16_round_up
from witcert.ref.philox import CHANNELS_PER_CALL, dither
from witcert.ref.types import EncodeCtx
from witcert.ref.validate import ATTENTION_DTYPES
from witcert.ref.witness import group_witness

AMAX_DIVISOR = 126.5  # |x/s| <= 126.5 and |xi| < 1/2 keep |y| < 127.5: codes never clip


def _check_x(x: torch.Tensor, group_size: int) -> tuple[int, int, int]:
    if x.dim() != 3:
        raise ValueError(f"x must be [T, H, D], got {tuple(x.shape)}")
    if x.dtype not in ATTENTION_DTYPES:
        # fp32 arithmetic on a float64 input would quantize a rounded copy, not x
        raise TypeError(f"x must be fp16, bf16 or fp32, got {x.dtype}")
    T, H, D = x.shape
    if group_size <= 0 or D % group_size != 0:
        raise ValueError(f"group_size {group_size} must divide head_dim {D}")
    return T, H, D


def bypass_mask(outlier_idx: torch.Tensor | None, num_heads: int, head_dim: int,
                device=None) -> torch.Tensor | None:
    """bool [H, D], True on the channels of ``outlier_idx`` (int64 [H, 2m]); None if no outliers."""
    if outlier_idx is None or outlier_idx.shape[-1] == 0:
        return None
    if outlier_idx.shape[0] != num_heads or outlier_idx.dim() != 2:
        raise ValueError(f"outlier_idx must be [H={num_heads}, 2m], got {tuple(outlier_idx.shape)}")
    if int(outlier_idx.min()) < 0 or int(outlier_idx.max()) >= head_dim:
        raise ValueError(f"outlier_idx entries must lie in [0, {head_dim})")
    mask = torch.zeros(num_heads, head_dim, dtype=torch.bool, device=device)
    return mask.scatter_(1, outlier_idx.to(device=device, dtype=torch.int64), True)


def dither8_scales(x: torch.Tensor, *, group_size: int,
                   outlier_idx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1-3: per-(token, head, group) scale and the bad flag.

    x: fp16/bf16/fp32 [T, H, D]. Returns ``(scales fp16 [T, H, D/G], bad bool [T, H])``.
    ``scale = max(fp16_round_up(amax / 126.5), 2^-14)`` with amax over non-bypassed
    channels; a bad token-head (non-finite value anywhere in the row, a scale that
    overflows fp16, or a bypassed value fp16 cannot hold exactly) has every scale ``+inf``.
    """
    T, H, D = _check_x(x, group_size)
    x32 = x.to(torch.float32)
    bad = ~torch.isfinite(x32).all(dim=-1)
    bypass = bypass_mask(outlier_idx, H, D, x.device)
    mag = x32.abs().masked_fill(bad[..., None], 0.0)
    if bypass is not None:
        mag = mag.masked_fill(bypass, 0.0)
        # outl stores bypassed values in fp16; "exact" must be literally true (a bf16 or
        # fp32 value outside fp16 would be silently rounded), else the row is flagged
        kept = x32[:, torch.arange(H, device=x.device)[:, None], outlier_idx.to(x.device)]
        bad |= (kept.to(torch.float16).to(torch.float32) != kept).any(dim=-1)
    amax = mag.view(T, H, D // group_size, group_size).amax(dim=-1)
    s32 = amax / torch.full_like(amax, AMAX_DIVISOR)  # IEEE fp32 division, not a reciprocal
    scales = fp16_round_up(s32).clamp_min(FP16_MIN_NORMAL)
    bad |= torch.isinf(scales).any(dim=-1)
    scales = scales.masked_fill(bad[..., None], float("inf"))
    return scales, bad


def dither8_y(x: torch.Tensor, xi: torch.Tensor, scales: torch.Tensor, *, group_size: int) -> torch.Tensor:
    """Step 4 before rounding: ``y = fl(fl(x / s) + xi)`` in fp32, f32 [T, H, D].

    Rows with infinite scales give meaningless y; ``quantize_dither8`` zeroes their codes.
    """
    s = scales.to(torch.float32).repeat_interleave(group_size, dim=-1)
    q = x.to(torch.float32) / s
    return q + xi.to(torch.float32)


def quantize_dither8(x: torch.Tensor, xi: torch.Tensor, *, group_size: int,
                     outlier_idx: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Encode one batch of token-heads with a given dither (DESIGN steps 1-7).

    x: fp16/bf16/fp32 [T, H, D]; xi: f32 [T, H, D] on the b-bit grid.
    Returns ``codes`` int8 [T, H, D], ``scales`` fp16 [T, H, D/G], ``wit`` fp16
    [T, H, D/G] and, when ``outlier_idx`` (int64 [H, 2m], m > 0) is given, ``outl``
    fp16 [T, H, 2m]. Bad token-heads: codes 0, scales +inf, outl 0, wit +inf.
    """
    T, H, D = _check_x(x, group_size)
    if xi.shape != x.shape:
        raise ValueError(f"xi {tuple(xi.shape)} must match x {tuple(x.shape)}")
    scales, bad = dither8_scales(x, group_size=group_size, outlier_idx=outlier_idx)
    y = dither8_y(x, xi, scales, group_size=group_size)
    codes = torch.round(y)  # round half to even
    drop = bad[..., None]
    bypass = bypass_mask(outlier_idx, H, D, x.device)
    if bypass is not None:
        drop = drop | bypass
    codes = codes.masked_fill(drop, 0.0).to(torch.int8)
    packed = {"codes": codes, "scales": scales}
    if bypass is not None:
        heads = torch.arange(H, device=x.device)[:, None]
        outl = x[:, heads, outlier_idx.to(x.device)].to(torch.float16)
        packed["outl"] = outl.masked_fill(bad[..., None], 0.0)
    xhat = dequantize_dither8(packed, xi, group_size=group_size, outlier_idx=outlier_idx)
    wit = group_witness(x, xhat, group_size=group_size, bypass=bypass)
    packed["wit"] = wit.masked_fill(bad[..., None], float("inf"))
    return packed


def dequantize_dither8(packed: dict[str, torch.Tensor], xi: torch.Tensor, *, group_size: int,
                       outlier_idx: torch.Tensor | None = None) -> torch.Tensor:
    """Step 6: ``xhat = (float(n) - xi) * float(s)`` (sub, then mul), f32 [T, H, D].

    Bypassed channels take ``outl``; a token-head with any infinite scale decodes to 0.
    """
    codes, scales = packed["codes"], packed["scales"]
    T, H, D = codes.shape
    s = scales.to(torch.float32).repeat_interleave(group_size, dim=-1)
    diff = codes.to(torch.float32) - xi.to(torch.float32)
    xhat = diff * s
    bypass = bypass_mask(outlier_idx, H, D, codes.device)
    if bypass is not None:
        xhat = xhat.clone()
        heads = torch.arange(H, device=codes.device)[:, None]
        xhat[:, heads, outlier_idx.to(codes.device)] = packed["outl"].to(torch.float32)
    bad = torch.isinf(scales).any(dim=-1)
    return xhat.masked_fill(bad[..., None], 0.0)


def _ctx_dither(ctx: EncodeCtx, *, head_dim: int, bits: int, rounds: int) -> torch.Tensor:
    return dither(seed=ctx.seed, layer=ctx.layer, kv_heads=ctx.kv_heads, side=ctx.side,
                  slots=ctx.slots, epochs=ctx.epochs, head_dim=head_dim, bits=bits, rounds=rounds)


def _check_dither_fields(c) -> None:
    """The fields both dithered compressors share: ``group_size > 0``, ``bits`` in 8/16/24."""
    if c.group_size <= 0:
        raise ValueError(f"group_size: {c.group_size} must be positive")
    if c.bits not in CHANNELS_PER_CALL:
        raise ValueError(f"bits: {c.bits} must be one of {tuple(CHANNELS_PER_CALL)}")


@dataclass(frozen=True)
class DitherInt8:
    """``dither8``: subtractive-dither INT8, one fp16 scale per (token, head, group).

    group_size: ``G`` channels per scale group and witness band.
    bits: dither bits ``b`` in {8, 16, 24}.
    outliers: ``m`` RoPE pairs per head kept exact (2m channels, from ``ctx.outlier_idx``).
    philox_rounds: Philox rounds of the dither stream (10 or 7).
    """

    group_size: int = 32
    bits: int = QuantConfig.dither_bits
    outliers: int = 0
    philox_rounds: int = 10

    name = "dither8"
    granularity = "token"
    has_prob_radius = True

    def __post_init__(self) -> None:
        _check_dither_fields(self)
        if self.outliers < 0:
            raise ValueError(f"outliers: {self.outliers} must be >= 0")

    @classmethod
    def from_config(cls, quant: QuantConfig) -> "DitherInt8":
        return cls(group_size=quant.group_size, bits=quant.dither_bits, outliers=quant.outliers,
                   philox_rounds=quant.philox_rounds)

    def storage_spec(self, num_kv_heads: int, head_dim: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        bands = head_dim // self.group_size
        spec = {"codes": ((head_dim,), torch.int8), "scales": ((bands,), torch.float16),
                "wit": ((bands,), torch.float16)}
        if self.outliers:
            spec["outl"] = ((2 * self.outliers,), torch.float16)
        return spec

    def bytes_per_token_head(self, head_dim: int) -> int:
        return sum(shape[0] * dtype.itemsize for shape, dtype in self.storage_spec(1, head_dim).values())

    def _outlier_idx(self, ctx: EncodeCtx, num_heads: int) -> torch.Tensor | None:
        idx = ctx.outlier_idx
        if self.outliers == 0:
            if idx is not None and idx.shape[-1] != 0:
                raise ValueError("ctx.outlier_idx given but outliers=0")
            return None
        if idx is None or tuple(idx.shape) != (num_heads, 2 * self.outliers):
            got = None if idx is None else tuple(idx.shape)
            raise ValueError(f"ctx.outlier_idx must be [H={num_heads}, 2m={2 * self.outliers}], got {got}")
        return idx

    def encode(self, x: torch.Tensor, *, ctx: EncodeCtx) -> dict[str, torch.Tensor]:
        """x: fp16/bf16/fp32 [T, H, D] -> storage dict (see ``storage_spec``), each [T, H, ...]."""
        T, H, D = _check_x(x, self.group_size)
        xi = _ctx_dither(ctx, head_dim=D, bits=self.bits, rounds=self.philox_rounds).to(x.device)
        return quantize_dither8(x, xi, group_size=self.group_size,
                                outlier_idx=self._outlier_idx(ctx, H))

    def decode(self, packed: dict[str, torch.Tensor], *, ctx: EncodeCtx) -> torch.Tensor:
        """Storage dict -> f32 [T, H, D], the exact values the kernels reconstruct."""
        T, H, D = packed["codes"].shape
        xi = _ctx_dither(ctx, head_dim=D, bits=self.bits, rounds=self.philox_rounds).to(packed["codes"].device)
        return dequantize_dither8(packed, xi, group_size=self.group_size,
                                  outlier_idx=self._outlier_idx(ctx, H))


@dataclass(frozen=True)
class DitherInt8Block:
    """``dither8_block``: subtractive-dither INT8 with one fp16 scale per (block, head, channel).

    Offline variant (docs/MATH.md §3): a whole sequence ``[T, H, D]`` is encoded at once. Tokens
    are cut into blocks of ``block_size`` along T; each full block has a per-channel
    scale ``max(fp16_round_up(amax_block / 126.5), 2^-14)``; the last incomplete block
    (the active tail, ``T % block_size`` tokens) is kept exact in the input dtype with
    witness 0. The dither is the token variant's (same counters: slot, channel).

    Storage for T tokens and one head: ``T_full * D`` bytes of codes,
    ``2 * D`` bytes of scales per full block (``2 D / block_size`` per token, 1 byte at
    D=128, block 256), ``2 * D / G`` bytes of witness per token, and the tail at the
    input precision (``2 D`` bytes per tail token for fp16/bf16). See ``storage_bytes``.
    No outlier bypass: per-channel scales already isolate outlier channels.
    """

    group_size: int = 32
    bits: int = QuantConfig.dither_bits
    block_size: int = 256
    philox_rounds: int = 10

    name = "dither8_block"
    granularity = "block"
    has_prob_radius = True

    def __post_init__(self) -> None:
        _check_dither_fields(self)
        if self.block_size <= 0:
            raise ValueError(f"block_size: {self.block_size} must be positive")

    @classmethod
    def from_config(cls, quant: QuantConfig) -> "DitherInt8Block":
        if quant.outliers:
            raise ValueError(f"outliers: dither8_block has no outlier bypass (got {quant.outliers})")
        return cls(group_size=quant.group_size, bits=quant.dither_bits, block_size=quant.block_size,
                   philox_rounds=quant.philox_rounds)

    def storage_spec(self, num_kv_heads: int, head_dim: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per-token tensors only (scales live per block, the tail at input precision)."""
        return {"codes": ((head_dim,), torch.int8), "wit": ((head_dim // self.group_size,), torch.float16)}

    def bytes_per_token_head(self, head_dim: int) -> int:
        """Bytes per token-head in full blocks: codes + witness + amortized block scales (rounded up)."""
        return head_dim + 2 * (head_dim // self.group_size) + -(-2 * head_dim // self.block_size)

    def storage_bytes(self, num_tokens: int, head_dim: int, *, tail_itemsize: int = 2) -> int:
        """Exact bytes for one head of a ``num_tokens`` sequence."""
        full = num_tokens - num_tokens % self.block_size
        return (full * head_dim + (full // self.block_size) * 2 * head_dim
                + num_tokens * 2 * (head_dim // self.group_size)
                + (num_tokens - full) * head_dim * tail_itemsize)

    def _ctx(self, x: torch.Tensor, ctx: EncodeCtx | None) -> EncodeCtx:
        return ctx if ctx is not None else EncodeCtx.simple(
            num_tokens=x.shape[0], num_heads=x.shape[1], device=x.device)

    def encode(self, x: torch.Tensor, *, ctx: EncodeCtx | None = None) -> dict[str, torch.Tensor]:
        """x: fp16/bf16/fp32 [T, H, D] -> ``codes`` int8 [Tf, H, D], ``scales`` fp16
        [Tf / block, H, D], ``tail`` x.dtype [T - Tf, H, D], ``wit`` fp16 [T, H, D/G],
        with ``Tf = T - T % block``. ``ctx`` defaults to slots 0..T-1, epoch 0, seed 0.

        A column (block, head, channel) with a non-finite value or an fp16 overflow gets
        scale +inf, codes 0 and decodes to 0; witnesses are always computed from the
        decoded values, and a token-head row with a non-finite value has witness +inf.
        """
        T, H, D = _check_x(x, self.group_size)
        ctx = self._ctx(x, ctx)
        nb = T // self.block_size
        tf = nb * self.block_size
        xi = _ctx_dither(ctx, head_dim=D, bits=self.bits, rounds=self.philox_rounds).to(x.device)[:tf]
        x32 = x[:tf].to(torch.float32)
        amax = x32.abs().view(nb, self.block_size, H, D).amax(dim=1)
        scales = fp16_round_up(amax / torch.full_like(amax, AMAX_DIVISOR)).clamp_min(FP16_MIN_NORMAL)
        s = scales.to(torch.float32).repeat_interleave(self.block_size, dim=0)
        q = x32 / s
        y = q + xi
        codes = torch.round(y).masked_fill(torch.isinf(s), 0.0).to(torch.int8)
        packed = {"codes": codes, "scales": scales, "tail": x[tf:].clone()}
        xhat = self._dequantize(packed, xi)
        packed["wit"] = group_witness(x, xhat, group_size=self.group_size)
        return packed

    def _dequantize(self, packed: dict[str, torch.Tensor], xi: torch.Tensor) -> torch.Tensor:
        codes, scales, tail = packed["codes"], packed["scales"], packed["tail"]
        s = scales.to(torch.float32).repeat_interleave(self.block_size, dim=0)
        diff = codes.to(torch.float32) - xi
        full = (diff * s).masked_fill(torch.isinf(s), 0.0)
        t32 = tail.to(torch.float32)
        t32 = t32.masked_fill(~torch.isfinite(t32).all(dim=-1, keepdim=True), 0.0)
        return torch.cat([full, t32], dim=0)

    def decode(self, packed: dict[str, torch.Tensor], *, ctx: EncodeCtx | None = None) -> torch.Tensor:
        """Storage dict -> f32 [T, H, D]; non-finite tail rows decode to 0 (their witness is +inf)."""
        codes, tail = packed["codes"], packed["tail"]
        T = codes.shape[0] + tail.shape[0]
        H, D = codes.shape[1], codes.shape[2]
        ctx = ctx if ctx is not None else EncodeCtx.simple(num_tokens=T, num_heads=H, device=codes.device)
        xi = _ctx_dither(ctx, head_dim=D, bits=self.bits, rounds=self.philox_rounds).to(codes.device)[:codes.shape[0]]
        return self._dequantize(packed, xi)
