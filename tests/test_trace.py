"""Audit trace: files have the documented format, recheck passes on honest records and
fails on tampered ones (cert lowered below TV, radius shrunk).

The first tests build records from the reference quantizer and certificate (no model);
the ``model`` tests trace the bundled SmolLM2-135M through the real WitCertCache.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from witcert.cli import main as cli_main
from witcert.config import QuantConfig
from witcert.ref.cert import certificate, radius_det
from witcert.ref.compressors import compress_roundtrip
from witcert.ref.types import EncodeCtx
from witcert.eval.trace import (TRACE_FORMAT, check_record, read_record, recheck_dir, record_name,
                           recompute, write_record)

HQ, HKV, D, N, G = 6, 2, 64, 97, 32
SM = D ** -0.5


def _record(seed: int = 0) -> dict:
    """One honest record from the reference: dither8 keys, deterministic radius, A - 1."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(N, HKV, D, generator=g) * 2.0
    q = torch.randn(HQ, D, generator=g) * 3.0
    k_hat, wit = compress_roundtrip(k, quant=QuantConfig(seed=seed + 1),
                                    ctx=EncodeCtx.simple(num_tokens=N, num_heads=HKV, seed=seed + 1))
    kv = torch.arange(HQ) // (HQ // HKV)
    u = radius_det(q, wit[:, kv].transpose(0, 1), sm_scale=SM, group_size=G)  # [Hq, N]
    zh = SM * torch.einsum("hd,nhd->hn", q, k_hat[:, kv])
    _, cert = certificate(zh, u)
    return {"q": q, "k_exact": k.transpose(0, 1), "k_hat": k_hat.transpose(0, 1),
            "radius": u.float(), "cert": cert.float()}


def _meta(layer=0, step=0) -> dict:
    return {"sm_scale": repr(SM), "group_size": str(G), "dither_bits": "16", "method": "dither8",
            "radius": "det", "delta": "0.01", "delta_loc": "1e-6", "allocation": "fixed",
            "layer": str(layer), "step": str(step), "model": "synthetic",
            "witcert_version": "test"}


def _tamper(path, **change):
    tensors, meta = read_record(path)
    for name, fn in change.items():
        tensors[name] = fn(tensors, meta)
    write_record(path, meta=meta, **tensors)


def test_record_round_trips_and_rechecks_clean(tmp_path):
    p = write_record(tmp_path / record_name(3, 7), meta=_meta(3, 7), **_record())
    tensors, meta = read_record(p)
    assert meta["format"] == TRACE_FORMAT and meta["layer"] == "3" and meta["seq_len"] == str(N)
    assert tensors["q"].shape == (HQ, D) and tensors["k_hat"].shape == (HKV, N, D)
    c = check_record(tensors, meta)
    assert c.ok and c.layer == 3 and c.step == 7
    assert all(tv <= ce for tv, ce in zip(c.tv, c.cert)) and max(c.max_err_ratio) <= 1.0


def test_recompute_matches_a_direct_float64_tv():
    r = _record(1)
    got = recompute(r["q"], r["k_exact"], r["k_hat"], r["radius"], sm_scale=SM)
    for h in range(HQ):
        kvh = h // (HQ // HKV)
        z = SM * (r["q"][h].double() @ r["k_exact"][kvh].double().T)
        zh = SM * (r["q"][h].double() @ r["k_hat"][kvh].double().T)
        tv = 0.5 * (z.softmax(0) - zh.softmax(0)).abs().sum()
        a = (zh.softmax(0) * r["radius"][h].double().exp()).sum() - 1
        assert got["tv"][h].item() == pytest.approx(tv.item(), rel=1e-12)
        assert got["cert"][h].item() == pytest.approx(a.item(), rel=1e-10)


def test_recheck_fails_when_cert_is_lowered_below_tv(tmp_path):
    p = write_record(tmp_path / record_name(0, 0), meta=_meta(), **_record())
    _tamper(p, cert=lambda t, m: recompute(t["q"], t["k_exact"], t["k_hat"], t["radius"],
                                           sm_scale=SM)["tv"].float() * 0.5)
    c = recheck_dir(tmp_path)[0]
    assert not c.sound and not c.cert_ok and not c.ok


def test_recheck_fails_when_radius_is_shrunk(tmp_path):
    p = write_record(tmp_path / record_name(0, 0), meta=_meta(), **_record())
    _tamper(p, radius=lambda t, m: t["radius"] * 0.05)
    c = recheck_dir(tmp_path)[0]
    assert not c.radius_ok and not c.cert_ok and not c.ok


def test_stored_inf_cert_is_honest_only_when_it_can_be():
    r = _record(2)
    r["radius"][0, 5] = math.inf
    r["cert"][0] = math.inf
    assert check_record(r, _meta()).ok
    r2 = _record(2)
    r2["cert"][1] = math.inf  # finite radius, small A - 1: an inf here was not computed honestly
    assert not check_record(r2, _meta()).cert_ok


def test_write_record_rejects_inconsistent_shapes(tmp_path):
    r = _record()
    r["radius"] = r["radius"][:, :-1]
    with pytest.raises(ValueError, match="inconsistent shapes"):
        write_record(tmp_path / "x.safetensors", meta=_meta(), **r)


def test_recheck_cli_exit_codes(tmp_path, capsys):
    for step in range(2):
        write_record(tmp_path / record_name(0, step), meta=_meta(0, step), **_record(step))
    assert cli_main(["recheck", str(tmp_path), "--json", str(tmp_path / "r.json")]) == 0
    assert "recheck: OK, 2 records" in capsys.readouterr().out
    assert all(r["ok"] for r in json.loads((tmp_path / "r.json").read_text()))
    _tamper(tmp_path / record_name(0, 1), radius=lambda t, m: t["radius"] * 0.05)
    assert cli_main(["recheck", str(tmp_path)]) == 1
    assert "VIOLATED" in capsys.readouterr().out


# ---- bundled model ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    pytest.importorskip("transformers")
    from witcert.hf.model import bundled_gguf_path

    try:
        bundled_gguf_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    from pydoc_data.topics import topics

    d = tmp_path_factory.mktemp("trace")
    (d / "prompt.txt").write_text(topics["assignment"][:2000])
    out = d / "out"
    rc = cli_main(["trace", "--text-file", str(d / "prompt.txt"), "--out", str(out),
                   "--steps", "2", "--layers", "0", "29", "--prefill-tokens", "48", "--seed", "5"])
    assert rc == 0
    return out


@pytest.mark.model
def test_trace_on_bundled_model_writes_documented_files(traced):
    manifest = json.loads((traced / "manifest.json").read_text())
    names = sorted(p.name for p in traced.glob("L*_S*.safetensors"))
    assert (traced / "heatmap.png").read_bytes()[:4] == b"\x89PNG"
    lines = (traced / "certs.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 30 + 1 and json.loads(lines[-1])["summary"]["records"] == 2 * 30 * 9
    assert names == sorted(manifest["files"]) == [
        "L000_S00000.safetensors", "L000_S00001.safetensors",
        "L029_S00000.safetensors", "L029_S00001.safetensors"]
    tensors, meta = read_record(traced / "L029_S00001.safetensors")
    n = 48 + 2  # prompt, then the tokens of decode steps 0 and 1
    shapes = {"q": (9, 64), "k_exact": (3, n, 64), "k_hat": (3, n, 64), "radius": (9, n),
              "cert": (9,)}
    assert {k: tuple(v.shape) for k, v in tensors.items()} == shapes
    assert all(v.dtype == torch.float32 for v in tensors.values())  # fp32 model: fp32 k_exact
    for key in ("sm_scale", "group_size", "dither_bits", "delta", "delta_loc", "allocation",
                "radius", "layer", "step", "model", "witcert_version"):
        assert key in meta, key
    assert meta["layer"] == "29" and meta["step"] == "1" and meta["radius"] == "min"
    assert float(meta["sm_scale"]) == pytest.approx(64 ** -0.5)
    assert 0 < float(meta["delta_loc"]) < float(meta["delta"])
    assert not torch.equal(tensors["k_exact"], tensors["k_hat"])
    assert (tensors["radius"] > 0).all() and torch.isfinite(tensors["cert"]).all()


@pytest.mark.model
def test_recheck_passes_on_bundled_model_trace(traced, capsys):
    assert cli_main(["recheck", str(traced)]) == 0
    assert "recheck: OK, 4 records, 36" in capsys.readouterr().out


@pytest.mark.model
def test_recheck_fails_on_tampered_bundled_model_trace(traced, tmp_path):
    import shutil

    for i, change in enumerate([
            {"cert": lambda t, m: recompute(t["q"], t["k_exact"], t["k_hat"], t["radius"],
                                            sm_scale=float(m["sm_scale"]))["tv"].float() * 0.9},
            {"radius": lambda t, m: t["radius"] * 0.1}]):
        d = tmp_path / f"t{i}"
        shutil.copytree(traced, d)
        _tamper(d / "L000_S00001.safetensors", **change)
        assert cli_main(["recheck", str(d), "--quiet"]) == 1


@pytest.mark.model
def test_audit_md_snippet_runs_on_a_real_trace(traced, capsys):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "AUDIT.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) <= 15
    exec(code.replace("trace/L000_S00000.safetensors", str(traced / "L000_S00000.safetensors")), {})
    assert capsys.readouterr().out.startswith("TV [")
