"""``witcert run``: generate on a model with the compressed KV cache and live certificates.

Streams the generated text, then prints the memory saved against an fp16 KV cache and the
certificate summary (coverage at tau, overflow fraction, finite max/mean, which radius).
"""

from __future__ import annotations

import sys

DEFAULT_PROMPT = "Explain in two sentences why the sky is blue."


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
    parser.add_argument("--max-new-tokens", type=int, default=48, metavar="N",
                        help="tokens to generate (greedy; default 48)")
    parser.add_argument("--method", default="dither8", metavar="NAME",
                        help="KV compressor: dither8 (default; the only one with the probabilistic "
                             "radius), rtn8, rtn4, sr8, fp8, fp8_scaled, fp16")
    parser.add_argument("--dither-bits", type=int, default=16, choices=(8, 16, 24),
                        help="bits per dither value b (one Philox call feeds 16/8/4 channels; "
                             "default 16)")
    parser.add_argument("--group-size", type=int, default=32, metavar="G",
                        help="channels per scale group and witness band (default 32)")
    parser.add_argument("--radius", default="min", choices=("det", "prob", "min"),
                        help="certificate radius: det (witness, valid for every query), prob "
                             "(dither, MATH 2b), min of both (default)")
    parser.add_argument("--tau", type=float, default=0.2,
                        help="certificate threshold for the coverage figure (default 0.2)")
    parser.add_argument("--delta", type=float, default=1e-2,
                        help="request-level failure probability of the probabilistic radius "
                             "(default 0.01)")
    parser.add_argument("--allocation", default="fixed", choices=("fixed", "anytime"),
                        help="risk budget split over steps: fixed (horizon = --max-new-tokens) "
                             "or anytime (6 delta / (pi^2 t^2)); default fixed")
    parser.add_argument("--page-size", type=int, default=16, choices=(1, 16),
                        help="tokens per KV page (default 16)")
    parser.add_argument("--outliers", type=int, default=0, metavar="M",
                        help="RoPE pairs per (layer, KV head) kept exact in fp16 and excluded "
                             "from the group scales (dither8 only; default 0). The pairs come "
                             "from --outlier-profile, else from a quick calibration on the prompt")
    parser.add_argument("--outlier-profile", default=None, metavar="FILE",
                        help="outlier profile written by `witcert calibrate` (used with --outliers)")
    parser.add_argument("--gate", action="store_true",
                        help="gate every certificate at --tau: when cert > tau, page exact K/V back "
                             "in from the host backup until cert <= tau (docs/GATING.md)")
    parser.add_argument("--repair", default="block", choices=("block", "head"),
                        help="with --gate: block (by contribution, default) or whole-head fallback")
    parser.add_argument("--block-tokens", type=int, default=16, metavar="N",
                        help="with --gate --repair block: tokens per repair block (default 16)")
    parser.add_argument("--seed", type=int, default=None,
                        help="dither seed (default: a fresh secret random seed)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                        help="model weights and activations (default float32); --outliers needs "
                             "float16, since bypassed channels are stored exactly in fp16")
    parser.add_argument("--json", dest="json_out", default=None, metavar="FILE",
                        help="also write the full result (texts, summary, bytes) as JSON")


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _outlier_idx(args, model, tok):
    """Per-layer (k_idx, v_idx) for ``--outliers``: from the profile, else calibrated on the
    prompt itself (few tokens: a rough choice; use `witcert calibrate` on real text)."""
    from witcert.calibrate import OutlierProfile, calibrate_model

    text = model.config.get_text_config(decoder=True)
    if args.outlier_profile:
        prof = OutlierProfile.load(args.outlier_profile)
    else:
        print(f"witcert run: no --outlier-profile; choosing {args.outliers} pairs per "
              "(layer, KV head) from the prompt's own keys", flush=True)
        prof = calibrate_model(model, tok, args.prompt, m=args.outliers, source="prompt")
    prof.check_geometry(num_layers=text.num_hidden_layers, num_kv_heads=text.num_key_value_heads,
                        head_dim=getattr(text, "head_dim", None)
                        or text.hidden_size // text.num_attention_heads)
    return prof.outlier_idx(args.outliers, device=model.device)


def main(args) -> int:
    import json

    from witcert.config import CertConfig, QuantConfig, RepairPolicy
    from witcert.hf.generate import generate
    from witcert.hf.model import load_model

    try:
        quant = QuantConfig(method=args.method, dither_bits=args.dither_bits,
                            group_size=args.group_size, outliers=args.outliers, seed=args.seed)
        cert = CertConfig(radius=args.radius, tau=args.tau, delta=args.delta,
                          allocation=args.allocation, horizon=max(1, args.max_new_tokens))
        repair = RepairPolicy(mode=args.repair, block_tokens=args.block_tokens) if args.gate else None
    except ValueError as exc:
        print(f"witcert run: {exc}", file=sys.stderr)
        return 2
    if args.outliers and args.dtype != "float16":
        print("witcert run: --outliers stores the bypassed channels exactly in fp16, so the model "
              f"must run in float16 (a {args.dtype} value that fp16 cannot hold is flagged and "
              "its certificate is +inf): add --dtype float16", file=sys.stderr)
        return 2
    import torch

    model, tok = load_model(args.model, device=args.device, dtype=getattr(torch, args.dtype))
    try:
        outlier_idx = _outlier_idx(args, model, tok) if args.outliers else None
        print(f"--- {args.prompt}\n", flush=True)
        res = generate(model, tok, [args.prompt], max_new_tokens=args.max_new_tokens, quant=quant,
                       cert=cert, cache_cfg=None, page_size=args.page_size, chat=not args.no_chat,
                       outlier_idx=outlier_idx, repair=repair,
                       stream=lambda s: print(s, end="", flush=True))
    except ValueError as exc:  # configuration refused by the pool or the cache
        print(f"\nwitcert run: {exc}", file=sys.stderr)
        return 2
    print("\n")
    b, st, s = res.bytes, res.cache_stats, res.cert_summary
    n_new = len(res.token_ids[0])
    print(f"generated {n_new} tokens in {res.seconds:.2f} s ({res.tokens_per_second:.2f} tokens/s; "
          f"prompt {res.prompt_tokens[0]} tokens)")
    print(f"KV memory: {b['bytes_per_token']} B/token with {b['method']} vs "
          f"{b['fp16_bytes_per_token']} B/token fp16 ({100 * b['saved_fraction']:.1f}% saved; "
          f"{b['bytes_per_token_head_side']} vs {b['fp16_bytes_per_token_head_side']} B per "
          "token, head and side)")
    if s is None:
        print("certificates: disabled")
    else:
        kind = args.radius
        if st["det_fallback_steps"]:
            kind += f" (det on {st['det_fallback_steps']} steps past the horizon)"
        cov = "n/a" if s["coverage"] is None else f"{100 * s['coverage']:.2f}%"
        ovf = "n/a" if s["overflow_fraction"] is None else f"{100 * s['overflow_fraction']:.2f}%"
        print(f"certificates: {s['records']} (layer, head, step) records over {s['steps']} decode "
              f"steps; coverage at tau={s['tau']:g}: {cov}; overflow (+inf): {ovf}; finite max "
              f"{_fmt(s['finite_max'])}, mean {_fmt(s['finite_mean'])}; radius {kind}; "
              f"risk allocation {st['allocation']}, delta {args.delta:g}")
        g = st.get("gate")
        if g is not None:
            print(f"gate ({g['mode']}, tau={g['tau']:g}): {g['steps_gated']} of {g['steps']} steps "
                  f"gated; {g['heads_gated']} (layer, head, step) certificates over tau, "
                  f"{g['heads_repaired']} repaired to <= tau; {g['blocks_paged']} blocks, "
                  f"{g['entries_paged']} (token, KV head) entries, {g['bytes_paged']} B paged in; "
                  f"cert before max {_fmt(g['cert_before_max'])}, after max "
                  f"{_fmt(g['cert_after_max'])}; exact store {g['exact_store_bytes']} B")
        if st["nonfinite_token_heads"]:
            print(f"warning: {st['nonfinite_token_heads']} stored (token, KV head) rows were "
                  "non-finite; their certificates are +inf")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"prompt": args.prompt, "text": res.texts[0], "token_ids": res.token_ids[0],
                       "seconds": res.seconds, "tokens_per_second": res.tokens_per_second,
                       "bytes": b, "cache_stats": st, "cert_summary": s}, f, indent=1)
    return 0
