"""``witcert report``: the benchmark report (report.md, report.json, PNG plots).

    witcert report --quick --out reports/quick          # CI size, a few minutes on 2 cores
    witcert report --out reports/2026-11-30             # full run (about two hours on 2 cores)

Every unit of work is cached under ``OUT/cache``; rerunning the same command after an
interruption resumes where it stopped. The command line is printed at the top of report.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import shlex
import sys
import time

from witcert.commands import options as opt
from witcert.config import DEFAULT_TAU

DESCRIPTION = """\
The evaluation report of the README's "Headline numbers": every compressor on the bundled
model and on synthetic keys, certificate soundness (true TV against the certificate, both
re-derived in float64 and as emitted by the runtime decode path: native C on CPU, Triton on
CUDA), tightness against the exact worst case, needle retrieval, the risk budget and quality, as
report.md, report.json and PNG plots in --out. Every unit of work is cached in --out/cache,
so rerunning the same command after an interruption resumes where it stopped. --quick takes
a few minutes on 2 cores, the full run over an hour. Exit status 1 on any violation.

examples:
  witcert report --quick --out reports/quick
  witcert report --out reports/full
"""


def _names():
    """(variant labels, needle tasks, haystacks) the report knows (imports torch)."""
    from witcert.report.engine import VARIANT_BY_LABEL
    from witcert.report.needles import HAYSTACKS, TASKS

    return sorted(VARIANT_BY_LABEL), TASKS, HAYSTACKS


def add_arguments(parser) -> None:
    from witcert.report.build import FULL, QUICK

    variants, tasks, haystacks = _names()

    def sizes(name):
        q, f = getattr(QUICK, name), getattr(FULL, name)
        show = lambda x: " ".join(map(str, x)) if isinstance(x, tuple) else str(x)  # noqa: E731
        return f" (default: {show(q)})" if q == f else f" (default: {show(q)} quick, {show(f)} full)"
    names = lambda xs: "; one or more of " + ", ".join(xs)  # noqa: E731
    parser.add_argument("--model", default=None, metavar="PATH",
                        help="HF model directory or .gguf file (default: bundled SmolLM2)")
    parser.add_argument("--quick", action="store_true",
                        help="CI-sized sample counts (a few minutes) instead of the full run")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output folder (report.md, report.json, *.png, cache/); required")
    parser.add_argument("--seed", type=opt.seed, default=12345,
                        help="dither seed, fixed so the report is reproducible (default 12345)")
    parser.add_argument("--tau", type=opt.positive_float, default=DEFAULT_TAU,
                        help="certificate threshold (default 0.2)")
    parser.add_argument("--delta", type=opt.probability, default=1e-2,
                        help="failure probability of the probabilistic radius (default 0.01)")
    parser.add_argument("--threads", type=opt.positive_int, default=None, metavar="N",
                        help="torch threads (default: torch's own choice)")
    parser.add_argument("--no-cache", action="store_true",
                        help="recompute everything instead of reusing --out/cache")
    g = parser.add_argument_group("size overrides (default: the --quick or the full sizes, "
                                  "witcert/report/build.py)")
    g.add_argument("--prefill", type=opt.positive_int, metavar="N",
                   help="prompt tokens of the real-text runs" + sizes("prefill"))
    g.add_argument("--steps", type=opt.positive_int, metavar="N",
                   help="decode steps of the real-text runs" + sizes("steps"))
    g.add_argument("--variants", nargs="+", metavar="NAME",
                   help="compressors compared" + sizes("variants") + names(variants))
    g.add_argument("--needle-lengths", type=opt.positive_int, nargs="+", metavar="N",
                   help="needle haystack lengths in tokens" + sizes("needle_lengths"))
    g.add_argument("--needle-samples", type=opt.positive_int, metavar="N",
                   help="samples per needle cell" + sizes("needle_samples"))
    g.add_argument("--needle-tasks", nargs="+", metavar="TASK",
                   help="needle tasks" + sizes("needle_tasks") + names(tasks))
    g.add_argument("--needle-haystacks", nargs="+", metavar="KIND",
                   help="haystack kinds" + sizes("needle_haystacks") + names(haystacks))
    g.add_argument("--needle-variants", nargs="+", metavar="NAME",
                   help="compressors in the needle test" + sizes("needle_variants") + names(variants))
    g.add_argument("--worst-variants", nargs="+", metavar="NAME",
                   help="compressors in the exact worst-case test" + sizes("worst_variants")
                        + names(variants))
    g.add_argument("--runtime-variants", nargs="+", metavar="NAME",
                   help="witcert variants whose runtime-path certificates are checked (on CPU the "
                        "outlier variants run the slow torch reference)" + sizes("runtime_variants")
                        + names([x for x in variants if x.startswith("witcert-")]))
    g.add_argument("--synth-tokens", type=opt.positive_int, metavar="N",
                   help="tokens of the synthetic-key runs" + sizes("synth_tokens"))
    g.add_argument("--latency-tokens", type=opt.positive_int, metavar="N",
                   help="context of the latency measurement" + sizes("latency_tokens"))
    g.add_argument("--calib-tokens", type=opt.int_range(2), metavar="N",
                   help="outlier calibration tokens" + sizes("calib_tokens"))


def _check_names(args) -> None:
    """``UsageError`` for an unknown variant, task or haystack name (before any work)."""
    variants, tasks, haystacks = _names()
    for option, known in (("variants", variants), ("needle_variants", variants),
                          ("worst_variants", variants),
                          ("runtime_variants", [x for x in variants if x.startswith("witcert-")]),
                          ("needle_tasks", tasks),
                          ("needle_haystacks", haystacks)):
        bad = [x for x in getattr(args, option) or () if x not in known]
        if bad:
            raise opt.UsageError("--" + option.replace("_", "-"),
                                 f"unknown {bad}; choose from {', '.join(known)}")


def _sizes(args):
    from witcert.report.build import FULL, QUICK

    s = QUICK if args.quick else FULL
    over = {}
    for name in ("prefill", "steps", "variants", "needle_lengths", "needle_samples", "needle_tasks",
                 "needle_haystacks", "needle_variants", "worst_variants", "runtime_variants",
                 "synth_tokens", "latency_tokens", "calib_tokens"):
        val = getattr(args, name)
        if val is not None:
            over[name] = tuple(val) if isinstance(val, list) else val
    if {"worst_variants", "runtime_variants", "variants"} & set(over):
        vs = set(over.get("variants", s.variants))
        over["worst_variants"] = tuple(x for x in over.get("worst_variants", s.worst_variants) if x in vs)
        over["runtime_variants"] = tuple(x for x in over.get("runtime_variants", s.runtime_variants) if x in vs)
    return dataclasses.replace(s, **over)


def main(args) -> int:
    import torch
    from tqdm import tqdm

    from witcert.hf.model import load_model
    from witcert.report import build, markdown, plots
    from witcert.report.cache import ResultCache

    _check_names(args)
    out = opt.check_output_dir(args.out, "--out")
    opt.check_model(args.model)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = _sizes(args)
    out.mkdir(parents=True, exist_ok=True)
    command = "witcert report " + _argv_of(args)
    t0 = time.perf_counter()
    model, tok = load_model(args.model)
    cache = ResultCache(out / "cache", enabled=not args.no_cache)
    bar = tqdm(total=build.count_units(sizes), desc="witcert report", unit="unit", file=sys.stderr)
    cx = build.Context(model=model, tok=tok, sizes=sizes, seed=args.seed, tau=args.tau, delta=args.delta,
                       cache=cache, progress=bar, model_id=str(args.model or "bundled:SmolLM2-135M-Instruct"))
    res = build.run_all(cx)
    bar.close()
    points = res.pop("_points")
    reported = {lab: row["kinds"][row["radius"]]["violations"] for lab, row in res["soundness"].items()}
    res["violations_engine"] = sum(reported.values())
    # the runtime paths' own certificates count too (NaN and negative ones fail cert >= TV)
    res["violations_runtime"] = sum(row["violations"] for row in res["runtime_soundness"].values())
    res["violations_total"] = res["violations_engine"] + res["violations_runtime"]
    res["latency_note"] = ("CPU, pure-torch reference read path at "
                           f"{sizes.latency_tokens} tokens, one layer" if not torch.cuda.is_available()
                           else "pure-torch reference read path (GPU present but not used for timing)")
    meta = {"mode": "quick" if args.quick else "full", "command": command,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
            "seconds": time.perf_counter() - t0, "machine": build.machine(), "model": cx.model_id,
            "seed": args.seed, "tau": args.tau, "delta": args.delta, "domains": build.domains_json(sizes),
            "cache": {"hits": cache.hits, "misses": cache.misses}, "timings": cx.timings}
    rep = {"meta": meta, "sizes": build.sizes_json(sizes), "results": res}
    plots.soundness_scatter(points, out / "soundness.png")
    plots.quad_plot(res["quad"], out / "quad.png")
    plots.budget_plot(res["budget"], args.tau, out / "budget.png")
    plots.needle_plot(res["needles"], out / "needles.png")
    plots.quality_plot(res["quality"], out / "quality.png")
    plots.tightness_hist({lab: w["exact_short"]["cert_over_w"] for lab, w in res["worst"].items()},
                         out / "tightness.png")
    (out / "report.json").write_text(json.dumps(rep, indent=1, default=_jsonable))
    (out / "report.md").write_text(markdown.render(rep))
    print(f"witcert report: {out / 'report.md'} ({meta['seconds']:.0f} s); "
          f"violations {res['violations_total']}")
    return 1 if res["violations_total"] else 0


def _argv_of(args) -> str:
    """The command line that reproduces this run (every option that differs from its default)."""
    parts = []
    if args.model:
        parts += ["--model", str(args.model)]
    if args.quick:
        parts.append("--quick")
    parts += ["--out", str(args.out)]
    for name, default in (("seed", 12345), ("tau", DEFAULT_TAU), ("delta", 1e-2), ("threads", None)):
        val = getattr(args, name)
        if val is not None and val != default:
            parts += ["--" + name, str(val)]
    if args.no_cache:
        parts.append("--no-cache")
    for name in ("prefill", "steps", "variants", "needle_lengths", "needle_samples", "needle_tasks",
                 "needle_haystacks", "needle_variants", "worst_variants", "runtime_variants",
                 "synth_tokens", "latency_tokens", "calib_tokens"):
        val = getattr(args, name)
        if val is not None:
            parts += ["--" + name.replace("_", "-")] + [str(x) for x in (val if isinstance(val, list) else [val])]
    return " ".join(shlex.quote(p) for p in parts)


def _jsonable(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, tuple):
        return list(x)
    return str(x)
