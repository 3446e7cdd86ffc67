"""Philox4x32-10 counter-based RNG and the dither stream of the KV cache (docs/MATH.md §6).

uint32 values live in ``torch.int64`` tensors. Every intermediate stays below 2^63:
the 32x32 -> 64 multiply uses the multiplier split in two 16-bit limbs, so each
partial product is < 2^48. The reference is bit-exact with Random123's
``philox4x32_10`` and is the oracle the Triton write/decode kernels are tested against.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9  # golden ratio
PHILOX_W1 = 0xBB67AE85  # sqrt(3) - 1
PHILOX_ROUNDS = 10

# dither bits b -> channels fed by one Philox call (4 words of 32 bits)
CHANNELS_PER_CALL = {8: 16, 16: 8, 24: 4}

_FIELD_BITS = {"slot": 32, "layer": 16, "kv_head": 16, "side": 1, "chunk": 31, "epoch": 32}


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of the 64-bit product ``a * m``; a uint32 in int64, m a constant."""
    p_lo = a * (m & 0xFFFF)  # < 2^48
    p_hi = a * (m >> 16)  # < 2^48
    lo = (p_lo + ((p_hi & 0xFFFF) << 16)) & MASK32
    hi = (p_hi + (p_lo >> 16)) >> 16
    return hi, lo


def _rounds(c0, c1, c2, c3, k0, k1, rounds: int):
    """Philox rounds on 1-D uint32 lanes; k0, k1 are Python ints or tensors of the lanes' shape."""
    for i in range(rounds):
        if i > 0:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        hi0, lo0 = _mulhilo(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1.bitwise_xor_(c1).bitwise_xor_(k0), lo1, hi0.bitwise_xor_(c3).bitwise_xor_(k1), lo0
    return c0, c1, c2, c3


# counters per pass: ~10 live int64 lanes of this length stay in cache (measured ~20x
# faster than one pass over a million counters).
_LANE_CHUNK = 1 << 16


def philox4x32(ctr: torch.Tensor, key: torch.Tensor, *, rounds: int = PHILOX_ROUNDS) -> torch.Tensor:
    """Philox4x32 with ``rounds`` rounds (10 is the standard; 7 is ``QuantConfig.philox_rounds=7``)."""
    if ctr.shape[-1] != 4 or key.shape[-1] != 2:
        raise ValueError(f"ctr must be [..., 4] and key [..., 2], got {tuple(ctr.shape)}, {tuple(key.shape)}")
    if ctr.dtype != torch.int64 or key.dtype != torch.int64:
        raise TypeError(f"ctr and key must be int64, got {ctr.dtype}, {key.dtype}")
    shape = torch.broadcast_shapes(ctr.shape[:-1], key.shape[:-1])
    n = 1
    for d in shape:
        n *= d
    lanes = [w.expand(shape).reshape(n) for w in ctr.unbind(-1)]
    if key.numel() == 2:  # one key for every counter: keep it a Python int
        keys = [int(w) for w in key.reshape(2)]
    else:
        keys = [w.expand(shape).reshape(n) for w in key.unbind(-1)]
    out = torch.empty((n, 4), dtype=torch.int64, device=ctr.device)
    for i in range(0, n, _LANE_CHUNK):
        sl = slice(i, i + _LANE_CHUNK)
        k = [kw if isinstance(kw, int) else kw[sl] for kw in keys]
        c = _rounds(*(w[sl] for w in lanes), *k, rounds)
        out[sl] = torch.stack(c, dim=-1)
    return out.reshape(*shape, 4)


def philox4x32_10(ctr: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Random123 ``philox4x32_10``.

    ctr: int64 [..., 4], each entry in [0, 2^32). key: int64 [..., 2], broadcastable
    against ctr. Returns int64 [broadcast(...), 4] with entries in [0, 2^32).
    """
    return philox4x32(ctr, key, rounds=PHILOX_ROUNDS)


def seed_to_key(seed: int) -> tuple[int, int]:
    """Split the 64-bit seed into the two Philox key words ``(low32, high32)``."""
    if not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed: {seed} must be a 64-bit unsigned integer")
    seed = int(seed)
    return seed & MASK32, seed >> 32


def _field(name: str, value, device) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.int64, device=device)
    if t.is_floating_point():
        raise TypeError(f"{name}: must be an integer")
    limit = 2 ** _FIELD_BITS[name]
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= limit):
        raise ValueError(f"{name}: values must lie in [0, {limit}), got range "
                         f"[{int(t.min())}, {int(t.max())}]")
    return t


def dither_counter(*, slot, layer, kv_head, side, chunk, epoch) -> torch.Tensor:
    """Philox counter of one dither call (DESIGN "Integers and Philox").

    Each argument is an int or an integer tensor; they broadcast together. Layout:
    ``c0 = slot``, ``c1 = layer << 16 | kv_head``, ``c2 = side << 31 | chunk``,
    ``c3 = epoch``. Every field is range checked (ValueError naming the field), which
    makes the map from fields to counters injective. Returns int64 [broadcast, 4].
    """
    device = next((v.device for v in (slot, layer, kv_head, side, chunk, epoch)
                   if isinstance(v, torch.Tensor)), torch.device("cpu"))
    f = {name: _field(name, v, device) for name, v in
         (("slot", slot), ("layer", layer), ("kv_head", kv_head), ("side", side),
          ("chunk", chunk), ("epoch", epoch))}
    c0 = f["slot"]
    c1 = (f["layer"] << 16) | f["kv_head"]
    c2 = (f["side"] << 31) | f["chunk"]
    c3 = f["epoch"]
    shape = torch.broadcast_shapes(c0.shape, c1.shape, c2.shape, c3.shape)
    return torch.stack([c.expand(shape) for c in (c0, c1, c2, c3)], dim=-1)


def words_to_dither(words: torch.Tensor, *, head_dim: int, bits: int) -> torch.Tensor:
    """Map Philox words of consecutive chunks to per-channel dither values.

    words: int64 [..., C, 4], chunk ``C`` feeding channels ``[C * cpc, (C + 1) * cpc)``.
    Returns f32 [..., head_dim]: ``xi = float32(2 r + 1 - 2^b) * 2^-(b + 1)``, exact,
    on the b-bit grid and in (-1/2, 1/2).
    """
    if bits not in CHANNELS_PER_CALL:
        raise ValueError(f"bits: {bits} must be one of {tuple(CHANNELS_PER_CALL)}")
    if bits == 24:
        r = words >> 8  # channel j <- word j
    else:
        per_word = 32 // bits
        shifts = torch.arange(per_word, dtype=torch.int64, device=words.device) * bits
        # channel j <- word j // per_word, sub-word j % per_word (little end first)
        r = ((words[..., None] >> shifts) & ((1 << bits) - 1)).flatten(-2)
    r = r.flatten(-2)[..., :head_dim].to(torch.float32)  # r < 2^24: exact
    # r * 2^-b is exact and the exact sum (2r + 1 - 2^b) 2^-(b+1) is an fp32 number, so
    # this equals float32(2r + 1 - 2^b) * 2^-(b+1) bit for bit, with fewer int64 passes
    return r.mul_(2.0**-bits).add_(2.0 ** -(bits + 1) - 0.5)


def dither(*, seed: int, layer: int, kv_heads: torch.Tensor, side: int, slots: torch.Tensor,
           epochs: torch.Tensor, head_dim: int, bits: int, rounds: int = PHILOX_ROUNDS) -> torch.Tensor:
    """Dither of a batch of tokens.

    kv_heads: int64 [H]; slots, epochs: int64 [T]. Returns f32 [T, H, head_dim], one
    Philox call per (token, head, chunk of ``CHANNELS_PER_CALL[bits]`` channels).
    rounds: Philox rounds (10 or 7, ``QuantConfig.philox_rounds``).
    """
    if rounds not in (7, 10):
        raise ValueError(f"rounds: {rounds} must be 10 or 7")
    if bits not in CHANNELS_PER_CALL:
        raise ValueError(f"bits: {bits} must be one of {tuple(CHANNELS_PER_CALL)}")
    if head_dim <= 0:
        raise ValueError(f"head_dim: {head_dim} must be positive")
    kv_heads = torch.as_tensor(kv_heads, dtype=torch.int64)
    slots = torch.as_tensor(slots, dtype=torch.int64, device=kv_heads.device)
    epochs = torch.as_tensor(epochs, dtype=torch.int64, device=kv_heads.device)
    if slots.shape != epochs.shape or slots.dim() != 1 or kv_heads.dim() != 1:
        raise ValueError(f"slots {tuple(slots.shape)} and epochs {tuple(epochs.shape)} must be [T], "
                         f"kv_heads {tuple(kv_heads.shape)} must be [H]")
    cpc = CHANNELS_PER_CALL[bits]
    chunks = torch.arange(-(-head_dim // cpc), dtype=torch.int64, device=kv_heads.device)
    ctr = dither_counter(slot=slots[:, None, None], layer=layer, kv_head=kv_heads[None, :, None],
                         side=side, chunk=chunks[None, None, :], epoch=epochs[:, None, None])
    k0, k1 = seed_to_key(seed)
    key = torch.tensor([k0, k1], dtype=torch.int64, device=kv_heads.device)
    return words_to_dither(philox4x32(ctr, key, rounds=rounds), head_dim=head_dim, bits=bits)
