"""The README's Python examples run as written (a new user's first copy-paste).

Each ```python block of README.md runs in a fresh interpreter from the repository root; the
transformers example needs the bundled model (marked ``model``: skipped where it is missing).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(), flags=re.S | re.M)


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_readme_has_the_two_python_examples():
    blocks = _blocks()
    assert len(blocks) == 2, [b.splitlines()[0] for b in blocks]
    assert "decode_attention" in blocks[0] and "generate(" in blocks[1]


def test_the_reference_example_runs_and_prints_a_certificate_per_head():
    res = _run(_blocks()[0])
    assert res.returncode == 0, res.stderr[-2000:]
    # "torch.Size([1, 8, 128]) min tensor([[c_0, ..., c_7]])": eight finite certificates in [0, 1]
    assert res.stdout.startswith("torch.Size([1, 8, 128]) min tensor("), res.stdout
    certs = [float(x) for x in re.findall(r"[-+0-9.e]+", res.stdout.split("tensor(")[1])]
    assert len(certs) == 8 and all(0.0 <= c <= 1.0 for c in certs), certs


@pytest.mark.model
def test_the_transformers_example_generates_with_certificates():
    res = _run(_blocks()[1])
    assert res.returncode == 0, res.stderr[-2000:]
    last = res.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"(\d+) certificates over (\d+) steps; coverage at tau 0.2: ([0-9.]+)%; largest ([0-9.]+)", last)
    assert m, last
    records, steps = int(m.group(1)), int(m.group(2))
    assert steps >= 1 and records > 0 and records % steps == 0  # one per (layer, head) and step
