"""``witcert eval teacher-forcing``: metrics are right on known inputs, and on the bundled
model the quick run certifies every sampled (layer, head, step) with zero violations."""

from __future__ import annotations

import json

import pytest
import torch

from witcert.cli import main as cli_main
from witcert.commands.eval import _step_metrics, reference_text


def test_reference_text_is_fixed_and_long():
    a, b = reference_text(), reference_text()
    assert a == b and len(a) > 200_000  # far beyond 2048 + 64 tokens
    assert a.startswith('The "assert" statement')


def test_step_metrics_on_known_logits():
    base = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0],
                         [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    same = _step_metrics(base, base.clone())
    assert same["kl"] == [0.0, 0.0] and same["top1"] == [True, True]
    assert same["top5_overlap"] == [1.0, 1.0]
    wit = base.clone()
    wit[0, 5] = 10.0  # new top-1 from outside the top 5: 4 of 5 shared
    m = _step_metrics(base, wit)
    assert m["top1"] == [False, True] and m["top5_overlap"] == [0.8, 1.0]
    lb, lw = base[0].double().log_softmax(0), wit[0].double().log_softmax(0)
    assert m["kl"][0] == pytest.approx((lb.exp() * (lb - lw)).sum().item(), rel=1e-12)
    assert m["kl"][1] == 0.0


def test_sweep_is_dispatched_to_its_module_or_reported_missing(monkeypatch, capsys):
    import importlib.util
    import sys

    from witcert.cli import build_parser
    from witcert.commands.eval import SWEEP_MODULE

    if importlib.util.find_spec(SWEEP_MODULE) is not None:
        args = build_parser("eval").parse_args(["eval", "sweep"])
        assert args._eval.__module__ == SWEEP_MODULE
    monkeypatch.setitem(sys.modules, SWEEP_MODULE, None)  # as in a build without the sweep
    assert cli_main(["eval", "sweep"]) == 2
    assert "not implemented in this build" in capsys.readouterr().out


@pytest.mark.model
def test_quick_teacher_forcing_has_zero_violations(tmp_path):
    pytest.importorskip("transformers")
    from witcert.hf.model import bundled_gguf_path

    try:
        bundled_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "tf.json"
    # --quick sizes (prefill 256), fewer steps to keep CI short; all layers checked.
    rc = cli_main(["eval", "teacher-forcing", "--quick", "--steps", "6", "--seed", "11",
                   "--out", str(out)])
    rep = json.loads(out.read_text())
    assert rc == 0
    s = rep["summary"]
    assert rep["text"] == {"source": "pydoc_data.topics (sorted keys, joined)", "tokens": 262,
                           "prefill_tokens": 256, "steps": 6, "feed": "baseline"}
    assert s["checked"] == 6 * 30 * 9 and s["violations"] == 0 and s["radius_violations"] == 0
    assert s["tightness_median"] >= 1.0 and s["tightness_p90"] >= s["tightness_median"]
    assert 0.0 <= s["coverage"] <= 1.0 and s["overflow_fraction"] == 0.0
    assert 0.0 <= s["kl_mean"] <= s["kl_max"] < 0.1 and s["top1_agreement"] >= 0.5
    assert 0.0 <= s["top5_overlap"] <= 1.0
    for key in ("kl", "top1", "top5_overlap", "token"):
        assert len(rep["per_step"][key]) == 6
    assert rep["certificates"]["radius_kinds"] == ["min"]
    assert rep["certificates"]["max_err_over_radius"] <= 1.0
    assert rep["bytes"]["saved_fraction"] > 0.4
    assert rep["cert_log"]["records"] == 6 * 30 * 9
