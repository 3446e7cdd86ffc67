"""Run every section of the report, each unit through the resumable cache."""

from __future__ import annotations

import dataclasses
import platform
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from witcert.report import budget, needles, quad, quality, runtime, soundness
from witcert.report.cache import ResultCache
from witcert.report.engine import EXACT, VARIANT_BY_LABEL, VARIANTS, Engine
from witcert.report.texts import DOMAINS, domain_source, domain_text

ALL = tuple(v.label for v in VARIANTS)
CACHE_FORMAT = 3  # bump when a unit's result changes meaning (old entries are then ignored)


@dataclass(frozen=True)
class Sizes:
    """Sample counts of one report run (``QUICK`` or ``FULL``, overridable from the CLI)."""

    prefill: int
    steps: int
    domains: tuple[str, ...] = DOMAINS
    variants: tuple[str, ...] = ALL
    long_rows_per_layer: int = 1
    short_prefill: int = 8
    short_steps: int = 16
    short_rows_per_layer: int = 1
    short_domains: tuple[str, ...] = ("docs",)
    worst_variants: tuple[str, ...] = ("rtn8", "rtn4", "sr8", "witcert-m0")
    synth_tokens: int = 512
    synth_queries: int = 8
    latency_tokens: int = 1024
    needle_lengths: tuple[int, ...] = (512,)
    needle_samples: int = 1
    needle_tasks: tuple[str, ...] = needles.TASKS
    needle_haystacks: tuple[str, ...] = needles.HAYSTACKS
    needle_variants: tuple[str, ...] = ("fp16", "rtn4", "kivi2", "witcert-m0")
    calib_tokens: int = 256
    # witcert variants whose runtime-path certificates are checked (section 2); on CPU the
    # outlier variants run the torch reference decode (about 1 s of CPU per layer at --quick
    # sizes against 0.1 s for the native path), hence m = 0 only in --quick
    runtime_variants: tuple[str, ...] = ("witcert-m0", "witcert-m4", "witcert-m8", "witcert-m16")

    def __post_init__(self) -> None:
        bad = [x for x in self.runtime_variants if not VARIANT_BY_LABEL.get(x, EXACT).is_dither]
        if bad:
            raise ValueError(f"runtime_variants: {bad} are not witcert variants; choose from "
                             f"{[v.label for v in VARIANTS if v.is_dither]}")


QUICK = Sizes(prefill=128, steps=8, needle_variants=("fp16", "witcert-m0"),
              runtime_variants=("witcert-m0",))
FULL = Sizes(prefill=2048, steps=64, long_rows_per_layer=1, short_rows_per_layer=2,
             short_domains=DOMAINS, worst_variants=("rtn8", "rtn4", "fp8", "sr8", "witcert-m0", "witcert-m8"),
             synth_tokens=2048, synth_queries=32, latency_tokens=4096,
             needle_lengths=(1024, 2048, 4096, 8192), needle_samples=1,
             needle_variants=("fp16", "rtn8", "rtn4", "sr8", "fp8", "kivi2", "kivi4",
                              "witcert-m0", "witcert-m8"),
             calib_tokens=1024)


@dataclass
class Context:
    model: object
    tok: object
    sizes: Sizes
    seed: int
    tau: float
    delta: float
    cache: ResultCache
    progress: object
    model_id: str
    texts: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)

    def ids(self, domain: str) -> list[int]:
        if domain not in self.texts:
            self.texts[domain] = self.tok(domain_text(domain), add_special_tokens=False)["input_ids"]
        return self.texts[domain]

    def key(self, **kw) -> dict:
        return {"model": self.model_id, "seed": self.seed, "tau": self.tau, "delta": self.delta,
                "format": CACHE_FORMAT} | kw

    def step(self, name: str) -> None:
        self.progress.set_postfix_str(name[:40])
        self.progress.update(1)


def _variants(labels) -> list:
    return [VARIANT_BY_LABEL[x] for x in labels]


def _calibration(cx: Context):
    """Outlier RoPE pairs (K) and channels (V) for m up to 16, from a docs stretch the
    evaluation never reads (token offset 60000)."""
    from witcert.eval.calibrate import calibrate_from_kv, collect_kv

    def fn():
        ids = cx.ids("docs")[60000:60000 + cx.sizes.calib_tokens]
        text = cx.tok.decode(ids)
        k, v = collect_kv(cx.model, cx.tok, text, max_tokens=cx.sizes.calib_tokens, window=512)
        prof = calibrate_from_kv(k, v, m=16, source="docs tokens 60000+")
        return {"idx": prof.outlier_idx(16), "stability": prof.stability(), "tokens": prof.tokens}

    res = cx.cache.get_or_compute("calib", cx.key(kind="calib", tokens=cx.sizes.calib_tokens), fn)
    cx.step("calibration")
    return res


def _real_runs(cx: Context, outlier_idx, *, prefill: int, steps: int, domains, labels, keep: int,
               section: str, runtime_units: dict | None = None) -> dict:
    """{domain: {label: unit}} for exact then each variant (one engine per domain, lazily).
    runtime_units: a dict that receives {domain: {label: runtime unit}} for each variant of
    ``sizes.runtime_variants`` (the runtime path's certificates on the same run), or None."""
    runs = {}
    for dom in domains:
        ids = torch.tensor(cx.ids(dom)[:prefill + steps], dtype=torch.int64)
        eng = []

        def engine_fn():
            if not eng:
                eng.append(Engine(cx.model, ids[:prefill]))
            return eng[0]

        base_key = cx.key(kind=section, domain=dom, prefill=prefill, steps=steps)
        base = cx.cache.get_or_compute(section, base_key | {"variant": "exact"}, lambda: quality.real_unit(
            engine_fn, ids[prefill:], EXACT, seed=cx.seed, tau=cx.tau, delta=cx.delta,
            outlier_idx=None, base_logits=None, keep_rows=0))
        cx.step(f"{section} {dom} exact")
        per = {}
        for v in _variants(labels):
            cap = {} if runtime_units is not None and v.label in cx.sizes.runtime_variants else None
            per[v.label] = cx.cache.get_or_compute(
                section, base_key | {"variant": v.label, "keep": keep},
                lambda v=v, cap=cap: quality.real_unit(
                    engine_fn, ids[prefill:], v, seed=cx.seed, tau=cx.tau, delta=cx.delta,
                    outlier_idx=outlier_idx, base_logits=base["logits"], keep_rows=keep, capture=cap))
            cx.step(f"{section} {dom} {v.label}")
            if cap is not None:
                runtime_units.setdefault(dom, {})[v.label] = _runtime_unit(
                    cx, engine_fn, ids[prefill:], v, outlier_idx, cap, key=base_key)
                cx.step(f"runtime {dom} {v.label}")
        runs[dom] = per
    return runs


def _runtime_unit(cx: Context, engine_fn, feed, variant, outlier_idx, cap: dict, *, key: dict) -> dict:
    """The runtime path's certificates on one (domain, variant) run (``witcert.report.runtime``),
    cached under the path and device that serve it. ``cap`` holds the run's captured
    activations when its real unit was computed now; else the engine reruns to capture them."""
    t = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    path, _ = runtime.plan_path(cx.model, variant.quant(cx.seed), device=device)
    rkey = key | {"kind": "runtime", "variant": variant.label, "path": path,
                  "device": runtime.device_name(device)}

    def fn():
        layers = cap.get("layers") or quality.capture_run(
            engine_fn, feed, variant, seed=cx.seed, tau=cx.tau, delta=cx.delta, outlier_idx=outlier_idx)
        eng = engine_fn()
        return runtime.runtime_unit(layers, eng.k, eng.v, quant=variant.quant(cx.seed),
                                    radius=variant.reported_radius, delta=cx.delta,
                                    outlier_idx=outlier_idx if variant.outliers else None, device=device)

    unit = cx.cache.get_or_compute("runtime", rkey, fn)
    cx.timings["runtime_paths"] = cx.timings.get("runtime_paths", 0.0) + time.perf_counter() - t
    return unit


def _needles(cx: Context, outlier_idx) -> dict:
    s = cx.sizes
    max_pos = cx.model.config.get_text_config(decoder=True).max_position_embeddings
    labels = list(s.needle_variants)
    if "fp16" not in labels:
        labels = ["fp16"] + labels
    vs = _variants(labels)
    units = []
    for length in s.needle_lengths:
        for task in s.needle_tasks:
            for hay in s.needle_haystacks:
                for i in range(s.needle_samples):
                    key = cx.key(kind="needle", length=length, task=task, haystack=hay, i=i,
                                 variants=labels, max_pos=max_pos)

                    def fn(length=length, task=task, hay=hay, i=i):
                        rng = random.Random(f"{cx.seed}-{task}-{hay}-{length}-{i}")
                        smp = needles.make_sample(cx.tok, task=task, haystack=hay, length=length, rng=rng,
                                                  text_ids=cx.ids("docs"), max_positions=max_pos)
                        return needles.needle_unit(cx.model, smp, vs, seed=cx.seed, tau=cx.tau,
                                                   delta=cx.delta, outlier_idx=outlier_idx)

                    units.append(cx.cache.get_or_compute("needles", key, fn))
                    cx.step(f"needle {task} {hay} {length}")
    names = needles.configs(vs)
    st = needles.needle_stats(units, names, reference="fp16")
    st["max_positions"] = max_pos
    st["contexts"] = sorted({u["context"] for u in units})
    return st


def count_units(s: Sizes) -> int:
    nv = len(s.variants)
    n_rt = sum(x in s.runtime_variants for x in s.variants)
    return (1 + len(s.domains) * (1 + nv + n_rt) + len(s.short_domains) * (1 + len(s.worst_variants))
            + 2 * nv + len(s.needle_lengths) * len(s.needle_tasks) * len(s.needle_haystacks) * s.needle_samples)


def run_all(cx: Context) -> dict:
    s, t0 = cx.sizes, time.perf_counter()
    variants = _variants(s.variants)
    calib = _calibration(cx)
    oi = calib["idx"]
    # sections 1, 2, 4, 5: real activations
    t = time.perf_counter()
    rt_units: dict = {}
    runs = _real_runs(cx, oi, prefill=s.prefill, steps=s.steps, domains=s.domains, labels=s.variants,
                      keep=s.long_rows_per_layer, section="real", runtime_units=rt_units)
    cx.timings["real_runs"] = time.perf_counter() - t - cx.timings.get("runtime_paths", 0.0)
    t = time.perf_counter()
    short = _real_runs(cx, oi, prefill=s.short_prefill, steps=s.short_steps, domains=s.short_domains,
                       labels=s.worst_variants, keep=s.short_rows_per_layer, section="short")
    cx.timings["short_runs"] = time.perf_counter() - t
    # section 1: synthetic + latency
    t = time.perf_counter()
    synth, lat = {}, {}
    for v in variants:
        synth[v.label] = cx.cache.get_or_compute("synthetic", cx.key(kind="synth", v=v.label, n=s.synth_tokens,
                                                                     q=s.synth_queries),
                                                 lambda v=v: quad.synthetic_unit(v, tokens=s.synth_tokens,
                                                                                 queries=s.synth_queries,
                                                                                 seed=cx.seed, tau=cx.tau,
                                                                                 delta=cx.delta))
        cx.step(f"synthetic {v.label}")
    for v in variants:  # latency is measured now, never cached
        lat[v.label] = quad.latency_unit(v, tokens=s.latency_tokens, seed=cx.seed)
        cx.step(f"latency {v.label}")
    cx.timings["synthetic_latency"] = time.perf_counter() - t
    quad_tab = {f"synthetic Gaussian (N={s.synth_tokens})": quad.quad_rows(synth, variants, tau=cx.tau)}
    for dom in s.domains:
        quad_tab[f"real: {dom} (P={s.prefill}, {s.steps} steps)"] = quad.quad_rows(runs[dom], variants, tau=cx.tau)
    for rows in quad_tab.values():
        for lab, row in rows.items():
            row["latency_ms"] = lat[lab]["ms"]
    # section 2
    t = time.perf_counter()
    sources = {f"real-{d}": runs[d] for d in s.domains} | {"synthetic": synth} | \
              {f"short-{d}": short[d] for d in s.short_domains}
    sound = soundness.soundness_rows(sources, variants)
    sound_rt = runtime.runtime_rows(rt_units, runs)
    worst = {}
    for lab in s.worst_variants:
        rows_short = [r for d in s.short_domains for r in short[d][lab]["rows"]]
        rows_long = [r for d in s.domains for r in runs[d][lab]["rows"]]
        worst[lab] = {"exact_short": soundness.worst_case_rows(rows_short, exact=True),
                      "lower_long": soundness.worst_case_rows(rows_long, exact=False)}
    cx.timings["worst_case"] = time.perf_counter() - t
    # sections 3, 4, 5
    t = time.perf_counter()
    needle = _needles(cx, oi)
    cx.timings["needles"] = time.perf_counter() - t
    bud = budget.budget_rows(runs, variants, tau=cx.tau)
    qual = quality.quality_section(runs, variants)
    cx.timings["total"] = time.perf_counter() - t0
    points = {}
    for v in variants:
        tv = torch.cat([src[v.label]["tv"] for src in sources.values() if v.label in src])
        c = torch.cat([src[v.label]["certs"][v.reported_radius] for src in sources.values() if v.label in src])
        points[v.label] = (tv, c)
    return {"quad": quad_tab, "latency": lat, "soundness": sound, "runtime_soundness": sound_rt,
            "worst": worst, "needles": needle,
            "budget": bud, "quality": qual, "calibration": {k: calib[k] for k in ("stability", "tokens")},
            "_points": points}


def machine() -> dict:
    import os

    return {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "processor": platform.processor() or platform.machine()}


def sizes_json(s: Sizes) -> dict:
    return dataclasses.asdict(s)


def domains_json(s: Sizes) -> dict:
    return {d: domain_source(d) for d in s.domains}


def out_paths(out: Path) -> dict:
    return {"md": out / "report.md", "json": out / "report.json", "plots": out}
