"""WitCertCache inside transformers: generation, padding, chunked prefill, NaN, capacity.

Tests marked ``model`` run on the bundled SmolLM2-135M (30 layers, 9 query heads, 3 KV
heads, D=64), converted once per machine by ``ensure_local_model`` (session fixture).
The others use a tiny randomly initialised Llama: a real transformers model, just small.
The pure-torch reference decode is slow on CPU (seconds per step), so runs are short.
"""

from __future__ import annotations

import math

import pytest
import torch

from witcert.config import CacheConfig, CertConfig, QuantConfig
from witcert.hf import register
from witcert.hf.cache import WitCertCache
from witcert.hf.model import UnsupportedModelError, check_supported
from witcert.runtime.slots import CapacityError

PROMPT = "What is the capital of France?"


class Recorder:
    """Observer keeping every layer's decode certificate ``[B, Hq]``."""

    wants_radius = False

    def __init__(self):
        self.certs: list[tuple[int, torch.Tensor]] = []

    def on_decode(self, *, layer_idx, q, out, slots_per_seq, pool):
        assert q.dtype == torch.float32 and q.dim() == 3
        assert len(slots_per_seq) == q.shape[0]
        self.certs.append((layer_idx, out.cert.clone()))

    def steps(self, num_layers: int) -> torch.Tensor:
        """cert [steps, L, B, Hq] (layers must arrive in order 0..L-1 every step)."""
        layers = [layer for layer, _ in self.certs]
        assert layers == list(range(num_layers)) * (len(layers) // num_layers)
        c = torch.stack([c for _, c in self.certs])
        return c.reshape(-1, num_layers, *c.shape[1:])


# ---- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def smol():
    pytest.importorskip("transformers")
    from witcert.hf.model import bundled_gguf_path, load_model

    try:
        bundled_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    register()
    model, tok = load_model()
    return model, tok


def _cache(model, *, quant=QuantConfig(seed=3), cert=CertConfig(), pages=32, observer=None):
    return WitCertCache.from_model(model, quant=quant, cert=cert, observer=observer,
                                   cache=CacheConfig(page_size=16, num_pages=pages))


def _encode(tok, prompts, chat=True):
    from witcert.hf.generate import format_prompts

    tok.padding_side = "left"
    return tok(format_prompts(tok, prompts, chat=chat), return_tensors="pt", padding=True,
               add_special_tokens=False)


def _greedy(model, enc, n, cache=None):
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=n, do_sample=False, cache=cache,
                             pad_token_id=model.generation_config.pad_token_id)
    return out[:, enc["input_ids"].shape[1]:]


def _tiny(kv_heads=2, layers=2, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=32,
                      max_position_embeddings=256, pad_token_id=0, **kw)
    register()
    model = LlamaForCausalLM(cfg).eval()
    model.set_attn_implementation("witcert")
    return model


# ---- bundled model -------------------------------------------------------------------------
@pytest.mark.model
def test_greedy_generation_certifies_every_layer_and_head_each_step_and_tracks_sdpa(smol):
    model, tok = smol
    enc = _encode(tok, [PROMPT])
    n_new = 6
    model.set_attn_implementation("sdpa")
    ref = _greedy(model, enc, n_new)
    model.set_attn_implementation("witcert")
    rec = Recorder()
    cache = _cache(model, cert=CertConfig(horizon=n_new), observer=rec)
    got = _greedy(model, enc, n_new, cache)
    steps = got.shape[1] - 1  # the first token comes from the (exact) prefill
    L, Hq = model.config.num_hidden_layers, model.config.num_attention_heads
    certs = rec.steps(L)
    assert certs.shape == (steps, L, 1, Hq)
    assert torch.isfinite(certs).all() and (certs >= 0).all()
    summary = cache.cert_log.summary()
    assert summary["steps"] == steps and summary["records"] == steps * L * Hq
    assert all(n == steps for row in summary["per_layer_head"]["count"] for n in row)
    assert summary["invalid"] == 0 and summary["overflow"] == 0
    # prefill is exact: the first token is sdpa's; the compressed decode keeps tracking it
    assert got[0, 0] == ref[0, 0]
    assert torch.equal(got[0], ref[0]), (tok.decode(got[0]), tok.decode(ref[0]))
    stats = cache.stats()
    assert stats["tokens_stored"] == enc["input_ids"].shape[1] + steps
    assert stats["nonfinite_token_heads"] == 0 and stats["det_fallback_steps"] == 0


@pytest.mark.model
def test_left_padded_batch_gives_the_tokens_of_single_runs(smol):
    # rtn8 (no dither): the stored values do not depend on the slot, so a sequence must
    # decode identically alone and in a padded batch. (With dither8 the dither is keyed
    # by slot, and a batch places a sequence in other slots than a single run: its noise
    # differs, by design, so near-tied tokens may legitimately differ.)
    model, tok = smol
    model.set_attn_implementation("witcert")
    prompts = [PROMPT, "Name a color."]
    quant, cert = QuantConfig(method="rtn8"), CertConfig(radius="det", horizon=3)
    enc = _encode(tok, prompts)
    assert (enc["attention_mask"] == 0).any(), "the batch must actually be padded"
    cache = _cache(model, quant=quant, cert=cert)
    batched = _greedy(model, enc, 3, cache)
    real = enc["attention_mask"].sum(1).tolist()
    alloc = cache.pool.allocator
    assert [alloc.seq_len(s) for s in cache._seq_ids] == [n + 2 for n in real], \
        "padding tokens were stored"
    for b, p in enumerate(prompts):
        single = _greedy(model, _encode(tok, [p]), 3, _cache(model, quant=quant, cert=cert))
        assert torch.equal(batched[b], single[0]), (b, tok.decode(batched[b]), tok.decode(single[0]))


@pytest.mark.model
@pytest.mark.parametrize("method, tol", [("fp16", 5e-2), ("dither8", None)])
def test_chunked_prefill_matches_one_shot_prefill(smol, method, tol):
    model, tok = smol
    model.set_attn_implementation("witcert")
    ids = _encode(tok, [PROMPT + " Answer in one word."])["input_ids"]
    n, split = ids.shape[1], ids.shape[1] - 7
    quant = QuantConfig(method=method, seed=11)
    cert = CertConfig(radius="det")
    with torch.no_grad():
        one = model(input_ids=ids, cache=_cache(model, quant=quant, cert=cert)).logits[0, split:]
        cache = _cache(model, quant=quant, cert=cert)
        model(input_ids=ids[:, :split], cache=cache)
        two = model(input_ids=ids[:, split:], cache=cache).logits[0]
    assert cache.get_seq_length() == n and cache.stats()["tokens_stored"] == n
    assert torch.isfinite(two).all()
    assert torch.equal(one.argmax(-1), two.argmax(-1))
    err = (one - two).abs().max().item()
    scale = one.abs().max().item()
    # fp16 storage: only fp16 rounding of the prefix; dither8: INT8 noise, still small
    assert err < (tol if tol is not None else 0.05 * scale), (err, scale)


@pytest.mark.model
def test_witcert_attention_without_our_cache_is_plain_exact_attention(smol):
    model, tok = smol
    enc = _encode(tok, [PROMPT, "Hi"])
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        ref = model(**enc).logits
        model.set_attn_implementation("witcert")
        got = model(**enc).logits  # the model makes its own DynamicCache
    real = enc["attention_mask"].bool()
    assert (got[real] - ref[real]).abs().max() < 1e-3


@pytest.mark.model
def test_nan_keys_in_one_layer_give_inf_for_that_group_only_and_generation_continues(smol):
    model, tok = smol
    model.set_attn_implementation("witcert")
    cfg = model.config
    L, Hq, Hkv, D = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    bad_layer, bad_kv = 5, 1
    armed = {"on": True}

    def poison(module, args, out):
        if out.shape[1] == 1 and armed["on"]:  # the first decode step only
            armed["on"] = False
            out = out.clone()
            out[..., bad_kv * D:(bad_kv + 1) * D] = math.nan
            return out
        return None

    handle = model.model.layers[bad_layer].self_attn.k_proj.register_forward_hook(poison)
    rec = Recorder()
    cache = _cache(model, cert=CertConfig(horizon=4), observer=rec)
    try:
        got = _greedy(model, _encode(tok, [PROMPT]), 4, cache)
    finally:
        handle.remove()
    assert not armed["on"] and got.shape[1] == 4
    certs = rec.steps(L)[:, :, 0]  # [steps, L, Hq]
    assert certs.shape[0] == 3
    group = torch.arange(Hq) // (Hq // Hkv) == bad_kv
    # the poisoned token is in every later step's context: +inf for its group, every step
    assert torch.isposinf(certs[:, bad_layer, group]).all()
    assert torch.isfinite(certs[:, bad_layer, ~group]).all()
    others = torch.ones(L, dtype=torch.bool)
    others[bad_layer] = False
    assert torch.isfinite(certs[:, others]).all()
    s = cache.cert_log.summary()
    assert s["overflow"] == 3 * int(group.sum()) and s["invalid"] == 0
    assert cache.stats()["nonfinite_token_heads"] == 1


# ---- tiny random Llama (fast) --------------------------------------------------------------
@pytest.mark.parametrize("kv_heads", [4, 2])  # MHA and GQA
def test_capacity_error_before_any_overwrite(kv_heads):
    model = _tiny(kv_heads=kv_heads)
    ids = torch.randint(1, 97, (1, 16))
    cache = _cache(model, pages=1)  # exactly the prompt: 16 tokens
    with torch.no_grad():
        model(input_ids=ids, cache=cache)
        snap = [t.clone() for lkv in cache.pool.layers for t in (*lkv.k.values(), *lkv.v.values())]
        epochs = cache.pool.epochs.clone()
        with pytest.raises(CapacityError, match="KV pool full"):
            model(input_ids=ids[:, :1], cache=cache)
    now = [t for lkv in cache.pool.layers for t in (*lkv.k.values(), *lkv.v.values())]
    assert all(torch.equal(a, b) for a, b in zip(snap, now))
    assert torch.equal(epochs, cache.pool.epochs)
    assert cache.get_seq_length() == 16, "a refused step must not advance the cache"
    with pytest.raises(CapacityError):  # a prefill that does not fit at all
        with torch.no_grad():
            model(input_ids=torch.randint(1, 97, (1, 17)), cache=_cache(model, pages=1))


def test_tiny_mha_decode_certifies_every_head():
    model = _tiny(kv_heads=4)
    rec = Recorder()
    cache = _cache(model, observer=rec, cert=CertConfig(horizon=3))
    with torch.no_grad():
        out = model.generate(input_ids=torch.randint(1, 97, (2, 9)), max_new_tokens=4,
                             do_sample=False, cache=cache, pad_token_id=0)
    assert out.shape == (2, 13)
    certs = rec.steps(2)
    assert certs.shape == (3, 2, 2, 4) and torch.isfinite(certs).all()
    assert cache.stats()["det_fallback_steps"] == 0


def test_steps_past_a_fixed_horizon_fall_back_to_the_deterministic_radius():
    model = _tiny()
    cache = _cache(model, cert=CertConfig(horizon=2))
    with torch.no_grad():
        model.generate(input_ids=torch.randint(1, 97, (1, 5)), max_new_tokens=5, do_sample=False,
                       cache=cache, pad_token_id=0)
    assert cache.stats()["decode_steps"] == 4 and cache.stats()["det_fallback_steps"] == 2


def test_chunked_prefill_certifies_every_new_token_and_takes_one_budget_step_per_column():
    from witcert.ref.cert import delta_local

    model = _tiny()
    cache = _cache(model, cert=CertConfig(allocation="anytime"))
    ids = torch.randint(1, 97, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        model(input_ids=ids[:, :9], cache=cache)   # exact prefill: no certificate
        model(input_ids=ids[:, 9:15], cache=cache)  # a chunk of 6 over the compressed prefix
        assert cache.budget_steps == 6 and cache.decode_steps == 0
        model(input_ids=ids[:, 15:], cache=cache)   # one decode step: the 7th index
    L, Hq = 2, 4
    pre = cache.cert_log.summary()["prefill"]
    assert pre["records"] == L * Hq * 2 * 6 and pre["invalid"] == 0 and pre["overflow"] == 0
    assert pre["finite_max"] is not None and pre["finite_max"] < 1.0
    assert cache.cert_log.summary()["records"] == L * Hq * 2  # the decode step, counted apart
    assert cache.budget_steps == 7 and cache.decode_steps == 1
    want = delta_local(delta=cache.cert.delta, num_layers=L, num_q_heads=Hq, allocation="anytime",
                       step=7)
    assert torch.allclose(cache._plan.delta_loc.double(), torch.tensor(want, dtype=torch.float64),
                          rtol=1e-6)


def test_a_chunk_past_a_fixed_horizon_uses_the_deterministic_radius():
    model = _tiny()
    cache = _cache(model, cert=CertConfig(horizon=4))
    ids = torch.randint(1, 97, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        model(input_ids=ids[:, :6], cache=cache)
        model(input_ids=ids[:, 6:], cache=cache)  # 6 columns, the horizon is 4
    assert cache.stats()["det_fallback_steps"] == 6 and cache._plan.cert.radius == "det"
    assert cache.cert_log.summary()["prefill"]["records"] == 2 * 4 * 6


@pytest.mark.parametrize("make, match", [
    (lambda: __import__("transformers").MistralConfig(sliding_window=1024), "sliding"),
    (lambda: __import__("transformers").Qwen2Config(use_sliding_window=True, sliding_window=512,
                                                    max_window_layers=0), "not supported"),
    (lambda: __import__("transformers").DeepseekV3Config(), "MLA"),
    (lambda: __import__("transformers").T5Config(), "encoder-decoder"),
    (lambda: __import__("transformers").GPT2Config(), "not supported"),
])
def test_unsupported_configs_are_refused_with_a_reason(make, match):
    with pytest.raises(UnsupportedModelError, match=match):
        check_supported(make())


def test_supported_configs_pass():
    import transformers as tf

    check_supported(tf.LlamaConfig(num_attention_heads=8, num_key_value_heads=8))  # MHA
    check_supported(tf.LlamaConfig(num_attention_heads=8, num_key_value_heads=2))  # GQA
    check_supported(tf.Qwen2Config())  # sliding window off by default
    check_supported(tf.MistralConfig(sliding_window=None))


def test_wrong_cache_setups_fail_at_construction():
    model = _tiny()
    with pytest.raises(ValueError, match="needs a dither method"):
        _cache(model, quant=QuantConfig(method="rtn8"), cert=CertConfig(radius="min"))
    model.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match="attn_implementation"):
        _cache(model)
