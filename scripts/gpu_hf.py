"""HF generation on the bundled model on one GPU, through the Triton kernels.

    python scripts/gpu_hf.py --gguf PATH [--new-tokens 32] [--out FILE]

Greedy decoding of a few chat prompts with transformers' own sdpa path (baseline, same
run), with witcert through the Triton kernels (``WITCERT_BACKEND`` auto on CUDA), and with
the pure-torch reference on the same GPU (``WITCERT_BACKEND=ref``). Prints per
configuration: tokens/s and its ratio to the baseline, greedy-token agreement with the
baseline (tokens before the first divergence, per prompt), certificate count, coverage at
tau, finite max/mean, and for the kernels the relative difference of the mean certificate
to the reference's.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from witcert.config import CertConfig, QuantConfig
from witcert.hf.generate import format_prompts, generate
from witcert.hf.model import load_model

PROMPTS = ["Explain in two sentences why the sky is blue.",
           "Write a haiku about the sea.",
           "What is the capital of France? Answer briefly.",
           "List three uses of a paperclip."]


def sdpa_generate(model, tok, prompts, new_tokens):
    text = format_prompts(tok, prompts, chat=True)
    enc = tok(text, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    model.set_attn_implementation("sdpa")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    ids = out[:, enc["input_ids"].shape[1]:].tolist()
    return ids, len(prompts) * new_tokens / dt


def agree(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model, tok = load_model(args.gguf, dtype=getattr(torch, args.dtype), device="cuda")
    n = args.new_tokens
    rows = []
    for batch in (1, 4):
        prompts = PROMPTS[:batch]
        sdpa_generate(model, tok, prompts, 2)  # warm-up
        base_ids, base_tps = sdpa_generate(model, tok, prompts, n)
        rows.append(dict(config=f"B{batch} sdpa (transformers)", tok_s=round(base_tps, 1), x_sdpa=1.0))
        ref_mean = None
        for backend, quant, cert in (("ref", QuantConfig(), CertConfig()),
                                     ("auto", QuantConfig(), CertConfig()),
                                     ("auto", QuantConfig(), CertConfig(enabled=False)),
                                     ("auto", QuantConfig(dither_bits=8), CertConfig())):
            os.environ["WITCERT_BACKEND"] = backend
            generate(model, tok, prompts, max_new_tokens=2, quant=quant, cert=cert)  # warm-up / compile
            res = generate(model, tok, prompts, max_new_tokens=n, quant=quant, cert=cert)
            name = (f"B{batch} witcert {'triton' if backend == 'auto' else 'reference'} b{quant.dither_bits} "
                    f"cert {'on' if cert.enabled else 'off'}")
            row = dict(config=name, tok_s=round(res.tokens_per_second, 1),
                       x_sdpa=round(res.tokens_per_second / base_tps, 3),
                       agree=[agree(a, b) for a, b in zip(res.token_ids, base_ids)])
            s = res.cert_summary
            if s is not None:
                row.update(records=s["records"], coverage=round(s["coverage"], 4), overflow=s["overflow"],
                           invalid=s["invalid"], finite_max=s["finite_max"], finite_mean=s["finite_mean"])
                if backend == "ref" and quant.dither_bits == 16:
                    ref_mean = s["finite_mean"]
                elif quant.dither_bits == 16 and ref_mean:
                    row["mean_vs_ref"] = f"{abs(s['finite_mean'] - ref_mean) / ref_mean:.2e}"
            rows.append(row)
            print(row, flush=True)
            if batch == 1 and backend == "auto" and cert.enabled and quant.dither_bits == 16:
                print("text:", repr(res.texts[0][:200]), flush=True)
    os.environ.pop("WITCERT_BACKEND", None)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    cols = ["config", "tok_s", "x_sdpa", "agree", "records", "coverage", "invalid", "finite_max", "mean_vs_ref"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))


if __name__ == "__main__":
    main()
