"""``witcert trace``: run a model through the compressed cache and write an audit trace.

One safetensors file per sampled (layer, decode step), format in ``witcert/eval/trace.py`` and
AUDIT.md, plus ``manifest.json``. Recheck it with ``witcert recheck DIR``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

from witcert.commands import options as opt
from witcert.config import PRESETS, RADII

DESCRIPTION = """\
Run a model over a text through the compressed KV cache and write an audit trace: for every
sampled (layer, decode step) the query, the exact and the stored keys, the radii and the
certificate, as safetensors files plus manifest.json (format in AUDIT.md). Anyone can then
recompute every certificate in float64 with `witcert recheck DIR`.

example (the README's first 512 tokens as the prompt: about 10 s on 2 CPU cores; the whole
README, about 13,000 tokens, takes minutes):
  witcert trace --text-file README.md --prefill-tokens 512 --out trace_out --steps 4 --layers 0 29 --seed 1
"""
# presets usable here: the trace does not calibrate outlier channels
TRACE_PRESETS = tuple(sorted(k for k, (q, _) in PRESETS.items() if q.outliers == 0))


def preset_help(names) -> str:
    """One phrase per preset: what it sets."""
    parts = [f"{k} ({PRESETS[k][0].method}, {PRESETS[k][0].dither_bits}-bit dither, radius "
             f"{PRESETS[k][1].radius})" for k in names]
    return "configuration: " + "; ".join(parts)


def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None, metavar="PATH",
                        help="HF model directory or .gguf file (default: bundled SmolLM2-135M)")
    parser.add_argument("--text-file", required=True, metavar="FILE",
                        help="prompt text (UTF-8); required")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output folder (created; existing records are overwritten); required")
    parser.add_argument("--steps", type=opt.positive_int, default=8, metavar="N",
                        help="decode steps after the prompt (default 8)")
    parser.add_argument("--layers", type=opt.int_range(0), nargs="+", default=None, metavar="L",
                        help="layer indices to record (default: all layers)")
    parser.add_argument("--stride", type=opt.positive_int, default=1, metavar="K",
                        help="record every K-th decode step: steps 0, K, 2K, ... (default 1: every "
                             "step)")
    parser.add_argument("--prefill-tokens", type=opt.positive_int, default=None, metavar="N",
                        help="use only the first N tokens of the text as the prompt (default: the "
                             "whole text)")
    parser.add_argument("--teacher-force", action="store_true",
                        help="feed the text's next tokens instead of the model's greedy choices")
    parser.add_argument("--preset", default="default", choices=TRACE_PRESETS,
                        help=preset_help(TRACE_PRESETS) + " (default: default)")
    parser.add_argument("--radius", default=None, choices=RADII,
                        help="override the preset's radius: det, prob or min (default: the "
                             "preset's)")
    parser.add_argument("--seed", type=opt.seed, default=None,
                        help="dither seed (default: a fresh secret random seed)")
    opt.add_device(parser)
    opt.add_dtype(parser)


class StepProgress:
    """Observer wrapper printing one stderr line as each decode step starts (a trace of a long
    text takes minutes); forwards every call to ``inner``."""

    wants_radius = True

    def __init__(self, inner, *, steps: int, label: str = "trace"):
        self.inner, self.steps, self.label = inner, steps, label
        self.step, self._last = 0, None
        self.t0 = time.perf_counter()

    def on_decode(self, *, layer_idx, **kw) -> None:
        if self._last is None or layer_idx <= self._last:
            self.step += 1
            print(f"{self.label}: decode step {self.step}/{self.steps} "
                  f"({time.perf_counter() - self.t0:.1f} s)", file=sys.stderr, flush=True)
        self._last = layer_idx
        self.inner.on_decode(layer_idx=layer_idx, **kw)


def model_sm_scale(model) -> float:
    """The logit scale the model's attention layers pass to the attention function."""
    for m in model.modules():
        if hasattr(m, "layer_idx") and isinstance(getattr(m, "scaling", None), float):
            return m.scaling
    from witcert.hf.geometry import AttentionGeometry

    return AttentionGeometry.of(model).head_dim ** -0.5


def configs_from_args(args):
    """(QuantConfig, CertConfig) from ``--preset``, ``--radius`` and ``--seed``."""
    quant, cert = PRESETS[args.preset]
    if args.seed is not None:
        quant = quant.replace(seed=args.seed)
    if args.radius is not None:
        cert = cert.replace(radius=args.radius)
    return quant, cert


def main(args) -> int:
    text = opt.check_text_file(args.text_file, "--text-file")
    out_dir = opt.check_output_dir(args.out, "--out")
    opt.check_model(args.model)
    opt.check_device(args.device)
    import torch

    import witcert
    from witcert.config import CacheConfig
    from witcert.hf.model import load_model
    from witcert.ref.cert import delta_local
    from witcert.eval.trace import CaptureObserver, build_cache, decode_through, record_name, write_record

    print(f"trace: loading {args.model or 'the bundled SmolLM2-135M-Instruct'}", file=sys.stderr,
          flush=True)
    model, tok = load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    opt.check_layers(args.layers, model.config.get_text_config(decoder=True).num_hidden_layers,
                     "--layers")
    ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.int64)
    n_prompt = len(ids) if args.prefill_tokens is None else min(args.prefill_tokens, len(ids))
    if args.teacher_force and len(ids) < n_prompt + args.steps:
        n_prompt = len(ids) - args.steps
    if n_prompt < 1:
        need = (f"{args.steps} teacher-forced steps plus a prompt (give a longer text or fewer "
                "--steps)" if args.teacher_force else "a prompt (give a non-empty text)")
        raise opt.UsageError("--text-file", f"{args.text_file}: {len(ids)} tokens, too few for "
                                            f"{need}")
    prompt = ids[:n_prompt]
    forced = ids[n_prompt:n_prompt + args.steps] if args.teacher_force else None

    quant, cert = configs_from_args(args)
    total = n_prompt + args.steps
    cache_cfg = CacheConfig(page_size=16, num_pages=-(-total // 16) + 1, exact_backup=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    L = model.config.get_text_config(decoder=True).num_hidden_layers
    hq = model.config.get_text_config(decoder=True).num_attention_heads
    base_meta = {"sm_scale": repr(model_sm_scale(model)), "group_size": str(quant.group_size),
                 "dither_bits": str(quant.dither_bits), "method": quant.method,
                 "outliers": str(quant.outliers), "delta": repr(cert.delta),
                 "allocation": cert.allocation, "horizon": str(cert.horizon),
                 "model": str(args.model or "bundled:SmolLM2-135M-Instruct"),
                 "witcert_version": witcert.__version__, "kv_dtype": args.dtype}
    files = []

    def sink(layer, step, rec, radius_kind):
        s = step + 1 if cert.allocation == "anytime" else min(step + 1, cert.horizon)
        dl = delta_local(delta=cert.delta, num_layers=L, num_q_heads=hq,
                         allocation=cert.allocation, horizon=cert.horizon, step=s)
        meta = dict(base_meta, radius=radius_kind, delta_loc=repr(dl), layer=str(layer),
                    step=str(step))
        files.append(write_record(out_dir / record_name(layer, step), meta=meta, **rec).name)

    obs = StepProgress(CaptureObserver(sink=sink, layers=args.layers, stride=args.stride),
                       steps=args.steps)
    cache = build_cache(model, quant=quant, cert=cert, cache_cfg=cache_cfg, observer=obs)
    print(f"trace: prefill of {n_prompt} tokens, then {args.steps} decode steps", file=sys.stderr,
          flush=True)
    fed, _ = decode_through(model, cache, prompt, steps=args.steps, forced=forced)
    manifest = {
        "format": "witcert-trace/1", "model": base_meta["model"], "prompt_tokens": n_prompt,
        "steps": args.steps, "teacher_forced": bool(args.teacher_force),
        "fed_tokens": fed.tolist(), "fed_text": tok.decode(fed.tolist()),
        "quant": dataclasses.asdict(quant) | {"seed": "set" if quant.seed is not None else "secret"},
        "cert": dataclasses.asdict(cert), "cache": cache.stats(),
        "cert_log": cache.cert_log.summary() if cache.cert_log is not None else None,
        "files": files,
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    if cache.cert_log is not None:  # every layer's certs, not only the traced ones
        cache.cert_log.to_jsonl(out_dir / "certs.jsonl")
        cache.cert_log.heatmap_png(out_dir / "heatmap.png")
    print(f"trace: {len(files)} records ({args.steps} steps, prompt {n_prompt} tokens) in {out_dir}")
    print(f"fed: {manifest['fed_text']!r}")
    print(f"recheck with: witcert recheck {out_dir}")
    return 0
