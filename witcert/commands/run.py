"""``witcert run``: generate on a model with the compressed KV cache and live certificates.

Streams the generated text, then prints the memory saved against an fp16 KV cache and the
certificate summary (coverage at tau, overflow fraction, finite max/mean, which radius);
``--explain`` adds what those numbers mean (``witcert.commands.run_summary``).
"""

from __future__ import annotations

import argparse
import sys

from witcert.commands import options as opt
from witcert.config import BLOCK_METHODS, DEFAULT_TAU, TOKEN_METHODS, QuantConfig

DEFAULT_PROMPT = "Explain in two sentences why the sky is blue."
GATE_MODES = ("block", "head")
DESCRIPTION = """\
Generate greedily on a model whose KV cache is stored compressed (INT8 with subtractive
dither by default) and print, for every decode step, layer and query head, a proven bound
on how far the attention moved (the certificate; docs/MATH.md §1). The summary at the end
says how many certificates stayed within --tau; add --explain to have each number explained,
or read "Reading the output" in the README.

examples:
  witcert run
  witcert run --prompt "Write a haiku about caches." --max-new-tokens 64 --seed 1
  witcert run --gate                      # repair every head whose certificate exceeds --tau
  witcert run --outliers 4 --dtype float16 --explain
"""
METHOD_HELP = (
    "KV compressor. dither8: 8-bit codes with subtractive dither, the only method with the "
    "probabilistic radius (docs/MATH.md §2b, §3); rtn8 / rtn4: round to nearest, 8 / 4 bits; "
    "sr8: stochastic rounding, 8 bits; fp8 / fp8_scaled: float8 e4m3, raw / with a group "
    "scale; fp16: plain fp16 storage (a control). The block-granular methods "
    f"({', '.join(BLOCK_METHODS)}) need whole blocks of tokens and are compared offline by "
    "`witcert report`, not served by this cache (default: dither8)")


def method_name(text: str) -> str:
    """argparse type of ``--method``: a per-token method, with a pointed message otherwise."""
    if text in TOKEN_METHODS:
        return text
    if text in BLOCK_METHODS:
        raise argparse.ArgumentTypeError(
            f"{text} is block-granular (one scale per block of tokens), which the paged cache of "
            f"`witcert run` cannot hold; choose one of {', '.join(TOKEN_METHODS)} "
            "(block methods are compared offline by `witcert report --variants`)")
    raise argparse.ArgumentTypeError(
        f"unknown method {text!r} (choose from {', '.join(TOKEN_METHODS)})")


def gate_mode(text: str) -> str:
    if text not in GATE_MODES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a repair mode (choose block or head; bare --gate means block)")
    return text


def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None, metavar="PATH",
                        help="local HF model directory or .gguf file (default: the bundled "
                             "SmolLM2-135M-Instruct GGUF, converted once to ~/.cache/witcert/models, "
                             "or $WITCERT_CACHE/models)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, metavar="TEXT",
                        help="user prompt (wrapped in the model's chat template if it has one; "
                             f"default: {DEFAULT_PROMPT!r})")
    parser.add_argument("--no-chat", action="store_true",
                        help="feed the prompt as raw text, without the chat template")
    parser.add_argument("--max-new-tokens", type=opt.positive_int, default=48,
                        metavar="N", help="tokens to generate, greedy (default 48)")
    parser.add_argument("--method", default="dither8", type=method_name, metavar="NAME",
                        help=METHOD_HELP)
    parser.add_argument("--dither-bits", type=int, default=QuantConfig.dither_bits, choices=(8, 16, 24),
                        help="bits of randomness per dither value, b (dither8 only). The codes "
                             "stay 8-bit whatever b is (the 8 in dither8); b sets how finely the "
                             "dither is drawn: one Philox call feeds 8, 16 or 4 channels at b = "
                             "16, 8, 24, and the radius adds a bias term 2^-(b+1) per channel "
                             f"(docs/MATH.md §2b) (default {QuantConfig.dither_bits})")
    parser.add_argument("--group-size", type=int, default=32, choices=(8, 16, 32, 64, 128),
                        metavar="G", help="channels per scale group and witness band; must divide "
                                          "the head dim {8,16,32,64,128} (default 32)")
    parser.add_argument("--radius", default=None, choices=("det", "prob", "min"),
                        help="logit-error radius behind the certificate: det (stored witness, "
                             "valid for every query, docs/MATH.md §2a), prob (from the dither, "
                             "dither8 only, §2b) or min (the smaller of both per token) "
                             "(default: min for dither8, det for the other methods)")
    parser.add_argument("--tau", type=opt.positive_float, default=DEFAULT_TAU,
                        help="threshold on the certificate: coverage counts certificates <= tau, "
                             "and --gate repairs those above it (default 0.2)")
    parser.add_argument("--delta", type=opt.probability, default=1e-2,
                        help="failure probability of the probabilistic radius for the whole "
                             "request, in (0, 1) (docs/MATH.md §4; default 0.01)")
    parser.add_argument("--allocation", default="fixed", choices=("fixed", "anytime"),
                        help="how delta is split over decode steps: fixed (even split over "
                             "--max-new-tokens steps) or anytime (6 delta / (pi^2 t^2) at step t, "
                             "no horizon) (default fixed)")
    parser.add_argument("--page-size", type=int, default=16, choices=(1, 16),
                        help="tokens per KV page (default 16)")
    parser.add_argument("--outliers", type=opt.int_range(0, 64), default=0, metavar="M",
                        help="RoPE pairs per (layer, KV head) kept exact in fp16 and excluded "
                             "from the group scales (dither8 and --dtype float16 only). The pairs "
                             "come from --outlier-profile, else from a quick calibration on the "
                             "prompt (default 0)")
    parser.add_argument("--outlier-profile", default=None, metavar="FILE",
                        help="outlier profile written by `witcert calibrate` (with --outliers M; "
                             "default: calibrate on the prompt)")
    parser.add_argument("--gate", nargs="?", const=True, default=None, type=gate_mode,
                        metavar="{block,head}",
                        help="repair every certificate above --tau from an exact host copy of K/V: "
                             "block pages exact blocks back in, largest contribution first, until "
                             "cert <= tau; head makes the whole (layer, KV head) exact. Bare "
                             "--gate means block (default: no gating, certificates only; "
                             "docs/GATING.md)")
    parser.add_argument("--repair", default=None, type=gate_mode, metavar="{block,head}",
                        help="deprecated alias: --repair MODE is --gate MODE (default: none)")
    parser.add_argument("--block-tokens", type=opt.positive_int, default=None, metavar="N",
                        help="with --gate block: tokens per repair block (default 16)")
    parser.add_argument("--seed", type=opt.seed, default=None,
                        help="dither seed, 0 <= seed < 2^64; fixes the run's numbers (default: "
                             "a fresh secret random seed each run, so certificates vary a little "
                             "between runs)")
    opt.add_device(parser)
    opt.add_dtype(parser, note="; --outliers needs float16, since bypassed channels are stored exactly in fp16")
    parser.add_argument("--json", dest="json_out", default=None, metavar="FILE",
                        help="also write the full result (texts, summary, bytes) as JSON "
                             "(default: none)")
    parser.add_argument("--explain", action="store_true",
                        help="after the summary, explain each number in plain words")


def _outlier_idx(args, model, tok):
    """Per-layer (k_idx, v_idx) for ``--outliers``: from the profile, else calibrated on the
    prompt itself (few tokens: a rough choice; use `witcert calibrate` on real text)."""
    from witcert.eval.calibrate import OutlierProfile, calibrate_model
    from witcert.hf.geometry import AttentionGeometry

    if args.outlier_profile:
        try:
            prof = OutlierProfile.load(args.outlier_profile)
            geo = AttentionGeometry.of(model)
            prof.check_geometry(num_layers=geo.num_layers, num_kv_heads=geo.num_kv_heads,
                                head_dim=geo.head_dim)
            return prof.outlier_idx(args.outliers, device=model.device)
        except ValueError as exc:
            raise opt.UsageError("--outlier-profile", f"{args.outlier_profile}: {exc}") from None
    print(f"witcert run: no --outlier-profile; choosing {args.outliers} pairs per "
          "(layer, KV head) from the prompt's own keys", file=sys.stderr, flush=True)
    prof = calibrate_model(model, tok, args.prompt, m=args.outliers, source="prompt")
    return prof.outlier_idx(args.outliers, device=model.device)


def repair_mode(args) -> str | None:
    """The gate's repair mode from ``--gate`` / ``--repair`` (None: no gating)."""
    gate = "block" if args.gate is True else args.gate
    if args.repair is not None:
        if args.gate not in (None, True, args.repair):
            raise opt.UsageError("--repair", f"{args.repair} contradicts --gate {args.gate}; "
                                             "drop the deprecated --repair")
        gate = args.repair
        print(f"witcert run: note: --repair is deprecated, use --gate {args.repair}",
              file=sys.stderr)
    if args.block_tokens is not None and gate != "block":
        raise opt.UsageError("--block-tokens", "applies to block repair only: add --gate "
                                               "(or --gate block), or drop --block-tokens")
    return gate


def configs(args):
    """(QuantConfig, CertConfig, RepairPolicy | None) from the options; ``UsageError`` on a
    combination the cache would refuse, so it is reported before the model loads."""
    from witcert.config import CertConfig, QuantConfig, RepairPolicy

    dither = args.method == "dither8"
    radius = args.radius or ("min" if dither else "det")
    if radius != "det" and not dither:
        raise opt.UsageError("--radius", f"{radius} needs the dither (docs/MATH.md §2b), which "
                                         f"{args.method} does not have: use --radius det or "
                                         "--method dither8")
    if args.outliers and not dither:
        raise opt.UsageError("--outliers", f"outlier bypass is implemented for dither8 only, "
                                           f"not {args.method}: drop --outliers or use "
                                           "--method dither8")
    if args.outliers and args.dtype != "float16":
        raise opt.UsageError("--outliers", "needs --dtype float16: the bypassed channels are "
                                           f"stored exactly in fp16 (a {args.dtype} value fp16 "
                                           "cannot hold would get cert +inf)")
    if args.outlier_profile and not args.outliers:
        raise opt.UsageError("--outlier-profile", "needs --outliers M (M > 0): add --outliers, "
                                                  "or drop --outlier-profile")
    mode = repair_mode(args)
    quant = QuantConfig(method=args.method, dither_bits=args.dither_bits,
                        group_size=args.group_size, outliers=args.outliers, seed=args.seed)
    cert = CertConfig(radius=radius, tau=args.tau, delta=args.delta,
                      allocation=args.allocation, horizon=args.max_new_tokens)
    repair = None if mode is None else RepairPolicy(
        mode=mode, block_tokens=args.block_tokens or 16)
    return quant, cert, repair


def main(args) -> int:
    import json

    from witcert.commands.run_summary import explain_lines, summary_lines

    if not args.prompt.strip():
        raise opt.UsageError("--prompt", "is empty: give some text to continue")
    quant, cert, repair = configs(args)
    opt.check_model(args.model)
    opt.check_device(args.device)
    if args.outlier_profile:
        opt.check_input_file(args.outlier_profile, "--outlier-profile")
    if args.json_out:
        opt.check_output_file(args.json_out, "--json")
    import torch

    from witcert.hf.generate import generate
    from witcert.hf.geometry import AttentionGeometry
    from witcert.hf.model import load_model

    print(f"witcert run: loading {args.model or 'the bundled SmolLM2-135M-Instruct'} "
          f"({args.dtype}, {args.device})", file=sys.stderr, flush=True)
    model, tok = load_model(args.model, device=args.device, dtype=getattr(torch, args.dtype))
    text = model.config.get_text_config(decoder=True)
    head_dim = AttentionGeometry.of(text).head_dim
    if head_dim % args.group_size:
        raise opt.UsageError("--group-size", f"{args.group_size} does not divide this model's "
                                             f"head dim {head_dim}: choose a divisor of it")
    max_pos = getattr(text, "max_position_embeddings", None)
    if max_pos is not None and args.max_new_tokens >= max_pos:
        raise opt.UsageError("--max-new-tokens", f"{args.max_new_tokens} does not fit this "
                                                 f"model's context of {max_pos} tokens: ask for "
                                                 "fewer")
    if 2 * args.outliers > head_dim:
        raise opt.UsageError("--outliers", f"{args.outliers} pairs need {2 * args.outliers} "
                                           f"channels, more than the head dim {head_dim}")
    outlier_idx = _outlier_idx(args, model, tok) if args.outliers else None
    print(f"--- {args.prompt}\n", flush=True)
    res = generate(model, tok, [args.prompt], max_new_tokens=args.max_new_tokens, quant=quant,
                   cert=cert, cache_cfg=None, page_size=args.page_size, chat=not args.no_chat,
                   outlier_idx=outlier_idx, repair=repair,
                   stream=lambda s: print(s, end="", flush=True))
    print("\n")
    for line in summary_lines(res, args):
        print(line)
    if res.cert_summary is not None:
        for line in (explain_lines(res, args) if args.explain else []):
            print(line)
        if not args.explain:
            print("(what these numbers mean: add --explain, or see \"Reading the output\" in the "
                  "README)")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"prompt": args.prompt, "text": res.texts[0], "token_ids": res.token_ids[0],
                       "seconds": res.seconds, "tokens_per_second": res.tokens_per_second,
                       "bytes": res.bytes, "cache_stats": res.cache_stats,
                       "cert_summary": res.cert_summary,
                       "seed": "set" if args.seed is not None else "secret"}, f, indent=1)
    return 0
