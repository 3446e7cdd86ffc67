"""The gate / outlier suite of ``bench_hf_cpu.py`` (``--suite gate``); see its docstring.

Each row is one ``witcert.hf.generate.generate`` call (greedy, the same prompt, fixed
dither seed); tokens/s is the library's own (new tokens / wall time of ``model.generate``).
"""

from __future__ import annotations

import os
import statistics
from contextlib import contextmanager

import torch

from witcert.config import CertConfig, QuantConfig, RepairPolicy
from witcert.hf.generate import generate
from witcert.hf.model import load_model

TAU = 0.2
M = 4
CALIB_TOKENS = 1024


@contextmanager
def _backend(name: str | None):
    """WITCERT_BACKEND=name for the block (None: leave it as it is)."""
    old = os.environ.get("WITCERT_BACKEND")
    if name is not None:
        os.environ["WITCERT_BACKEND"] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("WITCERT_BACKEND", None)
        else:
            os.environ["WITCERT_BACKEND"] = old


def _profile(model, tok):
    """Outlier pairs for m = M: calibrated on the first CALIB_TOKENS tokens of the pydoc text."""
    from witcert.eval.calibrate import calibrate_model
    from witcert.commands.eval import reference_text

    ids = tok(reference_text(), add_special_tokens=False)["input_ids"][:CALIB_TOKENS]
    text = tok.decode(ids)
    prof = calibrate_model(model, tok, text, m=M, max_tokens=CALIB_TOKENS, source="pydoc topics")
    return prof.outlier_idx(M, device=model.device)


def _configs(outlier_idx):
    """(name, dtype, baseline name, generate kwargs, WITCERT_BACKEND)."""
    gate = RepairPolicy(mode="block")
    q0, q4 = QuantConfig(seed=0), QuantConfig(seed=0, outliers=M)
    c = CertConfig(tau=TAU)
    b32, b16 = "native, fp32", "native, fp16"
    return [
        (b32, "float32", b32, dict(quant=q0, cert=c), None),
        ("native gated (block), fp32", "float32", b32, dict(quant=q0, cert=c, repair=gate), None),
        ("reference, fp32", "float32", b32, dict(quant=q0, cert=c), "ref"),
        ("reference gated (block), fp32", "float32", b32, dict(quant=q0, cert=c, repair=gate), "ref"),
        (b16, "float16", b16, dict(quant=q0, cert=c), None),
        (f"native m={M}, fp16", "float16", b16, dict(quant=q4, cert=c, outlier_idx=outlier_idx), None),
        (f"native m={M} gated (block), fp16", "float16", b16,
         dict(quant=q4, cert=c, outlier_idx=outlier_idx, repair=gate), None),
        (f"reference m={M}, fp16", "float16", b16, dict(quant=q4, cert=c, outlier_idx=outlier_idx),
         "ref"),
    ]


def run_suite(*, new_tokens: int, prompt_repeat: int, repeats: int, threads: int,
              prompt: str) -> None:
    models = {"float32": load_model(dtype=torch.float32), "float16": load_model(dtype=torch.float16)}
    text = " ".join([prompt] * prompt_repeat)
    outlier_idx = _profile(*models["float16"])
    cfgs = _configs(outlier_idx)
    for dt, (model, tok) in models.items():  # warm-up: the native build, first-call costs
        generate(model, tok, [text], max_new_tokens=2)
    tps = {name: [] for name, *_ in cfgs}
    info = {}
    for r in range(repeats):
        for name, dt, _, kw, force in cfgs:
            model, tok = models[dt]
            with _backend(force):
                res = generate(model, tok, [text], max_new_tokens=new_tokens, **kw)
            tps[name].append(res.tokens_per_second)
            gate = res.cache_stats["gate"]
            steps = res.cache_stats["decode_steps"]
            info[name] = (None if gate is None else gate["heads_gated"] / max(steps, 1),
                          res.cert_summary["coverage"] if res.cert_summary else None)
            print(f"  run {r + 1}/{repeats} {name}: {res.tokens_per_second:.2f} tok/s", flush=True)
    med = {k: statistics.median(v) for k, v in tps.items()}
    print(f"threads={threads} new_tokens={new_tokens} prompt_repeat={prompt_repeat} "
          f"repeats={repeats} tau={TAU} (median tok/s; ratio to the native ungated row of the "
          "same dtype)")
    print(f"{'configuration':34s} {'tok/s':>7s} {'ratio':>6s} {'gated/step':>10s} "
          f"{'coverage':>8s}  runs (tok/s)")
    for name, _, base, _, _ in cfgs:
        g, cov = info[name]
        runs = " ".join(f"{x:.2f}" for x in tps[name])
        print(f"{name:34s} {med[name]:7.2f} {med[name] / med[base]:6.3f} "
              f"{'-' if g is None else f'{g:.1f}':>10s} {'-' if cov is None else f'{cov:.4f}':>8s}"
              f"  {runs}")
