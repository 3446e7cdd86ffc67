"""benchmarks/floor_variants.py: the measurement-only variants the GPU scripts time (BENCHMARKS.md
4t, 13s, 13t). Each is a set of text edits of the current sources; an edit whose text the sources no
longer hold would stop a GPU call, so each must still apply exactly once, and each variant's kernel
file must differ from the package's (its build cache key its own)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import floor_variants  # noqa: E402

from witcert.kernels import cuda as wc_cuda  # noqa: E402


def test_every_variant_applies_to_the_current_sources_and_builds_apart(tmp_path):
    made = {d.name: d for d in floor_variants.write(tmp_path)}
    assert {"r0", "r0codes", "konly", "vonly", "noqk", "tn16", "tn16r168", "radiiearly", "radiifirst"} <= set(made)
    flags = ["-O3"]
    pkg = Path(wc_cuda.__file__).parent
    for name, d in made.items():
        for kernel in ("decode.cu", "extend.cu"):
            if (d / kernel).exists():
                assert wc_cuda.build_key(d / kernel, flags) != wc_cuda.build_key(pkg / kernel, flags), (name, kernel)
    noqk = (made["noqk"] / "extend.cu").read_text()
    assert "measurement-only noqk" in noqk and "mma_f16(c[ks / 2]" not in noqk
    for name, before in (("radiiearly", "// ---- online softmax"), ("radiifirst", "// ---- logits of the warp's")):
        text = (made[name] / "extend.cu").read_text()  # the radii once, ahead; the lambda's calls gone
        assert text.count("radii(nt, ue[nt]);") == 1 and "radii(nt, u);" not in text
        assert text.count("auto radii = [&]") == 1 and text.index("radii(nt, ue[nt]);") < text.index(before)
