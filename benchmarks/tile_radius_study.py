"""How much looser would a per-tile radius make the certificate? (issue 14, item 3; CPU study)

Greedy generation on the bundled model (as ``median_cert_check.py``); at every decode call the
native path hands back the logits it used and each (query head, token)'s whole radius ``u_t``.
For each (layer, head, step) this prints, next to the shipped certificate ``sum_t p_t expm1(u_t)``
(in its float64 form, without the tail and the sum inflation), the certificate a per-tile radius
would give, ``sum_T expm1(U_T) sum_{t in T} p_t`` with ``U_T = max_{t in T} u_t`` over aligned tiles
of ``--tile`` tokens. A per-tile radius formed from per-group maxima of the witnesses and scales is
at least ``max_t u_t``, so these ratios are lower bounds on the loosening (the best case of item 3).

    PYTHONPATH=<checkout> python benchmarks/tile_radius_study.py [--tile 16] [--tokens 94] [--radius min]
"""

from __future__ import annotations

import argparse

import torch

from witcert.config import CertConfig, QuantConfig
from witcert.hf.generate import generate
from witcert.hf.model import load_model
from witcert.runtime import dispatch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tile", type=int, nargs="*", default=[16, 64])
    ap.add_argument("--tokens", type=int, default=94)
    ap.add_argument("--radius", default="min")
    args = ap.parse_args()
    torch.set_num_threads(1)
    pairs, tiles = [], {t: [] for t in args.tile}
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
            n = z.shape[-1]
            for t in args.tile:
                pad = (-n) % t
                pp = torch.nn.functional.pad(p, (0, pad)).unflatten(-1, (-1, t))
                um = torch.nn.functional.pad(uu, (0, pad)).unflatten(-1, (-1, t)).amax(-1)
                tiles[t].append((torch.expm1(um) * pp.sum(-1)).sum(-1).flatten())
        if mine:
            kw["terms"] = None
        return out

    dispatch.decode_attention = spy
    model, tok = load_model(None, dtype=torch.float32, device="cpu")
    res = generate(model, tok, ["Explain in two sentences why the sky is blue."], max_new_tokens=args.tokens,
                   quant=QuantConfig(seed=20261201), cert=CertConfig(radius=args.radius))
    c = torch.cat(pairs)
    ok = torch.isfinite(c) & (c > 0)
    print(f"records {c.numel()} (finite {int(ok.sum())}); text {res.texts[0][:50]!r}")
    print(f"per (token, head) radius: median cert {c[ok].median().item():.6f}, mean {c[ok].mean().item():.6f}, "
          f"above 0.2: {(c[ok] > 0.2).double().mean().item():.4f}")
    for t in args.tile:
        ct = torch.cat(tiles[t])[ok]
        r = ct / c[ok]
        print(f"tile {t:3d} (max of the tile's radii): median cert {ct.median().item():.6f}, mean {ct.mean().item():.6f}, "
              f"above 0.2: {(ct > 0.2).double().mean().item():.4f}; ratio to the per-token cert: median "
              f"{r.median().item():.4f}, 90th pct {r.quantile(0.9).item():.4f}, max {r.max().item():.4f}")


if __name__ == "__main__":
    main()
