"""The gate's exact copy under a memory bound (``WITCERT_VLLM_GATE_COPY``): sizes, which
blocks hold a copy, eviction, resident memory, and the gate's answer when a token it needs
has no copy (reported unrepaired, the certificate still a bound)."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import torch

from test_gate import BT, HKV, PAGE, SL, SM, D, BLOCKS, _query, _reference
from witcert.config import CertConfig, QuantConfig, RepairPolicy
from witcert.integrations.vllm import settings
from witcert.integrations.vllm.attend import anytime_delta, decode_gated
from witcert.integrations.vllm.copystore import CopyGeometry, CopyStore
from witcert.integrations.vllm.paged import RecordLayout, layer_kv_view
from witcert.ref.attention import token_slots
from witcert.ref.cert import tv_distance
from witcert.ref.pool import gather, write_
from witcert.ref.types import K_SIDE

pytestmark = pytest.mark.vllm


def test_gate_copy_setting_parses_sizes_and_refuses_nonsense():
    p = settings.parse_size
    assert p("") is None and p("all") is None and p(" ALL ") is None
    assert p("0") == 0 and p("1000") == 1000 and p("512MiB") == 512 * 2**20
    assert p("1.5GB") == 1_500_000_000 and p("2gib") == 2 * 2**30 and p("64 KiB") == 65536
    for bad in ("lots", "-1", "12 parsecs", "inf", "nan", "1e999"):
        with pytest.raises(ValueError, match="WITCERT_VLLM_GATE_COPY"):
            p(bad)


def test_geometry_units_are_whole_pages_and_the_bound_is_respected():
    # SmolLM2 at vLLM's CPU block size: a 128-token block is 12 pages per side and layer
    g = CopyGeometry(num_layers=30, num_blocks=647, block_size=128, num_kv_heads=3,
                     head_dim=64, itemsize=2)
    assert g.unit_blocks == 1 and not g.bounded and g.capacity_tokens == 647 * 128
    assert g.total_bytes == 647 * 128 * 30 * 3 * (2 * 64 * 2 + 9)  # 1.98 GB at 1 GiB of KV
    assert g.full_bytes_per_token == 30 * 3 * 265
    b = CopyGeometry(**{**g.__dict__, "budget_bytes": 256 * 2**20})
    assert b.bounded and b.kv_bytes <= 256 * 2**20 < b.kv_bytes + b.unit_bytes
    assert b.capacity_tokens == b.budget_units * 128
    # 16-token blocks of 384 B rows: 6 KiB, so a unit is 2 blocks (12 KiB, 3 pages)
    s = CopyGeometry(num_layers=1, num_blocks=BLOCKS, block_size=PAGE, num_kv_heads=HKV,
                     head_dim=D, itemsize=2, budget_bytes=0)
    assert s.unit_blocks == 2 and (s.unit_slots * s.row_bytes) % mmap.PAGESIZE == 0
    assert s.budget_units == 0 and s.capacity_tokens == 0 and s.kv_bytes == 0
    with pytest.raises(ValueError, match="budget_bytes"):
        CopyGeometry(**{**s.__dict__, "budget_bytes": -1})


def _bounded(units: int, *, layers: int = 1):
    g = CopyGeometry(num_layers=layers, num_blocks=BLOCKS, block_size=PAGE, num_kv_heads=HKV,
                     head_dim=D, itemsize=2, budget_bytes=0)
    g = CopyGeometry(**{**g.__dict__, "budget_bytes": units * g.unit_bytes})
    epochs = torch.zeros(BLOCKS * PAGE, dtype=torch.int64)
    return CopyStore(g, dtype=torch.bfloat16, epochs=epochs)


def test_lru_units_not_used_by_the_step_are_evicted_and_their_flags_cleared():
    st = _bounded(2)
    ex = st.layer(0)
    us = st.geom.unit_slots  # 32
    k = torch.randn(us, HKV, D).bfloat16()

    def step(unit, *, reads=None):
        slots = torch.arange(unit * us, (unit + 1) * us)
        bt = None if reads is None else torch.tensor([[2 * u for u in reads]], dtype=torch.int32)
        sl = None if reads is None else torch.tensor([len(reads) * PAGE], dtype=torch.int32)
        st.epochs[slots] += 1
        st.begin_step(slots, block_table=bt, seq_lens=sl)
        ex.write_(slots, k, -k)
        return slots

    s0 = step(0)
    s1 = step(1)
    ex.mark_(s0[:4], torch.zeros(4, dtype=torch.int64))
    assert bool(st.have[:2 * us].all()) and st.covered_tokens == 2 * us
    # unit 2 needs room; unit 0 is read by this step, so unit 1 (older use) goes
    s2 = step(2, reads=[0])
    assert st.evicted_units == 1 and bool(st.have[s0].all()) and not bool(st.have[s1].any())
    assert bool(st.have[s2].all()) and bool(ex.live(s0[:4])[:, 0].all())
    rk, rv = ex.read(s1)
    assert bool(rk.isnan().all()) and bool(rv.isnan().all())
    torch.testing.assert_close(ex.read(s0)[0], k)
    # every held unit in use by the step: the new one gets no copy, nothing is evicted
    s3 = step(3, reads=[0, 2])
    assert st.evicted_units == 1 and not bool(st.have[s3].any()) and st.uncopied_tokens == us
    assert bool(ex.read(s3)[0].isnan().all())
    # eviction of a unit with live exact entries clears them in every layer
    step(4)
    assert st.evicted_units == 2 and not bool(ex.exact[s0].any()) and not bool(ex.live(s0).any())


def _rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon")


def test_resident_memory_of_a_bounded_copy_stays_within_the_bound():
    """Writing every slot once: an unbounded copy becomes resident in full, a bounded one
    no more than its bound (rows of evicted units are released)."""
    layers, blocks, page = 4, 1024, 16
    kw = dict(num_layers=layers, num_blocks=blocks, block_size=page, num_kv_heads=2,
              head_dim=64, itemsize=2)  # 16 x 256 B = one page per block and layer side
    full = 2 * layers * blocks * page * 2 * 64 * 2  # 33.5 MB
    bound = 4 * 2**20
    grown = {}
    for name, budget in (("bounded", bound), ("unbounded", None)):
        g = CopyGeometry(**kw, budget_bytes=budget)
        st = CopyStore(g, dtype=torch.bfloat16, epochs=torch.zeros(blocks * page,
                                                                     dtype=torch.int64))
        exs = [st.layer(i) for i in range(layers)]
        k = torch.ones(16 * page, 2, 64, dtype=torch.bfloat16)
        before = _rss_anon()
        for b0 in range(0, blocks, 16):
            slots = torch.arange(b0 * page, (b0 + 16) * page)
            st.epochs[slots] += 1
            st.begin_step(slots, block_table=None, seq_lens=None)
            for ex in exs:
                ex.write_(slots, k, k)
        grown[name] = _rss_anon() - before
        assert st.covered_tokens == (g.capacity_tokens if budget else blocks * page)
        del st, exs
    print(f"\nresident growth: bounded {grown['bounded'] / 2**20:.1f} MiB (bound "
          f"{bound / 2**20:.0f} MiB), unbounded {grown['unbounded'] / 2**20:.1f} MiB "
          f"(full {full / 2**20:.1f} MiB)")
    assert grown["unbounded"] > 0.9 * full
    assert grown["bounded"] < bound + 2 * 2**20  # + slack for the allocator's own pages


@pytest.mark.parametrize("native", ["off", "on"])
def test_a_head_needing_tokens_without_a_copy_is_reported_unrepaired_and_stays_sound(native):
    """Half the pool holds a copy. Sequences on held blocks are repaired as without a bound;
    a fired head of a sequence whose blocks hold none stays above tau, is counted
    unrepaired, and its certificate is the one computed over the stored values (a bound on
    the true TV), never a value read from a copy that is not held."""
    if native == "on":
        from witcert import native as nat

        if not nat.available():
            pytest.skip(f"native library unavailable: {nat.reason()}")
    quant = QuantConfig()
    lay = RecordLayout.build(quant, D)
    kv = torch.zeros(BLOCKS, PAGE, HKV, lay.size, dtype=torch.int8).permute(0, 2, 1, 3)
    st = _bounded(3)  # units 0..2 = blocks 0..5
    lkv = layer_kv_view(kv, layout=lay, quant=quant, layer=2, seed=7, epochs=st.epochs,
                        head_dim=D)
    ex = st.layer(0)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(BLOCKS * PAGE, HKV, D, generator=g) * 2
    k[:, :, 3] += 30 * torch.rand(BLOCKS * PAGE, HKV, generator=g)
    v = torch.randn(BLOCKS * PAGE, HKV, D, generator=g)
    slots = torch.arange(BLOCKS * PAGE)
    st.epochs[slots] += 1
    st.begin_step(slots, block_table=None, seq_lens=None)
    write_(lkv, k.bfloat16(), v.bfloat16(), slots=slots)
    ex.write_(slots, k.bfloat16(), v.bfloat16())
    assert st.covered_tokens == 6 * PAGE and st.uncopied_tokens == 6 * PAGE
    tau = 0.15
    cert = CertConfig(radius="min", allocation="anytime", tau=tau)
    d = anytime_delta(cert, num_layers=30, num_q_heads=HKV * 3, positions=SL)
    q = _query(0)
    o, c, ev = decode_gated(q, lkv, ex, BT, SL, page_size=PAGE, sm_scale=SM, cert=cert,
                            delta_loc=d, repair=RepairPolicy(mode="block"), native=native)
    held_rows = [b for b in range(4) if bool(st.have[token_slots(BT[b], int(SL[b]),
                                                                 page_size=PAGE)].all())]
    assert held_rows == [0, 2]  # rows 1 and 3 live on blocks 6..11: no copy
    assert not bool(ex.exact[6 * PAGE:].any())  # nothing made exact without a copy
    fired_unheld = int((c[[1, 3]] > tau).sum())
    assert ev.fired - ev.repaired == fired_unheld > 0
    assert bool((c[[0, 2]] <= tau * (1 + 1e-6)).all())
    ref_o, ref_c, _, _ = _reference(q, lkv, ex, cert, d)
    torch.testing.assert_close(o, ref_o.float(), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(c, ref_c.float(), atol=1e-6, rtol=1e-5)
    # the true TV against the real K (the copy of an unheld slot holds nothing)
    ktrue = k.bfloat16().double()
    for b in range(4):
        sl = token_slots(BT[b], int(SL[b]), page_size=PAGE)
        khat, _ = gather(lkv, K_SIDE, sl)
        kuse = torch.where(ex.live(sl)[..., None], ktrue[sl], khat.double())
        for h in range(HKV * 3):
            qh = q[b, h].double()
            tv = tv_distance(torch.softmax(SM * kuse[:, h // 3] @ qh, -1),
                             torch.softmax(SM * ktrue[sl][:, h // 3] @ qh, -1))
            assert float(c[b, h]) >= float(tv) - 1e-6, (b, h)
