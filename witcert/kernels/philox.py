"""Philox4x32-10 and the dither stream, as ``@triton.jit`` helpers.

Bitwise twin of ``witcert.ref.philox`` (docs/DESIGN.md, "Integers and Philox"):
counter ``(slot, (layer << 16) | kv_head, (side << 31) | chunk, epoch)``, key
``(seed & 0xFFFFFFFF, seed >> 32)``. All words are ``tl.uint32``; products wrap mod
2^32 and ``tl.umulhi`` gives the high half (both work in the interpreter and on GPU).
"""

from __future__ import annotations

import triton
import triton.language as tl

PHILOX_M0 = tl.constexpr(0xD2511F53)
PHILOX_M1 = tl.constexpr(0xCD9E8D57)
PHILOX_W0 = tl.constexpr(0x9E3779B9)
PHILOX_W1 = tl.constexpr(0xBB67AE85)

# channels fed by one Philox call (four 32-bit words) for b dither bits
CHANNELS_PER_CALL = {8: 16, 16: 8, 24: 4}


@triton.jit
def philox4x32(c0, c1, c2, c3, k0, k1, ROUNDS: tl.constexpr):
    """Random123 Philox4x32 with ROUNDS rounds (10 or 7). All inputs uint32 (tensors or
    scalars, broadcastable)."""
    for _ in tl.static_range(ROUNDS):
        hi0 = tl.umulhi(c0, PHILOX_M0)
        lo0 = c0 * PHILOX_M0
        hi1 = tl.umulhi(c2, PHILOX_M1)
        lo1 = c2 * PHILOX_M1
        c0 = hi1 ^ c1 ^ k0
        c1 = lo1
        c2 = hi0 ^ c3 ^ k1
        c3 = lo0
        k0 = k0 + PHILOX_W0
        k1 = k1 + PHILOX_W1
    return c0, c1, c2, c3


@triton.jit
def u32(x):
    """Any integer (int32 scalar from the interpreter, int64 tensor) -> uint32, low 32 bits."""
    return (tl.cast(x, tl.int64) & 0xFFFFFFFF).to(tl.uint32)


@triton.jit
def seed_key(seed_lo, seed_hi):
    """Key words from the two 32-bit halves of the 64-bit seed (passed as int64 scalars)."""
    return u32(seed_lo), u32(seed_hi)


@triton.jit
def dither_words(slot, epoch, chunk, layer_head, side, k0, k1, ROUNDS: tl.constexpr):
    """Philox words for tokens x chunks.

    slot, epoch: int64 [BLOCK_N, 1] (< 2^32); chunk: int32 [1, NCH]; layer_head:
    scalar ``(layer << 16) | kv_head``; side: 0 (K) or 1 (V); ROUNDS: 10 or 7. Returns four
    uint32 [BLOCK_N, NCH].
    """
    zero = tl.zeros_like(slot).to(tl.uint32) + tl.zeros_like(chunk).to(tl.uint32)
    c0 = u32(slot) + zero
    c1 = u32(layer_head) + zero
    c2 = (u32(chunk) | (u32(side) << 31)) + zero
    c3 = u32(epoch) + zero
    return philox4x32(c0, c1, c2, c3, k0, k1, ROUNDS)


@triton.jit
def dither_r(w0, w1, w2, w3, BLOCK_N: tl.constexpr, NCH: tl.constexpr,
             BITS: tl.constexpr, CPC: tl.constexpr):
    """Raw dither integers r (int32 [BLOCK_N, NCH * CPC]) from the words of each chunk.

    Channel ``c = chunk * CPC + j`` takes word ``j // (32 // BITS)`` (b=24: word j, top
    24 bits) and the ``j % (32 // BITS)``-th BITS-bit field of it.
    """
    offs_j = tl.arange(0, CPC)[None, None, :]
    if BITS == 24:
        wsel = offs_j
        shift = offs_j * 0 + 8
    else:
        wsel = offs_j // (32 // BITS)
        shift = (offs_j % (32 // BITS)) * BITS
    w = tl.where(wsel == 0, w0[:, :, None],
                 tl.where(wsel == 1, w1[:, :, None],
                          tl.where(wsel == 2, w2[:, :, None], w3[:, :, None])))
    MASK: tl.constexpr = (1 << BITS) - 1
    r = ((w >> shift.to(tl.uint32)) & MASK).to(tl.int32)
    return tl.reshape(r, (BLOCK_N, NCH * CPC))


@triton.jit
def dither_xi(r, BITS: tl.constexpr):
    """xi = float32(2 r + 1 - 2^b) * 2^-(b+1), exact, in (-1/2, 1/2)."""
    return (2 * r + (1 - (1 << BITS))).to(tl.float32) * (1.0 / (1 << (BITS + 1)))


@triton.jit
def _join4(x0, x1, x2, x3):
    """[..., K] x4 -> [..., K, 4] with x_i at index i of the new minor axis (registers only)."""
    return tl.reshape(tl.join(tl.join(x0, x2), tl.join(x1, x3)),
                      (x0.shape[0], x0.shape[1], 4))


@triton.jit
def dither_r_join(w0, w1, w2, w3, BLOCK_N: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr):
    """Same values as ``dither_r`` (int32 [BLOCK_N, D], channel ``chunk * CPC + j``) built
    with joins, so the fields of one Philox call land in registers of the thread that
    computed it (no broadcast of the words across threads, no recomputation)."""
    if BITS == 24:
        r = _join4(w0 >> 8, w1 >> 8, w2 >> 8, w3 >> 8)
    elif BITS == 16:
        lo = _join4(w0 & 0xFFFF, w1 & 0xFFFF, w2 & 0xFFFF, w3 & 0xFFFF)
        hi = _join4(w0 >> 16, w1 >> 16, w2 >> 16, w3 >> 16)
        r = tl.join(lo, hi)  # [BN, NCH, 4 words, 2 halves]: channel = word * 2 + half
    else:
        b0 = _join4(w0 & 0xFF, w1 & 0xFF, w2 & 0xFF, w3 & 0xFF)
        b1 = _join4((w0 >> 8) & 0xFF, (w1 >> 8) & 0xFF, (w2 >> 8) & 0xFF, (w3 >> 8) & 0xFF)
        b2 = _join4((w0 >> 16) & 0xFF, (w1 >> 16) & 0xFF, (w2 >> 16) & 0xFF, (w3 >> 16) & 0xFF)
        b3 = _join4(w0 >> 24, w1 >> 24, w2 >> 24, w3 >> 24)
        r = tl.join(tl.join(b0, b2), tl.join(b1, b3))  # [BN, NCH, 4, 2, 2]: word * 4 + byte
    return tl.reshape(r, (BLOCK_N, D)).to(tl.int32)
