"""Every ordinary user error of the CLI is one line on stderr naming the option, exit
status 2, and is reported before any model is loaded.

The real entry point runs in a subprocess (``python -m witcert``). "Before the model loads"
is proven, not timed: ``transformers`` is replaced by a stand-in whose import raises, and
``WITCERT_CACHE`` points at an empty folder, so a command that got as far as loading a
model would fail with that ImportError (a traceback) or leave a converted model behind.
A control case shows the stand-in does break a command that loads the model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FAKE_MARK = "stand-in transformers imported"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    fake = root / "fake" / "transformers"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"raise ImportError({FAKE_MARK!r})\n")
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(root / "fake"), str(REPO)])
    e["WITCERT_CACHE"] = str(root / "cache")
    e.pop("WITCERT_BACKEND", None)
    return e, root


def witcert(env, *args, cache=None):
    e, root = env
    if cache is not None:
        e = dict(e, WITCERT_CACHE=str(cache))
    return subprocess.run([sys.executable, "-m", "witcert", *args], env=e, cwd=root,
                          capture_output=True, text=True, timeout=120)


def assert_one_line_error(proc, *needles):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and FAKE_MARK not in proc.stderr
    assert "error:" in lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert proc.stdout == ""


def test_control_the_stand_in_transformers_breaks_a_command_that_loads_the_model(env):
    proc = witcert(env, "run", "--max-new-tokens", "1")
    assert proc.returncode != 0 and FAKE_MARK in proc.stderr


CASES = [
    # (argv, strings the one line must contain)
    (["run", "--model", "/nonexistent"], ["--model", "/nonexistent", "HF model directory"]),
    (["run", "--device", "cuda"], ["--device", "--device cpu"]),
    (["run", "--device", "nonsense"], ["--device", "cpu, cuda or cuda:N"]),
    (["run", "--max-new-tokens", "0"], ["--max-new-tokens", ">= 1"]),
    (["run", "--max-new-tokens", "many"], ["--max-new-tokens", "not an integer"]),
    (["run", "--radius", "prob", "--method", "rtn8"], ["--radius", "--radius det"]),
    (["run", "--radius", "min", "--method", "fp8"], ["--radius", "--method dither8"]),
    (["run", "--method", "kivi2"], ["--method", "block-granular", "dither8"]),
    (["run", "--method", "int3"], ["--method", "choose from"]),
    (["run", "--tau", "0"], ["--tau", "out of range"]),
    (["run", "--tau", "nan"], ["--tau", "finite"]),
    (["run", "--delta", "1"], ["--delta", "(0, 1)"]),
    (["run", "--seed", "-1"], ["--seed", "2^64"]),
    (["run", "--group-size", "7"], ["--group-size", "choose from"]),
    (["run", "--outliers", "4"], ["--outliers", "--dtype float16"]),
    (["run", "--outliers", "65", "--dtype", "float16"], ["--outliers", "[0, 64]"]),
    (["run", "--outliers", "4", "--dtype", "float16", "--method", "rtn8"], ["--outliers", "dither8"]),
    (["run", "--outlier-profile", "p.json"], ["--outlier-profile", "--outliers"]),
    (["run", "--outliers", "2", "--dtype", "float16", "--outlier-profile", "/nonexistent.json"],
     ["--outlier-profile", "no such file"]),
    (["run", "--gate", "sometimes"], ["--gate", "block or head"]),
    (["run", "--block-tokens", "8"], ["--block-tokens", "--gate"]),
    (["run", "--gate", "head", "--block-tokens", "8"], ["--block-tokens", "block repair"]),
    (["run", "--gate", "head", "--repair", "block"], ["--repair", "contradicts --gate head"]),
    (["run", "--json", "/nonexistent/out.json"], ["--json", "does not exist"]),
    (["run", "--prompt", "  "], ["--prompt", "empty"]),
    (["run", "--no-such-option"], ["unrecognized arguments", "--help"]),
    (["frobnicate"], ["unknown subcommand", "run"]),
    (["demo", "--q-heads", "3"], ["--q-heads", "--kv-heads"]),
    (["demo", "--head-dim", "48"], ["--head-dim", "--group-size"]),
    (["demo", "--tokens", "0"], ["--tokens", "out of range"]),
    (["trace", "--text-file", "/nonexistent.txt", "--out", "t"], ["--text-file", "no such file"]),
    (["trace", "--text-file", "README.md", "--out", "t", "--stride", "0"], ["--stride", ">= 1"]),
    (["trace", "--text-file", "README.md", "--out", "t", "--steps", "0"], ["--steps", ">= 1"]),
    (["trace", "--text-file", "README.md", "--out", "t", "--layers", "-1"], ["--layers"]),
    (["trace", "--text-file", "README.md", "--out", "t", "--preset", "bypass8"], ["--preset"]),
    (["trace", "--text-file", "README.md"], ["--out", "required"]),
    (["trace", "--text-file", "README.md", "--out", "README.md"], ["--out", "not a folder"]),
    (["recheck", "/nonexistent"], ["/nonexistent", "no such folder"]),
    (["recheck", "."], ["no trace records"]),
    (["eval"], ["<evaluation>", "required"]),
    (["eval", "teacher-forcing", "--steps", "0"], ["--steps", ">= 1"]),
    (["eval", "teacher-forcing", "--prefill-tokens", "-5"], ["--prefill-tokens"]),
    (["eval", "teacher-forcing", "--device", "cuda:3"], ["--device"]),
    (["eval", "teacher-forcing", "--model", "README.md"], ["--model", "not a .gguf"]),
    (["eval", "sweep", "--ms", "0", "99"], ["--ms", "[0, 64]"]),
    (["eval", "sweep", "--ms", "4", "--dtype", "float32"], ["--dtype", "float16"]),
    (["eval", "sweep", "--text-file", "/nonexistent.txt"], ["--text-file", "no such file"]),
    (["eval", "sweep", "--calib-tokens", "1"], ["--calib-tokens"]),
    (["calibrate", "--text-file", "README.md", "--outliers", "0", "--out", "p.json"],
     ["--outliers", "[1, 64]"]),
    (["calibrate", "--text-file", "/nonexistent.txt", "--outliers", "4", "--out", "p.json"],
     ["--text-file", "no such file"]),
    (["calibrate", "--text-file", "README.md", "--outliers", "4", "--out", "p.json",
      "--max-tokens", "1"], ["--max-tokens"]),
    (["calibrate", "--text-file", "README.md", "--outliers", "4", "--out", "p.json",
      "--window", "0"], ["--window"]),
    (["report", "--out", "r", "--variants", "witcert-m99"], ["--variants", "witcert-m0"]),
    (["report", "--out", "r", "--needle-tasks", "haystack"], ["--needle-tasks", "single"]),
    (["report", "--out", "r", "--threads", "0"], ["--threads"]),
    (["report", "--out", "r", "--model", "/nonexistent"], ["--model", "no such file"]),
]


@pytest.fixture(scope="module")
def case_runs(env):
    """Every case of CASES run once (a few at a time: each is a fresh interpreter), each with
    its own empty model cache folder: ``{index: (process, cache folder)}``."""
    _, root = env
    (root / "README.md").write_text("Some text to read.\n")

    def one(i):
        cache = root / f"cache{i}"
        return i, (witcert(env, *CASES[i][0], cache=cache), cache)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, range(len(CASES))))


@pytest.mark.parametrize("index", range(len(CASES)), ids=[" ".join(c[0]) for c in CASES])
def test_user_error_is_one_line_exit_2_before_the_model_loads(case_runs, index):
    proc, cache = case_runs[index]
    assert_one_line_error(proc, *CASES[index][1])
    assert not cache.exists(), "a model was converted before the error"


def test_a_text_file_that_is_not_utf8_is_a_one_line_error(env, tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    proc = witcert(env, "trace", "--text-file", str(bad), "--out", str(tmp_path / "t"))
    assert_one_line_error(proc, "--text-file", "UTF-8")


def test_a_corrupt_trace_record_is_a_one_line_error(env, tmp_path):
    (tmp_path / "L00_S0000.safetensors").write_bytes(b"not a safetensors file")
    proc = witcert(env, "recheck", str(tmp_path))
    assert_one_line_error(proc, "unreadable trace record")


def test_unsupported_model_family_is_refused_from_its_config(env, tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    proc = witcert(env, "run", "--model", str(tmp_path))
    assert_one_line_error(proc, "--model", "'gpt2'", "llama")


def test_help_and_no_arguments_exit_0(env):
    for argv in ([], ["--help"], ["run", "--help"], ["eval", "sweep", "--help"]):
        proc = witcert(env, *argv)
        assert proc.returncode == 0 and "usage:" in proc.stdout, (argv, proc.stderr)
