"""``witcert eval sweep``: the outlier-bypass sweep (``witcert.sweep``) on real text.

Writes ``sweep.json``, ``sweep.md`` (the table) and ``sweep.png`` (the plot) to ``--out-dir``.
"""

from __future__ import annotations

import json
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None, help="HF directory or .gguf (default: bundled SmolLM2)")
    parser.add_argument("--ms", type=int, nargs="+", default=[0, 4, 8, 16], help="values of m")
    parser.add_argument("--prefill-tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=32, help="teacher-forced decode steps")
    parser.add_argument("--calib-tokens", type=int, default=2048,
                        help="text tokens used for calibration (evaluation starts after them)")
    parser.add_argument("--tau", type=float, default=0.2)
    parser.add_argument("--radius", default="min", choices=("det", "prob", "min"))
    parser.add_argument("--mode", default="block", choices=("block", "head"), help="repair policy")
    parser.add_argument("--block-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0, help="dither seed (fixed for a reproducible table)")
    parser.add_argument("--text-file", default=None,
                        help="UTF-8 text (default: CPython's pydoc topics, as `eval teacher-forcing`)")
    parser.add_argument("--dtype", default="float16", choices=("float16", "float32", "bfloat16"),
                        help="model dtype (bypass needs fp16-exact K/V: keep float16)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out-dir", default="sweep_out")


def main(args) -> int:
    import torch

    from witcert.commands.eval import reference_text
    from witcert.hf.model import load_model
    from witcert.sweep import plot_png, sweep, table_markdown

    text = Path(args.text_file).read_text(encoding="utf-8") if args.text_file else reference_text()
    model, tok = load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    res = sweep(model, tok, text, ms=args.ms, prefill_tokens=args.prefill_tokens, steps=args.steps,
                calib_tokens=args.calib_tokens, tau=args.tau, mode=args.mode,
                block_tokens=args.block_tokens, seed=args.seed, radius=args.radius)
    res["meta"]["model"] = str(args.model or "bundled:SmolLM2-135M-Instruct")
    res["meta"]["text"] = args.text_file or "pydoc_data.topics"
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "sweep.md").write_text(table_markdown(res))
    plot_png(res, out / "sweep.png")
    print(table_markdown(res))
    print(f"sweep: wrote {out / 'sweep.json'}, {out / 'sweep.md'}, {out / 'sweep.png'}")
    return 0
