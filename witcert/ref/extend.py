"""Extend (chunked prefill, prefix reuse): T new tokens attend to the compressed prefix and,
causally, to themselves (exact K/V), with a certificate per (new token, query head).

The distribution of new token i is over the Np prefix tokens (dequantized keys: radius =
compression radius + the arithmetic slack of the reference's logits, docs/MATH.md §2, §7)
and the new tokens j <= i (exact keys: radius = the arithmetic slack only). Logits,
softmax, output and certificate follow the reference decode (``witcert.ref.logits``, float64
softmax, ``witcert.ref.cert.certificate``). The probabilistic radius's union bound covers
the Np prefix tokens of the row (the exact tokens have no probabilistic radius); the
caller's ``delta_loc`` is the budget of each (layer, head, new token) (docs/MATH.md §4: the
risk allocation counts every certified new token like a decode step).

Rows are processed in chunks so the float64 work stays O(chunk * (Np + T)).

Pool-read extend (``new_from_pool=True``, the consistent reads of the vLLM plugin's
position-keyed dither, docs/VLLM.md "Dither key"): the T new tokens have already been written
into the pool at the last T of the ``Np = P + T`` prefix slots, and new token j attends
causally over the pool: tokens ``0 .. P + j``, every one read compressed (dequantized, with its
whole radius; a flagged token has radius +inf), nothing exact. Row j is then the reference
decode of a single query over the first ``P + j + 1`` slots (``witcert.ref.attention.
decode_attention``, within float tiers), whatever P and T are: the result of a token does not
depend on how the prompt was split into steps or which part of it was a prefix-cache hit.
The certificate of row j covers exactly its visible tokens, and its probabilistic radius's
union bound covers those ``P + j + 1`` tokens (the row's budget ``delta_loc`` as before).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from witcert.config import CertConfig
from witcert.ref.cert import certificate
from witcert.ref.logits import exact_logits_and_radii, logits_and_radii
from witcert.ref.pool import LayerKV, gather
from witcert.ref.types import K_SIDE, V_SIDE
from witcert.ref.validate import check_attention_dtypes, check_delta_loc, check_sm_scale

INF = float("inf")
ROW_CHUNK = 128


@dataclass
class ExtendOut:
    """out f32 [T, Hq, D]; lse f32 [T, Hq]; cert f32 [T, Hq] (None when disabled; +inf = no
    guarantee); radius_kind as ``DecodeOut``."""

    out: torch.Tensor
    lse: torch.Tensor
    cert: torch.Tensor | None
    radius_kind: str


def _check(q, k_new, v_new, layer_kv, new_from_pool=False, Np=0):
    check_attention_dtypes(q=q, k_new=None if new_from_pool else k_new, v_new=None if new_from_pool else v_new)
    if new_from_pool:
        if q.dim() != 3 or q.shape[-1] != layer_kv.head_dim or q.shape[1] % layer_kv.num_kv_heads:
            raise ValueError(f"q [T, Hq, D] {tuple(q.shape)} does not fit the pool "
                             f"(Hkv={layer_kv.num_kv_heads}, D={layer_kv.head_dim})")
        if Np < q.shape[0]:
            raise ValueError(f"new_from_pool: prefix_slots ({Np}) must hold the T={q.shape[0]} "
                             "new tokens (at its last T slots)")
        return
    if q.dim() != 3 or k_new.shape != v_new.shape or k_new.dim() != 3 or k_new.shape[0] != q.shape[0]:
        raise ValueError(f"q [T, Hq, D] {tuple(q.shape)}, k_new/v_new [T, Hkv, D] "
                         f"{tuple(k_new.shape)}/{tuple(v_new.shape)} disagree")
    T, Hq, D = q.shape
    if D != layer_kv.head_dim or k_new.shape[1:] != (layer_kv.num_kv_heads, D) or Hq % k_new.shape[1]:
        raise ValueError("k_new must be [T, Hkv, D] matching the pool; Hq % Hkv must be 0")


def _zero_bad(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x with the rows holding a non-finite value zeroed, bad rows bool [..])."""
    bad = ~torch.isfinite(x).all(-1)
    return torch.where(bad[..., None], torch.zeros((), dtype=x.dtype, device=x.device), x), bad


def extend_attention_cert(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, layer_kv: LayerKV,
                          prefix_slots: torch.Tensor, *, sm_scale: float, cert: CertConfig,
                          delta_loc=1e-6, causal: bool = True,
                          new_from_pool: bool = False) -> ExtendOut:
    """Extend of one sequence with certificates.

    q: float [T, Hq, D]; k_new, v_new: float [T, Hkv, D] (the new tokens' exact K/V; a row
    with a non-finite value reads 0 and is flagged); prefix_slots: int64 [Np]. delta_loc:
    a float or a tensor [T], the budget of each (head, new token) (prob / min radius). A
    query head with a non-finite entry is attended with those entries zeroed and gets
    cert = +inf.

    new_from_pool: the pool-read extend (module docstring): prefix_slots holds ``P + T`` slots,
    the new tokens' records at the last T; row j sees slots ``0 .. P + j`` (all compressed;
    ``causal`` must be True); k_new and v_new are unused (pass None: the new tokens are read
    back from the pool).
    """
    _check(q, k_new, v_new, layer_kv, new_from_pool, prefix_slots.shape[0])
    if new_from_pool and not causal:
        raise ValueError("new_from_pool: the pool-read extend is causal")
    check_sm_scale(sm_scale)
    if cert.enabled and cert.radius != "det":
        check_delta_loc(delta_loc, batch=q.shape[0])
    T, Hq, D = q.shape
    Hkv = layer_kv.num_kv_heads
    kvh = torch.arange(Hq, device=q.device) // (Hq // Hkv)
    per_head = lambda t: t[:, kvh].transpose(0, 1)  # noqa: E731  [N, Hkv, ...] -> [Hq, N, ...]
    Np = prefix_slots.shape[0]
    kh, kp = gather(layer_kv, K_SIDE, prefix_slots)
    vh, vp = gather(layer_kv, V_SIDE, prefix_slots)
    kbad = ~torch.isfinite(kp["wit"].float()).all(-1)
    vbad = ~torch.isfinite(vp["wit"].float()).all(-1)
    kh = torch.where((kbad[..., None] | ~torch.isfinite(kh)), 0.0, kh)
    vh = torch.where((vbad[..., None] | ~torch.isfinite(vh)), 0.0, vh)
    if new_from_pool:  # the new tokens are the pool's last T slots: no exact keys
        kn = vn = q.new_zeros(0, Hkv, D, dtype=torch.float32)
        knbad = vnbad = torch.zeros(0, Hkv, dtype=torch.bool, device=q.device)
    else:
        kn, knbad = _zero_bad(k_new.to(torch.float32))
        vn, vnbad = _zero_bad(v_new.to(torch.float32))
    Tn = kn.shape[0]  # exact new-token keys (0 when reading from the pool)
    P = Np - T  # pool tokens before the first new one (new_from_pool)
    q32 = q.to(torch.float32)
    qbad = ~torch.isfinite(q32).all(-1)  # [T, Hq]
    q32 = torch.where(torch.isfinite(q32), q32, 0.0)
    G = D // kp["wit"].shape[-1] if Np else layer_kv.quant.group_size
    bypass = layer_kv.bypass_mask(K_SIDE)
    bypass = None if bypass is None else bypass[kvh]
    vall = torch.cat([per_head(vh), per_head(vn)], dim=1).to(torch.float64)  # [Hq, Np + T, D]
    outs, lses, certs = [], [], []
    j = torch.arange(T, device=q.device)
    for lo in range(0, T, ROW_CHUNK):
        hi = min(T, lo + ROW_CHUNK)
        qc = q32[lo:hi]  # [t, Hq, D]
        dl = delta_loc
        if isinstance(dl, torch.Tensor) and dl.dim():  # per new token: [t, 1, 1] against [t, Hq, Np]
            dl = dl.to(device=q.device, dtype=torch.float64).expand(T)[lo:hi].view(-1, 1, 1)
        # union bound: the prefix (normal) or the row's visible pool tokens (pool-read)
        nt = (P + j[lo:hi] + 1).to(torch.float64).view(-1, 1, 1) if new_from_pool else max(Np, 1)
        zp, up = logits_and_radii(
            qc, per_head(kh)[None], sm_scale=sm_scale, cert=cert, wit=per_head(kp["wit"])[None],
            scales=per_head(kp["scales"])[None] if "scales" in kp else None,
            flagged=per_head(kbad | vbad)[None].expand(hi - lo, Hq, Np), group_size=G,
            bits=layer_kv.quant.dither_bits, n_tokens=nt, delta_loc=dl, bypass=bypass,
            has_prob=layer_kv.compressor.has_prob_radius)
        zn, un = exact_logits_and_radii(qc, per_head(kn)[None], torch.zeros(1, Hq, Tn, device=q.device),
                                        sm_scale=sm_scale)
        if un is not None:
            un = torch.where(per_head(knbad | vnbad)[None], INF, un)
        z = torch.cat([zp, zn], dim=-1)  # [t, Hq, Np + T]
        live = torch.ones_like(z, dtype=torch.bool)
        if new_from_pool:  # row j sees pool tokens t <= P + j
            live = (torch.arange(Np, device=q.device)[None, :] <= (P + j[lo:hi])[:, None])[:, None, :]
            live = live.expand(hi - lo, Hq, Np)
        elif causal:
            rows = j[lo:hi]
            live[..., Np:] = (j[None, :] <= rows[:, None])[:, None, :]
        zl = torch.where(live, z.to(torch.float64), -INF)
        m = zl.amax(-1, keepdim=True)
        e = torch.exp(zl - m)
        l = e.sum(-1)
        outs.append((torch.einsum("thn,hnd->thd", e, vall) / l[..., None]).to(torch.float32))
        lses.append((m[..., 0] + torch.log(l)).to(torch.float32))
        if cert.enabled:
            u = torch.cat([up, un], dim=-1)
            _, c = certificate(z, u, mask=live)
            certs.append(torch.where(qbad[lo:hi], INF, c))
    return ExtendOut(out=torch.cat(outs), lse=torch.cat(lses),
                     cert=torch.cat(certs) if cert.enabled else None,
                     radius_kind=cert.radius if cert.enabled else "none")
