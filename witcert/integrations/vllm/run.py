"""Offline vLLM run on the bundled model: greedy tokens, throughput, capacity, certificates.

One engine per process (the plugin's backend override is process-global), so tests and
benchmarks call this as a subprocess, once with ``WITCERT_VLLM=on`` and once without:

    WITCERT_VLLM=on python -m witcert.integrations.vllm.run --out on.json
    python -m witcert.integrations.vllm.run --out off.json

The JSON holds the prompts, generated token ids and text, wall time of ``generate``,
decode tokens/s, the KV capacity vLLM allocated (blocks x block size), and with witcert
on the merged certificate summary of the worker(s). ``--prompt-tokens N`` puts a distinct
context of about N tokens in front of every question (long prompts: the extend path).
"""

from __future__ import annotations

import argparse
import json
import time

PROMPTS = (
    "The capital of France is",
    "Write a short poem about the sea.",
    "Explain what a hash table is in one paragraph.",
    "List three prime numbers and explain why they are prime.",
    "Once upon a time, in a small village,",
    "The three laws of thermodynamics are",
    "Translate to French: Good morning, how are you?",
    "def fibonacci(n):",
)


def chat(tokenizer, prompt: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


def long_prompts(tokenizer, n: int, tokens: int) -> list[str]:
    """n questions, each after its own ~``tokens``-token context (the questions' text
    repeated, tagged with the prompt number so no two prompts share a cached prefix)."""
    filler = " ".join(PROMPTS) + " "
    ids = tokenizer(filler * (tokens // 40 + 2), add_special_tokens=False)["input_ids"][:tokens]
    context = tokenizer.decode(ids)
    return [chat(tokenizer, f"Document {i}. {context}\n\nQuestion: {PROMPTS[i % len(PROMPTS)]}")
            for i in range(n)]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=None, help="model dir (default: the bundled SmolLM2)")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--kv-cache-memory-bytes", type=int, default=256 * 2**20)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--warmup", action="store_true", help="one untimed generate first")
    ap.add_argument("--prompt-tokens", type=int, default=0,
                    help="put a distinct ~N-token context before every question (0: short "
                         "prompts)")
    args = ap.parse_args(argv)

    from vllm import LLM, SamplingParams

    from witcert.integrations.vllm import settings
    from witcert.integrations.vllm.lifecycle import Instance
    from witcert.integrations.vllm.model import ensure_model_dir
    from witcert.integrations.vllm.stats import merge, read_snapshots

    model = args.model or str(ensure_model_dir())
    llm = LLM(model=model, dtype=args.dtype, enforce_eager=True, seed=0,
              max_model_len=args.max_model_len, kv_cache_memory_bytes=args.kv_cache_memory_bytes,
              kv_cache_dtype=args.kv_cache_dtype, max_num_seqs=max(8, args.num_prompts))
    tok = llm.get_tokenizer()
    prompts = long_prompts(tok, args.num_prompts, args.prompt_tokens) if args.prompt_tokens \
        else [chat(tok, p) for p in (PROMPTS * 8)[:args.num_prompts]]
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    if args.warmup:
        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    cc = llm.llm_engine.vllm_config.cache_config
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    res = {
        "witcert": settings.enabled(),
        "model": model, "dtype": args.dtype, "max_tokens": args.max_tokens,
        "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
        "num_blocks": cc.num_gpu_blocks, "block_size": cc.block_size,
        "capacity_tokens": None if cc.num_gpu_blocks is None else cc.num_gpu_blocks * cc.block_size,
        "wall_s": wall, "output_tokens": n_out, "tokens_per_s": n_out / wall,
        "prompt_tokens_per_s": sum(len(o.prompt_token_ids) for o in outs) / wall,
        "prompts": [o.prompt for o in outs],
        "prompt_tokens": [len(o.prompt_token_ids) for o in outs],
        "token_ids": [list(o.outputs[0].token_ids) for o in outs],
        "text": [o.outputs[0].text for o in outs],
    }
    if settings.enabled():
        s = settings.load()
        inst = Instance.decode(s.instance) if s.instance else None
        res["certs"] = merge(read_snapshots(s.stats_dir, instance=inst and inst.token))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    llm.llm_engine.engine_core.shutdown()  # stop the engine-core and worker processes
    return res


if __name__ == "__main__":
    r = main()
    print(json.dumps({k: r[k] for k in ("witcert", "capacity_tokens", "tokens_per_s",
                                        "prompt_tokens_per_s", "wall_s")}))
