"""Position-keyed dither (CacheConfig(dither_key="position"), docs/MATH.md §6).

Claims: a sequence's dither depends on its tokens' positions and its nonce, not on the slots
it lands in, so the same sequence written at other slots (another batch, other traffic)
decodes to the bitwise same output and certificate, in the reference and the Triton kernels;
a different nonce gives a different dither; the slot-keyed default is unchanged; bad nonces
and gating with the position key are refused.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from witcert.config import CacheConfig, CertConfig, QuantConfig  # noqa: E402
from witcert.pool import PagedPool  # noqa: E402
from witcert.ref import attention as ref_attn  # noqa: E402
from witcert.slots import SlotAllocator  # noqa: E402

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
    if impl == "ref":
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
    return slots, dec(q, layer, bt, sl, page_size=16, sm_scale=0.125, cert=CertConfig(), delta_loc=1e-6)


@pytest.mark.parametrize("impl", ["ref", "triton"])
def test_same_sequence_at_other_slots_gives_bitwise_the_same_result(impl):
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(37, 2, 64, generator=g).half().to(DEV) for _ in range(2))
    q = torch.randn(1, 4, 64, generator=g).to(DEV)
    s1, a = _write_and_decode(_pool(), occupy=0, nonce=1234, k=k, v=v, q=q, impl=impl)
    s2, b = _write_and_decode(_pool(), occupy=40, nonce=1234, k=k, v=v, q=q, impl=impl)
    assert not torch.equal(s1, s2)  # placed elsewhere
    assert torch.equal(a.out, b.out) and torch.equal(a.cert, b.cert) and torch.equal(a.lse, b.lse)
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
