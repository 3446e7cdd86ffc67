"""Section 2: soundness and tightness of the certificate.

Soundness: for every recorded (layer, query head, step), the true TV (float64 softmax of
exact-key logits vs stored-key logits) against the certificate; a violation is
``TV > cert + 1e-12``. The logit errors are also checked against the radius itself
(``|z^_t - z_t| > u_t`` for any token), which is what the lemma assumes.

Tightness: ``cert / TV`` (median, p90), and, to separate the slack of the lemma from the
slack of the radius, ``cert / W`` where ``W`` is the exact worst TV over the radius box
``|z - z^| <= u``. W is computed exactly by vertex enumeration, which is only possible for
N <= 24 tokens (the problem is NP-hard, ``witcert.report.worstcase``): those rows come from a
short-context run (context 8 tokens, then 16 decode steps, N = 9..24). For the long-context
rows only ``worst_tv_lower`` (an attained vertex, a lower bound on W) is computed, so
``cert / worst_tv_lower`` there is an UPPER bound on the lemma's slack, labelled as such.
"""

from __future__ import annotations

import torch

from witcert.report.worstcase import MAX_EXACT_TOKENS, exact_worst_tv, worst_tv_lower
from witcert.report.stats import quantiles

TV_ATOL = 1e-12


def soundness_rows(sources: dict, variants) -> dict:
    """sources: {source name: {label: unit}} (units with tv, certs, exceed)."""
    out = {}
    for v in variants:
        tv = torch.cat([s[v.label]["tv"] for s in sources.values() if v.label in s])
        row = {"checked": int(tv.numel()), "radius": v.reported_radius, "kinds": {}}
        for kind in v.radius_kinds:
            cert = torch.cat([s[v.label]["certs"][kind] for s in sources.values() if v.label in s])
            use = (tv > 0) & torch.isfinite(cert)
            t50, t90 = quantiles(cert[use] / tv[use])
            row["kinds"][kind] = {
                "violations": int((tv > cert + TV_ATOL).sum()),
                "radius_exceed": int(sum(s[v.label]["exceed"][kind] for s in sources.values()
                                         if v.label in s)),
                "tight_median": t50, "tight_p90": t90,
                "cert_median": quantiles(cert)[0], "infinite": int((~torch.isfinite(cert)).sum())}
        row["tv_median"], row["tv_p90"] = quantiles(tv)
        row["tv_max"] = float(tv.max()) if tv.numel() else None
        out[v.label] = row
    return out


def worst_case_rows(rows: list[dict], *, exact: bool) -> dict:
    """rows: kept (zhat, u, z) rows. Exact W (N <= 24) or worst_tv_lower, per row."""
    from witcert.ref.cert import certificate

    res = {"n": 0, "skipped": 0, "cert_over_w": [], "tv_over_w": [], "w_below_tv": 0, "w_above_cert": 0}
    for r in rows:
        zh, u, z = r["zhat"], r["u"], r["z"]
        n = zh.numel()
        if (exact and n > MAX_EXACT_TOKENS) or not bool(torch.isfinite(u).all()) or float(u.max()) > 700:
            res["skipped"] += 1
            continue
        w = float(exact_worst_tv(zh, u) if exact else worst_tv_lower(zh, u))
        cert = float(certificate(zh, u)[1])
        tv = float(0.5 * (torch.softmax(z, -1) - torch.softmax(zh, -1)).abs().sum())
        res["n"] += 1
        if w > 0:
            res["cert_over_w"].append(cert / w)
            res["tv_over_w"].append(tv / w)
        # W is the max over a box that contains the true logits (when the radius holds)
        res["w_below_tv"] += exact and w < tv - 1e-12
        res["w_above_cert"] += w > cert + 1e-12
    for key in ("cert_over_w", "tv_over_w"):
        vals = res.pop(key)
        res[key + "_median"], res[key + "_p90"] = quantiles(vals)
        res[key + "_min"] = min(vals) if vals else None
        res[key] = vals
    res["exact"] = exact
    return res
