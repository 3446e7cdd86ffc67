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


def test_torch_fallback_runs_the_spec_and_agrees_with_the_c_path():
    b, qsl, seq_lens = _vllm_batch()
    cert = CertConfig(radius="min")
    out_c, res_c = _attend(b, qsl, seq_lens, cert, "on")
    out_t, res_t = _attend(b, qsl, seq_lens, cert, "off")
    rows = torch.arange(2, b.q.shape[0])
    torch.testing.assert_close(out_c[rows].float(), out_t[rows].float(), rtol=1e-2, atol=1e-2)
    c, t = res_c.prefill_cert.double(), res_t.prefill_cert.double()
    assert torch.isfinite(c).all() and (c <= t * (1 + 1e-5) + 1e-12).all()
    assert ((t - c).abs() <= 1e-3 * t + 4e-6).all(), (c, t)


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
