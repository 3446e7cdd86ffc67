"""Long first-use steps say what they are doing: the GGUF conversion (a line per stage), the
native C build (a line before gcc runs and one after), and ``witcert trace`` (a line per
decode step). All go to stderr, so piped output stays clean."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="the native build needs gcc")
def test_native_build_prints_a_line_before_and_after_compiling_and_nothing_when_cached(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), WITCERT_NATIVE_CACHE=str(tmp_path))
    code = "import witcert.native as n; n.lib(); print('loaded')"
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=600)
    assert first.returncode == 0 and first.stdout.strip() == "loaded", first.stderr
    lines = first.stderr.strip().splitlines()
    assert "compiling the native CPU kernels with gcc" in lines[0] and str(tmp_path) in lines[0]
    assert "native CPU kernels built in" in lines[-1]
    again = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0 and again.stderr == ""


def test_gguf_conversion_prints_each_stage_in_order(tmp_path, monkeypatch, capsys):
    """Transformers' readers are replaced by stand-ins (the stages, not the conversion itself,
    are under test here; the conversion is covered wherever the bundled model loads)."""
    transformers = pytest.importorskip("transformers")
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from witcert.hf import model as hf_model

    calls = []

    class Config:
        tie_word_embeddings = False

    class Model:
        def load_state_dict(self, tensors, strict):
            calls.append("load")
            return [], []

        def tie_weights(self):
            pass

        def save_pretrained(self, out):
            calls.append("save")

    class Tok:
        def save_pretrained(self, out):
            calls.append("tok")

    monkeypatch.setattr(transformers, "AutoConfig",
                        type("C", (), {"from_pretrained": staticmethod(lambda *a, **k: Config())}))
    monkeypatch.setattr(transformers, "AutoModelForCausalLM",
                        type("M", (), {"from_config": staticmethod(lambda *a, **k: Model())}))
    monkeypatch.setattr(transformers, "AutoTokenizer",
                        type("T", (), {"from_pretrained": staticmethod(lambda *a, **k: Tok())}))
    monkeypatch.setattr(gguf_utils, "load_gguf_checkpoint",
                        lambda *a, **k: calls.append("dequant") or {"tensors": {}})
    hf_model._convert_gguf(tmp_path / "m.gguf", tmp_path / "out")
    err = capsys.readouterr().err.splitlines()
    assert calls == ["dequant", "load", "save", "tok"]
    assert "converting it once" in err[0]
    stages = [line for line in err if "witcert: [" in line]
    assert [s.split("]")[0][-3:] for s in stages] == ["1/4", "2/4", "3/4", "4/4"]
    assert "conversion done in" in err[-1]


def test_trace_progress_prints_one_line_per_decode_step_and_forwards_every_call(capsys):
    from witcert.commands.trace import StepProgress

    seen = []

    class Inner:
        wants_radius = True

        def on_decode(self, **kw):
            seen.append(kw["layer_idx"])

    obs = StepProgress(Inner(), steps=3)
    for _ in range(3):
        for layer in range(4):
            obs.on_decode(layer_idx=layer, q=None)
    lines = capsys.readouterr().err.strip().splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        "trace: decode step 1/3", "trace: decode step 2/3", "trace: decode step 3/3"]
    assert seen == [0, 1, 2, 3] * 3 and obs.wants_radius
