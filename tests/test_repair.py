"""Gating and repair (witcert.runtime.repair): each policy, persistence, accounting, soundness."""

from __future__ import annotations

import pytest
import torch

from witcert.runtime.dispatch import exact_entries
from witcert.config import CacheConfig, CertConfig, QuantConfig, RepairPolicy
from witcert.runtime.pool import PagedPool
from witcert.ref import pool as ref_pool
from witcert.ref.attention import decode_attention, exact_attention
from witcert.ref.cert import block_contributions, certificate, radius_det, tv_distance
from witcert.ref.types import K_SIDE, V_SIDE
from witcert.runtime.repair import Gate, rounding_witness
from witcert.runtime.telemetry import GatePrometheus

P, D = 16, 64
SM = D ** -0.5
CERT = CertConfig(radius="det", tau=0.05)


def make_case(*, N=100, Hkv=2, Hq=4, B=1, seed=0, backup_dtype=torch.float32, spike=60.0):
    """A one-layer pool holding B sequences of N tokens whose keys carry a large channel
    every 7th token (it inflates the group scale, so the certificate is loose)."""
    g = torch.Generator().manual_seed(seed)
    pool = PagedPool(num_layers=1, num_kv_heads=Hkv, head_dim=D, quant=QuantConfig(seed=7),
                     cache=CacheConfig(page_size=P, num_pages=8 * B), backup_dtype=backup_dtype)
    ks, vs = [], []
    for b in range(B):
        k = torch.randn(N, Hkv, D, generator=g)
        v = torch.randn(N, Hkv, D, generator=g)
        k[b::7, :, 3] = spike
        slots = pool.allocator.allocate(b, N)
        ref_pool.write_(pool.layers[0], k, v, slots=slots)
        pool.backup_write_(0, k, v, slots_host=slots)
        ks.append(k)
        vs.append(v)
    q = 3 * torch.randn(B, Hq, D, generator=g)
    return pool, q, ks, vs


def tables(pool, B):
    return pool.allocator.block_table(list(range(B))), pool.allocator.seq_lens(list(range(B)))


def decode(pool, q, B, gate=None, cert=CERT, *, reads=None):
    """The reference decode of layer 0 reading the exact entries of ``reads`` (a gate;
    default ``gate``), then ``gate``'s check and repair (None: ungated)."""
    bt, sl = tables(pool, B)
    kw = dict(page_size=P, sm_scale=SM, cert=cert, delta_loc=1e-4)
    reads = gate if reads is None else reads
    copy = None if reads is None else reads.exact_copy(0)
    out = decode_attention(q, pool.layers[0], bt, sl, **kw,
                           exact=exact_entries(copy, bt, sl, page_size=P))
    if gate is None:
        return out
    return gate.after_decode(out, q, pool.layers[0], bt, sl, **kw)


def repaired_cache(pool, gate, b, k_true, v_true):
    """The repaired cache of sequence b built independently: dequantised K/V with every
    live exact entry replaced by the true value; per-(token, kv head) exact mask."""
    slots = pool.allocator.slots(b)
    khat, kp = ref_pool.gather(pool.layers[0], K_SIDE, slots)
    vhat, _ = ref_pool.gather(pool.layers[0], V_SIDE, slots)
    _, ok = gate.store.live(0, slots)
    k = torch.where(ok[..., None], k_true, khat)
    v = torch.where(ok[..., None], v_true, vhat)
    return k, v, ok, kp["wit"]


def test_block_repair_brings_every_gated_cert_under_tau_with_fewer_bytes_than_head():
    pool, q, _, _ = make_case()
    before = decode(pool, q, 1)
    assert (before.cert > CERT.tau).any(), "the case must fire the gate"
    gb = Gate(pool, RepairPolicy(mode="block", block_tokens=16), tau=CERT.tau)
    after = decode(pool, q, 1, gb)
    assert (after.cert <= CERT.tau).all()
    gh = Gate(pool, RepairPolicy(mode="head"), tau=CERT.tau)
    head = decode(pool, q, 1, gh)
    # fp32 backup: witness 0; what remains is the fp32 rounding of the logits (PROOFS 5)
    assert (head.cert >= 0).all() and (head.cert < 1e-5).all()
    assert 0 < gb.stats.bytes_paged < gh.stats.bytes_paged
    assert gh.stats.entries_paged == 100 * int((before.cert > CERT.tau).view(2, 2).any(-1).sum())


def test_block_repair_pages_by_contribution_and_stops_as_soon_as_cert_holds():
    """One head: the first block paged is the one with the largest contribution, and the
    state one block short of the final one still had cert > tau."""
    pool, q, _, _ = make_case(Hkv=1, Hq=1, seed=3)
    bt = 16
    gate = Gate(pool, RepairPolicy(mode="block", block_tokens=bt), tau=CERT.tau)
    out0 = decode(pool, q, 1)
    assert float(out0.cert) > CERT.tau
    slots = pool.allocator.slots(0)
    khat, kp = ref_pool.gather(pool.layers[0], K_SIDE, slots)
    z = SM * khat[:, 0] @ q[0, 0]
    u = radius_det(q[0, 0], kp["wit"][:, 0], sm_scale=SM, group_size=32)
    first = int(block_contributions(z, u, block_tokens=bt).argmax())
    decode(pool, q, 1, gate)
    (_, _, _, _, before, after, order), = gate.stats.events
    assert before > CERT.tau >= after and order[0] == first and gate.stats.blocks_paged == len(order)
    # The state one block short (all but the last block paged) still had cert > tau.
    probe = Gate(pool, RepairPolicy(mode="block", block_tokens=bt), tau=1e9)
    for j in order[:-1]:
        probe.store.page_in_(0, slots[j * bt:(j + 1) * bt], 0)
    assert float(decode(pool, q, 1, probe).cert) > CERT.tau


@pytest.mark.parametrize("mode", ["block", "head"])
def test_repaired_output_equals_attention_over_the_repaired_cache(mode):
    pool, q, ks, vs = make_case(B=2)
    gate = Gate(pool, RepairPolicy(mode=mode, block_tokens=16), tau=CERT.tau)
    out = decode(pool, q, 2, gate)
    assert gate.stats.heads_gated > 0
    for b in range(2):
        k, v, ok, wit = repaired_cache(pool, gate, b, ks[b], vs[b])
        ref, p = exact_attention(q[b], k, v, sm_scale=SM, return_probs=True)
        err = (out.out[b].double() - ref).abs().max()
        assert err < 1e-5, err
        kvh = torch.arange(4) // 2
        u = radius_det(q[b], wit[:, kvh].transpose(0, 1), sm_scale=SM, group_size=32)
        u = torch.where(ok[:, kvh].T, torch.zeros_like(u), u)
        z = SM * torch.einsum("hd,nhd->hn", q[b].double(), k[:, kvh].double())
        _, c = certificate(z, u.double())
        # the path's certificate adds the arithmetic slack of its logits (PROOFS 5); c carries
        # certificate()'s own 1 + 2^-20 for float64 sums and u rounded up to f32 (radius_det
        # of an f32 q), neither of which the native path (float64 radii and sums) needs
        assert (out.cert[b].double() >= c / (1 + 2**-20) * (1 - 2**-21)).all()
        torch.testing.assert_close(out.cert[b].double(), c, rtol=1e-4, atol=1e-5)


def test_gate_lowers_error_against_exact_attention_and_stays_sound():
    """Where the gate fires the certificate is discriminative: after repair the true TV
    and the output error against exact attention both drop, and TV <= cert <= tau."""
    pool, q, ks, vs = make_case(B=2, seed=5)
    raw = decode(pool, q, 2)
    gate = Gate(pool, RepairPolicy(mode="block", block_tokens=16), tau=CERT.tau)
    rep = decode(pool, q, 2, gate)
    fired = raw.cert > CERT.tau
    assert fired.any()
    for b in range(2):
        ex, p_true = exact_attention(q[b], ks[b], vs[b], sm_scale=SM, return_probs=True)
        slots = pool.allocator.slots(b)
        khat, _ = ref_pool.gather(pool.layers[0], K_SIDE, slots)
        _, p_raw = exact_attention(q[b], khat, vs[b], sm_scale=SM, return_probs=True)
        k, v, _, _ = repaired_cache(pool, gate, b, ks[b], vs[b])
        _, p_rep = exact_attention(q[b], k, v, sm_scale=SM, return_probs=True)
        tv_raw, tv_rep = tv_distance(p_true, p_raw), tv_distance(p_true, p_rep)
        assert (tv_rep <= rep.cert[b].double() + 1e-9).all()
        f = fired[b]
        if f.any():
            assert (tv_rep[f] < tv_raw[f]).all()
            e_raw = (raw.out[b].double() - ex).norm(dim=-1)[f]
            e_rep = (rep.out[b].double() - ex).norm(dim=-1)[f]
            assert (e_rep < e_raw).all(), (e_raw, e_rep)


def test_batched_gate_leaves_rows_that_did_not_fire_bitwise_unchanged():
    pool, q, _, _ = make_case(B=2, seed=1)
    raw = decode(pool, q, 2)
    tau = float(raw.cert[0].max()) + 1.0  # row 0 never fires
    q[1] *= 3  # sharpen row 1 so that it fires
    raw = decode(pool, q, 2)
    assert (raw.cert[1] > tau).any() and not (raw.cert[0] > tau).any()
    gate = Gate(pool, RepairPolicy(mode="block"), tau=tau)
    out = decode(pool, q, 2, gate)
    assert torch.equal(out.out[0], raw.out[0]) and torch.equal(out.cert[0], raw.cert[0])
    assert (out.cert[1] <= tau).all()


class StoreBlindBackend:
    """Stands in for the Triton kernels: decodes the pool's codes, never the exact store."""

    @staticmethod
    def decode_attention(q, layer_kv, *args, **kw):
        return decode_attention(q, layer_kv, *args, **kw)  # no exact=: the codes only


def test_repaired_entries_persist_are_paged_once_and_die_with_the_slot_epoch():
    pool, q, ks, vs = make_case()
    gate = Gate(pool, RepairPolicy(mode="block", block_tokens=16), tau=CERT.tau)
    decode(pool, q, 1, gate)
    entries = gate.stats.entries_paged
    assert entries > 0
    # Next step: one more token, same query; the reference decode reads the store itself.
    g = torch.Generator().manual_seed(9)
    k1, v1 = torch.randn(1, 2, D, generator=g), torch.randn(1, 2, D, generator=g)
    s1 = pool.allocator.allocate(0, 1)
    ref_pool.write_(pool.layers[0], k1, v1, slots=s1)
    pool.backup_write_(0, k1, v1, slots_host=s1)
    out = decode(pool, q, 1, gate)
    assert (out.cert <= CERT.tau).all()
    k, v, ok, _ = repaired_cache(pool, gate, 0, torch.cat([ks[0], k1]), torch.cat([vs[0], v1]))
    assert int(ok.sum()) == gate.store.rows == gate.stats.entries_paged >= entries  # no entry twice
    torch.testing.assert_close(out.out[0].double(), exact_attention(q[0], k, v, sm_scale=SM),
                               rtol=0, atol=1e-5)
    assert gate.store.page_in_(0, pool.allocator.slots(0), 0) == 101 - int(ok[:, 0].sum())
    # Behind a backend that ignores the store, the gate recomputes the repaired row.
    bt, sl = tables(pool, 1)
    kw = dict(page_size=P, sm_scale=SM, cert=CERT, delta_loc=1e-4)
    blind = StoreBlindBackend.decode_attention(q, pool.layers[0], bt, sl, **kw)
    assert (blind.cert > out.cert).any()
    wrapped = gate.wrap(StoreBlindBackend)
    again = wrapped.decode_attention(q, pool.layers[0], bt, sl, **kw)
    assert gate.recompute_rows
    torch.testing.assert_close(again.out, decode(pool, q, 1, reads=gate).out)
    torch.testing.assert_close(again.cert, decode(pool, q, 1, reads=gate).cert)
    # Freeing the sequence bumps its slots' epochs: no entry is live for the next owner.
    pool.allocator.free(0)
    slots = pool.allocator.allocate(5, 101)
    assert not gate.store.live(0, slots)[1].any()
    gate.close()
    assert pool.exact_store is None


def test_flagged_token_with_nonfinite_backup_is_not_repairable_and_the_loop_ends():
    pool, q, ks, vs = make_case(N=40, Hkv=1, Hq=1)
    bad = pool.allocator.allocate(0, 1)
    kb = torch.full((1, 1, D), float("inf"))
    ref_pool.write_(pool.layers[0], kb, torch.zeros(1, 1, D), slots=bad)
    pool.backup_write_(0, kb, torch.zeros(1, 1, D), slots_host=bad)
    gate = Gate(pool, RepairPolicy(mode="block", block_tokens=8), tau=CERT.tau)
    out = decode(pool, q, 1, gate)
    assert torch.isposinf(out.cert).all()
    assert gate.stats.heads_gated == 1 and gate.stats.heads_repaired == 0
    assert gate.stats.blocks_paged <= 1  # the flagged block first, then it gives up


def test_mode_off_counts_and_pages_nothing():
    pool, q, _, _ = make_case()
    raw = decode(pool, q, 1)
    gate = Gate(pool, RepairPolicy(mode="off"), tau=CERT.tau)
    out = decode(pool, q, 1, gate)
    assert gate.stats.heads_gated == int((raw.cert > CERT.tau).sum()) > 0
    assert gate.stats.bytes_paged == 0 and gate.store is None
    torch.testing.assert_close(out.cert, raw.cert)


def test_nothing_fires_returns_the_backend_output_object():
    pool, q, _, _ = make_case()
    gate = Gate(pool, RepairPolicy(mode="block"), tau=1e6)
    bt, sl = tables(pool, 1)
    kw = dict(page_size=P, sm_scale=SM, cert=CERT, delta_loc=1e-4)
    out = decode_attention(q, pool.layers[0], bt, sl, **kw)
    assert gate.after_decode(out, q, pool.layers[0], bt, sl, **kw) is out
    assert gate.stats.steps == 1 and gate.stats.steps_gated == 0


def test_byte_accounting_of_paging_and_the_exact_store():
    pool, q, _, _ = make_case(backup_dtype=torch.float16)
    gate = Gate(pool, RepairPolicy(mode="block"), tau=CERT.tau)
    decode(pool, q, 1, gate)
    st, store = gate.stats, gate.store
    assert st.bytes_paged == st.entries_paged * 2 * D * 2  # K and V rows, fp16
    assert store.rows == st.entries_paged
    # K and V rows (fp16), the flag, the epoch (a rounding witness is a function of its row)
    assert store.entry_bytes() == 2 * D * 2 + 1 + 8
    assert gate.bytes_exact() == store.rows * store.entry_bytes()
    # the values are the backup itself (nothing copied): the gate allocates flags only
    cp = store.copies[0]
    assert cp.k is pool.backup.k[0] and cp.v is pool.backup.v[0] and cp.rounds
    tensors = (cp.exact, cp.exact_epoch)
    assert store.bytes_allocated() == sum(t.numel() * t.element_size() for t in tensors)


def test_fp16_backup_of_fp32_keys_gets_a_sound_nonzero_rounding_witness():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, D, generator=g) * torch.logspace(-9, 3, 500)[:, None]
    b = x.to(torch.float16)
    w = rounding_witness(b, kv_dtype=torch.float32)
    err = torch.linalg.vector_norm(x.double() - b.double(), dim=-1)
    assert (err <= w.double()).all() and (w > 0).all()
    assert (rounding_witness(b, kv_dtype=torch.float16) == 0).all()
    assert (rounding_witness(x, kv_dtype=torch.float32) == 0).all()
    # End to end: repaired certificate with an fp16 backup of fp32 keys is still sound.
    pool, q, ks, vs = make_case(backup_dtype=torch.float16, seed=2)
    gate = Gate(pool, RepairPolicy(mode="head"), tau=CERT.tau, kv_dtype=torch.float32)
    out = decode(pool, q, 1, gate)
    assert (out.cert > 0).all()  # not claimed exact
    k, v, _, _ = repaired_cache(pool, gate, 0, ks[0], vs[0])
    _, p_true = exact_attention(q[0], ks[0], vs[0], sm_scale=SM, return_probs=True)
    kstore = torch.where(gate.store.live(0, pool.allocator.slots(0))[1][..., None],
                         ks[0].half().float(), k)
    _, p_hat = exact_attention(q[0], kstore, v, sm_scale=SM, return_probs=True)
    assert (tv_distance(p_true, p_hat) <= out.cert[0].double()).all()


def test_prometheus_exports_gate_counters_monotonically():
    from prometheus_client import generate_latest

    pool, q, _, _ = make_case()
    prom = GatePrometheus()
    g1 = Gate(pool, RepairPolicy(mode="block"), tau=CERT.tau)
    prom.track(g1)
    decode(pool, q, 1, g1)
    text = generate_latest(prom.registry).decode()
    assert f"witcert_gate_bytes_paged_total {float(g1.stats.bytes_paged)}" in text
    g2 = Gate(pool, RepairPolicy(mode="block"), tau=CERT.tau)
    prom.track(g2)
    decode(pool, q, 1, g2)
    text = generate_latest(prom.registry).decode()
    total = g1.stats.heads_gated + g2.stats.heads_gated
    assert f"witcert_gate_heads_gated_total {float(total)}" in text


def test_step_check_defers_repair_to_the_next_step_without_touching_this_steps_output():
    """check="step": the step that fires returns the backend output unchanged (no host
    decision inside the step); at the next step's first layer the gate repairs with the
    stored queries, so that step is already certified <= tau."""
    pool, q, _, _ = make_case()
    raw = decode(pool, q, 1)
    gate = Gate(pool, RepairPolicy(mode="block"), tau=CERT.tau, check="step")
    first = decode(pool, q, 1, gate)
    assert torch.equal(first.cert, raw.cert) and gate.stats.heads_gated == 0
    bt, sl = tables(pool, 1)
    ops = gate.wrap(type("Ref", (), {"decode_attention": staticmethod(decode_attention)}))
    second = ops.decode_attention(q, pool.layers[0], bt, sl, page_size=P, sm_scale=SM, cert=CERT,
                                  delta_loc=1e-4)  # same cache and query: the repairs apply first
    assert gate.stats.heads_gated == int((raw.cert > CERT.tau).sum())
    assert (second.cert <= CERT.tau).all() and gate.stats.steps_gated == 1
    layer_gate = Gate(pool, RepairPolicy(mode="block"), tau=CERT.tau)
    torch.testing.assert_close(second.cert, decode(pool, q, 1, layer_gate).cert)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (Triton kernels)")
def test_gate_behind_the_triton_kernels_matches_the_reference_over_the_repaired_cache():
    """GPU: the kernels decode, the gate repairs outside them with the reference (staged
    backup flushed first), and a later step's rows holding exact entries are recomputed,
    so both steps equal the reference decode over the repaired cache."""
    from witcert.runtime import dispatch as backend
    dev = "cuda"
    pool = PagedPool(num_layers=2, num_kv_heads=2, head_dim=D, quant=QuantConfig(seed=7),
                     cache=CacheConfig(page_size=P, num_pages=16), device=dev)
    g = torch.Generator().manual_seed(0)
    B, N = 2, 100
    k = torch.randn(B * N, 2, D, generator=g)
    k[::7, :, 3] = 60.0
    k, v = k.half().to(dev), torch.randn(B * N, 2, D, generator=g).half().to(dev)
    flat, flat_host = pool.allocator.allocate_flat([0, 1], [N, N])
    for lkv in pool.layers:
        backend.write_kv_(lkv, k, v, slots=flat)
        pool.backup_write_(lkv.layer, k, v, slots_host=flat_host)
    q = 3 * torch.randn(B, 4, D, generator=g).to(dev)
    bt, sl = pool.allocator.block_table([0, 1]), pool.allocator.seq_lens([0, 1])
    kw = dict(page_size=P, sm_scale=SM, cert=CERT, delta_loc=torch.full((B,), 1e-4, device=dev))
    assert backend.backend_for(q, pool.layers[0]) == "triton"
    gate = Gate(pool, RepairPolicy(mode="block"), tau=CERT.tau, kv_dtype=torch.float16, check="layer")
    ops = gate.wrap(backend)
    for step in range(2):
        for lkv in pool.layers:
            out = ops.decode_attention(q, lkv, bt, sl, num_splits=None, **kw)
            assert gate.recompute_rows
            ref = decode_attention(q, lkv, bt, sl, **kw,  # the reference reads the store
                                   exact=exact_entries(gate.exact_copy(lkv.layer), bt, sl,
                                                      page_size=P, device=dev))
            assert (out.cert <= CERT.tau).all()
            torch.testing.assert_close(out.out, ref.out, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(out.cert, ref.cert, rtol=1e-3, atol=1e-5)
        assert gate.stats.heads_gated > 0
        if step == 0:
            paged = gate.stats.entries_paged
    assert gate.stats.entries_paged == paged  # step 2 reads the store, pages nothing new
