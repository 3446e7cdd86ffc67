"""Checks and summaries of the vLLM load harness that need no server: a load level's
numbers, and witcert's counters against each other and against vLLM's."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import vllm_load_client as cl


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


def summarize_level(run: cl.LoadRun, gen_tokens: float) -> dict:
    """tokens_per_s: tokens vLLM generated during the level (its counter, so requests cut at
    the time cap count what they produced) over the level's wall time; latencies of the
    finished requests."""
    ok = [r for r in run.results if r.ok]
    lat = sorted(r.latency_s for r in ok)
    failed = [r for r in run.results if not r.ok and not r.cancelled]
    return {"requests": len(run.results) + run.not_started, "finished": len(ok),
            "failed": len(failed), "cancelled": sum(r.cancelled for r in run.results),
            "not_started": run.not_started, "wall_s": round(run.wall_s, 2),
            "generated_tokens": gen_tokens, "tokens_per_s": round(gen_tokens / run.wall_s, 3),
            "client_tokens": sum(r.completion_tokens for r in ok),
            "p50_s": round(statistics.median(lat), 3) if lat else None,
            "p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 3) if lat else None,
            "failures": [f"{r.rid}: {r.status} {r.error}" for r in failed][:10]}


def counter_checks(m: dict[str, float], *, when: str, layers: int, heads: int,
                   sent: list[cl.Result], exact_decode: bool) -> tuple[list[Check], dict]:
    """Checks of one /metrics scrape ``m`` of a plugin server that answered ``sent``.

    decode_tokens counts one-token query rows. Every completion token but a request's
    first comes from a one-token row, except the first token after a preemption (the
    resumed request recomputes its tokens in one multi-token row); a prefill row that is
    one token long (a prompt whose uncached remainder or last chunk is one token) adds a
    row. So decode >= sum(completion - 1) - preemptions, with equality when no prefill row
    is one token long (``exact_decode``: prefix caching off, nothing chunked). With
    requests cut by the client their lengths are unknown: then decode >= generated tokens
    - requests - preemptions (each request's first token and each resumed request's next
    one come from multi-token rows). Returns (checks, numbers)."""
    out: list[Check] = []
    dec, certs = m["witcert_decode_tokens_total"], m["witcert_certificates_total"]
    out.append(Check(f"{when}: certificates = decode tokens x layers x query heads",
                     certs == dec * layers * heads, f"{certs} vs {dec} x {layers} x {heads}"))
    out.append(Check(f"{when}: histogram count = certificates",
                     m["witcert_certificate_count"] == certs))
    out.append(Check(f"{when}: no NaN certificate", m["witcert_invalid_total"] == 0))
    out.append(Check(f"{when}: covered <= certificates", m["witcert_covered_total"] <= certs))
    if "witcert_gate_fired_total" in m:
        f, rep, un = (m[f"witcert_gate_{k}_total"] for k in ("fired", "repaired", "unrepaired"))
        out.append(Check(f"{when}: gate fired = repaired + unrepaired", f == rep + un,
                         f"{f} = {rep} + {un}"))
        out.append(Check(f"{when}: gate coverage after >= before",
                         m["witcert_covered_total"] >= m["witcert_gate_covered_before_total"]))
    cut = [x for x in sent if x.cancelled or (x.status is None and not x.ok)]
    pre = cl.metric_sum(m, "vllm:num_preemptions_total")
    low = sum(x.completion_tokens - 1 for x in sent if x.ok) - pre
    if cut:
        low = cl.metric_sum(m, "vllm:generation_tokens_total") - len(sent) - pre
        out.append(Check(f"{when}: decode tokens >= generated - requests - preemptions "
                         f"({len(cut)} requests cut: their lengths are unknown to the client)",
                         dec >= low, f"{dec} >= {low}"))
    elif exact_decode:
        out.append(Check(f"{when}: decode tokens = sum(completion - 1) - preemptions",
                         dec == low, f"{dec} = {low} ({pre:.0f} preemptions)"))
    else:
        out.append(Check(f"{when}: decode tokens >= sum(completion - 1) - preemptions",
                         dec >= low, f"{dec} >= {low}; {dec - low:.0f} one-token prefill rows"))
    return out, {"decode_lower_bound": low, "preemptions": pre, "cut_requests": len(cut)}
