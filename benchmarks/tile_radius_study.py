"""How much looser would a per-tile radius make the certificate? (issue 14, item 3; issue 19; CPU study)

Greedy generation on the bundled model (as ``median_cert_check.py``); at every decode call the
native path hands back the logits it used and each (query head, token)'s whole radius ``u_t``.
For each (layer, head, step) this prints, next to the shipped certificate ``sum_t p_t expm1(u_t)``
(in its float64 form, without the tail and the sum inflation), the certificate a per-tile radius
would give, ``sum_T expm1(U_T) sum_{t in T} p_t`` with ``U_T = max_{t in T} u_t`` over aligned tiles
of ``--tile`` tokens. A per-tile radius formed from per-group maxima of the witnesses and scales is
at least ``max_t u_t``, so these ratios are lower bounds on the loosening (the best case of item 3).

With ``--budget BETA ...`` it prices instead a hybrid a kernel could run (issue 19: the certificate's
terms per (row, token) are 26% of the CUDA extend's time): tiles of ``--tile`` tokens in order, as
the prefix kernel walks them with its running max and sums; a tile takes the per-tile bound
``expm1(U_T) sum_{t in T} p_t`` in place of its per-token terms when the excess so taken, ``E``,
stays within ``BETA`` times the per-token terms summed so far, ``A`` (both rescaled with the running
max), else its per-token terms. ``E <= BETA A`` holds after every tile, so the hybrid certificate is
at most ``1 + BETA`` times the per-token one and never below it (sound by construction); what it
buys is the share of (row, tile) pairs that skip the per-token terms. Printed per BETA: that share
for each row on its own and for the rows of one KV head deciding together (a warp's rows must take
one branch), and the certificate's ratio to the per-token one (median, largest). ``U_T`` is the
best case again (the largest radius of the tile), so the shares are upper bounds. ``--context N``
prompts with the first N tokens of CPython's pydoc topics (no chat template) instead of the
question, so that the rows attend over a long real prefix.

    PYTHONPATH=<checkout> python benchmarks/tile_radius_study.py [--tile 16] [--tokens 94] [--radius min]
    PYTHONPATH=<checkout> python benchmarks/tile_radius_study.py --tile 32 --context 2048 --tokens 8 --budget 0.001 0.01
"""

from __future__ import annotations

import argparse

import torch

from witcert.config import CertConfig, QuantConfig
from witcert.hf.generate import generate
from witcert.hf.model import load_model
from witcert.report.texts import docs_text
from witcert.runtime import dispatch


def tiles_of(x: torch.Tensor, t: int) -> torch.Tensor:
    """[..., N] -> [..., ceil(N / t), t]: aligned tiles of t tokens, the last padded with 0."""
    return torch.nn.functional.pad(x, (0, (-x.shape[-1]) % t)).unflatten(-1, (-1, t))


def budgeted(p_tiles: torch.Tensor, e_tiles: torch.Tensor, b_tiles: torch.Tensor, beta: float,
             group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The hybrid's certificate sum and its fast (row, tile) mask. p_tiles [R, nT] the tiles' weight
    sums, e_tiles [R, nT] their per-token terms sum_t p_t expm1(u_t), b_tiles [R, nT] their per-tile
    bounds expm1(U_T) sum_t p_t, all on one scale (the final max: the kernel's rescalings multiply A,
    E and the tile's terms alike, so the rule's comparisons come out the same); rows in consecutive
    groups of ``group`` decide together. -> (A + E [R], fast [R, nT] bool)."""
    r, nt = p_tiles.shape
    a = torch.zeros(r, dtype=torch.float64)
    e = torch.zeros(r, dtype=torch.float64)
    fast = torch.zeros(r, nt, dtype=torch.bool)
    for j in range(nt):
        ok = (e + b_tiles[:, j] <= beta * a).view(-1, group).all(-1).repeat_interleave(group)
        e = torch.where(ok, e + b_tiles[:, j], e)
        a = torch.where(ok, a, a + e_tiles[:, j])
        fast[:, j] = ok
    return a + e, fast


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tile", type=int, nargs="*", default=[16, 64])
    ap.add_argument("--tokens", type=int, default=94)
    ap.add_argument("--radius", default="min")
    ap.add_argument("--budget", type=float, nargs="*", default=[])
    ap.add_argument("--context", type=int, default=0)
    args = ap.parse_args()
    if args.budget and len(args.tile) != 1:
        ap.error("--budget takes one --tile")
    torch.set_num_threads(1)
    pairs, tiles = [], {t: [] for t in args.tile}
    hybrid = {(b, g): ([], []) for b in args.budget for g in ("row", "kv")}  # -> (certificate ratios, fast masks)
    orig = dispatch.decode_attention

    def spy(*a, **kw):
        terms = kw.get("terms")
        mine = terms is None
        if mine:
            kw["terms"] = terms = {}
        out = orig(*a, **kw)
        if terms.get("backend") == "native" and "radius" in terms:
            z, u = terms["logits"].double(), terms["radius"].double()  # [B, Hq, N], NaN past the end
            live = torch.isfinite(z) & torch.isfinite(u)
            zz = torch.where(live, z, torch.full_like(z, -torch.inf))
            p = torch.softmax(zz, dim=-1)
            uu = torch.where(live, u, torch.zeros_like(u))
            pairs.append((p * torch.expm1(uu)).sum(-1).flatten())
            for t in args.tile:
                um = tiles_of(uu, t).amax(-1)
                tiles[t].append((torch.expm1(um) * tiles_of(p, t).sum(-1)).sum(-1).flatten())
            if args.budget:  # rows [B Hq] x tiles
                t = args.tile[0]
                ps = tiles_of(p, t).sum(-1).flatten(0, 1)
                et = tiles_of(p * torch.expm1(uu), t).flatten(0, 1)
                bt = torch.expm1(tiles_of(uu, t).amax(-1).flatten(0, 1)) * ps
                assert bool((ps.sum(-1) > 0).all())  # every row attends (the groups stay aligned)
                exact = et.sum((-2, -1))
                keep = torch.isfinite(exact) & (exact > 0)
                for b in args.budget:
                    for g, grp in (("row", 1), ("kv", hq_per_kv)):
                        c, f = budgeted(ps, et.sum(-1), bt, b, grp)
                        hybrid[b, g][0].append(c[keep] / exact[keep])
                        hybrid[b, g][1].append(f[ps > 0])
        if mine:
            kw["terms"] = None
        return out

    dispatch.decode_attention = spy
    model, tok = load_model(None, dtype=torch.float32, device="cpu")
    hq_per_kv = model.config.num_attention_heads // model.config.num_key_value_heads
    prompt, chat = "Explain in two sentences why the sky is blue.", True
    if args.context:
        prompt, chat = tok.decode(tok(docs_text())["input_ids"][:args.context]), False
    res = generate(model, tok, [prompt], max_new_tokens=args.tokens, chat=chat,
                   quant=QuantConfig(seed=20261201), cert=CertConfig(radius=args.radius))
    c = torch.cat(pairs)
    ok = torch.isfinite(c) & (c > 0)
    print(f"records {c.numel()} (finite {int(ok.sum())}); text {res.texts[0][:50]!r}")
    print(f"per (token, head) radius: median cert {c[ok].median().item():.6f}, mean {c[ok].mean().item():.6f}, "
          f"above 0.2: {(c[ok] > 0.2).double().mean().item():.4f}")
    if args.budget:
        for (b, g), (ratios, masks) in hybrid.items():
            r = torch.cat(ratios)
            who = "each row alone" if g == "row" else f"the {hq_per_kv} rows of a KV head together"
            print(f"budget {b:g}, tiles of {args.tile[0]}, {who}: (row, tile) pairs on the tile bound "
                  f"{torch.cat(masks).double().mean().item():.4f}; certificate / per-token: median "
                  f"{r.median().item():.6f}, max {r.max().item():.6f}")
        return
    for t in args.tile:
        ct = torch.cat(tiles[t])[ok]
        r = ct / c[ok]
        print(f"tile {t:3d} (max of the tile's radii): median cert {ct.median().item():.6f}, mean {ct.mean().item():.6f}, "
              f"above 0.2: {(ct > 0.2).double().mean().item():.4f}; ratio to the per-token cert: median "
              f"{r.median().item():.4f}, 90th pct {r.quantile(0.9).item():.4f}, max {r.max().item():.4f}")


if __name__ == "__main__":
    main()
