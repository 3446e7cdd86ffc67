"""dither8 with a numpy Philox: bitwise the reference, several times fewer host ops.

The reference Philox (``witcert.ref.philox``) carries uint32 in int64 tensors and splits
every 32x32 multiply in 16-bit limbs: ~30 torch ops per round. On a CPU server that
op overhead, paid per layer and per step, dominates the decode. numpy has native uint64,
so a full 32x32->64 product is one multiply: ~8 ops per round. Everything after the
Philox words (word -> xi, quantize, witness, dequantize) is the reference code itself,
so ``FastDither8`` is ``DitherInt8`` with the same bits (tested with ``torch.equal``).
Outlier bypass is not supported here (the vLLM integration rejects it up front).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from witcert.config import QuantConfig
from witcert.ref.philox import (CHANNELS_PER_CALL, MASK32, PHILOX_M0, PHILOX_M1, PHILOX_ROUNDS,
                                PHILOX_W0, PHILOX_W1, seed_to_key)
from witcert.ref.quant import DitherInt8, dequantize_dither8, quantize_dither8
from witcert.ref.types import EncodeCtx

_M = np.uint64(MASK32)
_S32 = np.uint64(32)


def philox4x32_10_np(c0, c1, c2, c3, k0: int, k1: int, rounds: int = PHILOX_ROUNDS) -> np.ndarray:
    """Random123 philox4x32 (``rounds`` rounds: 10, or 7 for ``QuantConfig.philox_rounds=7``)
    on uint64 arrays holding uint32 values (broadcastable). Returns uint64 [broadcast(...), 4]."""
    k0, k1 = np.uint64(k0), np.uint64(k1)
    m0, m1 = np.uint64(PHILOX_M0), np.uint64(PHILOX_M1)
    w0, w1 = np.uint64(PHILOX_W0), np.uint64(PHILOX_W1)
    for i in range(rounds):
        if i:
            k0, k1 = (k0 + w0) & _M, (k1 + w1) & _M
        p0, p1 = c0 * m0, c2 * m1  # < 2^64: exact in uint64
        c0, c1, c2, c3 = (p1 >> _S32) ^ c1 ^ k0, p1 & _M, (p0 >> _S32) ^ c3 ^ k1, p0 & _M
    return np.stack(np.broadcast_arrays(c0, c1, c2, c3), axis=-1)


def dither_np(ctx: EncodeCtx, *, head_dim: int, bits: int, rounds: int = PHILOX_ROUNDS) -> torch.Tensor:
    """Same values as ``witcert.ref.philox.dither`` for ``ctx``: f32 [T, H, head_dim]."""
    cpc = CHANNELS_PER_CALL[bits]
    n_chunks = -(-head_dim // cpc)
    slots = ctx.slots.cpu().numpy().astype(np.uint64)
    epochs = ctx.epochs.cpu().numpy().astype(np.uint64)
    heads = ctx.kv_heads.cpu().numpy().astype(np.uint64)
    if slots.size and (slots.max() >= 2**32 or epochs.max() >= 2**32):
        raise ValueError("slot and epoch must be < 2^32")
    if ctx.layer >= 2**16 or (heads.size and heads.max() >= 2**16):
        raise ValueError("layer and kv_head must be < 2^16")
    c0 = slots[:, None, None]
    c1 = ((np.uint64(ctx.layer) << np.uint64(16)) | heads)[None, :, None]
    c2 = ((np.uint64(ctx.side) << np.uint64(31)) | np.arange(n_chunks, dtype=np.uint64))[None, None, :]
    c3 = epochs[:, None, None]
    k0, k1 = seed_to_key(ctx.seed)
    words = philox4x32_10_np(c0, c1, c2, c3, k0, k1, rounds)
    words = np.broadcast_to(words, (slots.size, heads.size, n_chunks, 4)).astype(np.uint32)
    return torch.from_numpy(words_to_xi_np(words, head_dim=head_dim, bits=bits))


def words_to_xi_np(words: np.ndarray, *, head_dim: int, bits: int) -> np.ndarray:
    """``witcert.ref.philox.words_to_dither`` in numpy (DESIGN "Integers and Philox").

    words: uint32 [..., C, 4]. Channel j of a chunk: b=24 word j, top 24 bits; b=8/16
    word j // (32/b), sub-word j % (32/b), little end first. ``xi = float32(2r + 1 - 2^b)
    * 2^-(b+1)``: the integer is odd and below 2^24 in magnitude, so exact. f32 [..., D].
    """
    if bits == 24:
        r = words >> np.uint32(8)
    else:
        per = 32 // bits
        shifts = np.arange(per, dtype=np.uint32) * np.uint32(bits)
        r = (words[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    per_word = r.shape[-1] if r.ndim > words.ndim else 1
    r = r.reshape(*words.shape[:-2], words.shape[-2] * words.shape[-1] * per_word)
    r = r[..., :head_dim].astype(np.int32)
    return (2 * r + (1 - (1 << bits))).astype(np.float32) * np.float32(2.0 ** -(bits + 1))


@dataclass(frozen=True)
class FastDither8:
    """``dither8`` (no outliers) with the numpy Philox; the ``Compressor`` interface."""

    group_size: int = 32
    bits: int = 16
    philox_rounds: int = PHILOX_ROUNDS

    name = "dither8"
    granularity = "token"
    has_prob_radius = True

    @classmethod
    def from_config(cls, quant: QuantConfig) -> "FastDither8":
        if quant.method != "dither8" or quant.outliers:
            raise ValueError(f"FastDither8 implements dither8 without outliers, got {quant}")
        return cls(group_size=quant.group_size, bits=quant.dither_bits, philox_rounds=quant.philox_rounds)

    def _ref(self) -> DitherInt8:
        return DitherInt8(group_size=self.group_size, bits=self.bits, philox_rounds=self.philox_rounds)

    def storage_spec(self, num_kv_heads: int, head_dim: int):
        return self._ref().storage_spec(num_kv_heads, head_dim)

    def bytes_per_token_head(self, head_dim: int) -> int:
        return self._ref().bytes_per_token_head(head_dim)

    def encode(self, x: torch.Tensor, *, ctx: EncodeCtx) -> dict[str, torch.Tensor]:
        xi = dither_np(ctx, head_dim=x.shape[-1], bits=self.bits, rounds=self.philox_rounds).to(x.device)
        return quantize_dither8(x, xi, group_size=self.group_size)

    def decode(self, packed: dict[str, torch.Tensor], *, ctx: EncodeCtx) -> torch.Tensor:
        codes = packed["codes"]
        xi = dither_np(ctx, head_dim=codes.shape[-1], bits=self.bits, rounds=self.philox_rounds).to(codes.device)
        return dequantize_dither8(packed, xi, group_size=self.group_size)
