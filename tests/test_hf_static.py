"""Static decode planning (the CUDA-graph-ready path) on CPU, against per-forward planning.

A tiny random Llama (a real transformers model, just small) decodes greedily twice from
the same prompt with the same dither seed: once through ``WitCertCache``'s usual
per-forward plans, once through ``CapturedDecoder(use_graph=False)`` (preallocated
device tensors updated in place before each step, certificates folded into the
``CertLog`` by device ops). The GPU replay of the same path: tests/test_hf_graph_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

from witcert.config import CacheConfig, CertConfig, QuantConfig
from witcert.hf import register
from witcert.hf.cache import WitCertCache
from witcert.hf.generate import cache_kwarg
from witcert.hf.graph import CapturedDecoder

pytest.importorskip("transformers")

L, HQ, B, STEPS = 2, 4, 3, 6


def _tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=256, num_hidden_layers=L,
                      num_attention_heads=HQ, num_key_value_heads=2, head_dim=32,
                      max_position_embeddings=256, pad_token_id=0)
    register()
    model = LlamaForCausalLM(cfg).eval()
    model.set_attn_implementation("witcert")
    return model


def _cache(model, *, cert=CertConfig(), backup=True, **kw):
    return WitCertCache.from_model(model, quant=QuantConfig(seed=11), cert=cert,
                                   cache=CacheConfig(page_size=16, num_pages=12, exact_backup=backup),
                                   **kw)


def _prompt():
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 97, (B, 15), generator=gen)
    mask = torch.ones(B, 15, dtype=torch.int64)
    mask[1, :4] = 0  # left padding: rows of different real lengths
    mask[2, :9] = 0
    return ids, mask


@torch.no_grad()
def _dynamic(model, cache, ids, mask, steps):
    """Greedy decode with per-forward planning; logits [steps + 1, B, V]."""
    kw = {cache_kwarg(model): cache, "use_cache": True}
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, **kw)
    logits = [out.logits[:, -1]]
    p = mask.sum(-1, keepdim=True)
    for _ in range(steps):
        tok = logits[-1].argmax(-1, keepdim=True)
        logits.append(model(input_ids=tok, position_ids=p, **kw).logits[:, -1])
        p = p + 1
    return torch.stack(logits)


@torch.no_grad()
def _static(model, cache, ids, mask, steps, capacity=48):
    dec = CapturedDecoder(model, cache, capacity=capacity, use_graph=False)
    first = dec.prefill(ids, mask)
    logits, toks = [], [first]
    for _ in range(steps):
        toks.append(dec.step())
        logits.append(dec.logits.clone())
    return dec, torch.stack(logits), torch.stack(toks, 1)


def test_static_plan_decodes_bitwise_like_per_forward_plans_with_the_same_certificates():
    model = _tiny()
    ids, mask = _prompt()
    dyn_cache, st_cache = _cache(model), _cache(model)
    ref = _dynamic(model, dyn_cache, ids, mask, STEPS)
    dec, got, toks = _static(model, st_cache, ids, mask, STEPS)
    assert torch.equal(got, ref[1:]), (got - ref[1:]).abs().max()
    assert torch.equal(toks, ref.argmax(-1).T)
    a, b = dyn_cache.cert_log.summary(), st_cache.cert_log.summary()
    assert a["records"] == b["records"] == STEPS * L * HQ * B and b["steps"] == STEPS
    for key in ("covered", "overflow", "invalid", "finite_max", "finite_mean", "histogram"):
        assert a[key] == b[key], key
    assert b["per_layer_head"]["count"] == [[STEPS * B] * HQ] * L
    for (sa, la, ca), (sb, lb, cb) in zip(dyn_cache.cert_log.samples(), st_cache.cert_log.samples()):
        assert (sa, la) == (sb, lb) and torch.equal(ca, cb)
    assert (dec.eager_steps, dec.replays) == (STEPS, 0)
    # the exact host backup received every decoded token, as with per-forward plans
    dyn_cache.pool.flush_backup_()
    st_cache.pool.flush_backup_()
    for layer in range(L):
        assert torch.equal(dyn_cache.pool.backup.k[layer], st_cache.pool.backup.k[layer])
        assert torch.equal(dyn_cache.pool.backup.v[layer], st_cache.pool.backup.v[layer])
    assert st_cache.stats()["tokens_stored"] == dyn_cache.stats()["tokens_stored"]


def test_static_decode_crosses_pages_switches_certificates_and_returns_to_dynamic_plans():
    model = _tiny()
    ids, mask = _prompt()
    cache = _cache(model, backup=False)
    dec = CapturedDecoder(model, cache, capacity=64, use_graph=False)
    dec.prefill(ids, mask)
    for _ in range(3):
        dec.step()
    cache.set_cert(CertConfig(enabled=False))
    for _ in range(2):
        dec.step()
    cache.set_cert(CertConfig())
    dec.step()
    assert cache.cert_log.summary()["steps"] == 4  # steps with certificates only
    dec.close()
    seen = cache.get_seq_length()
    # per-forward planning continues where the static steps stopped
    kw = {cache_kwarg(model): cache, "use_cache": True}
    with torch.no_grad():
        model(input_ids=dec.next_tokens[:, None], position_ids=mask.sum(-1, keepdim=True) + 6, **kw)
    assert cache.get_seq_length() == seen + 1
    assert cache.cert_log.summary()["records"] == 5 * L * HQ * B


def test_static_decode_refuses_bad_setups_with_clear_errors():
    model = _tiny()
    ids, mask = _prompt()
    with pytest.raises(ValueError, match="run the prefill first"):
        _cache(model).begin_static_decode_(capacity=32)
    with pytest.raises(ValueError, match="use_graph=True needs the model on a CUDA device"):
        CapturedDecoder(model, _cache(model), capacity=32, use_graph=True)

    class Obs:
        def on_decode(self, **kw):
            pass

    with pytest.raises(ValueError, match="observer"):
        CapturedDecoder(model, _cache(model, observer=Obs()), capacity=32, use_graph=False).prefill(ids, mask)
    dec = CapturedDecoder(model, _cache(model), capacity=16, use_graph=False)
    dec.prefill(ids, mask)  # the longest row holds 15 tokens
    dec.step()  # its 16th fits
    with pytest.raises(ValueError, match="capacity"):
        dec.step()
    cache = _cache(model)
    dec = CapturedDecoder(model, cache, capacity=32, use_graph=False)
    dec.prefill(ids, mask)
    with pytest.raises(RuntimeError, match="static_step_"):
        with torch.no_grad():
            model(input_ids=ids[:, :1], position_ids=mask.sum(-1, keepdim=True),
                  **{cache_kwarg(model): cache, "use_cache": True})


def test_store_prompt_kv_stores_exactly_what_a_prefill_of_the_same_keys_stores():
    model = _tiny()
    ids = torch.randint(1, 97, (2, 20), generator=torch.Generator().manual_seed(5))
    pre, filled = _cache(model), _cache(model)
    seen = {}
    update = pre.update

    def recording_update(key, value, layer_idx, *args, **kwargs):
        seen[layer_idx] = (key.clone(), value.clone())
        return update(key, value, layer_idx, *args, **kwargs)

    pre.update = recording_update
    with torch.no_grad():
        model(input_ids=ids, **{cache_kwarg(model): pre, "use_cache": True})
    filled.store_prompt_kv_(lambda i: seen[i], batch_size=2, prompt_len=20)
    assert filled.get_seq_length() == 20 and filled.stats()["tokens_stored"] == 40
    for a, b in zip(pre.pool.layers, filled.pool.layers):
        for side in ("k", "v"):
            for name, t in getattr(a, side).items():
                assert torch.equal(t, getattr(b, side)[name]), (side, name)
    with pytest.raises(ValueError, match="expected"):
        _cache(model).store_prompt_kv_(lambda i: seen[i], batch_size=2, prompt_len=19)
    with pytest.raises(ValueError, match="must be empty"):
        filled.store_prompt_kv_(lambda i: seen[i], batch_size=2, prompt_len=20)
