"""Exact entries over the compressed ones: the spec of a repaired cache (docs/GATING.md).

A gate makes (slot, KV head) entries exact; a decode then reads those entries from an exact
copy instead of from the compressed record. Which entries are exact, and their values, are
the runtime's business (``witcert.runtime.exact.ExactCopy``, one layout for every gate); the spec
only takes them as plain data, ``ExactEntries``, and ``overlay_exact`` says what they do to
one sequence's terms: an exact entry's logit and value replace the dequantised ones, its
radius is the rounding witness of the copy (0 for an exact copy) plus the arithmetic slack
(``witcert.ref.logits.exact_logits_and_radii``), its value witness the copy's V witness.
Letters: Hq query heads, Hkv KV heads, D head dim, N tokens of a sequence, n entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from witcert.ref.logits import exact_logits_and_radii


@dataclass(frozen=True)
class ExactEntries:
    """Exact (slot, KV head) entries of one layer, each at most once.

    slot, kv_head: int64 [n]; k, v: f32 [n, D], the exact rows as the copy holds them;
    wk, wv: f32 [n], their rounding witnesses (``>= ||x_model - x_copy||_2``, 0 when the
    copy holds the model's K/V exactly). All on one device.
    """

    slot: torch.Tensor
    kv_head: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor

    def __post_init__(self) -> None:
        n = self.slot.shape[0]
        for name, t, dt, shape in (("slot", self.slot, torch.int64, (n,)),
                                   ("kv_head", self.kv_head, torch.int64, (n,)),
                                   ("wk", self.wk, torch.float32, (n,)),
                                   ("wv", self.wv, torch.float32, (n,))):
            if t.dtype != dt or tuple(t.shape) != shape:
                raise ValueError(f"ExactEntries.{name}: need {dt} {list(shape)}, got {t.dtype} "
                                 f"{tuple(t.shape)}")
        for name, t in (("k", self.k), ("v", self.v)):
            if t.dtype != torch.float32 or t.dim() != 2 or t.shape[0] != n \
                    or t.shape != self.k.shape:
                raise ValueError(f"ExactEntries.{name}: need f32 [n={n}, D], got {t.dtype} "
                                 f"{tuple(t.shape)}")

    def __len__(self) -> int:
        return self.slot.shape[0]


def _positions(slots: torch.Tensor, exact: ExactEntries) -> tuple[torch.Tensor, torch.Tensor]:
    """(token int64 [m], index int64 [m]): the entries ``index`` of ``exact`` that fall on the
    sequence's ``slots`` (int64 [N], distinct) and the token each one is."""
    dev = slots.device
    es = exact.slot.to(dev)
    size = int(torch.maximum(slots.max(), es.max())) + 1
    pos = torch.full((size,), -1, dtype=torch.int64, device=dev)
    pos[slots] = torch.arange(slots.shape[0], dtype=torch.int64, device=dev)
    tok = pos[es]
    index = (tok >= 0).nonzero().flatten()
    return tok[index], index


def overlay_exact(q: torch.Tensor, slots: torch.Tensor, z: torch.Tensor, v: torch.Tensor,
                  u: torch.Tensor | None, wv: torch.Tensor, exact: ExactEntries | None, *,
                  num_kv_heads: int, sm_scale: float):
    """One sequence's terms with its exact entries read exactly.

    q: f32 [Hq, D] (finite); slots: int64 [N] the sequence's slots; z f32 [Hq, N] logits,
    v f32 [Hq, N, D] values, u f32 [Hq, N] whole radii (None: no certificate), wv f32 [Hq, N]
    value witnesses, as ``witcert.ref.attention.sequence_terms`` builds them from the
    compressed records. exact: the layer's ``ExactEntries`` (None or empty: no change).
    Returns ``(z, v, u, wv)`` where the entries of ``exact`` on ``slots`` have the exact
    logit with radius ``sm ||q||_2 wk`` plus the arithmetic slack, the exact value and ``wv``.
    """
    if exact is None or len(exact) == 0 or slots.numel() == 0:
        return z, v, u, wv
    t_idx, index = _positions(slots, exact)
    if index.numel() == 0:
        return z, v, u, wv
    dev, N, Hkv, D = q.device, slots.shape[0], num_kv_heads, exact.k.shape[-1]
    index = index.to(exact.slot.device)
    h_idx = exact.kv_head[index].to(dev)
    t_idx = t_idx.to(dev)
    ok = torch.zeros(N, Hkv, dtype=torch.bool, device=dev)
    kd = torch.zeros(N, Hkv, D, dtype=torch.float32, device=dev)
    vd = torch.zeros(N, Hkv, D, dtype=torch.float32, device=dev)
    wkd = torch.zeros(N, Hkv, dtype=torch.float32, device=dev)
    wvd = torch.zeros(N, Hkv, dtype=torch.float32, device=dev)
    ok[t_idx, h_idx] = True
    kd[t_idx, h_idx], vd[t_idx, h_idx] = exact.k[index].to(dev), exact.v[index].to(dev)
    wkd[t_idx, h_idx], wvd[t_idx, h_idx] = exact.wk[index].to(dev), exact.wv[index].to(dev)
    Hq = q.shape[0]
    kvh = torch.arange(Hq, device=dev) // (Hq // Hkv)
    m = ok[:, kvh].T  # [Hq, N]
    ze, ue = exact_logits_and_radii(q, kd[:, kvh].transpose(0, 1), wkd[:, kvh].T, sm_scale=sm_scale)
    z = torch.where(m, ze, z)
    v = torch.where(m[..., None], vd[:, kvh].transpose(0, 1), v)
    wv = torch.where(m, wvd[:, kvh].T, wv)
    if u is not None:
        u = torch.where(m, ue, u)
    return z, v, u, wv
