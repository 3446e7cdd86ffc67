"""Needle-in-a-haystack retrieval generated locally (no download), scored per variant.

Tasks (RULER-style, written here): ``single`` (one needle), ``multi_key`` (four needles,
one asked), ``multi_value`` (three values of one key, all asked), ``multi_query`` (four
needles, two asked). Haystacks: ``noise`` (a few plain sentences repeated) and ``text``
(a random stretch of the ``docs`` domain). Needles go at random sentence boundaries.

Protocol: the haystack with its needles is the cached context (exact prefill, then
stored by the variant); the question and the answer are fed token by token as decode
steps over the stored cache (the follow-up-question setting: every answer token is
computed from the compressed cache, none from the exact prefill). The outcome is binary:
correct iff greedy decoding would produce the whole answer, i.e. every answer token is
the argmax given the question and the answer so far (teacher forcing checks exactly that).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

TASKS = ("single", "multi_key", "multi_value", "multi_query")
HAYSTACKS = ("noise", "text")
_KEYS = ("apple", "river", "candle", "violin", "harbor", "meadow", "lantern", "falcon",
         "pepper", "glacier", "marble", "orchid", "saddle", "thunder", "walnut", "compass",
         "ember", "lagoon", "quartz", "tundra", "velvet", "willow", "canyon", "dolphin")
_NOISE = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
          "There and back again. ")


@dataclass
class NeedleSample:
    task: str
    haystack: str
    length: int              # requested context length (tokens)
    context: torch.Tensor    # int64 [P]
    feed: torch.Tensor       # int64 [Q + A]: question then answer
    answer_len: int          # A


def _needle(key: str, value: int, multi: bool) -> str:
    if multi:
        return f" One of the special magic numbers for {key} is: {value}."
    return f" The special magic number for {key} is: {value}."


def _qa(task: str, keys: list[str], values: list[int]) -> tuple[str, str]:
    if task in ("single", "multi_key"):
        k = keys[0]
        return (f"\nQuestion: What is the special magic number for {k}? "
                f"Answer: The special magic number for {k} is:", f" {values[0]}.")
    if task == "multi_value":
        k = keys[0]
        return (f"\nQuestion: What are all the special magic numbers for {k}? "
                f"Answer: The special magic numbers for {k} are:",
                " " + ", ".join(str(v) for v in values) + ".")
    k1, k2 = keys[0], keys[1]
    return (f"\nQuestion: What are the special magic numbers for {k1} and {k2}? "
            f"Answer: The special magic numbers for {k1} and {k2} are:", f" {values[0]} and {values[1]}.")


def make_sample(tok, *, task: str, haystack: str, length: int, rng: random.Random,
                text_ids: list[int], max_positions: int) -> NeedleSample:
    """One sample of ``length`` context tokens (capped so context + question + answer fit
    ``max_positions``; the cap is visible in ``context.numel()``)."""
    if task not in TASKS or haystack not in HAYSTACKS:
        raise ValueError(f"task {task!r} / haystack {haystack!r} unknown")
    n_needles = {"single": 1, "multi_key": 4, "multi_value": 3, "multi_query": 4}[task]
    keys = rng.sample(_KEYS, 1 if task in ("single", "multi_value") else n_needles)
    values = [rng.randrange(1000, 10000) for _ in range(n_needles)]
    if task == "multi_value":
        needles = [_needle(keys[0], v, True) for v in values]
        asked_keys, asked_vals = keys, values
    else:
        needles = [_needle(k, v, False) for k, v in zip(keys, values)]
        order = list(range(len(keys)))
        rng.shuffle(order)
        n_ask = 2 if task == "multi_query" else 1
        asked_keys = [keys[i] for i in order[:n_ask]]
        asked_vals = [values[i] for i in order[:n_ask]]
    q, a = _qa(task, asked_keys, asked_vals)
    q_ids = tok(q, add_special_tokens=False)["input_ids"]
    a_ids = tok(a, add_special_tokens=False)["input_ids"]
    n_ids = [tok(s, add_special_tokens=False)["input_ids"] for s in needles]
    budget = min(length, max_positions - len(q_ids) - len(a_ids))
    hay_len = budget - sum(len(x) for x in n_ids)
    if hay_len < 16:
        raise ValueError(f"length {length} too short for task {task}")
    if haystack == "noise":
        unit = tok(_NOISE, add_special_tokens=False)["input_ids"]
        hay = (unit * (hay_len // len(unit) + 1))[:hay_len]
    else:
        start = rng.randrange(0, len(text_ids) - hay_len)
        hay = text_ids[start:start + hay_len]
    # sentence boundaries: after a token that ends with '.' or a newline
    ends = [i + 1 for i, t in enumerate(hay) if tok.decode([t]).rstrip(" ").endswith((".", "\n"))]
    ends = ends or list(range(1, hay_len))
    spots = sorted(rng.choice(ends) for _ in n_ids)
    ctx, last = [], 0
    for spot, nid in zip(spots, n_ids):
        ctx += hay[last:spot] + nid
        last = spot
    ctx += hay[last:]
    return NeedleSample(task=task, haystack=haystack, length=length,
                        context=torch.tensor(ctx, dtype=torch.int64),
                        feed=torch.tensor(q_ids + a_ids, dtype=torch.int64), answer_len=len(a_ids))


def correct(logits: torch.Tensor, sample: NeedleSample) -> bool:
    """Greedy would emit the whole answer: argmax at each answer position matches."""
    A = sample.answer_len
    Q = sample.feed.numel() - A
    pred = logits[Q - 1:Q - 1 + A].argmax(-1)
    return bool(torch.equal(pred, sample.feed[Q:]))


def configs(variants) -> list[str]:
    """Scored configurations: the uncompressed baseline, then each variant raw and gated."""
    return ["exact"] + [c for v in variants for c in (v.label, v.label + "+gated")]


def needle_unit(model, sample: NeedleSample, variants, *, seed: int, tau: float, delta: float,
                outlier_idx) -> dict:
    """Outcome of every configuration on one sample (one exact prefill shared by all)."""
    from witcert.report.engine import EXACT, Engine, RunConfig

    eng = Engine(model, sample.context)
    logits, _ = eng.run(RunConfig(EXACT, seed, collect=False), sample.feed)
    out = {"exact": correct(logits, sample)}
    repaired = {}
    for v in variants:
        for gated in (False, True):
            cfg = RunConfig(v, seed, tau=tau, delta=delta, gated=gated, collect=False,
                            outlier_idx=outlier_idx)
            logits, st = eng.run(cfg, sample.feed)
            name = v.label + ("+gated" if gated else "")
            out[name] = correct(logits, sample)
            if gated:
                repaired[name] = sum(st.repaired) / max(len(st.repaired), 1)
        eng.drop(v)
    return {"outcomes": out, "repaired": repaired, "context": int(sample.context.numel()),
            "task": sample.task, "haystack": sample.haystack, "length": sample.length}


def needle_stats(units: list[dict], names: list[str], *, reference: str = "fp16") -> dict:
    """Accuracy per configuration, paired bootstrap CI and McNemar against ``reference``."""
    from witcert.report.stats import mcnemar, paired_bootstrap

    ref = [u["outcomes"][reference] for u in units]
    rows = {}
    for name in names:
        o = [u["outcomes"][name] for u in units]
        row = {"accuracy": sum(o) / len(o), "n": len(o)}
        if name != reference:
            row["vs_ref"] = paired_bootstrap([float(x) for x in o], [float(x) for x in ref], seed=23)
            row["mcnemar"] = mcnemar(o, ref)
        if name.endswith("+gated"):
            fr = [u["repaired"][name] for u in units]
            row["repaired_fraction_mean"] = sum(fr) / len(fr)
        rows[name] = row
    by = {}
    for field_ in ("task", "haystack", "length"):
        cells = {}
        for u in units:
            cells.setdefault(str(u[field_]), []).append(u)
        by[field_] = {c: {name: sum(u["outcomes"][name] for u in us) / len(us) for name in names}
                      | {"n": len(us)} for c, us in sorted(cells.items())}
    return {"rows": rows, "by": by, "reference": reference}
