"""``witcert trace``: run a model through the compressed cache and write an audit trace.

One safetensors file per sampled (layer, decode step), format in ``witcert/trace.py`` and
AUDIT.md, plus ``manifest.json``. Recheck it with ``witcert recheck DIR``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from witcert.config import PRESETS, RADII


def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None,
                        help="HF model directory or .gguf file (default: bundled SmolLM2-135M)")
    parser.add_argument("--text-file", required=True, help="prompt text (UTF-8)")
    parser.add_argument("--out", required=True, help="output folder (created)")
    parser.add_argument("--steps", type=int, default=8, help="decode steps (default 8)")
    parser.add_argument("--layers", type=int, nargs="+", default=None,
                        help="layers to record (default: all)")
    parser.add_argument("--stride", type=int, default=1, help="record every stride-th step")
    parser.add_argument("--prefill-tokens", type=int, default=None,
                        help="use only the first N tokens of the text as the prompt")
    parser.add_argument("--teacher-force", action="store_true",
                        help="feed the text's next tokens instead of greedy choices")
    parser.add_argument("--preset", default="default", choices=sorted(PRESETS))
    parser.add_argument("--radius", default=None, choices=RADII, help="override the preset's radius")
    parser.add_argument("--seed", type=int, default=None, help="dither seed (default: secret random)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))


def model_sm_scale(model) -> float:
    """The logit scale the model's attention layers pass to the attention function."""
    for m in model.modules():
        if hasattr(m, "layer_idx") and isinstance(getattr(m, "scaling", None), float):
            return m.scaling
    text = model.config.get_text_config(decoder=True)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return head_dim ** -0.5


def configs_from_args(args):
    """(QuantConfig, CertConfig) from ``--preset``, ``--radius`` and ``--seed``."""
    quant, cert = PRESETS[args.preset]
    if args.seed is not None:
        quant = quant.replace(seed=args.seed)
    if args.radius is not None:
        cert = cert.replace(radius=args.radius)
    return quant, cert


def main(args) -> int:
    import torch

    import witcert
    from witcert.config import CacheConfig
    from witcert.hf.model import load_model
    from witcert.ref.cert import delta_local
    from witcert.trace import CaptureObserver, build_cache, decode_through, record_name, write_record

    if args.steps < 1:
        raise SystemExit("--steps must be >= 1")
    text = Path(args.text_file).read_text(encoding="utf-8")
    model, tok = load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"], dtype=torch.int64)
    n_prompt = len(ids) if args.prefill_tokens is None else min(args.prefill_tokens, len(ids))
    if args.teacher_force and len(ids) < n_prompt + args.steps:
        n_prompt = len(ids) - args.steps
    if n_prompt < 1:
        raise SystemExit(f"{args.text_file}: too few tokens ({len(ids)}) for {args.steps} "
                         "teacher-forced steps")
    prompt = ids[:n_prompt]
    forced = ids[n_prompt:n_prompt + args.steps] if args.teacher_force else None

    quant, cert = configs_from_args(args)
    total = n_prompt + args.steps
    cache_cfg = CacheConfig(page_size=16, num_pages=-(-total // 16) + 1, exact_backup=True)
    out_dir = Path(args.out)
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

    obs = CaptureObserver(sink=sink, layers=args.layers, stride=args.stride)
    cache = build_cache(model, quant=quant, cert=cert, cache_cfg=cache_cfg, observer=obs)
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
