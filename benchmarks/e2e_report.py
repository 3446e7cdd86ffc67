"""Capacity accounting, the table, the plot and the JSON of bench_e2e_gpu.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

from e2e_models import GIB, Arch

NOTE = ("Random bf16 weights from public architecture shapes (no download): the generated text is "
        "meaningless, the time and memory are real.")


def capacity(arch: Arch, acct: dict, *, budget_bytes: int, context: int) -> dict:
    """Largest batch of ``context``-token sequences whose KV fits ``budget_bytes``: an fp16
    (bf16) cache, ``context * 2 * L * Hkv * D * 2`` bytes per sequence, against witcert's
    pool, whole pages of ``bytes_per_slot`` (the compressor's storage spec, all layers,
    plus the slot epoch) and the pool's fixed bytes."""
    fp16_seq = context * arch.fp16_bytes_per_token
    P = acct["page_size"]
    wc_seq = -(-context // P) * P * acct["bytes_per_slot"]
    b_fp16 = budget_bytes // fp16_seq
    b_wc = max(0, budget_bytes - acct["fixed_bytes"]) // wc_seq
    return {"arch": arch.name, "context": context, "kv_budget_gib": budget_bytes / GIB,
            "fp16_bytes_per_seq": fp16_seq, "witcert_bytes_per_seq": wc_seq,
            "fp16_batch": int(b_fp16), "witcert_batch": int(b_wc),
            "batch_ratio": b_wc / b_fp16 if b_fp16 else None}


def capacity_measured(cap: dict, results: list[dict]) -> dict:
    """tokens/s each side reaches at its own largest batch (the capacity cells)."""
    def best(tag: str, prefix: str, *, cert_on: bool) -> dict | None:
        rows = [r for r in results if r.get("tag") == tag and r["arch"] == cap["arch"]
                and r["status"] == "ok" and r["method"].startswith(prefix)
                and (not cert_on or not r["method"].endswith("nocert"))]
        return max(rows, key=lambda r: r["tokens_per_s"], default=None)
    fp = best("capacity-fp16", "sdpa", cert_on=False)
    wc = best("capacity-witcert", "witcert", cert_on=True)
    out = {"fp16_best": None if fp is None else {"method": fp["method"], "tokens_per_s": fp["tokens_per_s"]},
           "witcert_best_cert_on": None if wc is None else {"method": wc["method"],
                                                            "tokens_per_s": wc["tokens_per_s"]}}
    out["tokens_per_s_ratio"] = wc["tokens_per_s"] / fp["tokens_per_s"] if fp and wc else None
    return out


def _fmt(v, spec: str = ".1f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _best_hf(results: list[dict]) -> dict:
    best: dict = {}
    for r in results:
        if r["status"] == "ok" and r["method"].startswith("sdpa"):
            key = (r["arch"], r["batch"], r["context"], r.get("tag", ""))
            best[key] = min(best.get(key, float("inf")), r["ms_per_step"])
    return best


def _sdpa_ttft(results: list[dict]) -> dict:
    return {(r["arch"], r["batch"], r["context"], r.get("tag", "")): r["ttft_s"] for r in results
            if r["method"] == "sdpa-dynamic" and r["status"] == "ok" and r.get("ttft_s")}


def table(results: list[dict]) -> str:
    """Markdown table, one row per (cell, method); ratios against the same cell's baselines."""
    best, ttft = _best_hf(results), _sdpa_ttft(results)
    cols = ["arch", "B", "context", "method", "status", "TTFT s", "TTFT / sdpa", "ms/step",
            "tok/s", "ms / best HF", "KV GiB", "peak GiB", "certs (invalid, coverage)", "note"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in results:
        key = (r["arch"], r["batch"], r["context"], r.get("tag", ""))
        ok = r["status"] == "ok"
        ms = r.get("ms_per_step") if ok else None
        ratio = ms / best[key] if ms and key in best else None
        t = r.get("ttft_s") if ok else None
        t_ratio = t / ttft[key] if t and key in ttft and r["method"].startswith("witcert") else None
        certs = "-"
        if ok and r.get("cert") == "on":
            cov = r.get("cert_coverage")
            certs = f"{r['cert_records']} ({r['cert_invalid']}, {_fmt(cov, '.3f')})"
            if not r.get("cert_complete", True):
                certs += " INCOMPLETE"
        elif ok and r.get("cert") == "off":
            certs = "off"
        note = r.get("reason") or r.get("note") or ""
        if ok and r.get("prefill", "").startswith("random"):
            note = (note + "; " if note else "") + r["prefill"]
        if ok and r.get("compile_s") is not None:
            note = (note + "; " if note else "") + f"compile {r['compile_s']} s"
        if r.get("tag"):
            note = f"[{r['tag']}] " + note
        peak = r.get("peak_decode_gib") if ok else None
        row = [r["arch"], r["batch"], r["context"], r["method"], r["status"], _fmt(t, ".3f"),
               _fmt(t_ratio, ".2f"), _fmt(ms, ".2f"), _fmt(r.get("tokens_per_s") if ok else None),
               _fmt(ratio, ".2f"), _fmt(r["kv_bytes"] / GIB if ok and r.get("kv_bytes") else None, ".2f"),
               _fmt(peak, ".1f"), certs, note]
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def capacity_table(caps: list[dict]) -> str:
    lines = ["| arch | context | KV budget GiB | fp16 batch | witcert batch | x | fp16 tok/s (method) | "
             "witcert tok/s, cert on (method) | x |", "|" + "---|" * 9]
    for c in caps:
        m = c.get("measured") or {}
        fp, wc = m.get("fp16_best"), m.get("witcert_best_cert_on")
        lines.append("| " + " | ".join([
            c["arch"], str(c["context"]), _fmt(c["kv_budget_gib"], ".3g"), str(c["fp16_batch"]),
            str(c["witcert_batch"]), _fmt(c["batch_ratio"], ".2f"),
            "-" if fp is None else f"{fp['tokens_per_s']:.1f} ({fp['method']})",
            "-" if wc is None else f"{wc['tokens_per_s']:.1f} ({wc['method']})",
            _fmt(m.get("tokens_per_s_ratio"), ".2f")]) + " |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> Path | None:
    """ms/step vs context, one panel per batch, one line per (arch, method); grid cells only."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [r for r in results if r["status"] == "ok" and not r.get("tag")]
    batches = sorted({r["batch"] for r in rows})
    if not batches:
        return None
    fig = Figure(figsize=(4.5 * len(batches), 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(batches), squeeze=False)[0]
    for ax, b in zip(axes, batches):
        series: dict = {}
        for r in rows:
            if r["batch"] == b:
                series.setdefault((r["arch"], r["method"]), []).append((r["context"], r["ms_per_step"]))
        for (arch, method), pts in sorted(series.items()):
            pts.sort()
            style = "-" if method.startswith("witcert") else "--"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=f"{arch} {method}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("decode ms/step")
        ax.set_title(f"batch {b}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle("decode step time (random-weight models: cost real, text meaningless)", fontsize=9)
    fig.savefig(path, format="png", dpi=100)
    return path


def write_json(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    os.replace(tmp, path)
