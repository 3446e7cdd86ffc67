"""Audit trace: what one decode step's attention saw, written so anyone can recheck it.

One safetensors file per sampled (layer, step), named ``L{layer:03d}_S{step:05d}.safetensors``
(sequence 0 of the batch), holding:

- ``q`` float32 ``[Hq, D]``: post-RoPE queries (non-finite entries as the model made them);
- ``k_exact`` ``[Hkv, N, D]``: the exact keys from the pool's backup (the model's KV dtype);
- ``k_hat`` float32 ``[Hkv, N, D]``: the dequantized keys the attention used;
- ``radius`` float32 ``[Hq, N]``: the radius ``u_t`` the certificate used;
- ``cert`` float32 ``[Hq]``: the reported certificate ``A - 1``;

and string metadata (``TRACE_FORMAT``, sm_scale, group_size, dither_bits, method, radius,
delta, delta_loc, allocation, layer, step, seq_len, num_q_heads, num_kv_heads, model,
witcert_version). Query head ``h`` reads KV head ``h // (Hq // Hkv)``.

``check_record`` recomputes everything in float64; ``AUDIT.md`` explains the checks.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

TRACE_FORMAT = "witcert-trace/1"
TENSORS = ("q", "k_exact", "k_hat", "radius", "cert")

# Tolerances of the float64 recheck (see AUDIT.md). The stored cert is an fp32 online sum;
# the logit-error check allows the fp32 rounding of the stored radius.
CERT_RTOL, CERT_ATOL = 1e-3, 1e-4
RADIUS_RTOL, RADIUS_ATOL = 1e-6, 1e-9
TV_ATOL = 1e-12
# Beyond this radius the fp32 sum exp(z - m + u) can overflow, so a stored +inf is honest.
FP32_EXP_OVERFLOW_U = 80.0


def record_name(layer: int, step: int) -> str:
    return f"L{layer:03d}_S{step:05d}.safetensors"


def write_record(path: str | Path, *, q: torch.Tensor, k_exact: torch.Tensor,
                 k_hat: torch.Tensor, radius: torch.Tensor, cert: torch.Tensor,
                 meta: dict) -> Path:
    """Write one trace record (shapes in the module docstring); ``meta`` values become strings."""
    from safetensors.torch import save_file

    hq, d = q.shape
    hkv, n, d2 = k_exact.shape
    if (d2 != d or k_hat.shape != k_exact.shape or radius.shape != (hq, n)
            or cert.shape != (hq,) or hq % hkv):
        raise ValueError(f"inconsistent shapes: q {tuple(q.shape)}, k_exact {tuple(k_exact.shape)}, "
                         f"k_hat {tuple(k_hat.shape)}, radius {tuple(radius.shape)}, "
                         f"cert {tuple(cert.shape)}")
    tensors = {
        "q": q.detach().to(torch.float32).cpu().contiguous(),
        "k_exact": k_exact.detach().cpu().contiguous(),
        "k_hat": k_hat.detach().to(torch.float32).cpu().contiguous(),
        "radius": radius.detach().to(torch.float32).cpu().contiguous(),
        "cert": cert.detach().to(torch.float32).cpu().contiguous(),
    }
    md = {"format": TRACE_FORMAT, "seq_len": str(n), "num_q_heads": str(hq),
          "num_kv_heads": str(hkv), "head_dim": str(d)}
    md.update({k: (v if isinstance(v, str) else json.dumps(v)) for k, v in meta.items()})
    path = Path(path)
    save_file(tensors, str(path), metadata=md)
    return path


def read_record(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Load one trace record: ``(tensors, metadata)``; checks the format tag."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if meta.get("format") != TRACE_FORMAT:
        raise ValueError(f"{path}: not a {TRACE_FORMAT} file (format={meta.get('format')!r})")
    missing = [k for k in TENSORS if k not in tensors]
    if missing:
        raise ValueError(f"{path}: missing tensors {missing}")
    return tensors, meta


@dataclass
class RecordCheck:
    """Float64 recheck of one (layer, step): per query head lists, then verdicts."""

    layer: int
    step: int
    tv: list[float]             # true TV(softmax(z), softmax(z^)) per query head
    cert: list[float]           # stored cert
    cert_recomputed: list[float]  # A - 1 from k_hat logits and the stored radius
    max_err_ratio: list[float]  # max_t |d_t| / u_t (must be <= 1)
    cert_ok: bool               # recomputed A - 1 matches the stored cert
    radius_ok: bool             # |d_t| <= u_t for every token
    sound: bool                 # TV <= stored cert for every head

    @property
    def ok(self) -> bool:
        return self.cert_ok and self.radius_ok and self.sound

    def to_dict(self) -> dict:
        def clean(xs):
            return [x if math.isfinite(x) else str(x) for x in xs]
        d = asdict(self)
        for k in ("tv", "cert", "cert_recomputed", "max_err_ratio"):
            d[k] = clean(d[k])
        d["ok"] = self.ok
        return d


def recompute(q: torch.Tensor, k_exact: torch.Tensor, k_hat: torch.Tensor,
              radius: torch.Tensor, *, sm_scale: float) -> dict[str, torch.Tensor]:
    """True TV, ``A - 1`` and the logit errors in float64 (shapes as in the file, one step).

    Returns float64 ``tv [Hq]``, ``cert [Hq]`` (A - 1 from k_hat logits and radius),
    ``err [Hq, N]`` (``|z^_t - z_t|``) and ``radius [Hq, N]``.
    """
    hq, hkv = q.shape[0], k_exact.shape[0]
    kv = torch.arange(hq) // (hq // hkv)  # GQA: query head h reads kv head h // group
    q64 = torch.nan_to_num(q.to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
    z = sm_scale * torch.einsum("hd,hnd->hn", q64, k_exact.to(torch.float64)[kv])
    zh = sm_scale * torch.einsum("hd,hnd->hn", q64, k_hat.to(torch.float64)[kv])
    u = radius.to(torch.float64)
    tv = 0.5 * (torch.softmax(z, -1) - torch.softmax(zh, -1)).abs().sum(-1)
    log_a = torch.logsumexp(zh + u, -1) - torch.logsumexp(zh, -1)
    cert = torch.where(torch.isposinf(u).any(-1), torch.full_like(log_a, math.inf),
                       torch.expm1(log_a))
    return {"tv": tv, "cert": cert, "err": (zh - z).abs(), "radius": u}


def check_record(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> RecordCheck:
    """Recompute one record in float64 and judge it (tolerances: module constants)."""
    r = recompute(tensors["q"], tensors["k_exact"], tensors["k_hat"], tensors["radius"],
                  sm_scale=float(meta["sm_scale"]))
    stored = tensors["cert"].to(torch.float64)
    rec, u, err = r["cert"], r["radius"], r["err"]
    both_fin = torch.isfinite(stored) & torch.isfinite(rec)
    close = (stored - rec).abs() <= CERT_ATOL + CERT_RTOL * rec.abs()
    # a stored +inf is honest when the float64 value is +inf too, or fp32 exp could overflow
    honest_inf = torch.isposinf(stored) & (torch.isposinf(rec) | (u.amax(-1) >= FP32_EXP_OVERFLOW_U))
    cert_ok = bool(torch.where(both_fin, close, honest_inf).all())
    radius_ok = bool((err <= u * (1 + RADIUS_RTOL) + RADIUS_ATOL).all())
    sound = bool((r["tv"] <= stored + TV_ATOL).all())
    ratio = torch.where(u > 0, err / u, torch.where(err > 0, math.inf, 0.0)).amax(-1)
    return RecordCheck(layer=int(meta.get("layer", -1)), step=int(meta.get("step", -1)),
                       tv=r["tv"].tolist(), cert=stored.tolist(), cert_recomputed=rec.tolist(),
                       max_err_ratio=ratio.tolist(), cert_ok=cert_ok, radius_ok=radius_ok,
                       sound=sound)


def recheck_dir(trace_dir: str | Path) -> list[RecordCheck]:
    """Check every record in ``trace_dir`` (sorted by name). Raises if there is none."""
    files = sorted(Path(trace_dir).glob("L*_S*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{trace_dir}: no trace records (L*_S*.safetensors)")
    return [check_record(*read_record(f)) for f in files]


# ---- capture from a running WitCertCache -----------------------------------------------------
def capture(*, layer_idx: int, q: torch.Tensor, out, slots_per_seq, pool, seq: int = 0) -> dict:
    """What the decode attention of ``layer_idx`` saw for sequence ``seq`` (observer arguments).

    Returns ``q [Hq, D]`` f32, ``k_exact [Hkv, N, D]`` (backup dtype, CPU), ``k_hat [Hkv, N, D]``
    f32 (flagged or non-finite entries zeroed, as the attention does), ``radius [Hq, N]`` f32
    and ``cert [Hq]`` f32, all on the CPU. Needs ``out.radius`` (observer ``wants_radius``)
    and the pool's exact backup.
    """
    from witcert.ref.pool import gather
    from witcert.ref.types import K_SIDE

    if pool.backup is None:
        raise ValueError("tracing needs the pool's exact backup (CacheConfig.exact_backup=True)")
    if out.radius is None or out.cert is None:
        raise ValueError("tracing needs the certificate and the radius (observer.wants_radius = True)")
    slots = slots_per_seq[seq]
    n = slots.shape[0]
    pool.flush_backup_()  # CUDA pools stage the newest token's backup asynchronously
    k_hat, packed = gather(pool.layers[layer_idx], K_SIDE, slots)
    bad = ~torch.isfinite(packed["wit"].float()).all(-1, keepdim=True) | ~torch.isfinite(k_hat)
    k_hat = torch.where(bad, torch.zeros((), dtype=k_hat.dtype, device=k_hat.device), k_hat)
    k_exact = pool.backup.k[layer_idx].index_select(0, slots.cpu())
    return {
        "q": q[seq].detach().float().cpu(),
        "k_exact": k_exact.transpose(0, 1).contiguous(),
        "k_hat": k_hat.transpose(0, 1).float().cpu().contiguous(),
        "radius": out.radius[seq, :, :n].float().cpu(),
        "cert": out.cert[seq].float().cpu(),
    }


class CaptureObserver:
    """``WitCertCache`` observer that captures sampled (layer, step) decode records.

    layers: layer indices to capture (None = all); stride: capture steps 0, stride, ...
    sink: ``sink(layer, step, record_dict, radius_kind)`` called per captured record.
    The step counter starts at 0 and advances whenever a layer index does not increase
    (the cache calls layers in order once per decode step).
    """

    wants_radius = True

    def __init__(self, *, sink, layers=None, stride: int = 1, seq: int = 0):
        if stride < 1:
            raise ValueError(f"stride={stride} must be >= 1")
        self.sink, self.stride, self.seq = sink, stride, seq
        self.layers = None if layers is None else set(layers)
        self.step, self._last_layer = -1, None

    def on_decode(self, *, layer_idx, q, out, slots_per_seq, pool) -> None:
        if self._last_layer is None or layer_idx <= self._last_layer:
            self.step += 1
        self._last_layer = layer_idx
        if self.step % self.stride or (self.layers is not None and layer_idx not in self.layers):
            return
        rec = capture(layer_idx=layer_idx, q=q, out=out, slots_per_seq=slots_per_seq, pool=pool,
                      seq=self.seq)
        self.sink(layer_idx, self.step, rec, out.radius_kind)


# ---- driving a model through the compressed cache -------------------------------------------
def build_cache(model, *, quant, cert, cache_cfg, observer=None, telemetry=True):
    """A ``WitCertCache`` whose exact backup keeps the model's own KV dtype (so ``k_exact`` is
    bit-for-bit what the quantizer saw). Registers the witcert attention if needed."""
    from witcert.hf.attention import ATTN_NAME, register
    from witcert.hf.cache import WitCertCache
    from witcert.hf.geometry import AttentionGeometry
    from witcert.runtime.pool import PagedPool

    register()
    if getattr(model.config, "_attn_implementation", None) != ATTN_NAME:
        model.set_attn_implementation(ATTN_NAME)
    geo = AttentionGeometry.of(model)
    pool = PagedPool(num_layers=geo.num_layers, num_kv_heads=geo.num_kv_heads,
                     head_dim=geo.head_dim, quant=quant, cache=cache_cfg, device=model.device,
                     backup_dtype=model.dtype)
    return WitCertCache(pool=pool, cert=cert, config=model.config, observer=observer,
                        telemetry=telemetry)


@torch.inference_mode()
def decode_through(model, cache, prompt_ids: torch.Tensor, *, steps: int,
                   forced: torch.Tensor | None = None, keep_logits: bool = False):
    """Prefill ``prompt_ids`` (int64 [T]) then ``steps`` decode steps of batch 1.

    forced: int64 [steps] tokens to feed (teacher forcing); None = greedy. Returns
    ``(fed tokens int64 [steps], logits f32 [steps, V] or None)``: row i is the next-token
    distribution after feeding token i (the prefill's last logits choose token 0 when greedy).
    """
    dev = model.device
    out = model(input_ids=prompt_ids[None].to(dev), cache=cache, use_cache=True,
                logits_to_keep=1)
    nxt = out.logits[0, -1].argmax()
    fed, rows = [], []
    for i in range(steps):
        tok = forced[i].to(dev) if forced is not None else nxt
        fed.append(tok)
        out = model(input_ids=tok.reshape(1, 1), cache=cache, use_cache=True)
        logits = out.logits[0, -1].float()
        if keep_logits:
            rows.append(logits)
        nxt = logits.argmax()
    fed_t = torch.stack(fed).cpu() if fed else torch.zeros(0, dtype=torch.int64)
    return fed_t, (torch.stack(rows).cpu() if keep_logits and rows else None)
