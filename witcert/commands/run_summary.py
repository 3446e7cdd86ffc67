"""The summary ``witcert run`` prints after generating, and its plain-language legend.

``summary_lines`` is the compact block (tokens/s, KV bytes, certificate counts, the gate);
``explain_lines`` (``--explain``) says what each figure means for this very run, with the
run's own numbers, and what to change to get other numbers.
"""

from __future__ import annotations

import textwrap

WIDTH = 96
RANDOMIZED = ("dither8", "sr8")  # methods whose stored values depend on the seed


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def summary_lines(res, args) -> list[str]:
    """The compact summary of one ``generate`` result (``res``) under the parsed ``args``."""
    b, st, s = res.bytes, res.cache_stats, res.cert_summary
    lines = [
        f"generated {len(res.token_ids[0])} tokens in {res.seconds:.2f} s "
        f"({res.tokens_per_second:.2f} tokens/s; prompt {res.prompt_tokens[0]} tokens)",
        f"KV memory: {b['bytes_per_token']} B/token with {b['method']} vs "
        f"{b['fp16_bytes_per_token']} B/token fp16 ({100 * b['saved_fraction']:.1f}% saved; "
        f"{b['bytes_per_token_head_side']} vs {b['fp16_bytes_per_token_head_side']} B per "
        "token, head and side)"]
    if s is None:
        return lines + ["certificates: disabled"]
    kind = st["radius"]
    if st["det_fallback_steps"]:
        kind += f" (det on {st['det_fallback_steps']} steps past the horizon)"
    lines.append(
        f"certificates: {s['records']} (layer, head, step) records over {s['steps']} decode "
        f"steps; coverage at tau={s['tau']:g}: {_pct(s['coverage'])}; overflow (+inf): "
        f"{_pct(s['overflow_fraction'])}; finite max {_fmt(s['finite_max'])}, mean "
        f"{_fmt(s['finite_mean'])}; radius {kind}; risk allocation {st['allocation']}, "
        f"delta {args.delta:g}" + (f"; seed {'fixed' if args.seed is not None else 'fresh secret'}"
                                   if args.method in RANDOMIZED else ""))
    g = st.get("gate")
    if g is not None:
        lines.append(
            f"gate ({g['mode']}, tau={g['tau']:g}): {g['steps_gated']} of {g['steps']} steps "
            f"gated; {g['heads_gated']} (layer, head, step) certificates over tau, "
            f"{g['heads_repaired']} repaired to <= tau; {g['blocks_paged']} blocks, "
            f"{g['entries_paged']} (token, KV head) entries, {g['bytes_paged']} B paged in; "
            f"cert before max {_fmt(g['cert_before_max'])}, after max "
            f"{_fmt(g['cert_after_max'])}; exact store {g['exact_store_bytes']} B")
    if st["nonfinite_token_heads"]:
        lines.append(f"warning: {st['nonfinite_token_heads']} stored (token, KV head) rows were "
                     "non-finite; their certificates are +inf")
    return lines


def _item(name: str, text: str) -> list[str]:
    head = f"  {name:<13}"
    return textwrap.wrap(text, WIDTH, initial_indent=head, subsequent_indent=" " * len(head))


def _coverage_text(s, gate) -> str:
    cov, tau = s["coverage"], s["tau"]
    if cov is None:
        return ("no decode step ran (one new token comes from the prompt pass alone), so there "
                "is no certificate: ask for more --max-new-tokens.")
    text = (f"{_pct(cov)} of the {s['records']} certificates are <= tau={tau:g}: for those the "
            f"attention provably moved by at most {tau:g}. ")
    if cov >= 1.0:
        return text + "Every head stayed within tau."
    text += (f"The other {_pct(1 - cov)} only have the weaker guarantee their certificate states; "
             "they are not errors. ")
    if gate is None:
        return text + ("Nothing is done about them because gating is off: --gate repairs each "
                       "from an exact copy of K/V until its certificate is <= tau.")
    return text + ("Gating is on, so these are the certificates delivered after the gate's "
                   "repairs; the gate line says how many were above tau before.")


def explain_lines(res, args) -> list[str]:
    """Plain-language legend of ``summary_lines`` for this run's numbers (``--explain``)."""
    s, st = res.cert_summary, res.cache_stats
    if s is None:
        return []
    gate, radius = st.get("gate"), st["radius"]
    out = ["", "What the numbers mean:"]
    out += _item("certificate", "for every layer, query head and decode step, a proven upper "
                 "bound on the total-variation distance between the attention weights over the "
                 "exact keys and over the compressed keys: 0 = unchanged, 1 = completely "
                 "different (docs/MATH.md §1). It bounds the change, it is not the change: in "
                 "the evaluation report the true change was a median 21x smaller.")
    out += _item("coverage", _coverage_text(s, gate))
    out += _item("max / mean", f"the largest ({_fmt(s['finite_max'])}) and the average "
                 f"({_fmt(s['finite_mean'])}) finite certificate; a certificate above 1 says "
                 "nothing (TV never exceeds 1). overflow (+inf) counts heads with no guarantee "
                 "(values the format cannot hold).")
    radii = {"det": "from an error witness stored with each key; it holds for any query "
                    "(docs/MATH.md §2a).",
             "prob": "from the dither's randomness; it holds except with probability "
                     "delta (docs/MATH.md §2b).",
             "min": "per token, the smaller of two proven bounds on the logit error: det, "
                    "from an error witness stored with each key, valid for any query "
                    "(docs/MATH.md §2a), and prob, from the dither's randomness, valid except "
                    "with probability delta (§2b)."}
    out += _item(f"radius {radius}", radii[radius])
    if radius == "det":
        out += _item("risk", "none: the det radius holds always, delta plays no part.")
    else:
        split = ("evenly over layers, query heads and the "
                 f"{st['horizon']} decode steps" if st["allocation"] == "fixed" else
                 "over steps as 6 delta / (pi^2 t^2) at step t, without a horizon")
        out += _item("risk", f"delta={args.delta:g} is the probability that any prob radius of "
                     f"this request fails; the {st['allocation']} allocation splits it {split} "
                     "(docs/MATH.md §4). A smaller delta gives slightly larger certificates.")
    if gate is not None:
        out += _item("gate", f"{gate['heads_gated']} certificates were above tau; "
                     f"{gate['heads_repaired']} were brought to <= tau by paging exact K/V "
                     f"back in ({gate['bytes_paged']} B); largest after repair: "
                     f"{_fmt(gate['cert_after_max'])} (docs/GATING.md).")
    out += _item("is it good?", "coverage depends on tau, the model and the settings. On the "
                 "bundled model at tau 0.2 the evaluation report measured 60% for rtn8, 70% for "
                 "dither8 and 100% for dither8 with 4 outlier pairs. To raise it: --outliers 4 "
                 "--dtype float16; to enforce it: --gate.")
    if args.method not in RANDOMIZED:
        seeded = f"{args.method} rounds deterministically: the same command gives the same numbers."
    elif args.seed is not None:
        seeded = "--seed fixed the random stream, so the same command repeats these numbers."
    else:
        seeded = ("the seed of the random stream (the dither) is a fresh secret random number "
                  "each run (the prob radius needs a dither the input cannot depend on), so the "
                  "numbers move a little from run to run; --seed N repeats a run exactly.")
    out += _item("run to run", seeded)
    return out
