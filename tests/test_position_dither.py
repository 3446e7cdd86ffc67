"""Position-keyed dither (CacheConfig(dither_key="position"), docs/MATH.md §6).

Claims: a sequence's dither depends on its tokens' positions and its nonce, not on the slots
it lands in, so the same sequence written at other slots (another batch, other traffic)
decodes to the bitwise same output and certificate, in the reference, the Triton kernels and
the native C path (codes, decode and extend); a different nonce gives a different dither; the
slot-keyed default is unchanged; bad nonces and gating with the position key are refused;
transformers generation with the position key runs on the native path on CPU.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from witcert.config import CacheConfig, CertConfig, QuantConfig  # noqa: E402
from witcert.runtime.pool import PagedPool  # noqa: E402
from witcert.ref import attention as ref_attn  # noqa: E402
from witcert.runtime.slots import SlotAllocator  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _pool(num_pages=8, *, key="position"):
    return PagedPool(num_layers=1, num_kv_heads=2, head_dim=64, quant=QuantConfig(dither_bits=8, seed=11),
                     cache=CacheConfig(page_size=16, num_pages=num_pages, dither_key=key, exact_backup=False),
                     device=DEV)


def _write_and_decode(pool, *, occupy: int, nonce: int, k, v, q, impl):
    """Occupy ``occupy`` tokens of another sequence first (so the target lands elsewhere),
    write the target sequence, decode it."""
    al = pool.allocator
    if occupy:
        other = al.new_seq_id()
        s = al.allocate(other, occupy)
        pool.layers[0].k["codes"][s] = 1  # anything: never read by the target
    sid = al.new_seq_id()
    if nonce is not None:
        al.set_nonce(sid, nonce)
    slots = al.allocate(sid, k.shape[0])
    layer = pool.layers[0]
    if impl == "native":
        from witcert.runtime import dispatch as backend
        from witcert.native.write import write_
        if not _native_ok():
            pytest.skip("native library unavailable")
        write_(layer, k, v, slots=slots)
        assert backend.backend_for(q, layer) == "native"
        terms = {}
        dec = lambda *a, **kw: backend.decode_attention(*a, terms=terms, **kw)  # noqa: E731
    elif impl == "ref":
        from witcert.ref.pool import write_
        write_(layer, k, v, slots=slots)
        dec = ref_attn.decode_attention
    else:
        from witcert.kernels.decode import decode_attention as dec
        from witcert.kernels.plan import decode_plan
        from witcert.kernels.write import write_kv_
        write_kv_(layer, k, v, slots=slots)
        plan = decode_plan("cuda:0" if DEV == "cuda" else "cpu")
        dec = lambda *a, **kw: decode_attention(*a, plan=plan, **kw)  # noqa: E731
        from witcert.kernels.decode import decode_attention
    bt, sl = al.block_table([sid]), al.seq_lens([sid])
    out = dec(q, layer, bt, sl, page_size=16, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-6)
    if impl == "native":
        assert terms["backend"] == "native"
    return slots, out


def _native_ok() -> bool:
    from witcert import native
    return DEV == "cpu" and native.available()


def _stored(pool, slots):
    return [t[slots] for side in (pool.layers[0].k, pool.layers[0].v) for t in side.values()]


@pytest.mark.parametrize("impl", ["ref", "triton", "native"])
def test_same_sequence_at_other_slots_gives_bitwise_the_same_result(impl):
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(37, 2, 64, generator=g).half().to(DEV) for _ in range(2))
    q = torch.randn(1, 4, 64, generator=g).to(DEV)
    p1, p2 = _pool(), _pool()
    s1, a = _write_and_decode(p1, occupy=0, nonce=1234, k=k, v=v, q=q, impl=impl)
    s2, b = _write_and_decode(p2, occupy=40, nonce=1234, k=k, v=v, q=q, impl=impl)
    assert not torch.equal(s1, s2)  # placed elsewhere
    assert all(torch.equal(x, y) for x, y in zip(_stored(p1, s1), _stored(p2, s2)))  # same codes
    assert torch.equal(a.out, b.out) and torch.equal(a.cert, b.cert) and torch.equal(a.lse, b.lse)
    if impl == "native":  # the native extend over the prefix placed at either slots
        from witcert.native.extend import extend_one
        kn, vn = k[:5].float() * 0.5, v[:5].float()
        qn = torch.randn(5, 4, 64, generator=g)
        e1, e2 = (extend_one(qn, kn, vn, p.layers[0], s, sm_scale=0.125,
                             cert=CertConfig(radius="min"), delta_loc=1e-6)
                  for p, s in ((p1, s1), (p2, s2)))
        assert torch.equal(e1.out, e2.out) and torch.equal(e1.cert, e2.cert)
        from witcert.ref.extend import extend_attention_cert
        spec = extend_attention_cert(qn, kn, vn, p1.layers[0], s1, sm_scale=0.125,
                                     cert=CertConfig(radius="min"), delta_loc=1e-6)
        # the C extend's fp32 dots (its default) add their slack: ~4e-4 of these certificates
        torch.testing.assert_close(e1.cert, spec.cert, rtol=1e-3, atol=1e-5)
        bt = (s1[::16] // 16).to(torch.int32)[None]  # the pages of the first placement
        ref = ref_attn.decode_attention(q, p1.layers[0], bt, torch.tensor([37], dtype=torch.int32),
                                        page_size=16, sm_scale=0.125, cert=CertConfig(),
                                        delta_loc=1e-6)
        torch.testing.assert_close(a.out, ref.out, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a.cert, ref.cert, rtol=1e-5, atol=1e-6)
    _, c = _write_and_decode(_pool(), occupy=0, nonce=99, k=k, v=v, q=q, impl=impl)
    assert not torch.equal(a.out, c.out)  # another nonce, another dither


def test_slot_keyed_default_depends_on_placement():
    g = torch.Generator().manual_seed(1)
    k, v = (torch.randn(20, 2, 64, generator=g).half().to(DEV) for _ in range(2))
    q = torch.randn(1, 4, 64, generator=g).to(DEV)
    _, a = _write_and_decode(_pool(key="slot"), occupy=0, nonce=None, k=k, v=v, q=q, impl="ref")
    _, b = _write_and_decode(_pool(key="slot"), occupy=40, nonce=None, k=k, v=v, q=q, impl="ref")
    assert not torch.equal(a.out, b.out)


def test_allocator_records_positions_and_nonces_and_keeps_epochs_on_free():
    al = SlotAllocator(num_pages=4, page_size=16, dither_key="position")
    a = al.new_seq_id()
    al.set_nonce(a, 7)
    s = al.allocate(a, 20)
    assert torch.equal(al.positions[s], torch.arange(20)) and bool((al.epochs[s] == 7).all())
    s2 = al.allocate(a, 3)
    assert torch.equal(al.positions[s2], torch.arange(20, 23))
    al.free(a)
    b = al.new_seq_id()
    sb = al.allocate(b, 5)  # a fresh secret nonce when none is set
    assert torch.equal(al.positions[sb], torch.arange(5))
    with pytest.raises(ValueError, match="nonce"):
        al.set_nonce(al.new_seq_id(), 2**32)
    with pytest.raises(ValueError, match="already holds tokens"):
        al.set_nonce(b, 3)
    with pytest.raises(ValueError, match="slot-keyed"):
        SlotAllocator(num_pages=1, page_size=16).set_nonce(0, 1)


def test_bad_dither_key_is_refused():
    with pytest.raises(ValueError, match="dither_key"):
        CacheConfig(dither_key="token")


def test_hf_generation_with_the_position_key_runs_on_the_native_path(monkeypatch):
    """transformers generation over a position-keyed pool on CPU: every write, decode and
    chunked-prefill extend goes through the C path (spied), none through the reference."""
    pytest.importorskip("transformers")
    if not _native_ok():
        pytest.skip("native library unavailable (or not a CPU run)")
    from transformers import LlamaConfig, LlamaForCausalLM

    from witcert.hf import register
    from witcert.hf.cache import WitCertCache
    from witcert.native import decode as nd
    from witcert.native import extend as ne
    from witcert.native import write as nw
    from witcert.ref import extend as ref_extend
    from witcert.ref import pool as ref_pool

    monkeypatch.delenv("WITCERT_BACKEND", raising=False)
    calls: dict[str, int] = {}

    def spy(mod, name, tag):
        real = getattr(mod, name)

        def wrapped(*a, **kw):
            calls[tag] = calls.get(tag, 0) + 1
            return real(*a, **kw)
        monkeypatch.setattr(mod, name, wrapped)

    spy(nw, "write_", "native_write")
    spy(nd, "decode_attention_full", "native_decode")
    spy(ne, "extend_one", "native_extend")
    spy(ref_pool, "write_", "ref_write")
    spy(ref_attn, "decode_attention", "ref_decode")
    spy(ref_extend, "extend_attention_cert", "ref_extend")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      max_position_embeddings=256, pad_token_id=0)
    register()
    model = LlamaForCausalLM(cfg).eval()
    model.set_attn_implementation("witcert")
    cache = WitCertCache.from_model(model, quant=QuantConfig(seed=3), cert=CertConfig(),
                                    cache=CacheConfig(page_size=16, num_pages=8,
                                                      dither_key="position"))
    assert cache.pool.allocator.positions is not None
    ids = torch.randint(1, 97, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        model(input_ids=ids[:, :6], cache=cache)    # prefill (written natively)
        model(input_ids=ids[:, 6:11], cache=cache)  # a chunk over the compressed prefix: extend
        model(input_ids=ids[:, 11:], cache=cache)   # one decode step
    L = 2
    assert calls.get("native_write", 0) == 3 * L and calls.get("native_decode", 0) == L
    assert calls.get("native_extend", 0) >= L
    assert not any(calls.get(t) for t in ("ref_write", "ref_decode", "ref_extend")), calls
