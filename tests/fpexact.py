"""Exact total variation for the soundness tests: a re-export of ``witcert.report.exact_tv``
(one copy, shared with the report and ``benchmarks/soundness_sweep.py``), and the float tier
of the tensor-core kernels (``fp16_sdpa_error``: what fp16 SDPA gets wrong on the same values)."""

from witcert.report.exact_tv import _tv_mp, exact_shifted_logits, tv  # noqa: F401


def fp16_sdpa_error(q, kh, vh, *, sm_scale, visible=None):
    """The float tier of the tensor-core kernels: max error against float64 attention of
    attention computed as fp16 SDPA does it on the same values (q, k, v rounded to fp16, fp32
    logits, weights rounded to fp16, fp32 sums).

    q: [T, Hq, D] or [Hq, D]; kh, vh: [N, Hkv, D]; visible: bool [T, N] (None: all).
    Returns (error, float64 attention of q's shape).
    """
    import torch

    one = q.dim() == 2
    q3 = (q[None] if one else q).cpu()
    hq, hkv = q3.shape[1], kh.shape[1]
    kvh = torch.arange(hq) // (hq // hkv)
    k, v = kh.cpu()[:, kvh], vh.cpu()[:, kvh]  # [N, Hq, D]
    vis = torch.ones(q3.shape[0], k.shape[0], dtype=torch.bool) if visible is None else visible.cpu()

    def attend(qq, kk, vv, dtype, round_p):
        z = sm_scale * torch.einsum("thd,nhd->htn", qq.to(dtype), kk.to(dtype))
        z = z.masked_fill(~vis[None], float("-inf"))
        p = torch.exp(z - z.amax(-1, keepdim=True))
        pr = p.half().to(dtype) if round_p else p
        return torch.einsum("htn,nhd->thd", pr, vv.to(dtype)) / p.sum(-1)[..., None].transpose(0, 1)

    out64 = attend(q3, k, v, torch.float64, False)
    out16 = attend(*(x.half() for x in (q3, k, v)), torch.float32, True)
    err = (out16.double() - out64).abs().max().item()
    return err, (out64[0] if one else out64)
