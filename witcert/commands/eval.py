"""``witcert eval <evaluation>``: offline evaluations on real text.

- ``teacher-forcing``: witcert against the plain sdpa baseline, step by step, both fed the
  same tokens; per-step KL / top-1 / top-5 and, for every sampled (layer, head, step), the
  true TV (float64, from the exact backup) against the certificate.
- ``sweep``: the outlier-bypass sweep, in ``witcert.commands.eval_sweep``
  (``add_arguments``/``main``); a build without that module says the sweep is not available.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import time
from pathlib import Path

from witcert.commands import options as opt
from witcert.config import RADII

SWEEP_MODULE = "witcert.commands.eval_sweep"
QUICK = {"prefill_tokens": 256, "steps": 32}
FULL = {"prefill_tokens": 2048, "steps": 64}


def reference_text() -> str:
    """The Python documentation topics shipped with CPython (``pydoc_data.topics``), every
    topic in sorted key order, joined by blank lines: a fixed, offline, real English text
    (about 465k characters, far more than any eval here needs)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k].strip() for k in sorted(topics))


TF_DESCRIPTION = """\
Teacher-forcing evaluation on real text (CPython's pydoc topics, shipped with Python): the
model reads a prompt, then decodes step by step twice, once with a plain exact KV cache (the
baseline) and once through witcert's compressed cache, both fed the same tokens. Printed:
KL(baseline || witcert) of the next-token distribution, top-1 agreement and top-5 overlap,
and for every sampled (layer, head, step) the true total variation (float64, from the exact
copy) against the certificate: a violation (TV > cert) would mean a bug. Exit status 1 on any
violation.

example:
  witcert eval teacher-forcing --quick --seed 1 --out tf.json
"""


def add_arguments(parser) -> None:
    from witcert.commands.trace import TRACE_PRESETS, preset_help

    sub = parser.add_subparsers(dest="evaluation", metavar="<evaluation>", required=True)
    tf = sub.add_parser("teacher-forcing", help="witcert vs the exact baseline under teacher "
                                                "forcing: KL, top-1, true TV vs certificate",
                        description=TF_DESCRIPTION)
    tf.add_argument("--model", default=None, metavar="PATH",
                    help="HF model directory or .gguf file (default: bundled SmolLM2)")
    tf.add_argument("--quick", action="store_true",
                    help=f"CI size: prefill {QUICK['prefill_tokens']} + {QUICK['steps']} steps "
                         f"instead of {FULL['prefill_tokens']} + {FULL['steps']}")
    tf.add_argument("--prefill-tokens", type=opt.positive_int, default=None, metavar="N",
                    help="prompt tokens read before decoding (default: "
                         f"{FULL['prefill_tokens']}, or {QUICK['prefill_tokens']} with --quick)")
    tf.add_argument("--steps", type=opt.positive_int, default=None, metavar="N",
                    help=f"decode steps compared (default: {FULL['steps']}, or {QUICK['steps']} "
                         "with --quick)")
    tf.add_argument("--feed", choices=("baseline", "text"), default="baseline",
                    help="tokens fed to both: the baseline's greedy choices or the text's own "
                         "next tokens (default baseline)")
    tf.add_argument("--tv-layers", type=opt.int_range(0), nargs="+", default=None, metavar="L",
                    help="layers whose true TV is computed (default: all layers)")
    tf.add_argument("--tv-stride", type=opt.positive_int, default=1, metavar="K",
                    help="compute the true TV every K-th step (default 1: every step)")
    tf.add_argument("--preset", default="default", choices=TRACE_PRESETS,
                    help=preset_help(TRACE_PRESETS) + " (default: default)")
    tf.add_argument("--radius", default=None, choices=RADII,
                    help="override the preset's radius: det, prob or min (default: the preset's)")
    tf.add_argument("--seed", type=opt.seed, default=None,
                    help="dither seed (default: a fresh secret random seed)")
    opt.add_device(tf)
    opt.add_dtype(tf)
    tf.add_argument("--out", default=None, metavar="FILE",
                    help="write the JSON report here (folders created; default: print only)")
    tf.set_defaults(_eval=teacher_forcing_main)
    try:
        sweep = importlib.import_module(SWEEP_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != SWEEP_MODULE:
            raise
        sw = sub.add_parser("sweep", help="(not available in this build)")
        sw.set_defaults(_eval=None)
    else:
        sw = sub.add_parser("sweep", help=sweep.HELP, description=sweep.DESCRIPTION)
        sweep.add_arguments(sw)
        sw.set_defaults(_eval=sweep.main)


def main(args) -> int:
    if args._eval is None:
        print(f"witcert eval {args.evaluation}: not implemented in this build "
              f"(expected in module {SWEEP_MODULE})")
        return 2
    return int(args._eval(args) or 0)


# ---- teacher forcing -------------------------------------------------------------------------
class CertStats:
    """Float64 recheck of every captured (layer, step) record, kept as small tensors."""

    def __init__(self):
        self.rows = []  # (layer, step, tv [Hq], cert [Hq], max |d|/u [Hq], radius_ok [Hq])
        self.radius_kinds: set[str] = set()

    def __call__(self, layer, step, rec, radius_kind) -> None:
        import torch

        from witcert.eval.trace import RADIUS_ATOL, RADIUS_RTOL, recompute

        r = recompute(rec["q"], rec["k_exact"], rec["k_hat"], rec["radius"],
                      sm_scale=self.sm_scale)
        u, err = r["radius"], r["err"]
        ok = (err <= u * (1 + RADIUS_RTOL) + RADIUS_ATOL).all(-1)
        ratio = torch.where(u > 0, err / u, torch.where(err > 0, math.inf, 0.0)).amax(-1)
        self.rows.append((layer, step, r["tv"], rec["cert"].double(), ratio, ok))
        self.radius_kinds.add(radius_kind)

    def report(self) -> dict:
        import torch

        from witcert.eval.trace import TV_ATOL

        if not self.rows:
            return {"checked": 0}
        tv = torch.cat([r[2] for r in self.rows])
        cert = torch.cat([r[3] for r in self.rows])
        ratio = torch.cat([r[4] for r in self.rows])
        ok = torch.cat([r[5] for r in self.rows])
        viol = tv > cert + TV_ATOL
        use = (tv > 0) & torch.isfinite(cert)
        tight = cert[use] / tv[use]
        q = (lambda t, p: float(torch.quantile(t, p)) if t.numel() else None)  # noqa: E731
        return {
            "checked": int(tv.numel()), "violations": int(viol.sum()),
            "radius_violations": int((~ok).sum()),
            "radius_kinds": sorted(self.radius_kinds),
            "tightness_median": q(tight, 0.5), "tightness_p90": q(tight, 0.9),
            "tightness_min": float(tight.min()) if tight.numel() else None,
            "tv_max": float(tv.max()), "tv_median": q(tv, 0.5),
            "cert_median": q(cert[torch.isfinite(cert)], 0.5),
            "max_err_over_radius": float(ratio.max()),
        }


def _step_metrics(base, wit) -> dict:
    """base, wit: f32 logits [S, V]. KL(base || wit) in float64, top-1 agreement, top-5 overlap."""
    import torch

    lb, lw = torch.log_softmax(base.double(), -1), torch.log_softmax(wit.double(), -1)
    kl = (lb.exp() * (lb - lw)).sum(-1).clamp_min(0.0)
    top1 = base.argmax(-1) == wit.argmax(-1)
    t5b, t5w = base.topk(5, -1).indices, wit.topk(5, -1).indices
    top5 = (t5b[:, :, None] == t5w[:, None, :]).any(-1).double().mean(-1)
    return {"kl": kl.tolist(), "top1": top1.tolist(), "top5_overlap": top5.tolist()}


def _baseline(model, prompt, *, steps, forced):
    """Plain sdpa with a DynamicCache: fed tokens int64 [S] and logits f32 [S, V]."""
    import torch
    from transformers import DynamicCache

    model.set_attn_implementation("sdpa")
    cache = DynamicCache(config=model.config)
    dev = model.device
    with torch.inference_mode():
        out = model(input_ids=prompt[None].to(dev), cache=cache, use_cache=True, logits_to_keep=1)
        nxt, fed, rows = out.logits[0, -1].argmax(), [], []
        for i in range(steps):
            tok = forced[i].to(dev) if forced is not None else nxt
            fed.append(tok)
            out = model(input_ids=tok.reshape(1, 1), cache=cache, use_cache=True)
            rows.append(out.logits[0, -1].float())
            nxt = rows[-1].argmax()
    return torch.stack(fed).cpu(), torch.stack(rows).cpu()


def teacher_forcing(model, tok, *, prefill_tokens: int, steps: int, quant, cert, feed="baseline",
                    tv_layers=None, tv_stride: int = 1) -> dict:
    """The whole evaluation on an already loaded model; returns the JSON-ready report."""
    import torch

    from witcert.commands.trace import model_sm_scale
    from witcert.config import CacheConfig
    from witcert.eval.trace import CaptureObserver, build_cache, decode_through

    ids = torch.tensor(tok(reference_text(), add_special_tokens=False)["input_ids"][
        :prefill_tokens + steps], dtype=torch.int64)
    if len(ids) < prefill_tokens + steps:
        raise ValueError(f"reference text has only {len(ids)} tokens")
    prompt = ids[:prefill_tokens]
    forced = ids[prefill_tokens:] if feed == "text" else None
    t0 = time.perf_counter()
    fed, base = _baseline(model, prompt, steps=steps, forced=forced)
    t1 = time.perf_counter()
    stats = CertStats()
    stats.sm_scale = model_sm_scale(model)
    obs = CaptureObserver(sink=stats, layers=tv_layers, stride=tv_stride)
    cache_cfg = CacheConfig(page_size=16, num_pages=-(-(prefill_tokens + steps) // 16) + 1)
    cache = build_cache(model, quant=quant, cert=cert, cache_cfg=cache_cfg, observer=obs)
    fed_w, wit = decode_through(model, cache, prompt, steps=steps, forced=fed, keep_logits=True)
    t2 = time.perf_counter()
    assert torch.equal(fed_w, fed)
    per_step = _step_metrics(base, wit)
    kl = torch.tensor(per_step["kl"], dtype=torch.float64)
    log = cache.cert_log.summary()
    certs = stats.report()
    return {
        "evaluation": "teacher-forcing",
        "text": {"source": "pydoc_data.topics (sorted keys, joined)", "tokens": len(ids),
                 "prefill_tokens": prefill_tokens, "steps": steps, "feed": feed},
        "quant": {k: v for k, v in dataclasses.asdict(quant).items() if k != "seed"}
                 | {"seed": "set" if quant.seed is not None else "secret"},
        "cert_config": dataclasses.asdict(cert),
        "summary": {
            "kl_mean": float(kl.mean()), "kl_median": float(kl.median()), "kl_max": float(kl.max()),
            "top1_agreement": sum(per_step["top1"]) / steps,
            "top5_overlap": sum(per_step["top5_overlap"]) / steps,
            "violations": certs.get("violations", 0),
            "radius_violations": certs.get("radius_violations", 0),
            "checked": certs["checked"],
            "tightness_median": certs.get("tightness_median"),
            "tightness_p90": certs.get("tightness_p90"),
            "coverage": log["coverage"], "tau": log["tau"],
            "overflow_fraction": log["overflow_fraction"],
            "cert_finite_max": log["finite_max"], "cert_finite_mean": log["finite_mean"],
        },
        "certificates": certs,
        "cert_log": {k: v for k, v in log.items() if k != "per_layer_head"},
        "per_step": per_step | {"token": fed.tolist()},
        "cache": cache.stats(),
        "bytes": cache.pool.bytes_report(),
        "seconds": {"baseline": t1 - t0, "witcert": t2 - t1},
    }


def teacher_forcing_main(args) -> int:
    import torch

    from witcert.commands.trace import configs_from_args
    from witcert.hf.model import load_model

    size = dict(QUICK if args.quick else FULL)
    if args.prefill_tokens is not None:
        size["prefill_tokens"] = args.prefill_tokens
    if args.steps is not None:
        size["steps"] = args.steps
    if args.out:
        opt.check_output_file(args.out, "--out", create_parent=True)
    opt.check_model(args.model)
    opt.check_device(args.device)
    quant, cert = configs_from_args(args)
    model, tok = load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    opt.check_layers(args.tv_layers, model.config.get_text_config(decoder=True).num_hidden_layers,
                     "--tv-layers")
    available = len(tok(reference_text(), add_special_tokens=False)["input_ids"])
    if size["prefill_tokens"] + size["steps"] > available:
        raise opt.UsageError("--prefill-tokens", f"{size['prefill_tokens']} + {size['steps']} "
                                                 f"steps exceed the {available} tokens of the "
                                                 "reference text: ask for fewer")
    rep = teacher_forcing(model, tok, quant=quant, cert=cert, feed=args.feed,
                          tv_layers=args.tv_layers, tv_stride=args.tv_stride, **size)
    rep["model"] = str(args.model or "bundled:SmolLM2-135M-Instruct")
    s = rep["summary"]
    fmt = lambda x: "n/a" if x is None else f"{x:.4g}"  # noqa: E731
    print(f"teacher forcing: {rep['text']['tokens']} tokens of pydoc text "
          f"(prefill {size['prefill_tokens']} + {size['steps']} steps, feed={args.feed})")
    print(f"  KL(base||witcert) mean {fmt(s['kl_mean'])}  median {fmt(s['kl_median'])}  "
          f"max {fmt(s['kl_max'])}")
    print(f"  top-1 agreement {s['top1_agreement']:.4f}  top-5 overlap {s['top5_overlap']:.4f}")
    print(f"  certificates checked {s['checked']}  violations (TV > cert) {s['violations']}  "
          f"radius violations {s['radius_violations']}")
    print(f"  tightness cert/TV median {fmt(s['tightness_median'])}  p90 {fmt(s['tightness_p90'])}")
    print(f"  coverage at tau={s['tau']:g}: {fmt(s['coverage'])}  overflow {fmt(s['overflow_fraction'])}")
    print(f"  time: baseline {rep['seconds']['baseline']:.1f}s, witcert {rep['seconds']['witcert']:.1f}s")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rep, indent=1))
        print(f"  report: {args.out}")
    return 1 if s["violations"] or s["radius_violations"] else 0
