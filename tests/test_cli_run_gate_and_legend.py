"""``witcert run``: ``--gate {block,head}`` as the README documents it (``--repair`` kept as
a deprecated alias), and the summary's plain-language legend (``--explain``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from witcert.cli import build_parser
from witcert.commands import options as opt
from witcert.commands.run import configs, repair_mode
from witcert.commands.run_summary import explain_lines, summary_lines

REPO = Path(__file__).resolve().parents[1]


def parse(*argv):
    return build_parser("run").parse_args(["run", *argv])


@pytest.mark.parametrize("argv,mode", [
    ([], None),
    (["--gate"], "block"),
    (["--gate", "block"], "block"),
    (["--gate", "head"], "head"),
    (["--gate", "--tau", "0.1"], "block"),        # bare --gate before another option
    (["--gate", "--repair", "head"], "head"),     # the old spelling
    (["--repair", "head"], "head"),               # the alias alone
    (["--gate", "head", "--repair", "head"], "head"),
])
def test_gate_option_gives_the_repair_mode(argv, mode, capsys):
    assert repair_mode(parse(*argv)) == mode
    err = capsys.readouterr().err
    assert ("deprecated" in err) == ("--repair" in argv)
    assert len(err.strip().splitlines()) <= 1


def test_gate_block_builds_a_block_policy_with_block_tokens():
    _, _, repair = configs(parse("--gate", "block", "--block-tokens", "8"))
    assert (repair.mode, repair.block_tokens) == ("block", 8)
    _, _, repair = configs(parse("--gate"))
    assert (repair.mode, repair.block_tokens) == ("block", 16)


def test_contradicting_repair_is_refused():
    with pytest.raises(opt.UsageError, match="contradicts"):
        repair_mode(parse("--gate", "head", "--repair", "block"))


def test_radius_defaults_to_min_for_dither_and_det_otherwise():
    assert configs(parse())[1].radius == "min"
    assert configs(parse("--method", "rtn8"))[1].radius == "det"
    assert configs(parse("--method", "rtn8", "--radius", "det"))[1].radius == "det"


def _fake_result(*, coverage, gate=None, records=100, radius="min"):
    summary = {"tau": 0.2, "steps": 4, "records": records, "coverage": coverage,
               "overflow_fraction": 0.0, "finite_max": 0.46, "finite_mean": 0.15}
    stats = {"radius": radius, "det_fallback_steps": 0, "allocation": "fixed", "horizon": 5,
             "gate": gate, "nonfinite_token_heads": 0}
    return SimpleNamespace(
        bytes={"bytes_per_token": 12960, "method": "dither8", "fp16_bytes_per_token": 23040,
               "saved_fraction": 0.4375, "bytes_per_token_head_side": 72,
               "fp16_bytes_per_token_head_side": 128},
        cache_stats=stats, cert_summary=summary, token_ids=[[1] * 5], seconds=1.0,
        tokens_per_second=5.0, prompt_tokens=[10])


def test_legend_explains_each_number_with_the_runs_values():
    args = parse()
    text = "\n".join(explain_lines(_fake_result(coverage=0.78), args))
    for needle in ("certificate", "total-", "78.00%", "22.00%", "not errors", "gating is off",
                   "--gate", "0.46", "radius min", "probability", "delta=0.01", "fixed",
                   "is it good?", "fresh secret", "--seed N", "docs/MATH.md"):
        assert needle in text, needle


def test_legend_says_a_fixed_seed_repeats_and_a_deterministic_method_never_varies():
    seeded = "\n".join(explain_lines(_fake_result(coverage=0.9), parse("--seed", "7")))
    assert "repeats these numbers" in seeded and "fresh secret" not in seeded
    rtn = "\n".join(explain_lines(_fake_result(coverage=0.6, radius="det"),
                                  parse("--method", "rtn8")))
    assert "deterministically" in rtn and "delta plays no part" in rtn


def test_legend_with_the_gate_says_coverage_is_after_repair():
    gate = {"heads_gated": 12, "heads_repaired": 12, "bytes_paged": 4096, "cert_after_max": 0.1,
            "mode": "block", "tau": 0.2, "steps_gated": 2, "steps": 4, "blocks_paged": 3,
            "entries_paged": 40, "cert_before_max": 0.5, "exact_store_bytes": 9000}
    text = "\n".join(explain_lines(_fake_result(coverage=0.95, gate=gate), parse("--gate")))
    assert "after the gate's repairs" in text and "12 certificates were above tau" in text
    assert any(line.startswith("gate (block") for line in
               summary_lines(_fake_result(coverage=0.95, gate=gate), parse("--gate")))


def test_summary_line_says_whether_the_seed_was_fixed():
    line = [x for x in summary_lines(_fake_result(coverage=0.8), parse()) if
            x.startswith("certificates:")][0]
    assert line.endswith("seed fresh secret")


@pytest.mark.model
def test_run_gate_block_end_to_end_with_legend_and_json(tmp_path):
    """The README's spelling `witcert run --gate block` runs and gates (real entry point)."""
    pytest.importorskip("transformers")
    from witcert.hf.model import bundled_gguf_path

    try:
        bundled_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    out = tmp_path / "run.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "witcert", "run", "--gate", "block", "--max-new-tokens", "4",
         "--tau", "0.05", "--seed", "3", "--explain", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gate (block, tau=0.05)" in proc.stdout
    assert "What the numbers mean:" in proc.stdout and "--seed fixed" in proc.stdout
    assert "witcert run: loading" in proc.stderr
    rep = json.loads(out.read_text())
    gate = rep["cache_stats"]["gate"]
    assert gate["mode"] == "block" and gate["heads_gated"] > 0
    assert gate["heads_repaired"] == gate["heads_gated"]
    assert rep["seed"] == "set"
