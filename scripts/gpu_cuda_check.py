"""GPU dev check (issue 14): the CUDA tensor-core decode kernel against the Triton kernel and the
reference on small cases, printing the largest differences per configuration (logits used, output,
certificate, radius). Usage: PYTHONPATH=. python scripts/gpu_cuda_check.py"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, "tests")
from test_kernels_decode import make_decode_case  # noqa: E402

from witcert.config import CertConfig  # noqa: E402
from witcert.kernels.decode import decode_attention  # noqa: E402
from witcert.kernels.plan import decode_plan  # noqa: E402


def one(*, seq_lens, hq, hkv, bits, page=16, radius="min", q_dtype=torch.float32, seed=1):
    layer, q, bt, sl, _ = make_decode_case(seq_lens=seq_lens, hq=hq, hkv=hkv, d=128, page=page, bits=bits,
                                           seed=seed, q_dtype=q_dtype)
    kw = dict(page_size=page, sm_scale=128 ** -0.5, cert=CertConfig(radius=radius), delta_loc=1e-6,
              num_splits=None, return_radius=True)
    res = {}
    for impl in ("triton", "cuda"):
        dbg = {}
        res[impl] = (decode_attention(q, layer, bt, sl, debug=dbg, plan=decode_plan("cuda:0").replace(impl=impl), **kw),
                     dbg["logits"])
    (tr, lt), (cu, lc) = res["triton"], res["cuda"]
    fin = torch.isfinite(lt)
    dl = (lt - lc)[fin].abs().max().item() if fin.any() else 0.0
    nan_mismatch = (torch.isnan(lt) != torch.isnan(lc)).sum().item()
    print(f"bits={bits} hq={hq} hkv={hkv} lens={seq_lens} {radius} {q_dtype}: logits max|diff| {dl:.3g} "
          f"(max |l| {lt[fin].abs().max().item():.3g}, nan mismatch {nan_mismatch}); "
          f"out max|diff| {(tr.out - cu.out).abs().max().item():.3g} (max |out| {tr.out.abs().max().item():.3g}); "
          f"cert tri {tr.cert.flatten()[:3].tolist()} cuda {cu.cert.flatten()[:3].tolist()}; "
          f"radius max rel {((tr.radius - cu.radius).abs() / tr.radius.clamp_min(1e-30)).max().item():.3g}; "
          f"lse max|diff| {(tr.lse - cu.lse).abs().max().item():.3g}", flush=True)


if __name__ == "__main__":
    for bits in (16, 8):
        for hq, hkv in ((8, 2), (2, 2), (4, 1)):
            try:
                one(seq_lens=(1, 17, 300, 1000), hq=hq, hkv=hkv, bits=bits)
            except Exception as e:  # noqa: BLE001
                print(f"bits={bits} hq={hq} hkv={hkv}: ERROR {e!r}"[:400], flush=True)
    for radius in ("det", "prob"):
        one(seq_lens=(33, 700), hq=8, hkv=2, bits=16, radius=radius)
    one(seq_lens=(33, 700), hq=8, hkv=2, bits=16, q_dtype=torch.bfloat16)
