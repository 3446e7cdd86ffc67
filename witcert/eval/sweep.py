"""Outlier-bypass sweep: coverage, fallback rate, bytes per token and quality for each m.

For every m (RoPE pairs bypassed per layer and KV head) the bundled model decodes a stretch
of real text under teacher forcing twice through ``WitCertCache``: once observed only
(gate ``off``: the coverage at tau of the raw certificates) and once gated (``block`` or
``head`` repair: the fallback rate, the bytes paged in and the quality after repair).
Quality is measured against the same model with a plain exact KV cache fed the same tokens:
KL(exact || witcert) of the next-token distribution and top-1 agreement.

The bypass keeps the model's K/V values in fp16, so the sweep runs the model in fp16 (an
fp32 value fp16 cannot hold is flagged, never silently rounded: see ``witcert.ref.quant``).
The outlier sets are calibrated once for max(m) on a part of the text disjoint from the
evaluated part; smaller m use the top-m prefix (the same sets a calibration for m picks).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from witcert.config import DEFAULT_TAU, CacheConfig, CertConfig, QuantConfig, RepairPolicy
from witcert.hf.geometry import AttentionGeometry

COLUMNS = ("m", "coverage", "fallback_rate", "heads_repaired", "kv_bytes_per_token",
           "exact_bytes_per_token", "bytes_per_token", "fp16_fraction", "kl_raw", "kl_gated",
           "top1_raw", "top1_gated", "cert_mean_raw", "k_jaccard")


def _kl_top1(base: torch.Tensor, wit: torch.Tensor) -> tuple[float, float]:
    lb, lw = torch.log_softmax(base.double(), -1), torch.log_softmax(wit.double(), -1)
    kl = (lb.exp() * (lb - lw)).sum(-1).clamp_min(0.0)
    return float(kl.mean()), float((base.argmax(-1) == wit.argmax(-1)).double().mean())


def run_setting(model, prompt: torch.Tensor, forced: torch.Tensor, *, quant: QuantConfig,
                cert: CertConfig, policy: RepairPolicy, outlier_idx) -> dict:
    """One teacher-forced decode through a gated ``WitCertCache``: logits, cert summary,
    gate summary and the pool's byte report."""
    from witcert.hf.attention import ATTN_NAME, register
    from witcert.hf.cache import WitCertCache
    from witcert.runtime.pool import PagedPool
    from witcert.eval.trace import decode_through

    register()
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTN_NAME)
    text = model.config.get_text_config(decoder=True)
    steps = forced.shape[0]
    try:
        geo = AttentionGeometry.of(text)
        pool = PagedPool(num_layers=geo.num_layers, num_kv_heads=geo.num_kv_heads, head_dim=geo.head_dim,
                         quant=quant, device=model.device, outlier_idx=outlier_idx,
                         cache=CacheConfig(page_size=16, num_pages=-(-(prompt.numel() + steps) // 16) + 1),
                         backup_dtype=model.dtype)
        cache = WitCertCache(pool=pool, cert=cert, config=model.config, repair=policy,
                             kv_dtype=model.dtype)
        gate = cache.gate
        t0 = time.perf_counter()
        try:
            _, logits = decode_through(model, cache, prompt, steps=steps, forced=forced, keep_logits=True)
        finally:
            gate.close()
        seconds = time.perf_counter() - t0
    finally:
        model.set_attn_implementation(previous)
    return {"logits": logits, "certs": cache.cert_log.summary(), "gate": gate.summary(),
            "bytes": pool.bytes_report(), "tokens": prompt.numel() + steps, "seconds": seconds}


def sweep(model, tok, text: str, *, ms=(0, 4, 8, 16), prefill_tokens: int = 256, steps: int = 32,
          calib_tokens: int = 2048, tau: float = DEFAULT_TAU, mode: str = "block", block_tokens: int = 16,
          seed: int = 0, radius: str = "min", log=print) -> dict:
    """The whole sweep on a loaded model; returns ``{"rows": [...], "meta": {...}}``."""
    from witcert.eval.calibrate import calibrate_model
    from witcert.commands.eval import _baseline

    ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.int64)
    if ids.numel() < calib_tokens + prefill_tokens + steps:
        raise ValueError(f"text has {ids.numel()} tokens, need {calib_tokens + prefill_tokens + steps}")
    model.set_attn_implementation("sdpa")
    mmax = max(ms)
    prof = calibrate_model(model, tok, tok.decode(ids[:calib_tokens]), m=mmax,
                           max_tokens=calib_tokens, window=1024) if mmax else None
    prompt = ids[calib_tokens:calib_tokens + prefill_tokens]
    forced = ids[calib_tokens + prefill_tokens:calib_tokens + prefill_tokens + steps]
    _, base = _baseline(model, prompt, steps=steps, forced=forced)
    cert = CertConfig(tau=tau, radius=radius, horizon=steps)
    rows = []
    for m in ms:
        quant = QuantConfig(outliers=m, seed=seed)
        idx = None if m == 0 else prof.outlier_idx(m)
        raw = run_setting(model, prompt, forced, quant=quant, cert=cert,
                          policy=RepairPolicy(mode="off"), outlier_idx=idx)
        gated = run_setting(model, prompt, forced, quant=quant, cert=cert,
                            policy=RepairPolicy(mode=mode, block_tokens=block_tokens), outlier_idx=idx)
        kl_raw, top1_raw = _kl_top1(base, raw["logits"])
        kl_g, top1_g = _kl_top1(base, gated["logits"])
        records = raw["certs"]["records"]
        g = gated["gate"]
        kv = raw["bytes"]["bytes_per_token"]
        exact = g["exact_store_bytes"] / gated["tokens"]
        sub = prof.stability(m)["k_jaccard_mean"] if prof is not None and m else None
        row = {"m": m, "coverage": raw["certs"]["coverage"],
               "fallback_rate": g["heads_gated"] / records if records else None,
               "heads_repaired": g["heads_repaired"] / g["heads_gated"] if g["heads_gated"] else None,
               "kv_bytes_per_token": kv, "exact_bytes_per_token": exact,
               "bytes_per_token": kv + exact,
               "fp16_fraction": (kv + exact) / raw["bytes"]["fp16_bytes_per_token"],
               "kl_raw": kl_raw, "kl_gated": kl_g, "top1_raw": top1_raw, "top1_gated": top1_g,
               "cert_mean_raw": raw["certs"]["finite_mean"], "k_jaccard": sub,
               "gate": g, "seconds": raw["seconds"] + gated["seconds"],
               "coverage_after": gated["certs"]["coverage"]}
        rows.append(row)
        log(format_row(row))
    meta = {"tau": tau, "radius": radius, "mode": mode, "block_tokens": block_tokens,
            "prefill_tokens": prefill_tokens, "steps": steps, "calib_tokens": calib_tokens,
            "records_per_setting": records,
            "dtype": str(model.dtype), "stability": None if prof is None else prof.stability()}
    return {"rows": rows, "meta": meta}


def _fmt(x, spec=".4g") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_row(r: dict) -> str:
    return (f"m={r['m']:>2}  coverage {_fmt(r['coverage'])}  fallback {_fmt(r['fallback_rate'])}  "
            f"bytes/token {r['bytes_per_token']:.0f} ({_fmt(r['fp16_fraction'], '.3f')} of fp16)  "
            f"KL raw {_fmt(r['kl_raw'])} gated {_fmt(r['kl_gated'])}  "
            f"top1 raw {_fmt(r['top1_raw'])} gated {_fmt(r['top1_gated'])}")


def table_markdown(result: dict) -> str:
    meta = result["meta"]
    head = ("| m | coverage@tau | fallback rate | repaired | KV B/tok | exact B/tok | total B/tok "
            "| vs fp16 | KL raw | KL gated | top-1 raw | top-1 gated | mean cert |")
    lines = [f"tau={meta['tau']}, radius={meta['radius']}, repair={meta['mode']} "
             f"(blocks of {meta['block_tokens']}), prefill {meta['prefill_tokens']} + "
             f"{meta['steps']} teacher-forced steps, model dtype {meta['dtype']}", "", head,
             "|" + "---|" * 13]
    for r in result["rows"]:
        lines.append(
            f"| {r['m']} | {_fmt(r['coverage'])} | {_fmt(r['fallback_rate'])} | "
            f"{_fmt(r['heads_repaired'])} | {r['kv_bytes_per_token']} | "
            f"{r['exact_bytes_per_token']:.0f} | {r['bytes_per_token']:.0f} | "
            f"{_fmt(r['fp16_fraction'], '.3f')} | {_fmt(r['kl_raw'])} | {_fmt(r['kl_gated'])} | "
            f"{_fmt(r['top1_raw'])} | {_fmt(r['top1_gated'])} | {_fmt(r['cert_mean_raw'])} |")
    return "\n".join(lines) + "\n"


def plot_png(result: dict, path: str | Path) -> Path:
    """Coverage and fallback rate (left axis) and bytes per token (right axis) against m."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = result["rows"]
    ms = [r["m"] for r in rows]
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(ms, [r["coverage"] for r in rows], "o-", label="coverage at tau (raw)")
    ax.plot(ms, [r["fallback_rate"] for r in rows], "s--", label="fallback rate (gated)")
    ax.set_xlabel("m (RoPE pairs bypassed per layer, kv head)")
    ax.set_ylabel("fraction of (layer, head, step)")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(ms)
    ax2 = ax.twinx()
    ax2.plot(ms, [r["bytes_per_token"] for r in rows], "d:", color="tab:red", label="bytes/token")
    ax2.set_ylabel("KV bytes per token (compressed + exact store)")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="center right", fontsize=8)
    ax.set_title(f"outlier bypass sweep, tau={result['meta']['tau']}", fontsize=9)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path
