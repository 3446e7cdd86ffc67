"""CPU tokens/s of greedy generation on the bundled model: witcert vs the plain sdpa
baseline, measured in the same run on the same prompt (issue 3's benchmark).

    python benchmarks/bench_hf_cpu.py [--new-tokens 32] [--prompt-repeat 1] [--threads 2]

Prints one table row per configuration with the ratio to the baseline. Greedy decoding,
same prompt, the baseline is ``model.generate`` with transformers' own DynamicCache and
the sdpa attention; witcert is ``witcert.hf.generate.generate`` (reference backend on CPU).
"""

from __future__ import annotations

import argparse
import time

import torch

from witcert.config import CertConfig, QuantConfig
from witcert.hf.generate import format_prompts, generate
from witcert.hf.model import load_model

PROMPT = "Explain in two sentences why the sky is blue."


def baseline(model, tok, prompt: str, new_tokens: int) -> float:
    text = format_prompts(tok, [prompt], chat=True)
    enc = tok(text, return_tensors="pt", add_special_tokens=False)
    model.set_attn_implementation("sdpa")
    t0 = time.perf_counter()
    out = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False)
    dt = time.perf_counter() - t0
    assert out.shape[1] - enc["input_ids"].shape[1] == new_tokens
    return new_tokens / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--prompt-repeat", type=int, default=1,
                    help="repeat the prompt to lengthen the context")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model()
    prompt = " ".join([PROMPT] * args.prompt_repeat)
    baseline(model, tok, prompt, 2)  # warm-up
    base = baseline(model, tok, prompt, args.new_tokens)
    rows = [("sdpa (transformers DynamicCache)", base)]
    for name, quant, cert in [
        ("witcert dither8 b16, cert min", QuantConfig(), CertConfig()),
        ("witcert dither8 b8, cert min", QuantConfig(dither_bits=8), CertConfig()),
        ("witcert dither8 b16, cert off", QuantConfig(), CertConfig(enabled=False)),
        ("witcert rtn8, cert det", QuantConfig(method="rtn8"), CertConfig(radius="det")),
    ]:
        res = generate(model, tok, [prompt], max_new_tokens=args.new_tokens, quant=quant, cert=cert)
        rows.append((name, res.tokens_per_second))
    print(f"threads={args.threads} new_tokens={args.new_tokens} prompt_repeat={args.prompt_repeat}")
    print(f"{'configuration':40s} {'tok/s':>8s} {'vs sdpa':>8s}")
    for name, tps in rows:
        print(f"{name:40s} {tps:8.2f} {tps / base:8.3f}")


if __name__ == "__main__":
    main()
