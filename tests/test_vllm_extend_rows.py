"""The vLLM plugin's extend rows (``witcert.integrations.vllm.attend``), pure torch and C.

A vLLM batch (decode rows and extend rows mixed, the new tokens already stored) through
``attend_batch``: on the native path all extend rows go through one C extend call whose
certificates are bitwise the per-sequence C extend with the anytime budget at each token's
position; the torch fallback (``native="off"``) runs the spec and agrees within the float
and rounding-model tolerance; the decode rows are untouched by the extend rows.
"""

from __future__ import annotations

import pytest
import torch

from extend_cases import make_batch
from witcert import native
from witcert.config import CertConfig
from witcert.integrations.vllm.attend import anytime_delta, attend_batch, decode_batched
from witcert.native.extend import extend_one
from witcert.ref.attention import token_slots
from witcert.ref.pool import write_

L = 30


@pytest.fixture(autouse=True, scope="module")
def _needs_native():
    if not native.available():
        pytest.skip(f"native library unavailable: {native.reason()}")


def _vllm_batch():
    """Rows: two decode sequences, then three extend sequences (prefix 0, 1, 37). Every
    token of every sequence is stored (vLLM writes the step's tokens before attention)."""
    prefix, new = (12, 20, 0, 1, 37), (1, 1, 9, 17, 5)
    b = make_batch(prefix_lens=prefix, new_lens=new, hq=6, hkv=2, d=64, page=16, bits=16, seed=3)
    for i in range(len(prefix)):
        slots = token_slots(b.block_table[i], prefix[i] + new[i], page_size=16)
        k = torch.cat([b.exact_prefix[i][0], b.k_new[b.rows(i)]])
        v = torch.cat([b.exact_prefix[i][1], b.v_new[b.rows(i)]])
        write_(b.layer, k, v, slots=slots)
    qsl = torch.tensor([0] + list(torch.tensor(new).cumsum(0)), dtype=torch.int32)
    seq_lens = torch.tensor([p + n for p, n in zip(prefix, new)], dtype=torch.int32)
    return b, qsl, seq_lens


def _attend(b, qsl, seq_lens, cert, native_mode):
    out = torch.zeros(b.q.shape, dtype=torch.bfloat16)
    res = attend_batch(b.q, b.k_new, b.v_new, b.layer, query_start_loc=qsl, seq_lens=seq_lens,
                       block_table=b.block_table, page_size=16, sm_scale=0.125, cert=cert,
                       num_layers=L, out=out, native=native_mode)
    return out, res


@pytest.mark.parametrize("radius", ["det", "min"])
def test_extend_rows_in_one_c_call_are_the_per_sequence_c_extend_with_the_position_budget(radius):
    b, qsl, seq_lens = _vllm_batch()
    cert = CertConfig(radius=radius)
    out, res = _attend(b, qsl, seq_lens, cert, "on")
    assert res.prefill_tokens == 9 + 17 + 5 and res.prefill_cert.shape == (31, 6)
    at = 0
    for i in (2, 3, 4):
        n, p = b.q_len[i], b.prefix_len[i]
        dl = anytime_delta(cert, num_layers=L, num_q_heads=6, positions=list(range(p + 1, p + n + 1)))
        r = b.rows(i)
        want = extend_one(b.q[r], b.k_new[r], b.v_new[r], b.layer, b.prefix_slots(i), sm_scale=0.125,
                          cert=cert, delta_loc=dl)
        assert torch.equal(res.prefill_cert[at:at + n], want.cert)
        assert torch.equal(out[r], want.out.to(torch.bfloat16))
        at += n
    # the decode rows: what decode_batched gives for them alone
    dec = torch.tensor([0, 1])
    d = anytime_delta(cert, num_layers=L, num_q_heads=6, positions=seq_lens[:2].tolist())
    o, c = decode_batched(b.q[:2], b.layer, b.block_table[dec], seq_lens[:2], page_size=16,
                          sm_scale=0.125, cert=cert, delta_loc=d, native="on")
    assert torch.equal(out[:2], o.to(torch.bfloat16)) and torch.equal(res.cert, c)


@pytest.mark.parametrize("arith", ["f64", "f32"])
def test_torch_fallback_runs_the_spec_and_agrees_with_the_c_path(arith, monkeypatch):
    """f64: the C extend's float64 model is tighter than the spec's (never above it). f32 (the
    C extend's default): its fp32 dots add ``gamma_{D/8+5}(2^-24) sm S`` per logit
    (docs/PROOFS.md 5.3), which moves these certificates by ~4e-4 relative (compressed
    prefix) and up to ~5e-5 absolute (exact new tokens)."""
    monkeypatch.setenv("WITCERT_NATIVE_EXTEND_ARITH", arith)
    b, qsl, seq_lens = _vllm_batch()
    cert = CertConfig(radius="min")
    out_c, res_c = _attend(b, qsl, seq_lens, cert, "on")
    out_t, res_t = _attend(b, qsl, seq_lens, cert, "off")
    rows = torch.arange(2, b.q.shape[0])
    torch.testing.assert_close(out_c[rows].float(), out_t[rows].float(), rtol=1e-2, atol=1e-2)
    c, t = res_c.prefill_cert.double(), res_t.prefill_cert.double()
    assert torch.isfinite(c).all()
    if arith == "f64":
        assert (c <= t * (1 + 1e-5) + 1e-12).all()
        assert ((t - c).abs() <= 1e-3 * t + 4e-6).all(), (c, t)
    else:
        assert ((t - c).abs() <= 2e-3 * t + 1e-4).all(), (c, t)


def test_a_batch_without_decode_rows_returns_only_prefill_certificates():
    b, qsl, seq_lens = _vllm_batch()
    sub = slice(2, 5)
    q0 = int(qsl[2])
    qsl2 = qsl[2:] - q0
    rows = slice(q0, None)
    out = torch.zeros(b.q[rows].shape, dtype=torch.bfloat16)
    res = attend_batch(b.q[rows], b.k_new[rows], b.v_new[rows], b.layer, query_start_loc=qsl2,
                       seq_lens=seq_lens[sub], block_table=b.block_table[sub], page_size=16,
                       sm_scale=0.125, cert=CertConfig(), num_layers=L, out=out, native="on")
    assert res.cert is None and res.decode_rows.numel() == 0
    assert res.prefill_cert.shape == (31, 6) and torch.isfinite(res.prefill_cert).all()


def test_prefill_certificates_reach_the_worker_snapshot_and_metrics_apart_from_decode(tmp_path):
    from witcert.integrations.vllm.metrics import WitcertCollector
    from witcert.integrations.vllm.stats import WorkerStats, merge

    b, qsl, seq_lens = _vllm_batch()
    _, res = _attend(b, qsl, seq_lens, CertConfig(), "on")
    res.prefill_cert[0, 0] = float("inf")  # one overflowed prefill certificate
    ws = WorkerStats(num_layers=2, num_q_heads=6, tau=0.2, stats_dir=str(tmp_path), info={})
    for layer in range(2):
        ws.record(layer, res.cert, decode_tokens=2, prefill_tokens=res.prefill_tokens,
                  prefill_cert=res.prefill_cert)
    ws.end_step()
    m = merge([ws.snapshot()])
    pc = res.prefill_cert.double()
    assert m["certificates"] == 2 * 2 * 6 and m["steps"] == 1  # decode only
    assert m["prefill_certificates"] == 2 * pc.numel() and m["prefill_overflow"] == 2
    assert m["prefill_covered"] == 2 * int((torch.isfinite(pc) & (pc <= 0.2)).sum())
    names = {f.name: f.samples[0].value for f in WitcertCollector(str(tmp_path), tau=0.2).collect()}
    assert names["witcert_prefill_certificates"] == m["prefill_certificates"]
    assert names["witcert_prefill_overflow"] == 2
    assert names["witcert_certificates"] == 24


# ---- position key: the pool-read extend (consistent reads, docs/VLLM.md "Dither key") ----

def _position_prompt(N=40):
    """One 40-token prompt, every token stored under the position-keyed dither."""
    b = make_batch(prefix_lens=(0,), new_lens=(N,), hq=6, hkv=2, d=64, page=16, seed=21,
                   key="position", pool_read=True)
    return b


def _steps(b, cuts, cert, native_mode):
    """The prompt scheduled as chunks ``cuts`` (one attend_batch per step, seq_len = the
    chunk's end): out [N, Hq, D] and the prefill certificates [N, Hq] (a 1-token chunk is a
    decode row)."""
    N = cuts[-1]
    out = torch.zeros(N, 6, 64, dtype=torch.bfloat16)
    certs = torch.empty(N, 6)
    for lo, hi in zip(cuts, cuts[1:]):
        o = torch.zeros(hi - lo, 6, 64, dtype=torch.bfloat16)
        res = attend_batch(b.q[lo:hi], b.k_new[lo:hi], b.v_new[lo:hi], b.layer,
                           query_start_loc=torch.tensor([0, hi - lo], dtype=torch.int32),
                           seq_lens=torch.tensor([hi], dtype=torch.int32),
                           block_table=b.block_table, page_size=16, sm_scale=0.125, cert=cert,
                           num_layers=L, out=o, native=native_mode, pool_read=True)
        out[lo:hi] = o
        certs[lo:hi] = res.prefill_cert if hi - lo > 1 else res.cert
    return out, certs


@pytest.mark.parametrize("native_mode", ["on", "off"])
def test_position_key_extend_rows_do_not_depend_on_the_chunking_and_equal_the_decode(native_mode):
    b = _position_prompt()
    cert = CertConfig(radius="min")
    whole = _steps(b, [0, 40], cert, native_mode)
    for cuts in ([0, 24, 40], [0, 16, 17, 40]):  # two chunks; a prefix hit + 1-token step + rest
        got = _steps(b, cuts, cert, native_mode)
        dec_rows = {lo for lo, hi in zip(cuts, cuts[1:]) if hi - lo == 1}
        same = [j for j in range(40) if j not in dec_rows]
        for g, w in zip(got, whole):  # extend rows: bitwise; a 1-token decode row: within tiers
            assert torch.equal(g[same], w[same]), cuts
            torch.testing.assert_close(g.float(), w.float(), rtol=1e-2, atol=1e-5)
    # every row is the decode of one query at its position over the pool
    dl = anytime_delta(cert, num_layers=L, num_q_heads=6, positions=list(range(1, 41)))
    o, c = decode_batched(b.q[:40], b.layer, b.block_table.expand(40, -1).contiguous(),
                          torch.arange(1, 41, dtype=torch.int32), page_size=16, sm_scale=0.125,
                          cert=cert, delta_loc=dl, native=native_mode)
    torch.testing.assert_close(whole[0].float(), o.to(torch.bfloat16).float(), rtol=1e-2, atol=1e-2)
    assert torch.isfinite(whole[1]).all()
    assert ((whole[1].double() - c.double()).abs() <= 1e-3 * c.double() + 1e-6).all(), (whole[1], c)


@pytest.mark.parametrize("arith,exact_max", [("f64", 1e-9), ("f32", 1e-4)])
def test_slot_key_extend_rows_keep_the_exact_new_tokens(arith, exact_max, monkeypatch):
    """pool_read off (the slot key): the new tokens are read exactly, as before (an extend
    over an empty prefix has only the arithmetic certificate: below 1e-9 with float64 dots,
    ~1e-5 with the fp32 dots of the default, docs/PROOFS.md 5.3)."""
    monkeypatch.setenv("WITCERT_NATIVE_EXTEND_ARITH", arith)
    b = _position_prompt()
    cert = CertConfig(radius="min")
    out = torch.zeros(40, 6, 64, dtype=torch.bfloat16)
    res = attend_batch(b.q[:40], b.k_new[:40], b.v_new[:40], b.layer,
                       query_start_loc=torch.tensor([0, 40], dtype=torch.int32),
                       seq_lens=torch.tensor([40], dtype=torch.int32), block_table=b.block_table,
                       page_size=16, sm_scale=0.125, cert=cert, num_layers=L, out=out, native="on")
    assert (res.prefill_cert < exact_max).all()
    _, pooled = _steps(b, [0, 40], cert, "on")
    assert (pooled > 1e-6).all()
