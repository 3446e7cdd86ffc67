"""The in-engine gate's pure-torch parts (no vllm, no engine): gated batched decode against a
direct float64 computation over the mixed stored/exact values, persistence, epochs,
settings and the gate metrics."""

from __future__ import annotations

import pytest
import torch

from cases import vllm_gated_layer  # tests/ is on sys.path (tests/conftest.py)
from witcert.config import CertConfig, RepairPolicy
from witcert.integrations.vllm import settings
from witcert.integrations.vllm.attend import anytime_delta, decode_batched, decode_gated
from witcert.integrations.vllm.stats import WorkerStats, merge
from witcert.ref.attention import token_slots
from witcert.ref.cert import certificate, combine_radius, radius_det, radius_prob, tv_distance
from witcert.ref.pool import gather, write_
from witcert.ref.types import K_SIDE, V_SIDE

pytestmark = pytest.mark.vllm

HKV, R, D, PAGE, BLOCKS, SM = 3, 3, 64, 16, 12, 0.125
TAU = 0.15  # fires on 15 of the 36 (sequence, query head) of _query(0), not on all


def _setup(seed=0):
    lkv, ex = vllm_gated_layer(blocks=BLOCKS, page=PAGE, hkv=HKV, d=D, layer=2)
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(BLOCKS * PAGE, HKV, D, generator=g) * 2
    k[:, :, 3] += 30 * torch.rand(BLOCKS * PAGE, HKV, generator=g)  # wide groups: large radii
    v = torch.randn(BLOCKS * PAGE, HKV, D, generator=g)
    _write(lkv, ex, k.bfloat16(), v.bfloat16(), torch.arange(BLOCKS * PAGE))
    return lkv, ex


def _write(lkv, ex, k, v, slots):
    """What the backend's do_kv_cache_update does: epoch bump, pages, then the exact copy."""
    lkv.epochs[slots] += 1
    write_(lkv, k, v, slots=slots)
    ex.write_(slots, k, v)


# no page shared between sequences (a shared prefix page is checked separately)
BT = torch.tensor([[3, 1, 0, 0], [7, 6, 0, 0], [2, 0, 0, 0], [8, 9, 10, 11]], dtype=torch.int32)
BT_SHARED = torch.tensor([[3, 1, 0, 2], [7, 6, 5, 4], [4, 0, 1, 2], [2, 3, 4, 5]],
                         dtype=torch.int32)
SL = torch.tensor([40, 17, 1, 64], dtype=torch.int32)


def _query(seed):
    g = torch.Generator().manual_seed(100 + seed)
    q = torch.randn(4, HKV * R, D, generator=g)
    q[:, :, 3] *= 3  # reads the wide channel
    return q


def _reference(q, lkv, ex, cert, delta):
    """Direct float64, one (sequence, query head) at a time, over the values the gate says
    are live-exact now: (out [B, Hq, D], cert [B, Hq], true TV [B, Hq], live per sequence)."""
    B, Hq, _ = q.shape
    out = torch.zeros(B, Hq, D, dtype=torch.float64)
    c = torch.zeros(B, Hq, dtype=torch.float64)
    tv = torch.zeros(B, Hq, dtype=torch.float64)
    lives = []
    for b in range(B):
        n = int(SL[b])
        slots = token_slots(BT[b], n, page_size=PAGE)
        khat, kp = gather(lkv, K_SIDE, slots)
        vhat, _ = gather(lkv, V_SIDE, slots)
        live = ex.live(slots)  # [n, Hkv]
        lives.append(live)
        kx, vx = ex.k[slots].double(), ex.v[slots].double()
        k = torch.where(live[..., None], kx, khat.double())
        v = torch.where(live[..., None], vx, vhat.double())
        for h in range(Hq):
            g, qh = h // R, q[b, h].double()
            z = SM * k[:, g] @ qh
            ud = radius_det(qh, kp["wit"][:, g], sm_scale=SM, group_size=32)
            up = radius_prob(qh, kp["scales"][:, g], sm_scale=SM, group_size=32, bits=lkv.quant.dither_bits,
                             n_tokens=n, delta_loc=float(delta[b]))
            u = torch.where(live[:, g], 0.0, combine_radius(ud, up, cert.radius))
            p = torch.softmax(z, -1)
            out[b, h] = p @ v[:, g]
            c[b, h] = certificate(z, u)[1]
            tv[b, h] = tv_distance(p, torch.softmax(SM * kx[:, g] @ qh, -1))
    return out, c, tv, lives


def _run(q, lkv, ex, *, tau=TAU, mode="block", native="auto"):
    cert = CertConfig(radius="min", allocation="anytime", tau=tau)
    d = anytime_delta(cert, num_layers=30, num_q_heads=HKV * R, positions=SL)
    o, c, ev = decode_gated(q, lkv, ex, BT, SL, page_size=PAGE, sm_scale=SM, cert=cert,
                            delta_loc=d, repair=RepairPolicy(mode=mode, block_tokens=16),
                            native=native)
    return o, c, ev, cert, d


@pytest.mark.parametrize("native", ["off", "on"])
@pytest.mark.parametrize("mode", ["block", "head"])
def test_gated_decode_repairs_and_matches_float64_over_mixed_values(mode, native):
    """The gate's one repair (``witcert.runtime.repair_rows``) on both decode paths (the
    reference and the C decode, through the dispatch): every fired head under tau,
    certificates sound against the true TV and equal to the direct float64 computation over
    the repaired cache, up to the path's own arithmetic slack: the C path's logits are float64
    (slack ~1e-13), the reference's are fp32 of a float64 dot (slack ~2^-24 |z| per logit,
    a few 1e-6 in a certificate here; docs/PROOFS.md section 5)."""
    if native == "on":
        _native_ok()
    lkv, ex = _setup()
    q = _query(0)
    cert0 = CertConfig(radius="min", allocation="anytime", tau=TAU)
    d = anytime_delta(cert0, num_layers=30, num_q_heads=HKV * R, positions=SL)
    _, raw = decode_batched(q, lkv, BT, SL, page_size=PAGE, sm_scale=SM, cert=cert0, delta_loc=d)
    fired = raw > TAU
    assert int(fired.sum()) >= 4, raw  # the setup must make the gate fire
    o, c, ev, cert, d = _run(q, lkv, ex, mode=mode, native=native)
    ref_o, ref_c, tv, lives = _reference(q, lkv, ex, cert, d)
    torch.testing.assert_close(o, ref_o.float(), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(c, ref_c.float(), atol=1e-7 if native == "on" else 1e-5, rtol=1e-5)
    assert bool((c.double() >= tv - 1e-6).all())  # still a bound on the true TV
    blocks = 0
    for b, h in fired.nonzero().tolist():
        full = bool(lives[b][:, h // R].all())
        assert float(c[b, h]) <= TAU * (1 + 1e-6) or full, (b, h, float(c[b, h]))
        if mode == "head":
            assert full
    assert ev.fired == int(fired.sum())
    assert ev.repaired == int((c[fired] <= TAU).sum()) == ev.fired
    assert ev.tokens == sum(int(lv.sum()) for lv in lives) > 0
    assert ev.raw_covered == int((raw <= TAU).sum())
    # raw: the native first pass; the torch path's fp32 logits differ by a few ulps
    assert ev.before_max == pytest.approx(float(raw[fired].max()), rel=1e-5)
    assert ev.after_max == pytest.approx(float(c[fired].max()), rel=1e-6)
    for lv in lives:
        n = lv.shape[0]
        blocks += int(torch.nn.functional.pad(lv.T, (0, -n % 16)).view(HKV, -1, 16)
                      .any(-1).sum())
    assert ev.blocks == blocks
    if mode == "head":
        assert ev.fallbacks == sum(int(lv.all(0).sum()) for lv in lives)
        assert ev.blocks >= ev.fallbacks
    else:
        assert ev.fallbacks == 0
        # block repair makes less exact than the whole head would
        assert ev.tokens < sum(int(lv.any(0).sum()) * lv.shape[0] for lv in lives)


@pytest.mark.parametrize("mode", ["block", "head"])
def test_a_page_shared_by_two_sequences_is_repaired_once(mode):
    """Prefix caching: two rows of a batch read the same slots; a later row sees the entries
    an earlier row made exact (its repair starts from the row decoded again, not from the
    batch's first pass), nothing is counted twice, the certificate stays sound, and the
    repair over the C decode makes the same entries exact as over the reference (their
    certificates differ by the reference's fp32 logit slack, a few 1e-6)."""
    cert = CertConfig(radius="min", allocation="anytime", tau=TAU)
    d = anytime_delta(cert, num_layers=30, num_q_heads=HKV * R, positions=SL)
    q = _query(0)
    res = {}
    for native in ("off", "on"):
        if native == "on":
            _native_ok()
        lkv, ex = _setup()
        o, c, ev = decode_gated(q, lkv, ex, BT_SHARED, SL, page_size=PAGE, sm_scale=SM,
                                cert=cert, delta_loc=d, repair=RepairPolicy(mode=mode),
                                native=native)
        assert ev.fired > 0 and ev.tokens == int(ex.exact.sum())  # distinct (slot, KV head)
        assert ev.repaired == ev.fired
        assert bool((c[torch.isfinite(c)] >= 0).all())
        # sound against the true TV over the final state (rows repaired before a later row
        # repaired a shared slot keep the certificate of the state they were computed on)
        for b in range(4):
            sl = token_slots(BT_SHARED[b], int(SL[b]), page_size=PAGE)
            khat, _ = gather(lkv, K_SIDE, sl)
            kx = ex.k[sl].double()
            for h in range(HKV * R):
                qh = q[b, h].double()
                p_x = torch.softmax(SM * kx[:, h // R] @ qh, -1)
                p_0 = torch.softmax(SM * khat[:, h // R].double() @ qh, -1)
                assert float(c[b, h]) >= float(tv_distance(p_0, p_x)) - 1e-6 \
                    or bool(ex.live(sl)[:, h // R].any()), (b, h)
        res[native] = (o, c, ev, ex.exact.clone())
    (o_t, c_t, ev_t, x_t), (o_n, c_n, ev_n, x_n) = res["off"], res["on"]
    assert torch.equal(x_n, x_t)
    for f in ("fired", "repaired", "blocks", "tokens", "fallbacks", "raw_covered"):
        assert getattr(ev_n, f) == getattr(ev_t, f), f
    torch.testing.assert_close(o_n, o_t, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(c_n, c_t, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("native", ["off", "on"])
@pytest.mark.parametrize("mode", ["block", "head"])
@pytest.mark.parametrize("shared", [False, True])
def test_terms_in_the_first_pass_change_nothing_but_the_cost(shared, mode, native):
    """``terms_first`` (the logits / radii the repair reads asked in the first pass, for
    every row, instead of a second pass over the fired rows) delivers the same bits: out,
    certificates, counters and the entries made exact, also with pages shared between rows
    (a later row starts from the earlier rows' repair either way)."""
    if native == "on":
        _native_ok()
    cert = CertConfig(radius="min", allocation="anytime", tau=TAU)
    d = anytime_delta(cert, num_layers=30, num_q_heads=HKV * R, positions=SL)
    bt = BT_SHARED if shared else BT
    res = []
    for first in (False, True):
        lkv, ex = _setup()
        for step in range(2):  # the second step starts from the first's exact entries
            o, c, ev = decode_gated(_query(step), lkv, ex, bt, SL, page_size=PAGE, sm_scale=SM,
                                    cert=cert, delta_loc=d, repair=RepairPolicy(mode=mode),
                                    native=native, terms_first=first)
            res.append((first, step, o, c, ev.as_dict(), ex.exact.clone()))
    assert res[0][4]["fired"] > 0  # the gate fired
    for a, b in zip(res[:2], res[2:]):
        assert torch.equal(a[2], b[2]) and torch.equal(a[3], b[3]), (a[1], "out / cert")
        assert a[4] == b[4], a[1]
        assert torch.equal(a[5], b[5]), a[1]


@pytest.mark.parametrize("native", ["off", "on"])
def test_a_later_row_on_the_same_slots_starts_from_the_earlier_rows_repair(native):
    """Two rows of one batch with the same slots and query (a shared prefix at its
    extreme): the second row is repaired over the entries the first made exact, so it adds
    nothing and delivers what the first delivered (not a plan from the batch's first pass,
    which would make more entries exact)."""
    if native == "on":
        _native_ok()
    lkv, ex = _setup()
    cert = CertConfig(radius="min", allocation="anytime", tau=TAU)
    q = _query(0)[[3, 3]]
    bt, sl = BT[[3, 3]], SL[[3, 3]]
    d = anytime_delta(cert, num_layers=30, num_q_heads=HKV * R, positions=sl)
    o, c, ev = decode_gated(q, lkv, ex, bt, sl, page_size=PAGE, sm_scale=SM, cert=cert,
                            delta_loc=d, repair=RepairPolicy(mode="block"), native=native)
    lkv1, ex1 = _setup()
    o1, c1, ev1 = decode_gated(q[:1], lkv1, ex1, bt[:1], sl[:1], page_size=PAGE, sm_scale=SM,
                               cert=cert, delta_loc=d[:1], repair=RepairPolicy(mode="block"),
                               native=native)
    assert ev1.fired > 0 and ev.fired == 2 * ev1.fired and ev.repaired == ev.fired
    assert ev.tokens == ev1.tokens == int(ex.exact.sum()) and torch.equal(ex.exact, ex1.exact)
    assert ev.blocks == ev1.blocks
    torch.testing.assert_close(o[1], o[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(c[1], c[0], atol=1e-7, rtol=1e-6)
    assert bool((c[1] <= TAU * (1 + 1e-6)).all())


def test_exactness_persists_and_is_dropped_when_the_slot_epoch_changes():
    lkv, ex = _setup()
    _, c1, ev1, cert, d = _run(_query(0), lkv, ex)
    assert ev1.tokens > 0
    slots0 = token_slots(BT[0], int(SL[0]), page_size=PAGE)
    live1 = [ex.live(token_slots(BT[b], int(SL[b]), page_size=PAGE)).clone() for b in range(4)]
    # next step, new queries, gate never fires (tau huge): exact entries are still read
    q2 = _query(1)
    o2, c2, ev2, cert2, d2 = _run(q2, lkv, ex, tau=1e9)
    assert ev2.fired == 0 and ev2.tokens == 0
    ref_o, ref_c, tv, lives = _reference(q2, lkv, ex, cert2, d2)
    assert all(torch.equal(a, b) for a, b in zip(live1, lives))
    torch.testing.assert_close(o2, ref_o.float(), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(c2, ref_c.float(), atol=1e-7, rtol=1e-5)
    assert bool((c2.double() >= tv - 1e-6).all())
    plain_o, plain_c = decode_batched(q2, lkv, BT, SL, page_size=PAGE, sm_scale=SM, cert=cert2,
                                      delta_loc=d2)
    rows = [b for b in range(4) if bool(live1[b].any())]
    assert rows and all(not torch.equal(o2[b], plain_o[b]) for b in rows)
    # a slot rewritten (vLLM reused it): epoch bump + new content -> not exact any more
    live0 = live1[0]
    hit = live0.any(1).nonzero().flatten()
    assert hit.numel() >= 2
    t_rew, t_bump = int(hit[0]), int(hit[1])
    g = torch.Generator().manual_seed(9)
    s_rew = slots0[t_rew:t_rew + 1]
    _write(lkv, ex, torch.randn(1, HKV, D, generator=g).bfloat16(),
           torch.randn(1, HKV, D, generator=g).bfloat16(), s_rew)
    # an epoch change alone (the flag untouched) also drops the entry
    s_bump = slots0[t_bump:t_bump + 1]
    assert bool(ex.exact[s_bump].any())
    lkv.epochs[s_bump] += 1
    write_(lkv, ex.k[s_bump], ex.v[s_bump], slots=s_bump)  # pages re-encoded, copy unchanged
    assert bool(ex.exact[s_bump].any()) and not bool(ex.live(s_bump).any())
    assert not bool(ex.live(s_rew).any())
    live_now = ex.live(slots0)
    assert not bool(live_now[t_rew].any()) and not bool(live_now[t_bump].any())
    assert int(live_now.sum()) == int(live0.sum()) - int(live0[t_rew].sum()) \
        - int(live0[t_bump].sum())
    o3, c3, _, cert3, d3 = _run(q2, lkv, ex, tau=1e9)
    ref_o, ref_c, _, _ = _reference(q2, lkv, ex, cert3, d3)
    torch.testing.assert_close(o3, ref_o.float(), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(c3, ref_c.float(), atol=1e-7, rtol=1e-5)


def test_gate_setting_is_parsed_and_bad_values_are_refused(monkeypatch, tmp_path):
    for k in [k for k in __import__("os").environ if k.startswith("WITCERT_VLLM")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("WITCERT_VLLM", "on")
    monkeypatch.setenv("WITCERT_VLLM_STATS_DIR", str(tmp_path))
    assert settings.load().repair.mode == "off" and not settings.load().gate
    for value, mode in (("on", "block"), ("1", "block"), ("block", "block"), ("HEAD", "head"),
                        ("off", "off"), ("0", "off")):
        monkeypatch.setenv("WITCERT_VLLM_GATE", value)
        s = settings.load()
        assert s.repair.mode == mode and s.repair.block_tokens == 16
    monkeypatch.setenv("WITCERT_VLLM_GATE", "everything")
    with pytest.raises(ValueError, match="WITCERT_VLLM_GATE"):
        settings.load()


def test_gate_counters_reach_the_snapshot_and_metrics(tmp_path):
    lkv, ex = _setup()
    _, c, ev, _, _ = _run(_query(0), lkv, ex)
    from witcert.integrations.vllm.capacity import capacity_info

    s = settings._parse("on", str(TAU), "", str(tmp_path), "on")
    info = capacity_info(s, num_layers=1, num_kv_heads=HKV, head_dim=D, model_dtype="bfloat16",
                         itemsize=2, num_blocks=BLOCKS, block_size=PAGE)
    ws = WorkerStats(num_layers=1, num_q_heads=HKV * R, tau=TAU, stats_dir=str(tmp_path),
                     info=info, gate=True)
    ws.record(0, c, decode_tokens=4, prefill_tokens=0)
    ws.record_gate(ev)
    ws.end_step()
    m = merge([ws.snapshot(), ws.snapshot()])  # two workers
    g = m["gate"]
    assert g["fired"] == 2 * ev.fired and g["tokens"] == 2 * ev.tokens
    assert g["after_max"] == ev.after_max
    assert g["coverage_before"] == pytest.approx(ev.raw_covered / c.numel())
    assert g["coverage_after"] == m["coverage"] == pytest.approx(float((c <= TAU).double().mean()))
    assert g["exact_copy_bytes"] == ex.nbytes == BLOCKS * PAGE * HKV * (2 * D * 2 + 9)
    pytest.importorskip("prometheus_client")
    from witcert.integrations.vllm.metrics import WitcertCollector

    names = {f.name: f for f in WitcertCollector(str(tmp_path), tau=TAU, gate=True).collect()}
    assert names["witcert_gate_fired"].samples[0].value == ev.fired
    assert names["witcert_gate_repaired_tokens"].samples[0].value == ev.tokens
    assert names["witcert_gate_coverage_after"].samples[0].labels == {"tau": f"{TAU:g}"}
    assert names["witcert_gate_exact_copy_bytes"].samples[0].value == ex.nbytes
    assert WorkerStats(num_layers=1, num_q_heads=1, tau=TAU, stats_dir=None,
                       info={}).snapshot()["gate"] is None


def _mark_some(lkv, ex):
    """Entries live before the step on rows 0, 1 and 3, and a stale one (flag set at an old
    epoch, garbage in its exact copy) that must not be read."""
    s = [token_slots(BT[b], int(SL[b]), page_size=PAGE) for b in range(4)]
    ex.mark_(s[0][:16], torch.zeros(16, dtype=torch.int64))
    ex.mark_(s[1][:9], torch.ones(9, dtype=torch.int64))
    ex.mark_(s[3][20:40], torch.full((20,), 2, dtype=torch.int64))
    stale = s[3][:8]
    ex.exact[stale, 1] = True
    ex.exact_epoch[stale, 1] = ex.epochs[stale] - 1
    ex.k[stale, 1] = 50.0
    ex.v[stale, 1] = -50.0


def _native_ok():
    from witcert import native

    if not native.available():
        pytest.skip(f"native library unavailable: {native.reason()}")


@pytest.mark.parametrize("mode", ["block", "head"])
@pytest.mark.parametrize("radius", ["det", "prob", "min"])
def test_gated_decode_over_the_c_path_matches_it_over_the_reference(radius, mode):
    _native_ok()
    from witcert.native import decode as nd

    tau = 0.35  # fires on rows 0 and 3, not on 1 and 2 (checked below)
    cert = CertConfig(radius=radius, allocation="anytime", tau=tau)
    d = anytime_delta(cert, num_layers=30, num_q_heads=HKV * R, positions=SL)
    q = _query(0)
    res = {}
    for nat in ("off", "on"):
        lkv, ex = _setup()
        _mark_some(lkv, ex)
        live0 = ex.live(torch.arange(BLOCKS * PAGE))
        _, raw = nd.decode_attention(q, lkv, BT, SL, page_size=PAGE, sm_scale=SM, radius=radius,
                                     delta_loc=d, exact=ex)
        o, c, ev = decode_gated(q, lkv, ex, BT, SL, page_size=PAGE, sm_scale=SM, cert=cert,
                                delta_loc=d, repair=RepairPolicy(mode=mode, block_tokens=16),
                                native=nat, num_threads=2)
        res[nat] = (o, c, ev, ex.exact.clone(), ex.exact_epoch.clone(), raw, live0)
    (o_t, c_t, ev_t, x_t, xe_t, raw, live0), (o_n, c_n, ev_n, x_n, xe_n, _, _) = \
        res["off"], res["on"]
    fired_rows = (raw > tau).any(1)
    assert fired_rows.tolist() == [True, False, False, True], raw
    assert bool(live0[token_slots(BT[1], int(SL[1]), page_size=PAGE)].any())  # unfired, live
    # the reference's certificates carry its fp32 logit slack (a few 1e-6 here), the C path's
    # its float64 one: same decisions, certificates within that slack
    torch.testing.assert_close(o_n, o_t, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(c_n, c_t, atol=1e-5, rtol=1e-5)
    for f in ("fired", "repaired", "blocks", "tokens", "fallbacks", "raw_covered"):
        assert getattr(ev_n, f) == getattr(ev_t, f), f
    assert ev_n.fired > 0 and ev_n.tokens > 0
    assert ev_n.raw_covered == int((raw <= tau).sum())
    for f in ("before_sum", "before_max", "after_sum", "after_max"):
        assert getattr(ev_n, f) == pytest.approx(getattr(ev_t, f), rel=1e-5, abs=2e-5), f
    assert torch.equal(x_n, x_t) and torch.equal(xe_n, xe_t)
    assert bool((c_n[fired_rows] <= tau * (1 + 1e-6)).all())


@pytest.mark.parametrize("native", ["off", "on"])
def test_all_live_overlay_gives_only_the_arithmetic_cert_and_a_stale_entry_is_not_read(native):
    if native == "on":
        _native_ok()
    lkv, ex = _setup()
    all_slots = torch.arange(BLOCKS * PAGE)
    ex.mark_(all_slots.repeat_interleave(HKV), torch.arange(HKV).repeat(BLOCKS * PAGE))
    cert = CertConfig(radius="min", allocation="anytime", tau=TAU)
    d = anytime_delta(cert, num_layers=30, num_q_heads=HKV * R, positions=SL)
    kw = dict(page_size=PAGE, sm_scale=SM, cert=cert, delta_loc=d,
              repair=RepairPolicy(mode="block"), native=native)
    q = _query(0)
    o, c, ev = decode_gated(q, lkv, ex, BT, SL, **kw)
    # exact entries: no compression radius; what remains is the arithmetic slack of the
    # path's logits (docs/PROOFS.md section 5: fp32 logits on the torch path, float64 in C)
    slack = 1e-4 if native == "off" else 1e-9
    assert bool(((c > 0) & (c < slack)).all()) and ev.fired == 0 and ev.raw_covered == c.numel()
    ref_o, ref_c, _, lives = _reference(q, lkv, ex, cert, d)
    # the direct float64 certificate with u = 0 keeps only the float64 tail term (N e^-700)
    assert all(bool(lv.all()) for lv in lives) and bool((ref_c < 1e-300).all())
    # float tier: the C path sums in float64; torch's fp32 einsum over the large exact logits
    # of this setup is a few ulps looser
    tol = dict(atol=2e-6, rtol=1e-5) if native == "on" else dict(atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(o, ref_o.float(), **tol)
    # stale: the epoch of one slot of row 3 moves on (pages re-encoded, exact copy left with
    # garbage and its flag set); that slot reads the stored values again, with its radius
    s = token_slots(BT[3], int(SL[3]), page_size=PAGE)[10:11]
    lkv.epochs[s] += 1
    write_(lkv, ex.k[s], ex.v[s], slots=s)
    ex.k[s] = 60.0
    ex.v[s] = -60.0
    assert bool(ex.exact[s].all()) and not bool(ex.live(s).any())
    o, c, ev = decode_gated(q, lkv, ex, BT, SL, **{**kw, "cert": CertConfig(
        radius="min", allocation="anytime", tau=1e9)})
    ref_o, ref_c, _, _ = _reference(q, lkv, ex, cert, d)
    assert bool((c[:3] < slack).all()) and float(c[3].max()) > slack
    torch.testing.assert_close(o, ref_o.float(), **tol)
    # the path's certificate = the direct one plus its arithmetic slack
    assert bool((c.double() >= ref_c * (1 - 1e-6)).all())
    torch.testing.assert_close(c, ref_c.float(), atol=slack, rtol=1e-4)


def test_a_rows_redecode_of_the_changed_kv_heads_is_the_whole_rows_decode():
    """After entries of one KV head are made exact, the gate decodes that KV head again and
    keeps the row's other query heads (``RowCtx.state(prev=, kv_heads=)``): the same out,
    lse, cert, vbound, logits and radii, bit for bit, as decoding the whole row."""
    from witcert.runtime.repair_rows import RowCtx

    _native_ok()
    lkv, ex = _setup()
    cert = CertConfig(radius="min", allocation="anytime", tau=TAU)
    d = anytime_delta(cert, num_layers=30, num_q_heads=HKV * R, positions=SL)
    ctx = RowCtx(_query(0), lkv, BT, SL, PAGE, SM, cert, d, copy=ex, tau=TAU,
                 policy=RepairPolicy(mode="block"), native=True, num_threads=1)
    b = 3
    before = ctx.state(b, terms=True)
    slots = token_slots(BT[b], int(SL[b]), page_size=PAGE)
    ex.mark_(slots[5:37], 1)  # two blocks' worth of KV head 1
    full = ctx.state(b, terms=True)
    part = ctx.state(b, terms=True, prev=before, kv_heads=[1])
    assert not torch.equal(full.cert, before.cert)  # the marks changed the row
    for f in ("out", "lse", "cert", "vbound", "z", "u"):
        assert torch.equal(getattr(full, f), getattr(part, f)), f
