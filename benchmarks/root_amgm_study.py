"""Could the probabilistic radius's square root go per tile? (issue 19; CPU study, priced, not built)

The CUDA extend's radius costs most of what is left of the certificate's time (BENCHMARKS.md 13an):
per (row, token) three tensor-core sums, a square root (one MUFU op), a minimum. Its probabilistic
part is ``sqrt(s2) + y`` with ``s2 = sum_g R_g^2 s_g^2`` (``R_g`` the row's group norms times its
constants, ``s_g`` the token's group scales). For any ``c > 0``, ``sqrt(s2) <= (s2 / c + c) / 2``
(AM-GM, equal at ``c = sqrt(s2)``): linear in ``s2``, so it would join ``y``'s tensor-core sum (one
sum fewer, no root) with the row's entries divided by ``2 c`` and ``c / 2`` in the row's tail. With
``c`` per (row, tile), the root of the tile's mean ``s2`` (from per-group means of ``s_g^2`` the
staging pass could record), a token pays ``(sqrt(s2) - c)^2 / (2 c sqrt(s2))`` of its root.

This measures that excess on real attention: the bundled model (SmolLM2-135M, D 64, groups of 32)
over the first ``--tokens`` tokens of CPython's pydoc topics, its keys' group scales (absmax / 127.5,
as the writer's) and its queries' group norms (both before RoPE, from the projections: an
approximation), tiles of ``--tile`` tokens, two query rows per head (the last token and the middle
one). Printed: the per-token excess on the root (quantiles) and, per row, the excess weighted by the
row's attention (softmax of q.k / sqrt(D) over its prefix), which bounds what the certificate's
terms would grow by (the root is at most the whole probabilistic radius).

    PYTHONPATH=<checkout> python benchmarks/root_amgm_study.py [--tokens 2048] [--tile 64]
"""

from __future__ import annotations

import argparse
import math

import torch

from bundled_qk import bundled_qk  # beside this script

GROUP = 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--tile", type=int, default=64)
    args = ap.parse_args()
    cfg, caps = bundled_qk(args.tokens)
    d = cfg.hidden_size // cfg.num_attention_heads
    hq, hkv, ng = cfg.num_attention_heads, cfg.num_key_value_heads, d // GROUP
    excess, weighted = [], []
    for i in range(cfg.num_hidden_layers):
        k = caps[f"k{i}"][0].view(-1, hkv, d)
        q = caps[f"q{i}"][0].view(-1, hq, d)
        scales = k.view(-1, hkv, ng, GROUP).abs().amax(-1) / 127.5  # [N, Hkv, NG]
        for h in range(hq):
            kv = h // (hq // hkv)
            for row in (k.shape[0] - 1, k.shape[0] // 2):
                n = (row + 1) // args.tile * args.tile
                if n == 0:
                    continue
                norms = q[row, h].view(ng, GROUP).norm(dim=-1)
                s2 = (norms ** 2 * scales[:n, kv] ** 2).sum(-1).view(-1, args.tile)
                root = s2.sqrt()
                c = s2.mean(-1, keepdim=True).sqrt()
                ex = ((root - c) ** 2 / (2 * c * root)).flatten()
                p = torch.softmax(k[:n, kv] @ q[row, h] / math.sqrt(d), 0)
                excess.append(ex)
                weighted.append(float((p * ex).sum()))
    ex, w = torch.cat(excess), torch.tensor(weighted)
    print(f"{len(weighted)} rows, {ex.numel()} (row, token) pairs, tiles of {args.tile}")
    print("per-token excess on the root: median {:.4f}, p90 {:.4f}, p99 {:.4f}, largest {:.3f}".format(
        ex.median(), ex.quantile(0.9), ex.quantile(0.99), ex.max()))
    print("attention-weighted excess per row: median {:.4f}, p90 {:.4f}, largest {:.3f}".format(
        w.median(), w.quantile(0.9), w.max()))


if __name__ == "__main__":
    main()
