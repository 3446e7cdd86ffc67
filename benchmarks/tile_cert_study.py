"""Could the certificate's per-token terms go per tile? (issue 19; CPU study, priced, not built)

What is left of the extend's certificate cost is its per-(row, token) work (BENCHMARKS.md 13an,
13av): three tensor-core sums for the radius, a root, a minimum and an ``expm1`` per (row, token).
The certificate's sum is ``a = sum_j p_j expm1(u_j)`` with ``u_j = min(d_j, r_j)`` (the minimum
radius: ``d_j`` deterministic, ``r_j`` probabilistic; ``witcert.ref.cert``). Three inequalities
move that work to once per (row, tile of tokens) and make the per-token part a weighted sum like the
output's ``p.v``:

1. ``expm1(u) <= u expm1(U) / U`` for ``0 <= u <= U`` (``expm1(u) / u`` increases): with ``U_t``
   an upper bound of the tile's radii (from per-tile maxima of the tokens' witnesses and scales),
   ``sum_{j in t} p_j expm1(u_j) <= f(U_t) sum_{j in t} p_j u_j``, ``f(U) = expm1(U) / U``.
2. ``sum_j p_j min(d_j, r_j) <= min(sum_j p_j d_j, sum_j p_j r_j)``: the minimum per (row, tile).
3. Cauchy-Schwarz on the probabilistic root, ``sum_j p_j sqrt(s2_j) <= sqrt(sum_j p_j) sqrt(sum_j
   p_j s2_j)``.

The row's group norms factor out of ``d_j`` and ``s2_j``, so the tile needs only ``sum_j p_j w_jg``,
``sum_j p_j s_jg^2`` and ``sum_j p_j s_jg`` per scale group: extra columns of the ``p.v`` product
(12 for D 128, G 32) in place of the per-token radius. Every step is an upper bound, so the result
stays sound; this measures how much looser it is (``B / A``, B the tiled form, A the exact sum) on
real attention: the bundled model (SmolLM2-135M, D 64, groups of 32) over the first ``--tokens``
tokens of CPython's pydoc topics, its keys quantized by the reference (``quantize_dither8``, 8-bit
dither from a seeded generator; keys and queries from the projections, before RoPE: an
approximation), two query rows per head (the last token and the middle one), delta_loc 1e-6. Also
printed: one tile for the whole row (``--tile 0``: the sums accumulated like the output, one
``f(U)``), the weakest form; and a fourth form (``row_prob_per_tile``, BENCHMARKS.md 13ba): the
deterministic radius per token as now, the probabilistic one per tile from the tile's largest
scales (the deterministic radius alone costs about 10%, the minimum 19-25%: 13ay).

    PYTHONPATH=<checkout> python benchmarks/tile_cert_study.py [--tokens 2048] [--tile 64]
"""

from __future__ import annotations

import argparse
import math

import torch

from witcert.ref.cert import FP_BIAS_SLACK, prob_log_factor
from witcert.ref.quant import quantize_dither8

from bundled_qk import bundled_qk  # beside this script

GROUP = 32
BITS = 8


def f_expm1(u: torch.Tensor) -> torch.Tensor:
    """``expm1(u) / u`` (1 at 0), float64."""
    return torch.where(u > 0, torch.expm1(u) / u.clamp_min(1e-300), torch.ones_like(u))


def det_radius(wit, qn2, *, sm):
    """``sm sum_g ||q_g||_2 w_g`` (``witcert.ref.cert.radius_det`` on the row's group norms, which the
    tiled sums need apart): wit [..., NG] -> [...]."""
    return sm * (wit * qn2).sum(-1)


def prob_radius(scales, qn2, qn1, *, sm, lf):
    """``sm sqrt(sum_g (||q_g||_2 s_g)^2 / 12) lf + bias sm sum_g ||q_g||_1 s_g`` (``witcert.ref.cert.
    radius_prob`` on the row's group norms): scales [..., NG] -> [...]."""
    bias_c = (2.0 ** -(BITS + 1) + FP_BIAS_SLACK) * sm
    return sm * torch.sqrt(((qn2 * scales) ** 2).sum(-1) / 12.0) * lf + bias_c * (qn1 * scales).sum(-1)


def row_forms(p, qn2, qn1, wit, scales, *, sm, lf, tile):
    """(A, B1, B2, B): the exact ``sum_j p_j expm1(u_j)``, the tiled bound after step 1 alone, after
    steps 1 and 2, and after all three, for one row.
    p [N] (the softmax); qn2, qn1 [NG] (the row's group l2 / l1 norms); wit, scales [N, NG]."""
    d = det_radius(wit, qn2, sm=sm)
    r = prob_radius(scales, qn2, qn1, sm=sm, lf=lf)
    bias_c = (2.0 ** -(BITS + 1) + FP_BIAS_SLACK) * sm
    u = torch.minimum(d, r)
    a = (p * torch.expm1(u)).sum()
    n = p.shape[0]
    tile = tile or n
    b = b1 = b2 = torch.zeros((), dtype=torch.float64)
    for t0 in range(0, n, tile):
        sl = slice(t0, min(n, t0 + tile))
        pt = p[sl]
        # U_t from the tile's per-group maxima (what a staging pass could record per tile)
        u_t = torch.minimum(det_radius(wit[sl].amax(0), qn2, sm=sm),
                            prob_radius(scales[sl].amax(0), qn2, qn1, sm=sm, lf=lf))
        d_t = sm * ((pt[:, None] * wit[sl]).sum(0) * qn2).sum()
        s2_t = ((pt[:, None] * scales[sl] ** 2).sum(0) * qn2 ** 2).sum()
        r_t = (sm * torch.sqrt(pt.sum() * s2_t / 12.0) * lf
               + bias_c * ((pt[:, None] * scales[sl]).sum(0) * qn1).sum())
        b = b + f_expm1(u_t) * torch.minimum(d_t, r_t)
        b1 = b1 + f_expm1(u_t) * (pt * u[sl]).sum()
        b2 = b2 + f_expm1(u_t) * torch.minimum(d_t, (pt * r[sl]).sum())
    return float(a), float(b1), float(b2), float(b)


def row_prob_per_tile(p, qn2, qn1, wit, scales, *, sm, lf, tile):
    """``sum_j p_j expm1(min(d_j, R_t))`` for one row: the deterministic radius per token, the
    probabilistic one per tile (``R_t``, its formula on the tile's per-group largest scales: at least
    every token's, so the sum stays an upper bound of the exact one). Shapes as ``row_forms``."""
    d = det_radius(wit, qn2, sm=sm)
    n = p.shape[0]
    tile = tile or n
    out = torch.zeros((), dtype=torch.float64)
    for t0 in range(0, n, tile):
        sl = slice(t0, min(n, t0 + tile))
        r_t = prob_radius(scales[sl].amax(0), qn2, qn1, sm=sm, lf=lf)
        out = out + (p[sl] * torch.expm1(torch.minimum(d[sl], r_t))).sum()
    return float(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--tile", type=int, default=64, help="tokens per tile (0: the whole row one tile)")
    args = ap.parse_args()
    cfg, caps = bundled_qk(args.tokens)
    d = cfg.hidden_size // cfg.num_attention_heads
    hq, hkv, ng = cfg.num_attention_heads, cfg.num_key_value_heads, d // GROUP
    sm = 1.0 / math.sqrt(d)
    gen = torch.Generator().manual_seed(0)
    ratios = []
    for i in range(cfg.num_hidden_layers):
        k = caps[f"k{i}"][0].view(-1, hkv, d)
        q = caps[f"q{i}"][0].view(-1, hq, d).to(torch.float64)
        n_all = k.shape[0]
        xi = (torch.randint(0, 2**BITS, k.shape, generator=gen).to(torch.float32) + 0.5) / 2**BITS - 0.5
        packed = quantize_dither8(k, xi, group_size=GROUP)
        wit, scales = packed["wit"].to(torch.float64), packed["scales"].to(torch.float64)
        k64 = k.to(torch.float64)
        for h in range(hq):
            kv = h // (hq // hkv)
            for row in (n_all - 1, n_all // 2):
                n = row + 1
                qr = q[row, h]
                qg = qr.view(ng, GROUP)
                p = torch.softmax(k64[:n, kv] @ qr * sm, 0)
                lf = prob_log_factor(n_tokens=n, delta_loc=1e-6)
                kw = dict(sm=sm, lf=lf, tile=args.tile)
                a, *bs = row_forms(p, qg.norm(dim=-1), qg.abs().sum(-1), wit[:n, kv], scales[:n, kv], **kw)
                bp = row_prob_per_tile(p, qg.norm(dim=-1), qg.abs().sum(-1), wit[:n, kv], scales[:n, kv], **kw)
                ratios.append([b / a for b in bs] + [bp / a])
    r = torch.tensor(ratios, dtype=torch.float64)
    print(f"{r.shape[0]} rows, tiles of {args.tile or 'the whole row'} tokens: tiled / exact certificate sum")
    names = ("step 1 (f(U_t))", "steps 1-2 (+ min per tile)", "steps 1-3 (+ Cauchy-Schwarz)",
             "det per token, prob per tile")
    for c, name in enumerate(names):
        x = r[:, c]
        print("{:30s} median {:.4f}, p90 {:.4f}, p99 {:.4f}, largest {:.4f}, smallest {:.4f}; "
              "above 1.13: {:.1%}".format(name, x.median(), x.quantile(0.9), x.quantile(0.99), x.max(), x.min(),
                                          float((x > 1.13).double().mean())))


if __name__ == "__main__":
    main()
