"""CertLog / PrometheusExporter: the numbers they report equal a direct float64 count."""

from __future__ import annotations

import json
import math

import pytest
import torch

from witcert.runtime.telemetry import HIST_BINS, CertLog, PrometheusExporter, hist_edges

L, HQ, TAU = 3, 5, 0.2


def _certs(steps: int, batch: int, seed: int = 0) -> torch.Tensor:
    """[steps, L, B, Hq] float32 certificates spanning decades, with exact-tau, 0 and inf."""
    g = torch.Generator().manual_seed(seed)
    c = torch.pow(10.0, torch.empty(steps, L, batch, HQ).uniform_(-7, 1.5, generator=g))
    c[0, 0, 0, 0] = TAU  # exactly tau counts as covered
    c[0, 0, 0, 1] = 0.0
    c[1, 2, 0, 3] = math.inf
    c[min(2, steps - 1), 1, batch - 1, 4] = math.inf
    return c.float()


def _fill(certs: torch.Tensor, stride: int = 1, device: str = "cpu") -> CertLog:
    log = CertLog(num_layers=L, num_q_heads=HQ, tau=TAU, stride=stride, device=device)
    for step in certs:
        for layer in range(L):
            log.record_(layer, step[layer].to(device))
        log.end_step_()
    return log


def test_summary_matches_direct_float64_count():
    certs = _certs(steps=7, batch=3)
    s = _fill(certs).summary()
    c = certs.double()
    finite = torch.isfinite(c)
    assert s["steps"] == 7 and s["records"] == c.numel()
    assert s["covered"] == int((finite & (c <= TAU)).sum())
    assert s["coverage"] == pytest.approx(s["covered"] / c.numel(), rel=0, abs=0)
    assert s["overflow"] == 2 and s["overflow_fraction"] == 2 / c.numel()
    assert s["invalid"] == 0
    assert s["finite_max"] == c[finite].max().item()
    assert s["finite_mean"] == pytest.approx(c[finite].mean().item(), rel=1e-12)
    per = s["per_layer_head"]
    for layer in range(L):
        for h in range(HQ):
            x = c[:, layer, :, h].flatten()
            f = x[torch.isfinite(x)]
            assert per["count"][layer][h] == x.numel()
            assert per["max"][layer][h] == f.max().item()
            assert per["mean"][layer][h] == pytest.approx(f.mean().item(), rel=1e-12)
            assert per["overflow"][layer][h] == int(torch.isinf(x).sum())
            assert per["coverage"][layer][h] == int((f <= TAU).sum()) / x.numel()
    # histogram: (edges[i-1], edges[i]] buckets, finite values only
    edges = hist_edges()
    f = c[finite]
    want = [int((f <= edges[0]).sum())]
    want += [int(((f > edges[i - 1]) & (f <= edges[i])).sum()) for i in range(1, HIST_BINS + 1)]
    want += [int((f > edges[-1]).sum())]
    assert s["histogram"]["counts"] == want
    assert sum(want) + s["overflow"] == s["records"]


def test_overflow_counts_against_coverage_and_is_not_in_finite_stats():
    log = CertLog(num_layers=1, num_q_heads=2, tau=0.5)
    log.record_(0, torch.tensor([[0.1, math.inf]]))
    log.end_step_()
    s = log.summary()
    assert s["coverage"] == 0.5 and s["overflow"] == 1 and s["overflow_fraction"] == 0.5
    assert s["finite_max"] == pytest.approx(0.1) and s["finite_mean"] == pytest.approx(0.1)
    assert s["per_layer_head"]["max"][0][1] is None  # no finite cert in that cell
    json.dumps(s)  # JSON-safe: no inf / nan


def test_nan_is_reported_as_invalid_never_covered():
    log = CertLog(num_layers=1, num_q_heads=1, tau=0.5)
    log.record_(0, torch.tensor([[math.nan]]))
    s = log.summary()
    assert s["invalid"] == 1 and s["covered"] == 0 and s["coverage"] == 0.0


def test_summary_inside_an_open_step_counts_each_record_once():
    certs = _certs(steps=2, batch=2)[1]  # step 1 holds an overflow
    log = CertLog(num_layers=L, num_q_heads=HQ, tau=TAU)
    log.record_(0, certs[0])
    assert log.summary()["records"] == 2 * HQ and log.steps == 0
    for layer in range(1, L):
        log.record_(layer, certs[layer])
    log.end_step_()
    s = log.summary()
    c = certs.double()
    assert s["records"] == c.numel() and s["steps"] == 1
    assert s["covered"] == int((torch.isfinite(c) & (c <= TAU)).sum())
    assert s["finite_mean"] == pytest.approx(c[torch.isfinite(c)].mean().item(), rel=1e-12)


def test_a_layer_recorded_twice_in_one_step_counts_twice():
    log = CertLog(num_layers=2, num_q_heads=1, tau=0.5)
    log.record_(0, torch.tensor([[0.1]]))
    log.record_(0, torch.tensor([[0.9]]))
    log.record_(1, torch.tensor([[0.2]]))
    log.end_step_()
    s = log.summary()
    assert s["records"] == 3 and s["covered"] == 2
    assert s["per_layer_head"]["max"][0][0] == pytest.approx(0.9)


def test_float64_certs_are_not_rounded_down():
    log = CertLog(num_layers=1, num_q_heads=1, tau=0.1)
    just_above = torch.tensor([[0.1 + 1e-12]], dtype=torch.float64)  # rounds to 0.1 in fp32
    log.record_(0, just_above)
    assert log.summary()["covered"] == 0


def test_empty_log_summary_has_no_fake_numbers():
    s = CertLog(num_layers=2, num_q_heads=2, tau=0.1).summary()
    assert s["records"] == 0 and s["coverage"] is None and s["finite_max"] is None


class _SyncCounter:
    """Counts every Python-level way a tensor reaches the host."""

    NAMES = ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "nonzero")

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for name in self.NAMES:
            orig = getattr(torch.Tensor, name)

            def wrapped(*a, _orig=orig, _name=name, **kw):
                self.calls.append(_name)
                return _orig(*a, **kw)

            monkeypatch.setattr(torch.Tensor, name, wrapped)


def test_record_and_end_step_do_not_touch_the_host(monkeypatch):
    certs = _certs(steps=4, batch=2)
    log = CertLog(num_layers=L, num_q_heads=HQ, tau=TAU, stride=2)
    counter = _SyncCounter(monkeypatch)
    for step in certs:
        for layer in range(L):
            log.record_(layer, step[layer])
        log.end_step_()
    assert counter.calls == []
    log.summary()
    assert counter.calls, "the counter must see summary()'s host copies"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_record_has_no_cuda_sync():
    certs = _certs(steps=3, batch=2).cuda()
    log = CertLog(num_layers=L, num_q_heads=HQ, tau=TAU, device="cuda")
    log.record_(0, certs[0, 0])  # warm-up allocations outside the checked region
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in certs:
            for layer in range(L):
                log.record_(layer, step[layer])
            log.end_step_()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref = _fill(certs.cpu()).summary()
    s = log.summary()
    assert s["records"] == ref["records"] + HQ * 2


def test_stride_keeps_every_stride_th_step_and_jsonl_has_them(tmp_path):
    certs = _certs(steps=5, batch=2)
    log = _fill(certs, stride=2)
    samples = log.samples()
    assert [s[0] for s in samples] == [0, 2, 4]
    for step, layers, buf in samples:
        assert layers == list(range(L)) and buf.shape == (L, 2, HQ)
        assert torch.equal(buf, certs[step].double())
    lines = log.to_jsonl(tmp_path / "c.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    assert len(recs) == 3 * L + 1 and "summary" in recs[-1]
    r = next(x for x in recs[:-1] if x["step"] == 2 and x["layer"] == 1)
    assert r["cert"] == [[None if math.isinf(v) else v for v in row] for row in certs[2, 1].tolist()]


def test_record_rejects_bad_shapes_and_layers():
    log = CertLog(num_layers=2, num_q_heads=3, tau=0.1)
    with pytest.raises(ValueError, match="layer"):
        log.record_(2, torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"\[B, 3\]"):
        log.record_(0, torch.zeros(1, 4))


def _parse(text: bytes) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_prometheus_text_matches_the_log():
    certs = _certs(steps=6, batch=2)
    log = _fill(certs)
    s = log.summary()
    exp = PrometheusExporter()
    exp.update(log, bytes_saved=4096)
    m = _parse(exp.render())
    assert m[("witcert_coverage", (("tau", "0.2"),))] == pytest.approx(s["coverage"])
    assert m[("witcert_overflow_total", ())] == s["overflow"] == 2
    assert m[("witcert_steps_total", ())] == 6
    assert m[("witcert_bytes_saved", ())] == 4096
    assert m[("witcert_certificate_count", ())] == s["records"]
    assert m[("witcert_certificate_sum", ())] == pytest.approx(s["finite_mean"] * (s["records"] - 2))
    # the bucket at le=tau-ish edge 0.1778 counts finite certs <= that edge
    edge = hist_edges()[29].item()
    c = certs.double()
    key = ("witcert_certificate_bucket", (("le", repr(edge)),))
    assert m[key] == int((torch.isfinite(c) & (c <= edge)).sum())


def test_prometheus_counters_stay_monotonic_across_logs_and_use_a_private_registry():
    from prometheus_client import REGISTRY

    exp = PrometheusExporter()
    a = _fill(_certs(steps=3, batch=1, seed=1))
    exp.update(a)
    exp.update(a)  # same log twice: no double count
    b = _fill(_certs(steps=2, batch=1, seed=2))
    exp.update(b)
    m = _parse(exp.render())
    assert m[("witcert_steps_total", ())] == 5
    assert m[("witcert_certificate_count", ())] == 5 * L * HQ
    assert m[("witcert_overflow_total", ())] == 2 + 2
    assert REGISTRY.get_sample_value("witcert_steps_total") is None


def test_heatmap_writes_a_png(tmp_path):
    log = _fill(_certs(steps=2, batch=1))
    for stat in ("max", "mean"):
        p = log.heatmap_png(tmp_path / f"h_{stat}.png", stat=stat)
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000


def test_prefill_records_are_counted_apart_from_decode_records():
    certs = _certs(steps=3, batch=2)
    log = _fill(certs)
    before = log.summary()
    g = torch.Generator().manual_seed(5)
    pre = torch.pow(10.0, torch.empty(L, 7, HQ).uniform_(-7, 1.5, generator=g)).float()
    pre[0, 0, 0], pre[1, 3, 2], pre[2, 6, 4] = TAU, math.inf, math.nan
    for layer in range(L):
        log.record_prefill_(layer, pre[layer])
    s = log.summary()
    for k in ("records", "covered", "overflow", "invalid", "finite_max", "steps"):
        assert s[k] == before[k], k  # decode figures untouched
    p, c = s["prefill"], pre.double()
    finite = torch.isfinite(c)
    assert p["records"] == c.numel() and p["covered"] == int((finite & (c <= TAU)).sum())
    assert p["coverage"] == p["covered"] / c.numel()
    assert p["overflow"] == 1 and p["invalid"] == 1
    assert p["finite_max"] == c[finite].max().item()
    assert p["finite_mean"] == pytest.approx(c[finite].mean().item(), rel=1e-12)
    assert sum(p["histogram_counts"]) == int(finite.sum())
    exp = PrometheusExporter()
    exp.update(log)
    exp.update(log)  # same log twice: no double count
    m = _parse(exp.render())
    assert m[("witcert_prefill_certificates_total", ())] == c.numel()
    assert m[("witcert_prefill_covered_total", ())] == p["covered"]
    assert m[("witcert_prefill_overflow_total", ())] == 2  # +inf and the NaN
    assert m[("witcert_certificate_count", ())] == s["records"]  # decode only


def test_prefill_record_of_the_wrong_shape_is_refused():
    log = CertLog(num_layers=L, num_q_heads=HQ, tau=TAU)
    with pytest.raises(ValueError, match="prefill cert"):
        log.record_prefill_(0, torch.zeros(3, HQ + 1))
    with pytest.raises(ValueError, match="layer"):
        log.record_prefill_(L, torch.zeros(3, HQ))
