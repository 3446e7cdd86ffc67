"""Bitwise contract of the CUDA write kernel (witcert/kernels/cuda/write.cu): every stored byte
(codes, scales, witnesses) equals the reference writer's, over the configurations it serves
(groups of 32 / 64 / 128, 8- and 16-bit dither, 10 and 7 Philox rounds, fp32 / fp16 / bf16
inputs, slot- and position-keyed dither) and the inputs that decide a code or a flag at an edge:
non-finite entries, scales that overflow fp16, all-zero rows, subnormals, a group whose scale
is exactly amax / 126.5, strided (aligned) inputs and row counts that do not fill the last CTA. Also: the
calls it does not serve go to the Triton kernel under ``impl="auto"`` and raise a one-line
ValueError under ``impl="cuda"``. Needs a CUDA GPU and nvcc; skipped otherwise (its build is
checked without a GPU in tests/test_cuda_build.py)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from witcert.kernels import cuda as wc_cuda  # noqa: E402

pytestmark = pytest.mark.skipif(not wc_cuda.available(), reason=f"CUDA write kernel: {wc_cuda.reason()}")

from witcert.kernels.write import cuda_write_reason, write_kv_  # noqa: E402
from witcert.ref.pool import write_  # noqa: E402

from cases import make_layer, random_kv, random_positions  # noqa: E402
from test_kernels_write import assert_pools_equal  # noqa: E402


def _edge_kv(T: int, hkv: int, *, dtype, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """K / V [T, hkv, 128] with the edges of the contract in some rows: a NaN, an inf, a scale
    that overflows fp16 (|x| ~ 1e30, fp32 only), an all-zero row, a subnormal row, and a row of
    values on its scale's grid."""
    k, v = random_kv(T, hkv, 128, dtype=torch.float32, gen=gen)
    k[0, 0, 3] = float("nan")
    v[1 % T, hkv - 1, 100] = float("inf")
    if dtype == torch.float32:
        k[2 % T, 0, :40] = 1e30
    k[3 % T, :, :] = 0.0
    # a row of subnormals of the dtype (its scale is then the floor 2^-14)
    v[4 % T, 0, :] = {torch.float32: 2.0**-140, torch.bfloat16: 2.0**-130, torch.float16: 2.0**-20}[dtype]
    # row (5, 0): amax 126.5 s exactly in group 0 (s = 1/16, an fp16 value: the quotient amax / 126.5
    # is exact), every value on the grid (k + 1/2) s, so x / s is exact and the code is decided by
    # the dither alone
    s = 1.0 / 16
    edge = (torch.arange(128, dtype=torch.float32) % 253 - 126) * s + s / 2
    edge[0] = 126.5 * s
    k[5 % T, 0, :] = edge.clamp(-126.5 * s, 126.5 * s)
    return k.to(dtype), v.to(dtype)


CASES = [  # (group, bits, rounds, dtype, positions)
    (32, 16, 10, torch.float16, False), (32, 16, 10, torch.bfloat16, True), (32, 16, 10, torch.float32, False),
    (32, 8, 10, torch.bfloat16, False), (32, 8, 7, torch.float16, True), (64, 16, 7, torch.bfloat16, False),
    (64, 8, 10, torch.float32, False), (128, 16, 10, torch.float16, False), (128, 8, 10, torch.bfloat16, True),
]


@pytest.mark.parametrize("group,bits,rounds,dtype,positions", CASES)
@pytest.mark.parametrize("T,hkv", [(1, 1), (7, 3), (301, 8)])
def test_cuda_writer_stores_bitwise_what_the_reference_stores(group, bits, rounds, dtype, positions, T, hkv):
    gen = torch.Generator().manual_seed(T * 7 + group + bits + rounds)
    num_slots = 2 * T + 5
    layers = [make_layer(hkv=hkv, d=128, num_slots=num_slots, bits=bits, group=group, rounds=rounds,
                         gen=torch.Generator().manual_seed(11)) for _ in range(3)]
    if positions:
        pos = random_positions(num_slots, torch.Generator().manual_seed(12)).cuda()
        for lk in layers:
            lk.positions = pos
    ref, cu, tr = layers
    k, v = _edge_kv(T, hkv, dtype=dtype, gen=gen)
    k, v = k.cuda(), v.cuda()
    slots = torch.randperm(num_slots, generator=gen)[:T].cuda()
    assert cuda_write_reason(cu, k, v) is None
    write_(ref, k, v, slots=slots)
    write_kv_(cu, k, v, slots=slots, impl="cuda")
    write_kv_(tr, k, v, slots=slots, impl="triton")
    torch.cuda.synchronize()
    assert_pools_equal(cu, ref)
    assert_pools_equal(tr, ref)


def test_cuda_writer_reads_strided_aligned_inputs_and_a_large_batch():
    """Head-strided views (every other head of a wider tensor, a transposed copy) at 16-byte
    aligned rows, and 20,000 tokens x 8 heads (many CTAs)."""
    gen = torch.Generator().manual_seed(5)
    T, hkv = 20000, 8
    ref = make_layer(hkv=hkv, d=128, num_slots=T + 9, gen=torch.Generator().manual_seed(1))
    cu = make_layer(hkv=hkv, d=128, num_slots=T + 9, gen=torch.Generator().manual_seed(1))
    k, v = random_kv(T, 2 * hkv, 128, dtype=torch.bfloat16, gen=gen)
    k, v = k.cuda()[:, ::2], v.cuda().transpose(0, 1).contiguous().transpose(0, 1)[:, 1::2]
    assert not k.is_contiguous() and not v.is_contiguous()
    slots = torch.randperm(T + 9, generator=gen)[:T].cuda()
    assert cuda_write_reason(cu, k, v) is None
    write_(ref, k, v, slots=slots)
    write_kv_(cu, k, v, slots=slots, impl="cuda")
    torch.cuda.synchronize()
    assert_pools_equal(cu, ref)


def test_calls_the_cuda_writer_does_not_serve_go_to_triton_or_raise():
    gen = torch.Generator().manual_seed(3)
    k, v = random_kv(4, 2, 128, dtype=torch.float16, gen=gen)
    k, v = k.cuda(), v.cuda()
    slots = torch.tensor([0, 3, 5, 1], device="cuda")
    cases = {
        "bypassed channels": (make_layer(hkv=2, d=128, num_slots=8, outliers=2), k, v),
        "24-bit dither": (make_layer(hkv=2, d=128, num_slots=8, bits=24), k, v),
        "unaligned rows": (make_layer(hkv=2, d=128, num_slots=8),
                           torch.zeros(4, 2, 129, dtype=torch.float16, device="cuda")[..., 1:].copy_(k),
                           v),
        "mixed dtypes": (make_layer(hkv=2, d=128, num_slots=8), k, v.float()),
    }
    for name, (lk, kk, vv) in cases.items():
        why = cuda_write_reason(lk, kk, vv)
        assert why is not None, name
        ref = make_layer(hkv=2, d=128, num_slots=8, outliers=lk.quant.outliers, bits=lk.quant.dither_bits)
        write_(ref, kk, vv, slots=slots)
        write_kv_(lk, kk, vv, slots=slots)  # auto: the Triton kernel
        assert_pools_equal(lk, ref)
        with pytest.raises(ValueError, match="CUDA write kernel does not serve"):
            write_kv_(lk, kk, vv, slots=slots, impl="cuda")


def test_the_writers_quotient_is_ieee_division_for_every_fp16_scale():
    """div_fast (write.cu: the reciprocal of the scale formed once per thread, three operations per
    element) against div.rn over every fp16 scale the writer can use ([2^-14, 65504]) with 64
    dividends each in [2^-80, 126.5 s] (log-uniform, random signs, and near the quotient's rounding
    midpoints): bitwise equal; below 2^-80 (zeros, subnormals) it returns 0 where the IEEE quotient
    is below 2^-66, too small to move RN(q + xi) for any dither |xi| >= 2^-17."""
    from witcert.kernels.launch import _arch

    lib = wc_cuda.library(qgp=1, group=32, bits=16, rounds=10, arch=_arch(torch.device("cuda")), kind="write")
    bits = torch.arange(0x0400, 0x7C00, dtype=torch.int32).to(torch.int16)  # fp16 normals >= 2^-14
    s = bits.view(torch.float16).float()
    gen = torch.Generator().manual_seed(9)
    per = 64
    ss = s.repeat_interleave(per)
    mag = torch.exp2(torch.rand(ss.numel(), generator=gen, dtype=torch.float64) * (80 + 6.98) - 80).float()
    x = torch.minimum(mag.double() * ss.double(), 126.5 * ss.double())  # |x| <= 126.5 s
    mid = torch.rand(ss.numel(), generator=gen) < 0.25  # x / s near a midpoint of two floats
    q = (x / ss.double()).float()
    ulp = (torch.nextafter(q, torch.tensor(float("inf"))) - q).double()
    x = torch.where(mid, (q.double() + ulp / 2) * ss.double(), x).float()
    x = torch.where(torch.rand(ss.numel(), generator=gen) < 0.5, -x, x)
    x = torch.where(x.abs() < 2.0**-80, torch.full_like(x, 2.0**-80), x)
    tiny = torch.tensor([0.0, -0.0, 2.0**-149, -(2.0**-130), 2.0**-81, -(2.0**-80) * 0.75])
    x = torch.cat([x, tiny.repeat(64)])
    ss = torch.cat([ss, s[torch.randint(0, s.numel(), (tiny.numel() * 64,), generator=gen)]])
    xd, sd = x.cuda(), ss.cuda()
    out, ieee = torch.empty_like(xd), torch.empty_like(xd)
    rc = lib.wc_div_probe(xd.data_ptr(), sd.data_ptr(), out.data_ptr(), ieee.data_ptr(), xd.numel(),
                          torch.cuda.current_stream().cuda_stream)
    assert rc == 0
    torch.cuda.synchronize()
    out, ieee = out.cpu(), ieee.cpu()
    big = x.abs() >= 2.0**-80
    assert big.sum() > 1_900_000
    assert torch.equal(out[big].view(torch.int32), ieee[big].view(torch.int32)), \
        f"{(out[big] != ieee[big]).sum().item()} quotients differ"
    assert (out[~big] == 0).all() and (ieee[~big].abs() < 2.0**-66).all()
