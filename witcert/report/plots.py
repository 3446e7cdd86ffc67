"""Matplotlib figures of the report (Agg backend, PNG). Each takes the report dict."""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def soundness_scatter(points: dict, path: Path, *, max_points: int = 4000) -> Path:
    """points: {label: (tv tensor, cert tensor)}: true TV vs certificate, log-log."""
    import torch

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    lo, hi = 1e-9, 1.0
    for label, (tv, cert) in points.items():
        ok = (tv > 0) & torch.isfinite(cert) & (cert > 0)
        tv, cert = tv[ok], cert[ok]
        if tv.numel() > max_points:
            idx = torch.randperm(tv.numel(), generator=torch.Generator().manual_seed(0))[:max_points]
            tv, cert = tv[idx], cert[idx]
        if tv.numel():
            ax.scatter(tv.numpy(), cert.numpy(), s=3, alpha=0.4, label=label)
            lo = min(lo, float(tv.min()))
            hi = max(hi, float(cert.max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="cert = TV")
    ax.set_xlim(lo / 2, 1.5)  # TV <= 1
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("true TV (float64, exact keys)")
    ax.set_ylabel("certificate A - 1")
    ax.set_title("Soundness: every point must lie above the diagonal")
    ax.legend(fontsize=7, markerscale=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def quad_plot(quad: dict, path: Path) -> Path:
    """Attention-output error (median) vs bytes per token per head, one panel per source."""
    plt = _plt()
    srcs = list(quad)
    fig, axes = plt.subplots(1, len(srcs), figsize=(5 * len(srcs), 4.2), squeeze=False)
    for ax, src in zip(axes[0], srcs):
        for label, row in quad[src].items():
            if row["err_median"] is None:
                continue
            e = max(row["err_median"], 1e-9)
            ax.scatter(row["bytes"], e, s=25)
            ax.annotate(label, (row["bytes"], e), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_yscale("log")
        ax.set_xlabel("bytes / token / KV head (K,V mean, witness incl.)")
        ax.set_ylabel("median ||o^ - o|| / ||o||")
        ax.set_title(src, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def budget_plot(budget: dict, tau: float, path: Path) -> Path:
    """Coverage vs outlier budget m (witcert radii) with the SR8 control as flat lines."""
    plt = _plt()
    doms = list(budget)
    fig, axes = plt.subplots(1, len(doms), figsize=(5.5 * len(doms), 4.2), squeeze=False)
    for ax, dom in zip(axes[0], doms):
        rows = budget[dom]
        wit = sorted((r["outliers"], r) for lab, r in rows.items() if lab.startswith("witcert"))
        ms = [m for m, _ in wit]
        for kind, style in (("min", "o-"), ("det", "s--"), ("prob", "^:")):
            ax.plot(ms, [r["kinds"][kind]["coverage"] for _, r in wit], style, label=f"witcert {kind}")
        for lab, kinds in (("sr8", ("det", "sr_hoeffding", "sr_naive")), ("rtn8", ("det",))):
            if lab in rows and ms:
                for kind in kinds:
                    c = rows[lab]["kinds"][kind]["coverage"]
                    ax.plot([min(ms), max(ms)], [c, c], lw=1, alpha=0.8, label=f"{lab} {kind}")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("outlier budget m (RoPE pairs kept exact)")
        ax.set_ylabel(f"coverage (cert <= {tau:g})")
        ax.set_title(dom, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def needle_plot(stats: dict, path: Path) -> Path:
    """Accuracy per configuration (raw and gated) with the paired CI against the reference."""
    plt = _plt()
    rows = stats["rows"]
    names = [n for n in rows if not n.endswith("+gated")]
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(names)), 4))
    xs = range(len(names))
    raw = [rows[n]["accuracy"] for n in names]
    gated = [rows.get(n + "+gated", {}).get("accuracy", float("nan")) for n in names]
    ax.bar([x - 0.2 for x in xs], raw, width=0.4, label="raw")
    ax.bar([x + 0.2 for x in xs], gated, width=0.4, label="gated")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("needle accuracy (whole answer, greedy)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def quality_plot(quality: dict, path: Path) -> Path:
    """Mean KL(exact || variant) per domain (log scale)."""
    plt = _plt()
    doms = list(quality)
    labels = list(next(iter(quality.values())))
    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(labels)), 4))
    w = 0.8 / max(len(doms), 1)
    for j, dom in enumerate(doms):
        ax.bar([i + j * w for i in range(len(labels))],
               [max(quality[dom][lab]["kl_mean"], 1e-12) for lab in labels], width=w, label=dom)
    ax.set_yscale("log")
    ax.set_xticks([i + w * (len(doms) - 1) / 2 for i in range(len(labels))])
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("mean KL(exact || variant), nats")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def tightness_hist(ratios: dict, path: Path) -> Path:
    """Histogram of cert / W (exact worst case, N <= 24) per variant."""
    import math

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, vals in ratios.items():
        vals = [math.log10(v) for v in vals if v > 0 and math.isfinite(v)]
        if vals:
            ax.hist(vals, bins=30, alpha=0.5, label=label)
    ax.set_xlabel("log10(cert / exact worst-case TV over the radius box)")
    ax.set_ylabel("rows")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
