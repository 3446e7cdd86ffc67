"""The gate on the native C path: the C decode reads the gate's exact entries (the one
``witcert.runtime.exact.ExactCopy`` layout), the repair plans from the C logits and radii and never
falls back to the reference, its certificates are sound, and the one-pass plan
(``witcert.runtime.repair_plan``) stops where the greedy block repair stops."""

from __future__ import annotations

import pytest
import torch

from cases import gate_rows
from test_repair import CERT, P, SM, decode, make_case, repaired_cache, tables
from witcert import native
from witcert.runtime import dispatch as backend
from witcert.config import RepairPolicy
from witcert.ref import attention as ref_attn
from witcert.ref.attention import exact_attention
from witcert.ref.cert import block_contributions, certificate, tv_distance
from witcert.runtime.repair import Gate
from witcert.runtime.repair_plan import plan_head


@pytest.fixture(autouse=True)
def _needs_native(monkeypatch):
    if not native.available():
        pytest.skip(f"native library unavailable: {native.reason()}")
    monkeypatch.delenv("WITCERT_BACKEND", raising=False)


def _kw(cert=CERT):
    return dict(page_size=P, sm_scale=SM, cert=cert, delta_loc=1e-4)


@pytest.mark.parametrize("backup,kv_dtype", [(torch.float32, None), (torch.float16, torch.float32)])
def test_native_decode_reads_the_gates_exact_entries_like_the_reference(backup, kv_dtype):
    """After a repair, the native backend (exact entries as the C overlay, with the fp16
    backup's rounding witnesses as radii) matches the reference decode that reads the same
    entries, and its certificate bounds the TV to attention over the true keys."""
    pool, q, ks, vs = make_case(B=2, backup_dtype=backup, seed=3)
    gate = Gate(pool, RepairPolicy(mode="block", block_tokens=16), tau=CERT.tau, kv_dtype=kv_dtype)
    decode(pool, q, 2, gate)
    assert gate.store.rows > 0
    assert gate.store.copies[0].rounds == (backup == torch.float16)
    bt, sl = tables(pool, 2)
    lkv = pool.layers[0]
    assert backend.backend_for(q, lkv) == "native" and backend.reads_exact(q, lkv)
    copy = gate.exact_copy(lkv.layer)
    got = backend.decode_attention(q, lkv, bt, sl, **_kw(), exact_copy=copy)
    ref = ref_attn.decode_attention(q, lkv, bt, sl, **_kw(),
                                    exact=backend.exact_entries(copy, bt, sl, page_size=P))
    torch.testing.assert_close(got.out, ref.out, rtol=1e-5, atol=2e-6)
    # atol: on fully exact heads the reference's certificate is its fp32 logit rounding
    # (2^-24 |l|, ~1e-6 here), the native one its float64 arithmetic (~1e-14)
    torch.testing.assert_close(got.cert, ref.cert, rtol=1e-4, atol=1e-5)
    vmax = max(float(torch.linalg.vector_norm(v, dim=-1).max()) for v in vs)
    torch.testing.assert_close(got.vbound, ref.vbound, rtol=1e-4, atol=2 * 1e-5 * vmax * 1.1)
    for b in range(2):
        _, ok = gate.store.live(0, pool.allocator.slots(b))
        k, v, _, _ = repaired_cache(pool, gate, b, ks[b], vs[b])
        kread = torch.where(ok[..., None], ks[b].to(backup).float(), k)  # what the copy holds
        _, p_true = exact_attention(q[b], ks[b], vs[b], sm_scale=SM, return_probs=True)
        _, p_hat = exact_attention(q[b], kread, v, sm_scale=SM, return_probs=True)
        assert (tv_distance(p_true, p_hat) <= got.cert[b].double()).all()


def test_gate_behind_the_native_backend_never_runs_the_reference(monkeypatch):
    """Several gated steps through ``gate.wrap(witcert.runtime.dispatch)`` with the reference decode
    disabled: the first pass, the persistence and the repair all run in C."""
    pool, q, ks, vs = make_case(B=2, seed=5)
    raw = decode(pool, q, 2)
    assert (raw.cert > CERT.tau).any()

    def boom(*a, **k):
        raise AssertionError("the reference decode ran")

    monkeypatch.setattr(ref_attn, "decode_attention", boom)
    monkeypatch.setattr(ref_attn, "sequence_terms", boom)
    gate = Gate(pool, RepairPolicy(mode="block", block_tokens=16), tau=CERT.tau)
    ops = gate.wrap(backend)
    bt, sl = tables(pool, 2)
    for step in range(3):
        out = ops.decode_attention(q * (1 + 0.1 * step), pool.layers[0], bt, sl, **_kw())
        assert not gate.recompute_rows and (out.cert <= CERT.tau).all()
    assert gate.stats.heads_gated == gate.stats.heads_repaired > 0
    monkeypatch.undo()
    for b in range(2):  # the delivered output is attention over the repaired cache
        k, v, _, _ = repaired_cache(pool, gate, b, ks[b], vs[b])
        ex = exact_attention(q[b] * 1.2, k, v, sm_scale=SM)
        torch.testing.assert_close(out.out[b].double(), ex, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["block", "head"])
def test_native_and_reference_gates_deliver_sound_certificates_under_tau(mode, monkeypatch):
    pool_n, q, ks, vs = make_case(B=2, seed=1)
    pool_r, _, _, _ = make_case(B=2, seed=1)
    gn = Gate(pool_n, RepairPolicy(mode=mode, block_tokens=16), tau=CERT.tau)
    out_n = gn.wrap(backend).decode_attention(q, pool_n.layers[0], *tables(pool_n, 2), **_kw())
    monkeypatch.setenv("WITCERT_BACKEND", "ref")
    gr = Gate(pool_r, RepairPolicy(mode=mode, block_tokens=16), tau=CERT.tau)
    out_r = gr.wrap(backend).decode_attention(q, pool_r.layers[0], *tables(pool_r, 2), **_kw())
    for out, gate, pool in ((out_n, gn, pool_n), (out_r, gr, pool_r)):
        assert (out.cert <= CERT.tau).all() and gate.stats.heads_gated > 0
        for b in range(2):
            k, v, _, _ = repaired_cache(pool, gate, b, ks[b], vs[b])
            _, p_true = exact_attention(q[b], ks[b], vs[b], sm_scale=SM, return_probs=True)
            _, p_hat = exact_attention(q[b], k, v, sm_scale=SM, return_probs=True)
            assert (tv_distance(p_true, p_hat) <= out.cert[b].double()).all()
    # the same plan from float64 (native) or fp32 (reference) logits: the same entries here
    assert gn.stats.entries_paged == gr.stats.entries_paged
    torch.testing.assert_close(out_n.out, out_r.out, rtol=1e-5, atol=2e-6)


def _head_case(seed=0, n=100):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, generator=g, dtype=torch.float64) * 2
    u = torch.rand(n, generator=g, dtype=torch.float64) * 0.6
    zx = z + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    return z, u, zx, torch.zeros(n, dtype=torch.float64)


def _cert_after(z, u, zx, ux, take):
    return float(certificate(torch.where(take, zx, z), torch.where(take, ux, u))[1])


@pytest.mark.parametrize("seed", range(5))
def test_plan_is_the_greedy_block_order_and_stops_at_the_first_prefix_under_tau(seed):
    z, u, zx, ux = _head_case(seed)
    cand = torch.ones_like(z, dtype=torch.bool)
    tau = 0.05
    take, blocks = plan_head(z, u, zx, ux, cand, tau=tau, block_tokens=16)
    assert blocks and _cert_after(z, u, zx, ux, take) <= tau
    c = block_contributions(z, u, block_tokens=16)
    assert blocks == torch.sort(c, descending=True, stable=True).indices[:len(blocks)].tolist()
    short = torch.zeros_like(take)
    for j in blocks[:-1]:
        short[j * 16:(j + 1) * 16] = True
    assert _cert_after(z, u, zx, ux, short) > tau  # one block fewer is not enough


def test_plan_skips_what_cannot_help_and_head_mode_takes_every_candidate():
    z, u, zx, ux = _head_case(7)
    cand = torch.ones_like(z, dtype=torch.bool)
    u_bad = u.clone()
    u_bad[40] = float("inf")
    no = cand.clone()
    no[40] = False  # a flagged token whose copy is not finite: no repair makes cert finite
    take, blocks = plan_head(z, u_bad, zx, ux, no, tau=0.05, block_tokens=16)
    assert blocks == [] and not take.any()
    take, blocks = plan_head(z, u_bad, zx, ux, cand, tau=0.05, block_tokens=16)
    assert blocks[0] == 2 and bool(take[40])  # a repairable flagged token's block goes first
    take, blocks = plan_head(z, u, zx, ux, no, tau=0.05, block_tokens=16, whole=True)
    assert blocks == [0] and torch.equal(take, no)
    assert plan_head(z, u, zx, ux, torch.zeros_like(cand), tau=0.05, block_tokens=16)[1] == []


def test_exact_entries_die_with_the_slot_epoch_on_the_native_path():
    pool, q, _, _ = make_case(seed=2)
    gate = Gate(pool, RepairPolicy(mode="block"), tau=CERT.tau)
    decode(pool, q, 1, gate)
    bt, sl = tables(pool, 1)
    copy = gate.exact_copy(0)
    before = backend.decode_attention(q, pool.layers[0], bt, sl, **_kw(), exact_copy=copy)
    pool.epochs.add_(1)  # every slot reused: no entry may stay live (the dither moves too)
    after = backend.decode_attention(q, pool.layers[0], bt, sl, **_kw(), exact_copy=copy)
    ref = ref_attn.decode_attention(q, pool.layers[0], bt, sl, **_kw())
    assert not bool(gate.store.live(0, pool.allocator.slots(0))[1].any())
    torch.testing.assert_close(after.cert, ref.cert, rtol=1e-4, atol=1e-6)
    assert (after.cert > before.cert).any()


def _plan_rows(count: int, *, seed: int):
    """``cases.gate_rows`` (5..300 tokens) with what a live pool adds: exact radii, candidate
    subsets, blocks of 1..32 tokens."""
    g = torch.Generator().manual_seed(seed + 1)
    for trial, z, u, zx in gate_rows(count, seed=seed, n_min=5, n_max=300):
        n = z.numel()
        ux = 1e-6 * torch.rand(n, generator=g, dtype=torch.float64)
        cand = torch.rand(n, generator=g) < [1.0, 0.7, 0.3, 0.9][trial % 4]
        yield z, u, zx, ux, cand, [16, 1, 5, 32][trial % 4]


@pytest.mark.parametrize("tau", [0.2, 0.05])
def test_c_plan_makes_the_numpy_plans_blocks(tau):
    """The C plan (``witcert.native.plan``, what ``plan_head`` runs when the library loads)
    takes the blocks of the numpy plan that specifies it (``repair_plan._plan``), in the same
    order, on rows with candidate subsets, exact radii, flagged entries and odd block sizes."""
    import numpy as np

    from witcert.native.plan import plan
    from witcert.runtime import repair_plan

    kinds = set()
    for trial, (z, u, zx, ux, cand, bt) in enumerate(_plan_rows(400, seed=11)):
        args = (z.numpy(), u.numpy(), zx.numpy(), ux.numpy(), cand.numpy())
        with np.errstate(over="ignore", invalid="ignore"):
            want = repair_plan._plan(*args, tau=tau, block_tokens=bt)
        got = plan(*args, tau=tau, block_tokens=bt, slack=repair_plan._TARGET_SLACK)
        assert got[1] == want[1], trial
        assert torch.equal(got[0], want[0]), trial
        kinds.add(min(len(want[1]), 2))
    assert kinds == {0, 1, 2}  # rows with no block, one block and several
    assert repair_plan.native_plan()
