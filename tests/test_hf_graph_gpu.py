"""GPU only: the whole transformers decode step with ``WitCertCache`` replayed from a CUDA graph.

A small random Llama in bf16 (D = 128, GQA 4, three left-padded prompts of different
lengths, one of them long enough for several KV splits) decodes greedily through
``CapturedDecoder`` twice with the same dither seed: replayed from CUDA graphs, and
eagerly through the same static path. Claims: every replayed step is bitwise the eager
step (logits, tokens, certificates, the exact host backup); the ``CertLog`` holds a
certificate for every (layer, head, sequence) of every step, recomputed at each replay;
replays run with no host-device synchronisation (``set_sync_debug_mode("error")``); the
static path agrees with per-forward planning (fp32 model, float tolerance: the static
block table is wider, so the split-KV merge sums over more, empty, partials).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")
pytest.importorskip("transformers")

from witcert.config import CacheConfig, CertConfig, QuantConfig  # noqa: E402
from witcert.hf import register  # noqa: E402
from witcert.hf.cache import WitCertCache  # noqa: E402
from witcert.hf.generate import cache_kwarg  # noqa: E402
from witcert.hf.graph import CapturedDecoder  # noqa: E402

L, HQ, HKV, D, V = 3, 8, 2, 128, 512
LENS = (1100, 700, 40)  # real prompt tokens per row (left padding up to 1100)
STEPS, CAPACITY = 9, 1200


def _model(dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=HQ * D, intermediate_size=2048, num_hidden_layers=L,
                      num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=D,
                      max_position_embeddings=4096, pad_token_id=0)
    register()
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    model.set_attn_implementation("witcert")
    return model


def _prompt():
    gen = torch.Generator().manual_seed(1)
    T = max(LENS)
    ids = torch.randint(1, V, (len(LENS), T), generator=gen)
    mask = torch.zeros(len(LENS), T, dtype=torch.int64)
    for b, n in enumerate(LENS):
        mask[b, T - n:] = 1
    return ids.cuda(), mask.cuda()


def _cache(model):
    return WitCertCache.from_model(model, quant=QuantConfig(seed=7), cert=CertConfig(horizon=64),
                                   cache=CacheConfig(page_size=16, num_pages=3 * CAPACITY // 16 + 3))


def _decode(model, *, use_graph, steps=STEPS):
    cache = _cache(model)
    dec = CapturedDecoder(model, cache, capacity=CAPACITY, use_graph=use_graph)
    ids, mask = _prompt()
    toks, logits = [dec.prefill(ids, mask)], []
    for _ in range(steps):
        toks.append(dec.step())
        logits.append(dec.logits.clone())
    torch.cuda.synchronize()
    return dict(dec=dec, cache=cache, toks=torch.stack(toks, 1), logits=torch.stack(logits))


@pytest.fixture(scope="module")
def bf16_model():
    return _model(torch.bfloat16)


@pytest.fixture(scope="module")
def runs(bf16_model):
    return _decode(bf16_model, use_graph=False), _decode(bf16_model, use_graph=True)


def test_replayed_decode_steps_are_bitwise_the_eager_steps(runs):
    eager, graph = runs
    dec = graph["dec"]
    assert dec.eager_steps == 1 and dec.captures == 1 and dec.replays == STEPS - 1
    diff = (graph["logits"].float() - eager["logits"].float()).abs().amax(dim=(1, 2))
    assert torch.equal(graph["logits"], eager["logits"]), f"max |diff| per step {diff.tolist()}"
    assert torch.equal(graph["toks"], eager["toks"])
    sa, sb = eager["cache"].cert_log.samples(), graph["cache"].cert_log.samples()
    assert len(sa) == len(sb) == STEPS
    for (step_a, _, ca), (step_b, _, cb) in zip(sa, sb):
        assert step_a == step_b and torch.equal(ca, cb), f"certificates differ at step {step_a}"
    for cache in (eager["cache"], graph["cache"]):
        cache.pool.flush_backup_()
    for ka, kb in zip(eager["cache"].pool.backup.k, graph["cache"].pool.backup.k):
        assert torch.equal(ka, kb)


def test_every_replayed_step_logs_a_fresh_certificate_per_layer_head_and_sequence(runs):
    _, graph = runs
    log = graph["cache"].cert_log
    n = STEPS
    s = log.summary()
    assert s["steps"] == n and s["records"] == n * L * HQ * len(LENS) and s["invalid"] == 0
    assert s["per_layer_head"]["count"] == [[n * len(LENS)] * HQ] * L
    prev = None
    for step, layers, certs in log.samples():
        assert layers == list(range(L)) and certs.shape == (L, len(LENS), HQ)
        assert torch.isfinite(certs).all() and (certs > 0).all(), f"step {step}"
        assert prev is None or not torch.equal(certs, prev), f"step {step} repeats the previous certificates"
        prev = certs


def test_replayed_steps_never_synchronise_with_the_host(bf16_model):
    cache = _cache(bf16_model)
    dec = CapturedDecoder(bf16_model, cache, capacity=CAPACITY)
    dec.prefill(*_prompt())
    dec.step()  # eager warm-up
    dec.step()  # capture, replay
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising call now raises
    try:
        for _ in range(4):  # host planning, pinned copies, replay, certificate bookkeeping, backup
            dec.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert dec.replays == 5 and dec.captures == 1
    assert cache.cert_log.summary()["records"] == 6 * L * HQ * len(LENS)


@torch.no_grad()
def test_static_plan_agrees_with_per_forward_plans_on_the_gpu():
    model = _model(torch.float32)
    static = _decode(model, use_graph=True)
    cache = _cache(model)
    kw = {cache_kwarg(model): cache, "use_cache": True}
    ids, mask = _prompt()
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    model(input_ids=ids, attention_mask=mask, position_ids=pos, **kw)
    p = mask.sum(-1, keepdim=True)
    for i in range(STEPS):  # teacher-forced with the static run's tokens
        logits = model(input_ids=static["toks"][:, i:i + 1], position_ids=p + i, **kw).logits[:, -1]
        torch.testing.assert_close(logits, static["logits"][i], atol=1e-4, rtol=1e-4)
    a, b = static["cache"].cert_log.summary(), cache.cert_log.summary()
    assert a["records"] == b["records"]
    assert abs(a["finite_mean"] - b["finite_mean"]) <= 1e-4 * b["finite_mean"]
