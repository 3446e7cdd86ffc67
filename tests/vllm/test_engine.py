"""vLLM with the witcert plugin, end to end on the bundled model (slow: 40-100 s per engine).

Each engine runs in its own subprocess; see conftest.py. Agreement numbers are printed
(``-s`` shows them) and asserted against a floor, not hidden.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from witcert_vllm_helpers import ENGINE_TIMEOUT_S, NEEDS_VLLM, engine_env, run_offline

pytestmark = [pytest.mark.vllm, pytest.mark.slow, NEEDS_VLLM]

NUM_LAYERS, NUM_Q_HEADS = 30, 9  # SmolLM2-135M
MAX_TOKENS = 24


def _agreed_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _looks_like_text(s: str) -> bool:
    words = re.findall(r"[A-Za-z]{2,}", s)
    return len(words) >= 3 and len(set(words)) >= 3


@pytest.fixture(scope="module")
def offline_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("offline")
    args = ["--num-prompts", "4", "--max-tokens", str(MAX_TOKENS)]
    rc_on, on, log_on = run_offline(tmp, "on", witcert=True, args=args)
    assert rc_on == 0, log_on[-4000:]
    rc_off, off, log_off = run_offline(tmp, "off", witcert=False, args=args)
    assert rc_off == 0, log_off[-4000:]
    return on, off, tmp


def test_offline_generate_is_coherent_and_agrees_with_vllm(offline_runs):
    on, off, _ = offline_runs
    assert on["prompts"] == off["prompts"]
    prefixes = [_agreed_prefix(a, b) for a, b in zip(on["token_ids"], off["token_ids"])]
    exact = sum(p == MAX_TOKENS for p in prefixes)
    mean = sum(prefixes) / (len(prefixes) * MAX_TOKENS)
    print(f"\ngreedy agreement witcert vs vLLM: identical {exact}/{len(prefixes)} prompts, "
          f"mean agreed prefix {mean:.2%}, prefixes {prefixes}")
    for t in on["text"]:
        assert _looks_like_text(t), t
    assert all(p >= 1 for p in prefixes), "first greedy token must match on every prompt"
    assert mean >= 0.5


def test_offline_certificates_cover_every_layer_and_decode_token(offline_runs):
    on, off, tmp = offline_runs
    c = on["certs"]
    decode_tokens = sum(len(t) - 1 for t in on["token_ids"])  # first token comes from prefill
    assert c["decode_tokens"] == decode_tokens
    assert c["per_layer_count"] == [decode_tokens * NUM_Q_HEADS] * NUM_LAYERS
    assert c["certificates"] == decode_tokens * NUM_LAYERS * NUM_Q_HEADS
    assert c["invalid"] == 0
    assert sum(c["histogram"]) + c["overflow"] == c["certificates"]
    assert 0.0 <= c["coverage"] <= 1.0
    print(f"\ncoverage@{c['tau']} {c['coverage']:.4f}, overflow {c['overflow_fraction']:.2e}, "
          f"max finite cert {c['finite_max']:.3g}")
    assert "certs" not in off  # plugin off: no witcert state at all


def test_offline_capacity_follows_witcert_byte_account(offline_runs):
    on, off, _ = offline_runs
    info = on["certs"]["info"]
    # same KV memory: tokens scale with 1 / bytes per token (block rounding aside)
    assert info["witcert_bytes_per_token"] == NUM_LAYERS * 3 * 2 * (64 + 4 * 64 // 32)
    assert info["baseline_bytes_per_token"] == NUM_LAYERS * 3 * 2 * 64 * 2  # bf16
    assert on["capacity_tokens"] == info["witcert_capacity_tokens"]
    ratio = on["capacity_tokens"] / off["capacity_tokens"]
    print(f"\nKV capacity at {on['kv_cache_memory_bytes']} B: witcert {on['capacity_tokens']} "
          f"tokens, vLLM {off['capacity_tokens']} tokens ({ratio:.2f}x)")
    assert ratio == pytest.approx(256 / 144, rel=0.02)


def test_offline_gate_fires_repairs_and_is_counted(tmp_path):
    """WITCERT_VLLM_GATE=on with a small tau: the gate fires, repairs from the exact copy,
    and its counters reach the merged snapshot; generation still produces every token."""
    n_prompts, max_tokens, tau = 2, 12, 0.05
    rc, res, log = run_offline(
        tmp_path, "gate", witcert=True,
        args=["--num-prompts", str(n_prompts), "--max-tokens", str(max_tokens),
              "--kv-cache-memory-bytes", str(64 * 2**20)],
        extra_env={"WITCERT_VLLM_GATE": "on", "WITCERT_VLLM_TAU": str(tau)})
    assert rc == 0, log[-4000:]
    assert [len(t) for t in res["token_ids"]] == [max_tokens] * n_prompts
    for t in res["text"]:
        assert _looks_like_text(t), t
    c, g = res["certs"], res["certs"]["gate"]
    decode_tokens = n_prompts * (max_tokens - 1)
    assert c["decode_tokens"] == decode_tokens
    assert c["certificates"] == decode_tokens * NUM_LAYERS * NUM_Q_HEADS
    assert c["invalid"] == 0 and c["tau"] == tau
    assert c["info"]["gate"] == "block"
    assert c["info"]["exact_copy_bytes"] == \
        res["capacity_tokens"] * NUM_LAYERS * 3 * (2 * 64 * 2 + 1 + 8)  # bf16 K+V, flag, epoch
    assert g["fired"] > 0 and g["tokens"] > 0 and g["blocks"] > 0 and g["fallbacks"] == 0
    assert 0 <= g["repaired"] <= g["fired"]
    assert g["coverage_after"] >= g["coverage_before"]
    assert g["after_max"] <= g["before_max"]
    print(f"\ngate@tau={tau}: {decode_tokens} decode tokens, {c['certificates']} certificates, "
          f"fired {g['fired']}, repaired {g['repaired']}, {g['blocks']} blocks / "
          f"{g['tokens']} (token, KV head) entries made exact, coverage "
          f"{g['coverage_before']:.4f} -> {g['coverage_after']:.4f}, max fired cert "
          f"{g['before_max']:.3g} -> {g['after_max']:.3g}, exact copy "
          f"{c['info']['exact_copy_bytes']} B")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def _post(url: str, body: dict, timeout: float = 600.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    assert m, f"{name}{labels} missing from /metrics"
    return float(m.group(1))


def test_serve_concurrent_completions_and_metrics(tmp_path):
    """A live server with the gate on: completions, then witcert's certificate and gate
    metrics on a real /metrics scrape (the ungated engine path is the offline tests')."""
    from witcert.integrations.vllm.model import ensure_model_dir

    model, port = str(ensure_model_dir()), _free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
         "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--enforce-eager",
         "--max-model-len", "1024", "--kv-cache-memory-bytes", str(256 * 2**20)],
        env=engine_env(tmp_path, witcert=True, extra={"WITCERT_VLLM_GATE": "on"}), stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + ENGINE_TIMEOUT_S
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-4000:]
            try:
                if _get(f"{base}/health", timeout=2) is not None:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server did not become healthy"
            time.sleep(2)
        prompts = [f"Question {i}: name a colour and explain why people like it." for i in range(4)]
        results: list = [None] * len(prompts)

        def one(i):
            results[i] = _post(f"{base}/v1/completions", {
                "model": model, "prompt": prompts[i], "max_tokens": 12, "temperature": 0.0,
                "ignore_eos": True})

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        completion_tokens = [r["usage"]["completion_tokens"] for r in results]
        assert completion_tokens == [12] * len(prompts)
        decode_tokens = sum(n - 1 for n in completion_tokens)
        text = _get(f"{base}/metrics")
        assert _metric(text, "witcert_decode_tokens_total") == decode_tokens
        certs = _metric(text, "witcert_certificates_total")
        assert certs == decode_tokens * NUM_LAYERS * NUM_Q_HEADS
        assert _metric(text, "witcert_certificate_count") == certs
        assert _metric(text, "witcert_invalid_total") == 0
        cov = _metric(text, "witcert_coverage", '{tau="0.2"}')
        assert 0.0 <= cov <= 1.0
        assert 0 < _metric(text, "witcert_decode_steps_total") <= decode_tokens
        assert _metric(text, "witcert_kv_capacity_tokens", '{cache="witcert"}') > \
            _metric(text, "witcert_kv_capacity_tokens", '{cache="baseline"}')
        assert "vllm:" in text  # vLLM's own metrics are still there
        fired = _metric(text, "witcert_gate_fired_total")
        repaired = _metric(text, "witcert_gate_repaired_total")
        assert 0 <= repaired <= fired <= certs
        assert _metric(text, "witcert_gate_unrepaired_total") == fired - repaired
        assert _metric(text, "witcert_gate_coverage_after", '{tau="0.2"}') == cov
        before = _metric(text, "witcert_gate_coverage_before", '{tau="0.2"}')
        assert before <= cov
        assert (fired == 0) == (before == 1.0)  # a fired certificate is one not covered before
        assert _metric(text, "witcert_gate_exact_copy_bytes") > 0
        if fired:
            assert _metric(text, "witcert_gate_repaired_tokens_total") > 0
            assert _metric(text, "witcert_gate_cert_max", '{when="after"}') <= \
                _metric(text, "witcert_gate_cert_max", '{when="before"}')
        print(f"\n/metrics: {decode_tokens} decode tokens, {certs:.0f} certificates, "
              f"coverage@0.2 {before:.4f} before / {cov:.4f} after repair, gate fired {fired:.0f}, "
              f"repaired {repaired:.0f}")
    finally:
        os.kill(proc.pid, signal.SIGTERM)  # the server by its own PID
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: engine core and worker
            proc.wait(timeout=30)
        log.close()


def _tiny_llama(tmp: Path, *, head_dim: int) -> Path:
    """A 1-layer random Llama (SmolLM2 tokenizer) with an unsupported head size."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from witcert.integrations.vllm.model import ensure_model_dir

    src = ensure_model_dir()
    cfg = LlamaConfig(vocab_size=49152, hidden_size=2 * head_dim, intermediate_size=64,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=head_dim, max_position_embeddings=1024, tie_word_embeddings=True)
    out = tmp / f"tiny-llama-hd{head_dim}"
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


@pytest.mark.parametrize("case", ["kv_cache_dtype_fp8", "head_dim_80"])
def test_unsupported_setting_fails_at_startup_with_a_witcert_error(tmp_path, case):
    if case == "kv_cache_dtype_fp8":
        args, want = ["--kv-cache-dtype", "fp8"], "--kv-cache-dtype"
    else:
        model = _tiny_llama(tmp_path, head_dim=80)
        args, want = ["--model", str(model)], "head_size 80 is not a multiple"
    rc, res, log = run_offline(tmp_path, case, witcert=True, args=["--max-tokens", "2", *args])
    assert rc != 0 and res is None
    assert "witcert:" in log and want in log, log[-4000:]


_REPLAY = r'''
import json, sys
import torch
from vllm import LLM, SamplingParams
from witcert.integrations.vllm import backend
from witcert.integrations.vllm.model import ensure_model_dir
from witcert.integrations.vllm.run import PROMPTS, chat

SENTINEL = 2**40  # no position: marks the slots a generate did not write


def written(rt):
    """Slots whose position was written since the last mark (then marks them all again)."""
    if rt is None or rt.positions is None or caching:  # cached blocks keep their positions
        return None
    s = (rt.positions != SENTINEL).nonzero().flatten().tolist()
    with torch.inference_mode():  # made inside a forward pass: an inference tensor
        rt.positions.fill_(SENTINEL)  # no live request between the generates
    return s


caching = sys.argv[3] == "caching"  # prefix caching on, a long prompt, small prefill chunks
kw = dict(enable_prefix_caching=True, max_num_batched_tokens=40) if caching else dict(
    enable_prefix_caching=False)
llm = LLM(model=str(ensure_model_dir()), dtype="bfloat16", enforce_eager=True, seed=0,
          max_model_len=512, kv_cache_memory_bytes=64 * 2**20, max_num_seqs=8, **kw)
tok = llm.get_tokenizer()
sp = SamplingParams(temperature=0.0, max_tokens=int(sys.argv[2]), ignore_eos=True, logprobs=0)
a = chat(tok, " ".join(PROMPTS * 3) if caching else PROMPTS[0])  # caching: ~250 tokens
prompt_tokens = len(tok(a)["input_ids"])
llm.generate([chat(tok, PROMPTS[7])], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
written(backend._RUNTIME)
r1 = llm.generate([a], sp, use_tqdm=False)[0]
first = list(r1.outputs[0].token_ids)
s1 = written(backend._RUNTIME)
llm.generate([chat(tok, p) for p in PROMPTS[1:4]], sp, use_tqdm=False)  # other traffic
written(backend._RUNTIME)
r2 = llm.generate([a], sp, use_tqdm=False)[0]
again = list(r2.outputs[0].token_ids)
s2 = written(backend._RUNTIME)
json.dump({"first": first, "again": again, "slots_first": s1, "slots_again": s2,
           "prompt_tokens": prompt_tokens, "cached_first": r1.num_cached_tokens or 0,
           "cached_again": r2.num_cached_tokens or 0,
           "logprobs": [[next(iter(d.values())).logprob for d in r.outputs[0].logprobs]
                        for r in (r1, r2)]}, open(sys.argv[1], "w"))
llm.llm_engine.engine_core.shutdown()
'''


def _replay(tmp_path, mode: str) -> dict:
    out = tmp_path / f"replay_{mode}.json"
    # ONEDNN_MAX_CPU_ISA: on a CPU with AMX, oneDNN's bf16 matmuls (the model's linear layers,
    # not witcert) round differently for different row counts, so a prompt prefilled in other
    # chunks gets other K/V bits before witcert sees them (measured 2026-12-03 on an AMX host:
    # stock vLLM's completion itself changes on this prefix-cache hit, logprobs by 2.19). Capped
    # below AMX the engine's matmuls are row-count invariant and what remains is witcert's part.
    env = engine_env(tmp_path, witcert=True,
                     extra={"WITCERT_VLLM_DITHER_KEY": "position",
                            "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
                            "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})  # the runtime in-process
    proc = subprocess.run([sys.executable, "-c", _REPLAY, str(out), "24", mode], env=env,
                          capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(out.read_text())


def test_position_key_answers_the_same_greedy_prompt_identically_after_other_traffic(tmp_path):
    """WITCERT_VLLM_DITHER_KEY=position (issue 18): the same greedy prompt served again after
    other requests lands in other KV slots (prefix caching off, so nothing is reused) and
    still gets the identical completion, since its dither depends only on token positions
    and the server nonce. (With the slot key and this seed, the same run's second completion
    differs from the first at token 23 of 24: measured 2026-12-01.)"""
    res = _replay(tmp_path, "nocache")
    assert len(res["first"]) == 24 and res["first"] == res["again"]
    if res["slots_first"] is not None:  # the worker ran in this process: placement visible
        assert res["slots_first"] and res["slots_first"] != res["slots_again"], res
    print(f"\nposition key: same completion from slots {res['slots_first'][:3]}... and "
          f"{(res['slots_again'] or [])[:3]}...")


def test_position_key_answers_a_prefix_cache_hit_identically(tmp_path):
    """Prefix caching on (vLLM's default) and 40-token prefill chunks (not aligned with the
    16-token blocks): a 234-token prompt is served, then other traffic, then the same prompt
    again, which hits the prefix cache (cached blocks not recomputed, the rest prefilled in
    other chunks). With the position key the extend rows read every token from the pool (the
    pool-read extend, docs/VLLM.md "Dither key"), so the second greedy completion is identical
    and so are its logprobs (measured 2026-12-01: difference 0; with the old extend, exact
    reads of each step's own tokens, the completion matched but the logprobs differed by
    0.0226)."""
    res = _replay(tmp_path, "caching")
    assert res["prompt_tokens"] >= 200, res["prompt_tokens"]
    assert res["cached_again"] > res["cached_first"] and res["cached_again"] >= 64, res
    assert len(res["first"]) == 24 and res["first"] == res["again"], res
    lp1, lp2 = res["logprobs"]
    diff = max(abs(x - y) for x, y in zip(lp1, lp2))
    print(f"\nposition key, prefix cache hit: {res['cached_again']} of {res['prompt_tokens']} "
          f"prompt tokens cached, same completion, max |logprob difference| {diff:.3g}")
    assert diff <= 1e-4, (lp1, lp2)
