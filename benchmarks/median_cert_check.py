"""Median certificate on the bundled model: greedy generation, every decode record captured.

    PYTHONPATH=<checkout> python benchmarks/median_cert_check.py <radius> <tag> [<dither bits, 16>]

Saves the records to /tmp/certs_<radius>_<tag>.pt, so two checkouts (e.g. before and after
a change of the rounding model) can be compared record by record on the steps where their
greedy tokens still agree (BENCHMARKS.md 8)."""
import sys, torch
from witcert.runtime import telemetry
from witcert.config import CertConfig, QuantConfig
from witcert.hf.generate import generate
from witcert.hf.model import load_model
got = []
orig = telemetry.CertLog.record_
def rec(self, layer, cert):
    got.append(cert.detach().double().flatten().clone())
    return orig(self, layer, cert)
telemetry.CertLog.record_ = rec
torch.set_num_threads(1)
model, tok = load_model(None, dtype=torch.float32, device="cpu")
radius = sys.argv[1]
res = generate(model, tok, ["Explain in two sentences why the sky is blue."], max_new_tokens=94,
               quant=QuantConfig(seed=20261201, dither_bits=int(sys.argv[3]) if len(sys.argv) > 3 else 16),
               cert=CertConfig(radius=radius))
c = torch.cat(got)
f = c[torch.isfinite(c)]
torch.save(c, f"/tmp/certs_{radius}_{sys.argv[2]}.pt")
print(f"radius={radius} records={c.numel()} finite={f.numel()} median={f.median().item():.6f} "
      f"mean={f.mean().item():.6f} above_0.2={(c > 0.2).double().mean().item():.4f} text={res.texts[0][:60]!r}")
