"""Section 4: coverage against the outlier budget, and the stochastic-rounding control.

Coverage = fraction of (layer, head, step) with ``cert <= tau``. For witcert at
m = 0, 4, 8, 16 bypassed RoPE pairs, with each radius: ``det`` (witness, valid for every
query), ``prob`` (dither, valid for queries independent of the dither) and ``min`` (the
reported one). SR8 cannot bypass outliers, so its values are the same at every m:

- ``det``: its own witness. Sound, always; SR's error reaches a full step ``s`` where
  RTN's is at most ``s/2``, so this is the price of unbiasedness under a witness.
- ``sr_hoeffding``: a concentration radius SR does earn, from BOUNDEDNESS (its error
  lies in an interval of length ``s``: Hoeffding proxy ``s^2/4``, sqrt(3) times the
  dither's sigma), valid under the same independence assumption as ``prob``.
- ``sr_naive``: the dither's uniform proxy ``s^2/12`` applied to SR. Nothing justifies
  it (SR's error law depends on x and has variance up to ``s^2/4``); its logit-error
  exceedances ``|d_t| > u_t`` are counted to show what an unjustified radius does.
Unbiasedness alone (``E e = 0``) bounds no single realisation: every SR certificate above
comes from a witness or from the bounded range, not from the mean.
"""

from __future__ import annotations


def budget_rows(runs: dict, variants, *, tau: float) -> dict:
    """runs: {domain: {label: unit}}. Returns {domain: {label: {kind: {coverage, exceed}}}}."""
    out = {}
    for dom, per in runs.items():
        rows = {}
        for v in variants:
            if v.label not in per or not (v.is_dither or v.method in ("sr8", "rtn8")):
                continue
            r = per[v.label]
            rows[v.label] = {"outliers": v.outliers, "kinds": {
                k: {"coverage": float((c <= tau).double().mean()), "exceed": int(r["exceed"][k])}
                for k, c in r["certs"].items()}}
        out[dom] = rows
    return out
