"""``witcert demo``: a certificate table on synthetic Gaussian keys (no model needed).

For each sequence length and radius it stores Gaussian K/V in a one-layer pool, runs the
certified decode attention with Gaussian queries, and compares the certificate ``A - 1``
with the true total variation between the softmax over exact and over stored keys
(float64). Every certificate must be >= the true TV (docs/MATH.md §1); the table shows by how
much.
"""

from __future__ import annotations

from witcert.commands import options as opt
from witcert.config import DEFAULT_TAU, QuantConfig

DESCRIPTION = """\
A certificate table on synthetic Gaussian keys, values and queries (no model needed): for
each sequence length and radius (det, prob, min; docs/MATH.md §2) it stores the keys in a
one-layer dithered INT8 pool, runs the certified decode attention, and compares the
certificate with the true total variation of the attention (float64). The last column says
whether every certificate was >= the true TV; exit status 1 if one was not.
"""


def add_arguments(parser) -> None:
    parser.add_argument("--tokens", type=opt.int_range(1, 1 << 20), nargs="+",
                        default=[64, 512, 4096], metavar="N",
                        help="sequence lengths to test (default 64 512 4096)")
    parser.add_argument("--q-heads", type=opt.positive_int, default=8, metavar="HQ",
                        help="query heads, a multiple of --kv-heads (default 8)")
    parser.add_argument("--kv-heads", type=opt.positive_int, default=2, metavar="HKV",
                        help="KV heads (default 2)")
    parser.add_argument("--head-dim", type=opt.positive_int, default=64, metavar="D",
                        help="head dim, a multiple of --group-size (default 64)")
    parser.add_argument("--queries", type=opt.positive_int, default=4, metavar="B",
                        help="independent queries (batch rows) per length (default 4)")
    parser.add_argument("--key-std", type=opt.positive_float, default=1.0,
                        help="std of the Gaussian keys (larger = peakier attention; default 1)")
    parser.add_argument("--query-std", type=opt.positive_float, default=1.0,
                        help="std of the Gaussian queries (default 1)")
    parser.add_argument("--dither-bits", type=int, default=QuantConfig.dither_bits, choices=(8, 16, 24),
                        help="bits of randomness per dither value; the codes are 8-bit whatever "
                             f"this is (default {QuantConfig.dither_bits})")
    parser.add_argument("--group-size", type=int, default=32, choices=(8, 16, 32, 64, 128),
                        help="channels per scale group (default 32)")
    parser.add_argument("--tau", type=opt.positive_float, default=DEFAULT_TAU,
                        help="threshold for the coverage column (default 0.2)")
    parser.add_argument("--delta", type=opt.probability, default=1e-2,
                        help="failure probability of the probabilistic radius (default 0.01)")
    parser.add_argument("--seed", type=opt.int_range(0, 2**63 - 1), default=0,
                        help="seed of the data and of the dither (default 0)")


def _table_rows(args):
    import torch

    from witcert.config import CacheConfig, CertConfig
    from witcert.runtime.pool import PagedPool
    from witcert.ref import attention as ref_attention
    from witcert.ref.cert import delta_local, tv_distance
    from witcert.ref.pool import gather, write_
    from witcert.ref.types import K_SIDE

    gen = torch.Generator().manual_seed(args.seed)
    quant = QuantConfig(dither_bits=args.dither_bits, group_size=args.group_size, seed=args.seed)
    D, Hkv, Hq, B = args.head_dim, args.kv_heads, args.q_heads, args.queries
    sm = D ** -0.5
    for n in args.tokens:
        page = 16
        cache = CacheConfig(page_size=page, num_pages=B * -(-n // page), exact_backup=False)
        pool = PagedPool(num_layers=1, num_kv_heads=Hkv, head_dim=D, quant=quant, cache=cache)
        lkv = pool.layers[0]
        seqs = [pool.allocator.new_seq_id() for _ in range(B)]
        k = torch.randn(B, n, Hkv, D, generator=gen) * args.key_std
        v = torch.randn(B, n, Hkv, D, generator=gen)
        q = torch.randn(B, Hq, D, generator=gen) * args.query_std
        slots = pool.allocator.allocate_many(seqs, [n] * B)
        for b in range(B):
            write_(lkv, k[b], v[b], slots=slots[b])
        # true TV per (b, head): exact vs stored keys, float64 softmax
        tv = torch.empty(B, Hq, dtype=torch.float64)
        kvh = torch.arange(Hq) // (Hq // Hkv)
        for b in range(B):
            khat, _ = gather(lkv, K_SIDE, slots[b])
            z = sm * torch.einsum("hd,nhd->hn", q[b].double(), k[b].double()[:, kvh])
            zh = sm * torch.einsum("hd,nhd->hn", q[b].double(), khat.double()[:, kvh])
            tv[b] = tv_distance(torch.softmax(z, -1), torch.softmax(zh, -1))
        table = pool.allocator.block_table(seqs)
        lens = pool.allocator.seq_lens(seqs)
        dl = delta_local(delta=args.delta, num_layers=1, num_q_heads=Hq, allocation="fixed", horizon=1)
        for radius in ("det", "prob", "min"):
            cert_cfg = CertConfig(radius=radius, tau=args.tau, delta=args.delta, horizon=1)
            out = ref_attention.decode_attention(q, lkv, table, lens, page_size=page, sm_scale=sm,
                                                 cert=cert_cfg, delta_loc=dl)
            c = out.cert.double()
            yield {"tokens": n, "radius": radius, "tv_max": float(tv.max()),
                   "cert_mean": float(c.mean()), "cert_max": float(c.max()),
                   "tightness": float((c / tv.clamp_min(1e-300)).median()),
                   "coverage": float((c <= args.tau).double().mean()),
                   "sound": bool((c >= tv).all())}


def main(args) -> int:
    if args.q_heads % args.kv_heads:
        raise opt.UsageError("--q-heads", f"{args.q_heads} is not a multiple of --kv-heads "
                                          f"{args.kv_heads}")
    if args.head_dim % args.group_size:
        raise opt.UsageError("--head-dim", f"{args.head_dim} is not a multiple of --group-size "
                                           f"{args.group_size}")
    from witcert.ref.compressors import get_compressor

    comp = get_compressor(QuantConfig(dither_bits=args.dither_bits, group_size=args.group_size))
    per = comp.bytes_per_token_head(args.head_dim)
    print(f"dither8 (b={args.dither_bits}, G={args.group_size}): {per} B per token, head and side "
          f"vs {2 * args.head_dim} B fp16 ({100 * (1 - per / (2 * args.head_dim)):.1f}% saved); "
          f"Hq={args.q_heads} Hkv={args.kv_heads} D={args.head_dim}, {args.queries} queries per "
          f"length, delta={args.delta:g}, tau={args.tau:g}\n")
    print(f"{'tokens':>7} {'radius':>6} {'true TV max':>12} {'cert mean':>10} {'cert max':>10} "
          f"{'cert/TV (median)':>16} {'coverage':>9} {'TV <= cert':>10}")
    ok = True
    for r in _table_rows(args):
        ok &= r["sound"]
        print(f"{r['tokens']:>7} {r['radius']:>6} {r['tv_max']:>12.3e} {r['cert_mean']:>10.4f} "
              f"{r['cert_max']:>10.4f} {r['tightness']:>16.1f} {100 * r['coverage']:>8.1f}% "
              f"{'yes' if r['sound'] else 'NO':>10}")
    print("\ncert = A - 1, a proven bound on the TV of the attention (docs/MATH.md §1); det = "
          "witness radius, valid for any query (§2a); prob = dither radius, valid except with "
          "probability delta (§2b); min = the smaller of both per token.")
    return 0 if ok else 1
