"""Offline profile of the load harness's prompt mix: where the server's worker spends its time.

The in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) pinned like the harness's worker
(vLLM's CPU executor binds it to one core with one torch thread: BENCHMARKS 5c4), one untimed
warm-up generate, then one generate of ``--requests`` requests of the harness's mix (all
admitted at once), under cProfile with ``--profile``. The plugin's configuration comes from
the environment as for a server (``WITCERT_VLLM``, ``WITCERT_VLLM_GATE``, ``WITCERT_VLLM_TAU``).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=1 WITCERT_VLLM=on WITCERT_VLLM_GATE=on \\
        WITCERT_VLLM_TAU=0.2 taskset -c 0 python benchmarks/profile_vllm_load.py \\
        --profile /tmp/gated.prof --out /tmp/gated.json

``--rounds N`` repeats the timed generate (an in-process A/B compares trees run alternately).
``--requests 150 --max-seqs 32`` keeps 32 sequences running while the others wait, as the
harness's 32 clients do (admission as requests finish, prompts chunked into decode steps).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_load_client as cl  # noqa: E402
from bench_vllm_load import MIX  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON: wall, tokens, token ids")
    ap.add_argument("--profile", default=None, help="cProfile output of the timed generates")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-seqs", type=int, default=None,
                    help="vLLM's max_num_seqs (default: all requests at once); below --requests "
                         "the engine keeps that many running, as the harness's clients do")
    args = ap.parse_args(argv)

    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from witcert.integrations.vllm.model import ensure_model_dir

    torch.set_num_threads(1)
    model = str(ensure_model_dir())
    reqs = cl.make_requests(cl.corpus_ids(model), n=args.requests, mix=MIX, max_tokens=(32, 64),
                            seed=args.seed, prefix="p")
    llm = LLM(model=model, dtype="bfloat16", enforce_eager=True, seed=0, max_model_len=2048,
              kv_cache_memory_bytes=2**30, max_num_seqs=args.max_seqs or max(16, args.requests))
    prompts = [TokensPrompt(prompt_token_ids=list(r.prompt)) for r in reqs]
    sps = [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True) for r in reqs]
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    prof = cProfile.Profile() if args.profile else None
    walls, ids = [], None
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        outs = llm.generate(prompts, sps, use_tqdm=False)
        if prof:
            prof.disable()
        walls.append(time.perf_counter() - t0)
        ids = [list(o.outputs[0].token_ids) for o in outs]
    tokens = sum(len(t) for t in ids)
    res = {"walls_s": walls, "output_tokens": tokens, "tok_s": [tokens / w for w in walls],
           "prompt_tokens": sum(len(r.prompt) for r in reqs), "token_ids": ids}
    Path(args.out).write_text(json.dumps(res))
    if prof:
        prof.dump_stats(args.profile)
    print(json.dumps({k: v for k, v in res.items() if k != "token_ids"}))
    return res


if __name__ == "__main__":
    main()
