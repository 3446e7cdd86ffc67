"""``witcert calibrate``: choose the outlier RoPE pairs per (layer, KV head) over a text.

    witcert calibrate --text-file F --outliers 16 --out profile.json [--model PATH]

Writes an outlier profile (``witcert.calibrate.OutlierProfile``) and prints the stability
of the choice: Jaccard of the sets chosen on the first and second half of the text. A
profile for m pairs also serves any smaller m (top-m prefix).
"""

from __future__ import annotations

from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None,
                        help="local HF model directory or .gguf (default: bundled SmolLM2-135M)")
    parser.add_argument("--text-file", required=True, help="calibration text (UTF-8)")
    parser.add_argument("--outliers", "-m", type=int, required=True, help="RoPE pairs m per (layer, kv head)")
    parser.add_argument("--out", required=True, help="profile JSON to write")
    parser.add_argument("--max-tokens", type=int, default=4096, help="calibration tokens used")
    parser.add_argument("--window", type=int, default=1024, help="tokens per prefill window")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    parser.add_argument("--device", default="cpu")


def main(args) -> int:
    import torch

    from witcert.calibrate import calibrate_model
    from witcert.hf.model import load_model

    if args.outliers < 0:
        raise SystemExit("--outliers must be >= 0")
    text = Path(args.text_file).read_text(encoding="utf-8")
    model, tok = load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    model.set_attn_implementation("sdpa")
    prof = calibrate_model(model, tok, text, m=args.outliers, max_tokens=args.max_tokens,
                           window=args.window, source=str(args.model or "bundled"))
    prof.save(args.out)
    s = prof.stability()
    fmt = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    print(f"calibrate: {prof.tokens} tokens, m={prof.m} pairs per (layer, kv head), "
          f"{prof.num_layers} layers x {prof.num_kv_heads} kv heads -> {args.out}")
    print(f"stability (Jaccard, first vs second half): K mean {fmt(s['k_jaccard_mean'])} "
          f"min {fmt(s['k_jaccard_min'])}; V mean {fmt(s['v_jaccard_mean'])} min {fmt(s['v_jaccard_min'])}")
    return 0
