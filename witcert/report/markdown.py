"""report.md from the report dict (every number in it comes from report.json)."""

from __future__ import annotations


def _f(x, nd=3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if x != x:
        return "nan"
    if x == float("inf"):
        return "inf"
    a = abs(x)
    if a != 0 and (a < 1e-3 or a >= 1e4):
        return f"{x:.{nd - 1}e}"
    return f"{x:.{nd}g}" if a < 1 else f"{x:.{nd + 1}g}"


def _ci(d: dict | None) -> str:
    if not d:
        return "ref"
    return f"{_f(d['diff'])} [{_f(d['lo'])}, {_f(d['hi'])}]"


def _table(head: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out + [""]


def _runtime_section(r: dict) -> list[str]:
    """Section 2's tables of the certificates the runtime decode paths emit."""
    rows = r.get("runtime_soundness") or {}
    L = ["### Certificates of the runtime path", "",
         "The table above re-derives every certificate in float64. Here the real runs' exact K/V are "
         "written into a paged pool and every teacher-forced decode step runs through the decode path "
         "the runtime dispatch picks (native C on CPU, the Triton kernel on CUDA, else the torch "
         "reference), which returns its own certificate and the logits it used. Each (layer, head, step) "
         "certificate is checked against the exact TV (double-double logits of the exact keys, mpmath "
         "where float64 cannot decide) between the softmax of the exact keys and of the path's logits: "
         "a violation is cert < TV, no tolerance, or a NaN certificate (must be 0).", ""]
    if not rows:
        return L + ["No witcert variant checked in this run.", ""]
    head = ["checked", "violations", "NaN", "negative", "+inf", "cert/TV median", "cert/TV p90",
            "max TV/cert"]

    def cells(x):
        return [x["checked"], x["violations"], x["nan"], x["negative"], x["inf"], _f(x["tight_median"]),
                _f(x["tight_p90"]), _f(x["max_tv_over_cert"])]

    L += _table(["variant", "path", "device", "radius"] + head,
                [[lab, x["path"], x["device"], x["radius"]] + cells(x) for lab, x in rows.items()])
    L += [f"- {lab}: the reference ran ({x['why']})" for lab, x in rows.items() if x["why"]]
    L += ["", "The engine's float64 re-derivation on the same rows (violation: TV > cert + 1e-12), and "
          "`cert / engine cert - 1`: what the path's own arithmetic (its slack terms, the certificate "
          "rounded up to fp32) changes; the engine inflates its float64 sums by 1 + 2^-20, the native path "
          "by its own smaller rounding bound, so the column can be slightly negative there.", ""]
    L += _table(["variant"] + head + ["cert / engine cert - 1: median", "min", "max"],
                [[lab] + cells(x["engine"]) + [_f(x["cert_excess_median"]), _f(x["cert_excess_min"]),
                                               _f(x["cert_excess_max"])] for lab, x in rows.items()])
    return L


def render(rep: dict) -> str:
    m, s, r = rep["meta"], rep["sizes"], rep["results"]
    tau = m["tau"]
    L = [f"# witcert report ({m['mode']})", "",
         "Regenerate every number and figure of this report with:", "",
         f"    {m['command']}", "",
         f"- date (UTC): {m['date']}; wall time {m['seconds']:.0f} s; "
         f"cache hits {m['cache']['hits']}, misses {m['cache']['misses']}",
         f"- machine: {m['machine']['platform']}, {m['machine']['cpu_count']} CPUs "
         f"({m['machine']['torch_threads']} torch threads), torch {m['machine']['torch']}, "
         f"GPU: {m['machine']['cuda'] or 'none (latencies are CPU)'}",
         f"- model: {m['model']}; dither seed {m['seed']} (fixed for reproducibility); "
         f"tau = {tau}, delta = {m['delta']} (fixed allocation over layers x heads x steps)",
         "- domains: " + "; ".join(f"**{k}** = {v}" for k, v in m["domains"].items()),
         f"- sizes: `{s}`", ""]
    if m["mode"] == "quick":
        L += ["**Quick run**: sample counts are CI-sized; it checks structure and the zero-violation "
              "invariant. Confidence intervals here are wide by construction.", ""]
    # 1
    L += ["## 1. Quad report", "",
          "Attention-output error against exact float64 attention with the real V (median and p90 "
          "over layer x head x step), bytes per token per KV head (mean of K and V, witness included), "
          f"decode read-path latency ({r['latency_note']}), certificate coverage at tau = {tau} "
          "(radius: det, or min(det, prob) for witcert).", "", "![quad](quad.png)", ""]
    for src, rows in r["quad"].items():
        L += [f"**{src}**", ""]
        L += _table(["variant", "err median", "err p90", "bytes/token/head", "latency ms", "radius", "coverage"],
                    [[lab, _f(x["err_median"]), _f(x["err_p90"]), _f(x["bytes"]), _f(x["latency_ms"]),
                      x["radius"], _f(x["coverage"])] for lab, x in rows.items()])
    # 2
    L += ["## 2. Soundness and tightness", "",
          "True TV (float64, exact keys) against the certificate for every recorded (layer, head, step) "
          "of all sources (real runs on both domains, the short-context runs and the synthetic keys). "
          "Violations must be 0. `radius exceed` counts tokens with |z^ - z| > u (the lemma's premise).",
          "", "![soundness](soundness.png)", ""]
    rows = []
    for lab, row in r["soundness"].items():
        for kind, k in row["kinds"].items():
            rows.append([lab, kind, row["checked"], k["violations"], k["radius_exceed"], _f(k["tight_median"]),
                         _f(k["tight_p90"]), k["infinite"]])
    L += _table(["variant", "radius", "checked", "violations", "radius exceed", "cert/TV median",
                 "cert/TV p90", "cert = inf"], rows)
    L += _runtime_section(r)
    L += [f"Total violations (reported radii of the float64 re-derivation, plus the runtime paths): "
          f"**{r['violations_total']}** ({r['violations_engine']} + {r['violations_runtime']}).", "",
          "Slack of the bound itself: cert / W with W the worst TV over the radius box. `exact` rows "
          "(N <= 24, short context) enumerate every vertex; `lower` rows (long context) use "
          "`worst_tv_lower`, an attained vertex, so their cert/W is an UPPER bound on the slack. "
          "TV/W shows how much of the box the real error uses.", "", "![tightness](tightness.png)", ""]
    rows = []
    for lab, w in r["worst"].items():
        for kind, x in (("exact, N<=24", w["exact_short"]), ("lower bound, long", w["lower_long"])):
            rows.append([lab, kind, x["n"], x["skipped"], _f(x["cert_over_w_median"]), _f(x["cert_over_w_p90"]),
                         _f(x["tv_over_w_median"]), x["w_above_cert"]])
    L += _table(["variant", "W", "rows", "skipped", "cert/W median", "cert/W p90", "TV/W median",
                 "W > cert (must be 0)"], rows)
    # 3
    nd = r["needles"]
    L += ["## 3. Needle retrieval", "",
          "Generated locally (single, multi-key, multi-value, multi-query; noise and real-text haystacks). "
          "The haystack is the cached context; the question and the answer are decoded over the stored "
          "cache; an outcome is correct iff greedy decoding yields the whole answer. Paired against "
          f"`{nd['reference']}` on the same samples: bootstrap CI of the accuracy difference (10^4 "
          "resamples, 95%) and McNemar's exact test. Gated = block repair until cert <= tau (the "
          f"engine's offline implementation of RepairPolicy(mode='block')). Context lengths used: "
          f"{nd['contexts']} (max position embeddings {nd['max_positions']}; longer requests are capped).",
          "", "![needles](needles.png)", ""]
    L += _table(["config", "n", "accuracy", "diff vs ref [95% CI]", "McNemar n01/n10", "p", "repaired frac"],
                [[name, x["n"], _f(x["accuracy"]), _ci(x.get("vs_ref")),
                  f"{x['mcnemar']['n01']}/{x['mcnemar']['n10']}" if "mcnemar" in x else "",
                  _f(x["mcnemar"]["p"]) if "mcnemar" in x else "", _f(x.get("repaired_fraction_mean"))]
                 for name, x in nd["rows"].items()])
    for field_, cells in nd["by"].items():
        names = [n for n in nd["rows"]]
        L += [f"Accuracy by {field_}:", ""]
        L += _table([field_, "n"] + names, [[c, v["n"]] + [_f(v[n]) for n in names] for c, v in cells.items()])
    # 4
    L += ["## 4. Coverage against the outlier budget; stochastic-rounding control", "",
          f"Coverage at tau = {tau} for witcert with m RoPE pairs kept exact, per radius; SR8 and RTN8 "
          "cannot bypass outliers (flat). `exceed` = tokens with |z^ - z| > u. See docs/REPORT.md for "
          "why `sr_hoeffding` is a valid radius and `sr_naive` is not.", "", "![budget](budget.png)", ""]
    for dom, rows in r["budget"].items():
        L += [f"**{dom}**", ""]
        L += _table(["variant", "m", "radius", "coverage", "exceed"],
                    [[lab, x["outliers"], kind, _f(k["coverage"]), k["exceed"]]
                     for lab, x in rows.items() for kind, k in x["kinds"].items()])
    # 5
    L += ["## 5. Teacher-forced quality", "",
          "Each variant and the uncompressed model read the same tokens; KL(exact || variant) per step "
          "(nats), top-1 agreement, top-5 overlap. CI: paired bootstrap over steps of the difference "
          "to fp16.", "", "![quality](quality.png)", ""]
    for dom, rows in r["quality"].items():
        L += [f"**{dom}**", ""]
        L += _table(["variant", "steps", "KL mean", "KL median", "KL max", "top-1", "top-5",
                     "KL - KL(fp16) [95% CI]"],
                    [[lab, x["steps"], _f(x["kl_mean"]), _f(x["kl_median"]), _f(x["kl_max"]), _f(x["top1"]),
                      _f(x["top5"]), _ci(x.get("kl_vs_ref"))] for lab, x in rows.items()])
    L += ["## Timings", "", "```", *(f"{k}: {v:.1f} s" for k, v in m["timings"].items()), "```", ""]
    return "\n".join(L)
