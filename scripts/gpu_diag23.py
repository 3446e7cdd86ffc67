"""Diagnostic (GPU): the decode case test_decode_kernel_groups_of_64_and_128_meet_every_tier[64-16-16-cuda]
with the current decode.cu and the previous one (_prev_decode.cu): certificates and radii against the
reference, where they differ most."""
import functools, sys
from pathlib import Path
import torch
sys.path.insert(0, "tests")
from test_kernels_decode import make_decode_case, plan_for
from witcert.config import CertConfig
from witcert.kernels import cuda as wc
from witcert.kernels.decode import decode_attention
from witcert.ref import attention as ref_attn

for group, bits, hq in [(64, 16, 16), (64, 8, 4), (128, 16, 2), (128, 8, 16)]:
    layer, q, bt, sl, exact = make_decode_case(seq_lens=(1, 40, 300), hq=hq, hkv=2, d=128, page=16, bits=bits,
                                               seed=group + bits + hq, group=group)
    kw = dict(page_size=16, sm_scale=0.1, cert=CertConfig(radius="min"), delta_loc=1e-6, num_splits=2, return_radius=True)
    ref = ref_attn.decode_attention(q, layer, bt, sl, **kw)
    now = wc.library
    for name, lib in (("now", now), ("prev", functools.partial(now, src=Path("_prev_decode.cu")))):
        wc.library = lib
        try:
            ker = decode_attention(q, layer, bt, sl, plan=plan_for("cuda"), **kw)
        finally:
            wc.library = now
        rel = ((ker.cert - ref.cert).abs() / ref.cert.abs().clamp_min(1e-9))
        i = int(rel.argmax())
        n = int(sl[-1])
        rr = (ker.radius[-1, :, :n] - ref.radius[-1, :, :n]) / ref.radius[-1, :, :n]
        print(group, bits, hq, name, "cert max rel", f"{rel.max().item():.5f}", "at", divmod(i, hq),
              "ker", ker.cert.flatten()[i].item(), "ref", ref.cert.flatten()[i].item(),
              "radius rel (last seq) min/max", f"{rr.min().item():.3g} {rr.max().item():.3g}", flush=True)
