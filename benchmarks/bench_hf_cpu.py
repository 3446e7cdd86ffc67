"""CPU tokens/s of greedy generation on the bundled model: witcert vs the plain sdpa
baseline, measured in the same run on the same prompt (issue 3's benchmark).

    python benchmarks/bench_hf_cpu.py [--new-tokens 32] [--prompt-repeat 1] [--threads 2]
    python benchmarks/bench_hf_cpu.py --suite gate [--repeats 3] [--new-tokens 32]

Prints one table row per configuration with the ratio to the baseline. Greedy decoding,
same prompt, the baseline is ``model.generate`` with transformers' own DynamicCache and
the sdpa attention; witcert is ``witcert.hf.generate.generate`` through ``witcert.runtime.dispatch``
(``WITCERT_BACKEND`` auto: the native C decode / write for dither8 on CPU, the reference for
rtn8), plus one dither8 row forced onto the pure-torch reference (``WITCERT_BACKEND=ref``)
for comparison. The ``backend`` column is what ``witcert.runtime.dispatch`` picked for the decode.

``--suite gate`` (issue 16): gating and outlier bypass on the native path, each against the
ungated native path of the same model dtype, measured in the same run: fp32 model: native,
native gated (``--gate block``, tau 0.2), the reference, the reference gated; fp16 model
(bypassed values must be fp16): native, native with m = 4 outlier pairs (a profile
calibrated once on the first 1024 tokens of CPython's pydoc topics, as ``witcert eval
sweep`` does), the same gated, the reference with m = 4. Every configuration runs
``--repeats`` times, round robin (so load drift on a shared machine hits all of them
alike); the table gives the median tok/s, the ratio to the native ungated row of its
dtype, the gated heads per step and the coverage at tau of the delivered certificates.
Implemented in ``bench_hf_gate.py``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from witcert.runtime import dispatch as wc_backend
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
    ap.add_argument("--suite", choices=("backends", "gate"), default="backends",
                    help="backends: the table above (default); gate: gating and outliers")
    ap.add_argument("--repeats", type=int, default=3, help="--suite gate: runs per configuration")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.suite == "gate":
        from bench_hf_gate import run_suite
        run_suite(new_tokens=args.new_tokens, prompt_repeat=args.prompt_repeat,
                  repeats=args.repeats, threads=args.threads, prompt=PROMPT)
        return
    model, tok = load_model()
    prompt = " ".join([PROMPT] * args.prompt_repeat)
    baseline(model, tok, prompt, 2)  # warm-up
    base = baseline(model, tok, prompt, args.new_tokens)
    rows = [("sdpa (transformers DynamicCache)", "-", base)]
    env = os.environ.get("WITCERT_BACKEND")
    for name, quant, cert, force in [
        ("witcert dither8 b16, cert min", QuantConfig(), CertConfig(), None),
        ("witcert dither8 b8, cert min", QuantConfig(dither_bits=8), CertConfig(), None),
        ("witcert dither8 b16, cert off", QuantConfig(), CertConfig(enabled=False), None),
        ("witcert rtn8, cert det", QuantConfig(method="rtn8"), CertConfig(radius="det"), None),
        ("witcert dither8 b16, cert min", QuantConfig(), CertConfig(), "ref"),
    ]:
        if force is not None:
            os.environ["WITCERT_BACKEND"] = force
        try:
            picked = _picked_backend(model, quant)
            res = generate(model, tok, [prompt], max_new_tokens=args.new_tokens, quant=quant,
                           cert=cert)
        finally:
            if env is None:
                os.environ.pop("WITCERT_BACKEND", None)
            else:
                os.environ["WITCERT_BACKEND"] = env
        rows.append((name, picked, res.tokens_per_second))
    print(f"threads={args.threads} new_tokens={args.new_tokens} prompt_repeat={args.prompt_repeat}")
    print(f"{'configuration':40s} {'backend':>8s} {'tok/s':>8s} {'vs sdpa':>8s}")
    for name, picked, tps in rows:
        print(f"{name:40s} {picked:>8s} {tps:8.2f} {tps / base:8.3f}")


def _picked_backend(model, quant: QuantConfig) -> str:
    """What ``witcert.runtime.dispatch`` picks for a CPU decode of ``model`` over a ``quant`` pool."""
    from witcert.ref.pool import LayerKV
    cfg = model.config
    hq, hkv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", cfg.num_attention_heads)
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // hq
    lkv = LayerKV.allocate(num_slots=16, num_kv_heads=hkv, head_dim=d, quant=quant, layer=0,
                           seed=0, epochs=torch.zeros(16, dtype=torch.int64))
    return wc_backend.backend_for(torch.zeros(1, hq, d), lkv)


if __name__ == "__main__":
    main()
