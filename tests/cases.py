"""The shared case generators of the decode / write / extend contract tests and of the
benchmarks that time the same cases (no test functions here, no Triton import).

``make_layer``: an empty dither8 pool layer (random epochs, optional outlier pairs) on the
tests' device (CUDA when present); ``random_kv``: K/V like a model's; ``make_case``: a CPU
pool filled by the reference writer with queries, block tables and the exact K/V;
``random_positions`` / ``outlier_indices``: the position-keyed and bypass variants;
``DECODE_SHAPES``: the decode contract's shape matrix; ``extend_visible``: the extend's
causal visibility; ``compression_radius``: the
reference radius without arithmetic slack (the slack tier of the kernel tests).
"""

from __future__ import annotations

import torch

from witcert.config import QuantConfig
from witcert.ref import attention as ref_attn
from witcert.ref.pool import LayerKV, write_

# The decode contract's shape matrix, shared by the Triton (interpreter), native C and
# backend tests: (seq_lens, Hq, Hkv, D, page). Lengths 1, P-1, P, P+1, 4P+3 and ~300 mixed in
# one batch; GQA 1, 3, 2, 4; D 64 / 128; pages of 1 and 16 tokens. Each test adds its own axes
# (splits, dither bits, radius, dither key); the GPU adds full-size shapes on top.
DECODE_SHAPES = [
    ((1, 15, 16, 17, 67, 300), 9, 3, 64, 16),
    ((300, 1, 67), 4, 1, 128, 16),
    ((1, 2, 67, 17), 4, 4, 64, 1),
    ((17, 300, 16), 8, 2, 128, 1),
]

SEED = 0x9E3779B97F4A7C15  # both key words >= 2^31: exercises the uint32 paths
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make_layer(*, hkv: int, d: int, num_slots: int, bits: int = 16, group: int = 32,
               outliers: int = 0, layer: int = 3, seed: int = SEED, device=DEV,
               gen: torch.Generator | None = None, rounds: int = 10) -> LayerKV:
    """An empty dither8 pool layer with random epochs and (if m > 0) random outlier pairs."""
    gen = gen or torch.Generator().manual_seed(0)
    quant = QuantConfig(method="dither8", group_size=group, dither_bits=bits, outliers=outliers,
                        philox_rounds=rounds)
    epochs = torch.randint(0, 2**32, (num_slots,), generator=gen, dtype=torch.int64).to(device)
    idx = None
    if outliers:
        idx = torch.stack([torch.randperm(d, generator=gen)[:2 * outliers].sort().values
                           for _ in range(hkv)]).to(device)
    return LayerKV.allocate(num_slots=num_slots, num_kv_heads=hkv, head_dim=d, quant=quant,
                            layer=layer, seed=seed, epochs=epochs, device=device,
                            k_outlier_idx=idx, v_outlier_idx=idx)


def random_kv(t: int, hkv: int, d: int, *, dtype=torch.float16, gen=None, device=DEV):
    """K and V like a model's: mostly unit scale, a few large channels, fresh each call."""
    gen = gen or torch.Generator().manual_seed(1)
    k = torch.randn(t, hkv, d, generator=gen) * torch.exp(torch.randn(1, hkv, d, generator=gen))
    v = torch.randn(t, hkv, d, generator=gen)
    return k.to(dtype).to(device), v.to(dtype).to(device)


def random_positions(num_slots: int, gen: torch.Generator) -> torch.Tensor:
    """int64 [num_slots] positions of a position-keyed pool, random in [0, 2^32)."""
    return torch.randint(0, 2**32, (num_slots,), generator=gen, dtype=torch.int64)


def outlier_indices(*, hkv: int, d: int, m: int, seed: int) -> torch.Tensor:
    """Distinct random bypassed channels per KV head: int64 [hkv, 2m]."""
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(d, generator=gen)[:2 * m] for _ in range(hkv)])


def make_case(*, seq_lens, hq, hkv, d, page, bits=16, group=32, layer=5, seed=0,
              dtype=torch.bfloat16, outliers=0, massive=False, key="slot"):
    """A dither8 pool filled by the reference writer (shuffled pages, random epochs).

    key "position": the pool has ``positions`` (random in [0, 2^32), so word 0 of the
    counter is not the slot and its top bit is exercised; docs/MATH.md §6).

    outliers: m RoPE pairs bypassed per head (random distinct channels, different for K and
    V). massive: the first bypassed K channel of every head holds +-60000 (fp16-exact) and
    the first bypassed V channel +-3000, as massive activations do.
    Returns (layer_kv, q f32 [B, Hq, D], block_table int32, seq_lens int32, exact: list of
    (k, v) [n, Hkv, D] per sequence in the written dtype).
    """
    gen = torch.Generator().manual_seed(seed)
    pages_per = [-(-n // page) for n in seq_lens]
    num_pages = sum(pages_per) + 1
    epochs = torch.randint(0, 2**32, (num_pages * page,), generator=gen, dtype=torch.int64)
    positions = random_positions(num_pages * page, gen) if key == "position" else None
    kidx = vidx = None
    if outliers:
        kidx = outlier_indices(hkv=hkv, d=d, m=outliers, seed=seed + 1000)
        vidx = outlier_indices(hkv=hkv, d=d, m=outliers, seed=seed + 2000)
    lkv = LayerKV.allocate(num_slots=num_pages * page, num_kv_heads=hkv, head_dim=d,
                           quant=QuantConfig(dither_bits=bits, group_size=group,
                                             outliers=outliers), layer=layer,
                           seed=SEED, epochs=epochs, k_outlier_idx=kidx, v_outlier_idx=vidx,
                           positions=positions)
    perm = torch.randperm(num_pages, generator=gen)
    bt = torch.zeros(len(seq_lens), max(pages_per), dtype=torch.int32)
    exact, used = [], 0
    for b, n in enumerate(seq_lens):
        bt[b, :pages_per[b]] = perm[used:used + pages_per[b]].to(torch.int32)
        used += pages_per[b]
        k = torch.randn(n, hkv, d, generator=gen) * torch.exp(torch.randn(1, hkv, d, generator=gen))
        v = torch.randn(n, hkv, d, generator=gen)
        if massive:
            heads = torch.arange(hkv)
            sign = torch.where(torch.rand(n, hkv, generator=gen) < 0.5, -1.0, 1.0)
            k[:, heads, kidx[:, 0]] = 60000.0 * sign
            v[:, heads, vidx[:, 0]] = 3000.0 * sign
        k, v = k.to(dtype), v.to(dtype)
        write_(lkv, k, v, slots=ref_attn.token_slots(bt[b], n, page_size=page))
        exact.append((k, v))
    q = torch.randn(len(seq_lens), hq, d, generator=gen) * 2.0
    return lkv, q, bt, torch.tensor(seq_lens, dtype=torch.int32), exact


def vllm_gated_layer(*, blocks: int, page: int, hkv: int, d: int, layer: int, seed: int = 7,
                     copy_dtype=torch.bfloat16):
    """An empty vLLM-layout paged layer (``[blocks, Hkv, page, record]`` int8 view of the
    plugin's records) and its exact copy, sharing zero slot epochs.
    Returns (layer_kv, exact_copy)."""
    from witcert.integrations.vllm.gate import ExactCopy
    from witcert.integrations.vllm.paged import RecordLayout, layer_kv_view

    quant = QuantConfig()
    lay = RecordLayout.build(quant, d)
    kv = torch.zeros(blocks, page, hkv, lay.size, dtype=torch.int8).permute(0, 2, 1, 3)
    epochs = torch.zeros(blocks * page, dtype=torch.int64)
    lkv = layer_kv_view(kv, layout=lay, quant=quant, layer=layer, seed=seed, epochs=epochs,
                        head_dim=d)
    ex = ExactCopy(num_slots=blocks * page, num_kv_heads=hkv, head_dim=d, dtype=copy_dtype,
                   epochs=epochs)
    return lkv, ex


def fake_extend_library(launch=None):
    """extend.cu's library faked for its launcher without a GPU (``witcert.kernels.cuda.library``
    monkeypatched to return it): 32-token tiles, 4-warp CTAs, splits allowed, a workspace of 24,336
    bytes per tile and KV head; ``launch(args_ref, grid_x, grid_y, stream)`` records each launch
    (default: none, returns 0)."""
    import types

    return types.SimpleNamespace(wc_extend_tile_tokens=lambda: 32, wc_extend_carry_floats=lambda: 73,
                                 wc_extend_workspace_bytes=lambda n, h: h * -(-n // 32) * 24336,
                                 wc_extend_cta_threads=lambda: 128, wc_extend_max_splits=lambda: 65535,
                                 wc_extend_launch=launch or (lambda *a: 0))


def extend_visible(n_prefix: int, T: int, causal: bool = True) -> torch.Tensor:
    """bool [T, Np + T]: what new token i sees in an extend: the whole prefix, then the new
    tokens j <= i (causal) or all of them."""
    j = torch.arange(n_prefix + T)
    if not causal:
        return torch.ones(T, n_prefix + T, dtype=torch.bool)
    return j[None, :] - n_prefix <= torch.arange(T)[:, None]


def compression_radius(q, layer, slots, *, sm_scale, cert, delta_loc):
    """u_quant [Hq, N] in float64 of one query q [Hq, D] over the stored tokens at ``slots``,
    from the reference radius formulas (no arithmetic slack)."""
    from witcert.ref.cert import combine_radius, radius_det, radius_prob
    from witcert.ref.pool import gather
    from witcert.ref.types import K_SIDE

    hq, hkv = q.shape[0], layer.num_kv_heads
    kvh = torch.arange(hq, device=q.device) // (hq // hkv)
    _, kp = gather(layer, K_SIDE, slots)
    qf = torch.where(torch.isfinite(q.float()), q.float(), 0).double()
    g = layer.head_dim // kp["wit"].shape[-1]
    byp = layer.bypass_mask(K_SIDE)
    byp = None if byp is None else byp[kvh]
    ud = radius_det(qf, kp["wit"][:, kvh].transpose(0, 1), sm_scale=sm_scale, group_size=g, bypass=byp)
    up = radius_prob(qf, kp["scales"][:, kvh].transpose(0, 1), sm_scale=sm_scale, group_size=g,
                     bits=layer.quant.dither_bits, n_tokens=slots.shape[0], delta_loc=delta_loc, bypass=byp)
    return combine_radius(ud, up, cert.radius)


def gate_rows(count: int, *, seed: int = 1, n_min: int = 1, n_max: int = 700):
    """Rows for the gate's block plan: (trial, stored logits, radii, exact logits) f64 [n],
    n in [n_min, n_max), where a few, many or all blocks are needed, one in ten with an inf
    radius (the report's gate and the runtime's plan are tested on them)."""
    g = torch.Generator().manual_seed(seed)
    for trial in range(count):
        n = int(torch.randint(n_min, n_max, (1,), generator=g))
        zx = 3 * torch.randn(n, generator=g, dtype=torch.float64)
        scale = [0.01, 0.1, 0.5, 2.0][trial % 4]
        zh = zx + scale * torch.randn(n, generator=g, dtype=torch.float64)
        u = scale * 3 * torch.rand(n, generator=g, dtype=torch.float64)
        if trial % 10 == 3:
            u[int(torch.randint(0, n, (1,), generator=g))] = float("inf")
        yield trial, zh, u, zx
