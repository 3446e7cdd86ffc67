"""``witcert eval sweep``: the outlier-bypass sweep (``witcert.eval.sweep``) on real text.

Writes ``sweep.json``, ``sweep.md`` (the table) and ``sweep.png`` (the plot) to ``--out-dir``.
"""

from __future__ import annotations

import json

from witcert.commands import options as opt
from witcert.config import DEFAULT_TAU

HELP = "outlier-bypass sweep: coverage, fallback rate, bytes and quality for each m in --ms"
DESCRIPTION = """\
The outlier-bypass sweep on real text (CPython's pydoc topics unless --text-file): for each
m in --ms (default 0 4 8 16 RoPE pairs per layer and KV head kept exact in fp16), the model
teacher-forces the same stretch of text twice through witcert's cache, once observed only
(coverage of the certificates at --tau, quality without repair) and once gated (--mode:
fallback rate, bytes paged in, quality after repair). Quality is KL and top-1 agreement
against the same model with an exact KV cache. The outlier pairs are calibrated once, for
the largest m, on the first --calib-tokens tokens; the evaluation uses the tokens after
them. Writes sweep.json, sweep.md (the table) and sweep.png to --out-dir.

example:
  witcert eval sweep --ms 0 4 --prefill-tokens 128 --steps 16 --calib-tokens 1024
"""


def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None, metavar="PATH",
                        help="HF model directory or .gguf file (default: bundled SmolLM2)")
    parser.add_argument("--ms", type=opt.int_range(0, 64), nargs="+", default=[0, 4, 8, 16],
                        metavar="M", help="outlier budgets m to sweep: RoPE pairs per (layer, KV "
                                          "head) kept exact, each in [0, 64] (default 0 4 8 16)")
    parser.add_argument("--prefill-tokens", type=opt.positive_int, default=256, metavar="N",
                        help="prompt tokens read before the evaluated steps (default 256)")
    parser.add_argument("--steps", type=opt.positive_int, default=32, metavar="N",
                        help="teacher-forced decode steps evaluated per setting (default 32)")
    parser.add_argument("--calib-tokens", type=opt.int_range(2), default=2048, metavar="N",
                        help="text tokens used to calibrate the outlier pairs; the evaluation "
                             "starts after them (default 2048)")
    parser.add_argument("--tau", type=opt.positive_float, default=DEFAULT_TAU,
                        help="certificate threshold for coverage and for the gate (default 0.2)")
    parser.add_argument("--radius", default="min", choices=("det", "prob", "min"),
                        help="logit-error radius: det, prob or min (docs/MATH.md §2; default min)")
    parser.add_argument("--mode", default="block", choices=("block", "head"),
                        help="repair of the gated run: block (exact blocks by contribution) or "
                             "head (the whole KV head) (default block)")
    parser.add_argument("--block-tokens", type=opt.positive_int, default=16, metavar="N",
                        help="tokens per repair block with --mode block (default 16)")
    parser.add_argument("--seed", type=opt.seed, default=0,
                        help="dither seed, fixed so the table is reproducible (default 0)")
    parser.add_argument("--text-file", default=None, metavar="FILE",
                        help="UTF-8 text (default: CPython's pydoc topics, as `eval teacher-forcing`)")
    opt.add_dtype(parser, default="float16",
                  note="; m > 0 needs float16, since bypassed channels are stored exactly in fp16")
    opt.add_device(parser)
    parser.add_argument("--out-dir", default="sweep_out", metavar="DIR",
                        help="folder for sweep.json, sweep.md, sweep.png (created; default "
                             "sweep_out)")


def main(args) -> int:
    text = opt.check_text_file(args.text_file, "--text-file") if args.text_file else None
    if max(args.ms) > 0 and args.dtype != "float16":
        raise opt.UsageError("--dtype", f"m > 0 in --ms needs --dtype float16 (bypassed channels "
                                        f"are stored exactly in fp16; {args.dtype} values fp16 "
                                        "cannot hold would get cert +inf)")
    out = opt.check_output_dir(args.out_dir, "--out-dir")
    opt.check_model(args.model)
    opt.check_device(args.device)
    import torch

    from witcert.commands.eval import reference_text
    from witcert.hf.geometry import AttentionGeometry
    from witcert.hf.model import load_model
    from witcert.eval.sweep import plot_png, sweep, table_markdown

    text = reference_text() if text is None else text
    model, tok = load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    head_dim = AttentionGeometry.of(model).head_dim
    if 2 * max(args.ms) > head_dim:
        raise opt.UsageError("--ms", f"m = {max(args.ms)} needs {2 * max(args.ms)} channels, more "
                                     f"than this model's head dim {head_dim}")
    need = args.calib_tokens + args.prefill_tokens + args.steps
    have = len(tok(text, add_special_tokens=False)["input_ids"])
    if have < need:
        raise opt.UsageError("--text-file" if args.text_file else "--calib-tokens",
                             f"the text has {have} tokens; --calib-tokens + --prefill-tokens + "
                             f"--steps = {need}: ask for fewer or give a longer text")
    res = sweep(model, tok, text, ms=args.ms, prefill_tokens=args.prefill_tokens, steps=args.steps,
                calib_tokens=args.calib_tokens, tau=args.tau, mode=args.mode,
                block_tokens=args.block_tokens, seed=args.seed, radius=args.radius)
    res["meta"]["model"] = str(args.model or "bundled:SmolLM2-135M-Instruct")
    res["meta"]["text"] = args.text_file or "pydoc_data.topics"
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "sweep.md").write_text(table_markdown(res))
    plot_png(res, out / "sweep.png")
    print(table_markdown(res))
    print(f"sweep: wrote {out / 'sweep.json'}, {out / 'sweep.md'}, {out / 'sweep.png'}")
    return 0
