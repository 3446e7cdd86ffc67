"""The test command's engine-venv set-up, run for real against a stand-in interpreter.

``scripts/setup_{vllm,sglang}_env.sh`` and ``scripts/test.sh`` are executed with bash; the
"python3.11" they create a venv with is a small shell script that records each call and
prints what pip would (including the dependency-conflict report pip gives for the SGLang
install), so the scripts' own behaviour is tested without downloading gigabytes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

FAKE_PYTHON = r"""#!/usr/bin/env bash
# stand-in interpreter: records its arguments, imitates venv and pip
echo "$*" >> "$FAKE_CALLS"
case "$1 $2" in
  "-m venv") mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; exit 0 ;;
  "-m pip")
    if [ "$3" = "install" ]; then
      echo "Collecting packages ..."
      [ -n "${FAKE_PIP_FAIL:-}" ] && { echo "pip: boom"; exit 1; }
      case "$*" in *xgrammar*)
        echo "ERROR: pip's dependency resolver does not currently take into account all the packages that are installed. This behaviour is the source of the following dependency conflicts."
        echo "sglang 0.5.23 requires xgrammar==0.2.7, but you have xgrammar 0.2.9 which is incompatible." ;;
      esac
      echo "Successfully installed"
    fi
    exit 0 ;;
esac
if [ "$1" = "-" ]; then exit 1; fi          # the readiness probe: not ready
if [ "$1" = "-c" ]; then
  case "$2" in
    *"import witcert, os"*) [ -n "${FAKE_WITCERT_AT:-}" ] && { echo "$FAKE_WITCERT_AT"; exit 0; }; exit 1 ;;
    *) echo "imports ok"; exit 0 ;;
  esac
fi
exit 0
"""


def _env(tmp_path, **extra):
    fake = tmp_path / "bin" / "python3.11"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items()  # the caller's engine settings (and WITCERT_SKIP_ENGINES,
           # which the README's main-suite command sets) would change what the scripts under test do
           if not k.startswith(("WITCERT_VLLM", "WITCERT_SGLANG", "WITCERT_SKIP_ENGINES", "XDG_CACHE"))}
    env.update(FAKE_CALLS=str(tmp_path / "calls.txt"), HOME=str(tmp_path / "home"),
               WITCERT_VLLM_BASE_PYTHON=str(fake), WITCERT_SGLANG_BASE_PYTHON=str(fake))
    env.update(extra)
    return env


def _bash(script, env, *args):
    return subprocess.run(["bash", str(REPO / "scripts" / script), *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_venvs_default_to_a_per_user_cache_folder(tmp_path):
    show = f'source "{REPO}/scripts/engine_env.sh"; echo "$VLLM_VENV"; echo "$SGLANG_VENV"'
    env = _env(tmp_path)
    out = subprocess.run(["bash", "-c", show], env=env, capture_output=True, text=True).stdout
    home = tmp_path / "home"
    assert out.split() == [f"{home}/.cache/witcert/venvs/vllm", f"{home}/.cache/witcert/venvs/sglang"]
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    out = subprocess.run(["bash", "-c", show], env=env, capture_output=True, text=True).stdout
    assert out.split()[0] == f"{tmp_path}/xdg/witcert/venvs/vllm"
    env["WITCERT_VLLM_VENV"] = "/elsewhere/v"
    out = subprocess.run(["bash", "-c", show], env=env, capture_output=True, text=True).stdout
    assert out.split()[0] == "/elsewhere/v"


def test_sglang_setup_keeps_pips_expected_conflict_report_in_its_log(tmp_path):
    venv = tmp_path / "venvs" / "sglang"
    proc = _bash("setup_sglang_env.sh", _env(tmp_path, WITCERT_SGLANG_VENV=str(venv)))
    assert proc.returncode == 0, proc.stderr
    log = venv / "witcert-setup.log"
    assert "dependency conflicts" in log.read_text()
    assert "ERROR" not in proc.stderr and "incompatible" not in proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "note:" in line]
    assert len(notes) == 1 and "expected" in notes[0] and str(log) in notes[0]
    calls = (tmp_path / "calls.txt").read_text()
    assert f"-m venv {venv}" in calls
    assert f"--no-deps -e {REPO}" in calls   # a fresh venv gets this checkout


def test_setup_leaves_a_venvs_existing_witcert_alone(tmp_path):
    venv = tmp_path / "venvs" / "vllm"
    env = _env(tmp_path, WITCERT_VLLM_VENV=str(venv), FAKE_WITCERT_AT="/some/other/clone")
    proc = _bash("setup_vllm_env.sh", env)
    assert proc.returncode == 0, proc.stderr
    assert "editable from /some/other/clone" in proc.stderr
    assert " -e " not in (tmp_path / "calls.txt").read_text()


def test_a_failing_pip_step_shows_the_log_tail_and_where_the_log_is(tmp_path):
    venv = tmp_path / "venvs" / "vllm"
    proc = _bash("setup_vllm_env.sh", _env(tmp_path, WITCERT_VLLM_VENV=str(venv), FAKE_PIP_FAIL="1"))
    assert proc.returncode != 0
    assert "pip: boom" in proc.stderr and f"full log: {venv}/witcert-setup.log" in proc.stderr


def test_test_command_stops_before_the_main_suite_without_python311(tmp_path):
    env = _env(tmp_path, WITCERT_VLLM_BASE_PYTHON="python3.11-not-installed",
               WITCERT_VLLM_VENV=str(tmp_path / "none"))
    proc = _bash("test.sh", env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "python3.11-not-installed" in lines[0]
    assert "WITCERT_VLLM_BASE_PYTHON" in lines[0] and "WITCERT_SKIP_ENGINES=1" in lines[0]
    assert "main suite" not in proc.stdout
