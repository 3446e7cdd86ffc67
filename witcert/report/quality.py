"""Real-activation runs (sections 1, 2, 4, 5 read them) and teacher-forced quality (section 5).

Per domain: one exact prefill of ``prefill`` tokens of the domain text, then ``steps``
further tokens of the same text fed (teacher forcing) through every variant and through
the uncompressed ``exact`` baseline. Each (domain, variant) is one cached unit.
"""

from __future__ import annotations

import time

import torch

from witcert.report.engine import EXACT, RunConfig, Variant
from witcert.report.stats import paired_bootstrap


def step_metrics(base: torch.Tensor, other: torch.Tensor) -> dict[str, torch.Tensor]:
    """base, other: logits f32 [T, V]. KL(base || other) f64, top-1 agreement, top-5 overlap."""
    lb, lo = torch.log_softmax(base.double(), -1), torch.log_softmax(other.double(), -1)
    kl = (lb.exp() * (lb - lo)).sum(-1).clamp_min(0.0)
    top1 = (base.argmax(-1) == other.argmax(-1)).double()
    t5b, t5o = base.topk(5, -1).indices, other.topk(5, -1).indices
    top5 = (t5b[:, :, None] == t5o[:, None, :]).any(-1).double().mean(-1)
    return {"kl": kl, "top1": top1, "top5": top5}


def summarize_run(st, variant: Variant) -> dict:
    """Flatten an engine run's records to tensors over (layer, query head, position)."""
    recs = [st.records[i] for i in sorted(st.records)]
    out = {"tv": torch.stack([r.tv for r in recs]).flatten(),
           "err": torch.stack([r.err for r in recs]).flatten(),
           "certs": {k: torch.stack([r.certs[k] for r in recs]).flatten() for k in variant.radius_kinds},
           "exceed": {k: sum(r.exceed[k] for r in recs) for k in variant.radius_kinds},
           "rows": st.rows}
    return out


def real_unit(engine_fn, ids_feed, variant: Variant, *, seed, tau, delta, outlier_idx, base_logits,
              keep_rows: int, capture: dict | None = None) -> dict:
    """One variant's run over the engine's context. capture: a dict that receives
    ``layers``, the run's ``engine.Captured`` per layer (not part of the returned unit)."""
    eng = engine_fn()
    cfg = RunConfig(variant=variant, seed=seed, tau=tau, delta=delta, keep_rows=keep_rows,
                    outlier_idx=outlier_idx, capture=capture is not None)
    t0 = time.perf_counter()
    logits, st = eng.run(cfg, ids_feed)
    seconds = time.perf_counter() - t0
    eng.drop(variant)
    if capture is not None:
        capture["layers"] = [st.captured[i] for i in sorted(st.captured)]
    if variant is EXACT:
        return {"logits": logits, "seconds": seconds}
    res = summarize_run(st, variant)
    res.update(step_metrics(base_logits, logits))
    res["seconds"] = seconds
    return res


def capture_run(engine_fn, ids_feed, variant: Variant, *, seed, tau, delta, outlier_idx) -> list:
    """The ``engine.Captured`` per layer of one variant's run, without its records (for a
    runtime check whose ``real_unit`` came from the cache)."""
    eng = engine_fn()
    cfg = RunConfig(variant=variant, seed=seed, tau=tau, delta=delta, collect=False,
                    outlier_idx=outlier_idx, capture=True)
    _, st = eng.run(cfg, ids_feed)
    eng.drop(variant)
    return [st.captured[i] for i in sorted(st.captured)]


def quality_section(runs: dict, variants, *, reference: str = "fp16") -> dict:
    """KL / top-1 / top-5 per (domain, variant), with a paired bootstrap CI of the KL
    difference against ``reference`` over decode steps (same steps, same tokens)."""
    out = {}
    for dom, per in runs.items():
        rows = {}
        ref = per.get(reference)
        for v in variants:
            r = per[v.label]
            row = {"kl_mean": float(r["kl"].mean()), "kl_median": float(r["kl"].median()),
                   "kl_max": float(r["kl"].max()), "top1": float(r["top1"].mean()),
                   "top5": float(r["top5"].mean()), "steps": int(r["kl"].numel())}
            if ref is not None and v.label != reference:
                row["kl_vs_ref"] = paired_bootstrap(r["kl"], ref["kl"], seed=17)
                row["top1_vs_ref"] = paired_bootstrap(r["top1"], ref["top1"], seed=18)
            rows[v.label] = row
        out[dom] = rows
    return out
