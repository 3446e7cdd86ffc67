"""``witcert calibrate``: choose the outlier RoPE pairs per (layer, KV head) over a text.

    witcert calibrate --text-file F --outliers 16 --out profile.json [--model PATH]

Writes an outlier profile (``witcert.eval.calibrate.OutlierProfile``) and prints the stability
of the choice: Jaccard of the sets chosen on the first and second half of the text. A
profile for m pairs also serves any smaller m (top-m prefix).
"""

from __future__ import annotations

import sys

from witcert.commands import options as opt

DESCRIPTION = """\
Choose, for every (layer, KV head), the m RoPE pairs of key channels with the largest
magnitude over a text (and the 2m largest value channels): the channels `witcert run
--outliers m --outlier-profile FILE` then keeps exact in fp16 and leaves out of the group
scales, which shrinks every other channel's quantization error (docs/MATH.md §3,
docs/GATING.md). Prints how stable the choice is (Jaccard index of the sets chosen on the
first and on the second half of the text). A profile for m also serves any smaller m.

example:
  witcert calibrate --text-file README.md --outliers 8 --out profile.json
"""


def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None, metavar="PATH",
                        help="local HF model directory or .gguf (default: bundled SmolLM2-135M)")
    parser.add_argument("--text-file", required=True, metavar="FILE",
                        help="calibration text (UTF-8); required")
    parser.add_argument("--outliers", "-m", type=opt.int_range(1, 64), required=True, metavar="M",
                        help="RoPE pairs m per (layer, KV head), 1 to 64; required")
    parser.add_argument("--out", required=True, metavar="FILE",
                        help="profile JSON to write (folders created); required")
    parser.add_argument("--max-tokens", type=opt.int_range(2), default=4096, metavar="N",
                        help="use at most the first N tokens of the text (default 4096)")
    parser.add_argument("--window", type=opt.positive_int, default=1024, metavar="N",
                        help="tokens per prefill forward; the text is read in windows of N "
                             "tokens, each from an empty cache (default 1024)")
    opt.add_dtype(parser)
    opt.add_device(parser)


def main(args) -> int:
    text = opt.check_text_file(args.text_file, "--text-file")
    out = opt.check_output_file(args.out, "--out", create_parent=True)
    opt.check_model(args.model)
    opt.check_device(args.device)
    import torch

    from witcert.eval.calibrate import calibrate_model
    from witcert.hf.geometry import AttentionGeometry
    from witcert.hf.model import load_model

    print(f"calibrate: loading {args.model or 'the bundled SmolLM2-135M-Instruct'}",
          file=sys.stderr, flush=True)
    model, tok = load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    head_dim = AttentionGeometry.of(model).head_dim
    if 2 * args.outliers > head_dim:
        raise opt.UsageError("--outliers", f"{args.outliers} pairs need {2 * args.outliers} "
                                           f"channels, more than this model's head dim {head_dim}")
    n_tokens = len(tok(text, add_special_tokens=False)["input_ids"])
    if n_tokens < 2:
        raise opt.UsageError("--text-file", f"{args.text_file}: {n_tokens} tokens; calibration "
                                            "needs at least 2 (give a longer text)")
    model.set_attn_implementation("sdpa")
    prof = calibrate_model(model, tok, text, m=args.outliers, max_tokens=args.max_tokens,
                           window=args.window, source=str(args.model or "bundled"))
    out.parent.mkdir(parents=True, exist_ok=True)
    prof.save(out)
    s = prof.stability()
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    print(f"calibrate: {prof.tokens} tokens, m={prof.m} pairs per (layer, kv head), "
          f"{prof.num_layers} layers x {prof.num_kv_heads} kv heads -> {args.out}")
    print(f"stability (Jaccard, first vs second half): K mean {fmt(s['k_jaccard_mean'])} "
          f"min {fmt(s['k_jaccard_min'])}; V mean {fmt(s['v_jaccard_mean'])} min {fmt(s['v_jaccard_min'])}")
    return 0
