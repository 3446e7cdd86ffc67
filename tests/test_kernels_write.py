"""Bitwise contract: the Triton writer (and its Philox) equals the reference writer.

On a CPU-only machine the kernels run in the Triton interpreter (TRITON_INTERPRET=1 is
set here, before triton is imported, only when CUDA is absent) on tiny shapes; on a
GPU the same tests run compiled, with larger shapes.
"""

from __future__ import annotations

import os

import torch

GPU = torch.cuda.is_available()
if not GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from witcert.kernels.philox import (dither_r, dither_words, dither_xi, philox4x32,  # noqa: E402
                                    seed_key, u32)
from witcert.kernels.write import write_kv_  # noqa: E402
from witcert.ref import philox as ref_philox  # noqa: E402
from witcert.ref.pool import LayerKV, write_  # noqa: E402

from cases import DEV, SEED, make_layer, random_kv  # noqa: E402, F401


def assert_pools_equal(a: LayerKV, b: LayerKV) -> None:
    for side in ("k", "v"):
        for name, t in getattr(a, side).items():
            u = getattr(b, side)[name]
            assert torch.equal(t.cpu().view(torch.int8) if t.dtype == torch.int8 else t.cpu(), u.cpu()), \
                f"{side}.{name} differs: {(t.cpu().float() != u.cpu().float()).sum().item()} elements"


@triton.jit
def _philox_kernel(C, K, Out, N: tl.constexpr, ROUNDS: tl.constexpr):
    o = tl.arange(0, N)
    c0 = u32(tl.load(C + o * 4))
    c1 = u32(tl.load(C + o * 4 + 1))
    c2 = u32(tl.load(C + o * 4 + 2))
    c3 = u32(tl.load(C + o * 4 + 3))
    w0, w1, w2, w3 = philox4x32(c0, c1, c2, c3, u32(tl.load(K + o * 2)), u32(tl.load(K + o * 2 + 1)), ROUNDS)
    tl.store(Out + o * 4, w0.to(tl.int64))
    tl.store(Out + o * 4 + 1, w1.to(tl.int64))
    tl.store(Out + o * 4 + 2, w2.to(tl.int64))
    tl.store(Out + o * 4 + 3, w3.to(tl.int64))


@pytest.mark.parametrize("rounds", [10, 7])
def test_philox_kernel_matches_random123_known_answers_and_reference(rounds):
    from test_philox import KAT
    kat = [(c, k, e) for r, c, k, e in KAT if r == rounds]
    ctr = torch.tensor([c for c, _, _ in kat]
                       + torch.randint(0, 2**32, (13, 4), generator=torch.Generator().manual_seed(2)).tolist(),
                       dtype=torch.int64)
    key = torch.tensor([k for _, k, _ in kat]
                       + torch.randint(0, 2**32, (13, 2), generator=torch.Generator().manual_seed(3)).tolist(),
                       dtype=torch.int64)
    out = torch.empty(16, 4, dtype=torch.int64, device=DEV)
    _philox_kernel[(1,)](ctr.to(DEV), key.to(DEV), out, 16, rounds)
    assert out[:3].cpu().tolist() == [list(e) for _, _, e in kat]
    assert torch.equal(out.cpu(), ref_philox.philox4x32(ctr, key, rounds=rounds))


@triton.jit
def _dither_kernel(Slots, Epochs, Out, layer, kvh, side, seed_lo, seed_hi,
                   T: tl.constexpr, D: tl.constexpr, BITS: tl.constexpr, CPC: tl.constexpr,
                   ROUNDS: tl.constexpr = 10):
    NCH: tl.constexpr = D // CPC
    o = tl.arange(0, T)
    k0, k1 = seed_key(seed_lo, seed_hi)
    w0, w1, w2, w3 = dither_words(tl.load(Slots + o).to(tl.int64)[:, None], tl.load(Epochs + o).to(tl.int64)[:, None],
                                  tl.arange(0, NCH)[None, :], (layer << 16) | kvh, side, k0, k1, ROUNDS)
    xi = dither_xi(dither_r(w0, w1, w2, w3, T, NCH, BITS, CPC), BITS)
    tl.store(Out + o[:, None] * D + tl.arange(0, D)[None, :], xi)


@pytest.mark.parametrize("bits,cpc", [(8, 16), (16, 8), (24, 4)])
def test_dither_kernel_equals_reference_bitwise(bits, cpc):
    slots = torch.tensor([0, 5, 2**32 - 1, 77], dtype=torch.int64)
    epochs = torch.tensor([0, 3, 2**32 - 1, 9], dtype=torch.int64)
    out = torch.empty(4, 64, device=DEV)
    _dither_kernel[(1,)](slots.to(DEV), epochs.to(DEV), out, 65535, 7, 1, SEED & 0xFFFFFFFF, SEED >> 32,
                         4, 64, bits, cpc)
    ref = ref_philox.dither(seed=SEED, layer=65535, kv_heads=torch.tensor([7]), side=1, slots=slots,
                            epochs=epochs, head_dim=64, bits=bits)[:, 0]
    assert torch.equal(out.cpu(), ref)


WRITE_CASES = [  # (T, Hkv, D, bits, group, outliers, dtype)
    (5, 2, 64, 16, 32, 0, torch.float16),
    (3, 3, 128, 8, 32, 0, torch.bfloat16),
    (4, 1, 64, 24, 16, 0, torch.float32),
    (3, 2, 64, 16, 32, 2, torch.float16),
]
if GPU:
    WRITE_CASES += [(257, 8, 128, b, 32, m, dt) for b in (8, 16, 24) for m in (0, 4)
                    for dt in (torch.float16, torch.bfloat16)]


# on a GPU every case runs through both kernels: "auto" takes write.cu where it serves the pool
IMPLS = ["auto", "triton"] if GPU else ["auto"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("T,hkv,d,bits,group,outliers,dtype", WRITE_CASES)
def test_write_kernel_stores_bitwise_what_the_reference_stores(T, hkv, d, bits, group, outliers, dtype, impl):
    gen = torch.Generator().manual_seed(T * 31 + d + bits)
    num_slots = 2 * T + 3
    ref = make_layer(hkv=hkv, d=d, num_slots=num_slots, bits=bits, group=group, outliers=outliers, gen=gen)
    ker = make_layer(hkv=hkv, d=d, num_slots=num_slots, bits=bits, group=group, outliers=outliers,
                     gen=torch.Generator().manual_seed(T * 31 + d + bits))
    k, v = random_kv(T, hkv, d, dtype=dtype, gen=gen)
    slots = torch.randperm(num_slots, generator=gen)[:T].to(DEV)  # scattered, unordered
    write_(ref, k, v, slots=slots)
    write_kv_(ker, k, v, slots=slots, impl=impl)
    assert_pools_equal(ker, ref)


def test_write_kernel_accepts_non_contiguous_inputs():
    hkv, d, T = 2, 64, 4
    ref = make_layer(hkv=hkv, d=d, num_slots=8)
    ker = make_layer(hkv=hkv, d=d, num_slots=8)
    k, v = random_kv(T, 2 * hkv, d)
    k, v = k[:, ::2], v.transpose(0, 1).contiguous().transpose(0, 1)[:, 1::2]
    assert not k.is_contiguous()
    slots = torch.tensor([7, 0, 3, 4], device=DEV)
    write_(ref, k, v, slots=slots)
    write_kv_(ker, k, v, slots=slots)
    assert_pools_equal(ker, ref)


def test_write_kernel_flags_nonfinite_and_unrepresentable_rows_like_the_reference():
    hkv, d, T = 2, 64, 4
    ref = make_layer(hkv=hkv, d=d, num_slots=6, outliers=1)
    ker = make_layer(hkv=hkv, d=d, num_slots=6, outliers=1)
    k, v = (x.float() for x in random_kv(T, hkv, d))  # fp16 values: outliers representable
    k[0, 1, 5] = float("nan")
    v[2, 0, 0] = float("inf")
    k[3, 0, :] = 1e30  # scale overflows fp16
    idx = ref.v_outlier_idx[1, 0].item()
    v[1, 1, idx] = 1.0 + 2.0**-20  # bypassed value fp16 cannot hold
    slots = torch.tensor([1, 4, 0, 5], device=DEV)
    write_(ref, k, v, slots=slots)
    write_kv_(ker, k, v, slots=slots)
    assert_pools_equal(ker, ref)
    assert torch.isinf(ker.k["wit"][1, 1]).all() and torch.isinf(ker.v["scales"][0, 0]).all()
    assert torch.isinf(ker.k["scales"][5, 0]).all() and torch.isinf(ker.v["wit"][4, 1]).all()
    assert torch.isfinite(ker.k["wit"][1, 0]).all()


@pytest.mark.skipif(not GPU, reason="the Triton interpreter's own bf16 -> fp32 conversion flushes "
                    "bf16 subnormals to 0 (Triton 3.x), so on a CPU this checks the interpreter, "
                    "not the kernel; it runs compiled on the GPU")
def test_write_kernel_flags_a_bf16_subnormal_in_a_bypassed_channel_like_the_reference():
    """A bypassed channel is stored exactly in fp16 or its row is flagged. A bf16 subnormal
    (down to 2^-133) has no fp16 value: the reference flags the row; the compiled kernel must
    too, not read it as 0 and store 0 unflagged."""
    hkv, d, T = 2, 64, 6
    ref = make_layer(hkv=hkv, d=d, num_slots=8, outliers=2)
    ker = make_layer(hkv=hkv, d=d, num_slots=8, outliers=2)
    k, v = random_kv(T, hkv, d, dtype=torch.bfloat16)
    ik, iv = ref.k_outlier_idx[0, 0].item(), ref.v_outlier_idx[1, 1].item()
    tiny = torch.tensor([2.0**-133, -(2.0**-127), 2.0**-126 * 0.75], dtype=torch.bfloat16)
    assert tiny.float().abs().min() > 0 and (tiny.float().abs() < 2.0**-126).any()
    k[0, 0, ik], k[1, 0, ik], v[2, 1, iv] = tiny[0], tiny[1], tiny[2]
    slots = torch.tensor([3, 0, 7, 1, 5, 2], device=DEV)
    write_(ref, k, v, slots=slots)
    write_kv_(ker, k, v, slots=slots)
    assert_pools_equal(ker, ref)


def test_write_kernel_dither_depends_on_epoch():
    """A reused slot (new epoch) never reuses a dither: codes of the same input change."""
    hkv, d = 2, 64
    ker = make_layer(hkv=hkv, d=d, num_slots=2)
    k, v = random_kv(1, hkv, d)
    write_kv_(ker, k, v, slots=torch.tensor([0], device=DEV))
    first = ker.k["codes"][0].clone()
    ker.epochs[0] += 1
    write_kv_(ker, k, v, slots=torch.tensor([0], device=DEV))
    assert not torch.equal(first, ker.k["codes"][0])
