"""Offline compressed decoding on a real model: the measuring instrument of the report.

One exact prefill (plain ``DynamicCache``, sdpa) gives the post-RoPE K/V of a context of
``P`` tokens. Then, per compressor variant, ``T`` further tokens are fed through the model
with the ``"witcert_report"`` attention: query position ``P + i`` attends to the
*stored* (encoded, then decoded) keys and values of tokens ``0 .. P + i``, exactly as a
witcert decode step does (the new token is written before it is read). The stored values
are dequantised once per variant and reused: a token's stored value never changes, so
this is the same arithmetic as the pool's decode without re-running the Philox stream
for the whole cache at every step.

Per (layer, query head, position) the engine records, from the same logits:
the true TV (float64, softmax of exact-key logits vs stored-key logits), the
certificate ``A - 1`` for every radius the variant admits (float64), the logit error
against each radius, and the relative attention-output error against exact attention
with the real (exact) V. ``gated=True`` applies block repair (``RepairPolicy(mode="block")``
semantics, ``witcert.report.gate``) before the output goes back into the model.

Letters: Hq query heads, Hkv KV heads, D head dim, G channel groups, P context, T fed
tokens, N = P + T.
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass, field

import torch

from witcert.config import DEFAULT_TAU, QuantConfig
from witcert.ref.cert import certificate, delta_local, prob_log_factor, radius_det, radius_prob
from witcert.ref.compressors import get_compressor
from witcert.ref.types import K_SIDE, V_SIDE, EncodeCtx
from witcert.report.gate import gate_positions

ATTN_NAME = "witcert_report"
# K/V are stored from fp16 values, the KV dtype witcert's contract is written for (docs/MATH.md:
# keys as the model produced them, in its own 16-bit dtype; outlier channels are kept in fp16 and a
# value fp16 cannot hold flags its token). The fp32 model's K/V are rounded to fp16 once,
# for every variant and for the exact baseline alike, so all comparisons stay paired.
KV_DTYPE = torch.float16
# |z^ - z| > u is judged with the float64 evaluation error of the two logits allowed for
# (they come from separate float64 matmuls over D = 64 products; ~1e-15 relative).
EXCEED_RTOL, EXCEED_ATOL = 1e-9, 1e-10
_ENGINE: contextvars.ContextVar = contextvars.ContextVar("witcert_report_engine", default=None)


@dataclass(frozen=True)
class Variant:
    """One compressor configuration of the report.

    label: report name; method: ``config.METHODS`` entry or ``"exact"`` (no compression,
    the baseline every other variant is paired with); outliers: ``m`` (dither only).
    """

    label: str
    method: str
    outliers: int = 0

    @property
    def is_dither(self) -> bool:
        return self.method == "dither8"

    def quant(self, seed: int) -> QuantConfig:
        return QuantConfig(method=self.method, outliers=self.outliers, seed=seed)

    @property
    def radius_kinds(self) -> tuple[str, ...]:
        """Radii recorded. ``det`` always; dither: ``prob`` and ``min`` (the reported one);
        sr8: the two concentration radii of the negative control (see docs/REPORT.md)."""
        if self.method == "exact":
            return ()
        if self.is_dither:
            return ("det", "prob", "min")
        if self.method == "sr8":
            return ("det", "sr_hoeffding", "sr_naive")
        return ("det",)

    @property
    def reported_radius(self) -> str:
        return "min" if self.is_dither else "det"


EXACT = Variant("exact", "exact")
VARIANTS = (
    Variant("fp16", "fp16"), Variant("rtn8", "rtn8"), Variant("rtn4", "rtn4"),
    Variant("sr8", "sr8"), Variant("fp8", "fp8"), Variant("fp8_scaled", "fp8_scaled"),
    Variant("kivi2", "kivi2"), Variant("kivi4", "kivi4"),
    Variant("witcert-m0", "dither8", 0), Variant("witcert-m4", "dither8", 4),
    Variant("witcert-m8", "dither8", 8), Variant("witcert-m16", "dither8", 16),
)
VARIANT_BY_LABEL = {v.label: v for v in VARIANTS + (EXACT,)}


@dataclass
class Stored:
    """What one layer's cache holds for one variant, for tokens 0..n-1 (one side each).

    khat, vhat f32 [n, Hkv, D]; kwit, vwit fp16 [n, Hkv, G]; kscales fp16 [n, Hkv, G] or
    None (dither and sr8 only); kbypass bool [Hkv, D] or None.
    """

    khat: torch.Tensor
    vhat: torch.Tensor
    kwit: torch.Tensor
    vwit: torch.Tensor
    kscales: torch.Tensor | None
    kbypass: torch.Tensor | None


def _encode_side(comp, x, *, side, layer, seed, start, outlier_idx):
    T, H, _ = x.shape
    ctx = EncodeCtx(seed=seed, layer=layer, kv_heads=torch.arange(H, dtype=torch.int64), side=side,
                    slots=torch.arange(start, start + T, dtype=torch.int64),
                    epochs=torch.zeros(T, dtype=torch.int64), outlier_idx=outlier_idx)
    packed = comp.encode(x, ctx=ctx)
    return comp.decode(packed, ctx=ctx).to(torch.float32), packed


def store(variant: Variant, k: torch.Tensor, v: torch.Tensor, *, layer: int, seed: int,
          start: int = 0, outlier_idx: tuple[torch.Tensor, torch.Tensor] | None = None,
          group_size: int = 32) -> Stored:
    """Encode then decode exact k, v (float [n, Hkv, D]) of tokens start..start+n-1."""
    n, H, D = k.shape
    if variant.method == "exact":
        z = torch.zeros(n, H, D // group_size, dtype=torch.float16)
        return Stored(k.float(), v.float(), z, z, None, None)
    comp = get_compressor(variant.quant(seed))
    kidx, vidx = outlier_idx if variant.outliers else (None, None)
    khat, kp = _encode_side(comp, k, side=K_SIDE, layer=layer, seed=seed, start=start, outlier_idx=kidx)
    vhat, vp = _encode_side(comp, v, side=V_SIDE, layer=layer, seed=seed, start=start, outlier_idx=vidx)
    bypass = None
    if kidx is not None:
        bypass = torch.zeros(H, D, dtype=torch.bool).scatter_(1, kidx, True)
    scales = kp.get("scales") if variant.method in ("dither8", "sr8") else None
    return Stored(khat, vhat, kp["wit"], vp["wit"], scales, bypass)


def _cat(a: Stored, b: Stored) -> Stored:
    return Stored(*(None if x is None else torch.cat([x, y]) for x, y in
                    zip((a.khat, a.vhat, a.kwit, a.vwit, a.kscales),
                        (b.khat, b.vhat, b.kwit, b.vwit, b.kscales))), a.kbypass)


def radii(variant: Variant, q: torch.Tensor, st: Stored, *, sm: float, n_tokens: torch.Tensor,
          delta_loc: float, group_size: int = 32) -> dict[str, torch.Tensor]:
    """Every radius of ``variant.radius_kinds``: q f64 [Hq, T, D], stored [N, Hkv, ...];
    n_tokens f64 [T, 1] (tokens attended by each position). Returns {kind: f64 [Hq, T, N]}."""
    Hq, Hkv = q.shape[0], st.khat.shape[1]
    kvh = torch.arange(Hq) // (Hq // Hkv)
    bypass = None if st.kbypass is None else st.kbypass[kvh][:, None, :]
    wit = st.kwit[:, kvh].transpose(0, 1)[:, None]  # [Hq, 1, N, G]
    dither_bits = variant.quant(seed=0).dither_bits
    out = {"det": radius_det(q, wit, sm_scale=sm, group_size=group_size, bypass=bypass)}
    if variant.is_dither or variant.method == "sr8":
        sc = st.kscales[:, kvh].transpose(0, 1)[:, None]
        up = radius_prob(q, sc, sm_scale=sm, group_size=group_size, bits=dither_bits,
                         n_tokens=n_tokens, delta_loc=delta_loc, bypass=bypass)
        if variant.is_dither:
            out["prob"] = up
            out["min"] = torch.minimum(out["det"], up)
        else:
            # sr8: for fixed x its error is a zero-mean (up to the b-bit bias) two-point law
            # inside an interval of length s: Hoeffding's lemma gives the proxy s^2/4 = 3 s^2/12,
            # i.e. sqrt(3) times the dither's sigma. "sr_naive" reuses the dither's s^2/12,
            # which nothing justifies for SR (docs/REPORT.md, negative control).
            sigma, bias = _sigma_bias(q, sc, sm=sm, group_size=group_size, bits=dither_bits,
                                      bypass=bypass)
            lf = prob_log_factor(n_tokens=n_tokens, delta_loc=delta_loc).to(q.dtype)
            out["sr_hoeffding"] = math.sqrt(3.0) * sigma * lf + bias
            out["sr_naive"] = sigma * lf + bias
    vbad = ~torch.isfinite(st.vwit.float()).all(-1)[:, kvh].T[:, None, :]  # [Hq, 1, N]
    return {k: torch.where(vbad, math.inf, u) for k, u in out.items()}


def _sigma_bias(q, sc, *, sm, group_size, bits, bypass):
    """``(sigma, bias)`` of docs/MATH.md §2b for scales ``sc`` (the terms of ``radius_prob``); a
    token with a non-finite scale gets ``+inf``. q [Hq, T, D]; sc [Hq, 1, N, G]."""
    D = q.shape[-1]
    qm = q if bypass is None else torch.where(bypass, torch.zeros((), dtype=q.dtype), q)
    qg = qm.reshape(*q.shape[:-1], D // group_size, group_size)
    q2 = torch.linalg.vector_norm(qg, dim=-1).unsqueeze(-2)
    q1 = qg.abs().sum(-1).unsqueeze(-2)
    s = sc.to(q.dtype)
    ok = torch.isfinite(s).all(-1)
    s = torch.where(torch.isfinite(s), s, torch.zeros((), dtype=s.dtype))
    sigma = sm * torch.sqrt(((q2 * s) ** 2).sum(-1) / 12.0)
    bias = (2.0 ** -(bits + 1) + 2.0 ** -15) * sm * (q1 * s).sum(-1)
    inf = torch.full_like(sigma, math.inf)
    return torch.where(ok, sigma, inf), torch.where(ok, bias, inf)


@dataclass
class LayerRecord:
    """Per (query head, position) results of one layer, each f64 [Hq, T] unless noted."""

    tv: torch.Tensor
    err: torch.Tensor                       # ||o^ - o|| / ||o||
    certs: dict[str, torch.Tensor]          # radius kind -> cert (raw, before any repair)
    exceed: dict[str, int]                  # radius kind -> #(token, head, pos) with |d| > u
    gated_cert: torch.Tensor | None = None  # after repair (gated runs)
    repaired_frac: float = 0.0              # fraction of (kv head, token) entries made exact


@dataclass
class RunConfig:
    """Static parameters of one engine run."""

    variant: Variant
    seed: int
    tau: float = DEFAULT_TAU
    delta: float = 1e-2
    gated: bool = False
    block_tokens: int = 16
    collect: bool = True
    keep_rows: int = 0          # rows (zhat, u) kept per layer for worst-case analysis
    outlier_idx: list | None = None
    capture: bool = False       # keep each layer's decode queries and new K/V (``Captured``)


@dataclass
class _State:
    cfg: RunConfig
    prefix_k: list[torch.Tensor]
    prefix_v: list[torch.Tensor]
    P: int
    T: int
    num_layers: int
    num_q_heads: int
    prefix_store: dict = field(default_factory=dict)
    records: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)
    repaired: list = field(default_factory=list)  # per layer: fraction of entries made exact
    captured: dict = field(default_factory=dict)  # layer -> Captured (RunConfig.capture)


@dataclass(frozen=True)
class Captured:
    """One layer's activations of a teacher-forced run, as the runtime paths take them.

    q f32 [T, Hq, D]: the decode queries (step i attends tokens 0 .. P + i); k_new, v_new
    fp16 [T, Hkv, D]: the fed tokens' exact K/V (the prefix's are ``Engine.k/v``);
    sm_scale: the layer's softmax scale."""

    q: torch.Tensor
    k_new: torch.Tensor
    v_new: torch.Tensor
    sm_scale: float


class Engine:
    """Holds an exact prefill and runs variants over it (one model, one context)."""

    def __init__(self, model, prefix_ids: torch.Tensor):
        from witcert.eval.calibrate import _cache_kwarg
        from transformers import DynamicCache

        register()
        self.model = model
        text = model.config.get_text_config(decoder=True)
        self.num_layers, self.num_q_heads = text.num_hidden_layers, text.num_attention_heads
        self.P = int(prefix_ids.numel())
        prev = model.config._attn_implementation
        model.set_attn_implementation("sdpa")
        try:
            cache = DynamicCache(config=model.config)
            with torch.inference_mode():
                model(input_ids=prefix_ids[None].to(model.device), **{_cache_kwarg(model): cache},
                      use_cache=True, logits_to_keep=1)
        finally:
            model.set_attn_implementation(prev)
        self.k = [layer.keys[0].transpose(0, 1).to(KV_DTYPE).cpu() for layer in cache.layers]
        self.v = [layer.values[0].transpose(0, 1).to(KV_DTYPE).cpu() for layer in cache.layers]
        self._stores: dict = {}

    def prefix_store(self, cfg: RunConfig, layer: int) -> Stored:
        key = (cfg.variant, cfg.seed, layer)
        if key not in self._stores:
            oi = cfg.outlier_idx[layer] if (cfg.variant.outliers and cfg.outlier_idx) else None
            if cfg.variant.outliers and oi is None:
                raise ValueError(f"{cfg.variant.label}: needs outlier indices (calibration)")
            if oi is not None:
                m2 = 2 * cfg.variant.outliers
                oi = (oi[0][:, :m2], oi[1][:, :m2])
            self._stores[key] = store(cfg.variant, self.k[layer], self.v[layer], layer=layer,
                                      seed=cfg.seed, outlier_idx=oi)
        return self._stores[key]

    def drop(self, variant: Variant) -> None:
        self._stores = {k: s for k, s in self._stores.items() if k[0] != variant}

    def run(self, cfg: RunConfig, ids: torch.Tensor) -> tuple[torch.Tensor, _State]:
        """Feed ``ids`` int64 [T] at positions P..P+T-1; returns (logits f32 [T, V], state)."""
        T = int(ids.numel())
        st = _State(cfg=cfg, prefix_k=self.k, prefix_v=self.v, P=self.P, T=T,
                    num_layers=self.num_layers, num_q_heads=self.num_q_heads)
        st.engine = self
        prev = self.model.config._attn_implementation
        self.model.set_attn_implementation(ATTN_NAME)
        token = _ENGINE.set(st)
        try:
            with torch.inference_mode():
                pos = torch.arange(self.P, self.P + T)[None].to(self.model.device)
                out = self.model(input_ids=ids[None].to(self.model.device), position_ids=pos,
                                 use_cache=False)
        finally:
            _ENGINE.reset(token)
            self.model.set_attn_implementation(prev)
        return out.logits[0].float().cpu(), st


# ---- the attention function ----------------------------------------------------------------

def _new_store(st: _State, layer: int, k_new: torch.Tensor, v_new: torch.Tensor):
    """Stored K/V seen by each position: ([(first position, Stored of N tokens, lens)], full).
    ``lens`` is None for token methods, else the group's quantised lengths (nK, nV), and
    ``full`` the one encode of all N tokens the groups are masked from (None for token methods).

    Token methods: one Stored for all positions (a token's stored value does not depend on
    later tokens). Block methods (KIVI): the quantised prefix grows in whole blocks, so
    positions are grouped by the (K, V) quantised lengths they would see."""
    cfg, eng = st.cfg, st.engine
    pre = eng.prefix_store(cfg, layer)
    comp = None if cfg.variant.method == "exact" else get_compressor(cfg.variant.quant(cfg.seed))
    if comp is None or comp.granularity == "token":
        oi = None
        if cfg.variant.outliers:
            m2 = 2 * cfg.variant.outliers
            oi = (cfg.outlier_idx[layer][0][:, :m2], cfg.outlier_idx[layer][1][:, :m2])
        new = store(cfg.variant, k_new, v_new, layer=layer, seed=cfg.seed, start=st.P, outlier_idx=oi)
        return [(0, _cat(pre, new), None)], None
    kall = torch.cat([st.prefix_k[layer], k_new])
    vall = torch.cat([st.prefix_v[layer], v_new])
    full = store(cfg.variant, kall, vall, layer=layer, seed=cfg.seed)
    return block_groups(comp, full, kall, vall, first_n=st.P + 1, count=st.T), full


def block_groups(comp, full: Stored, kall: torch.Tensor, vall: torch.Tensor, *, first_n: int,
                 count: int) -> list[tuple[int, Stored, tuple[int, int]]]:
    """Stored K/V seen by positions 0..count-1 (position i attends n = first_n + i tokens)
    of a block method, from one encode ``full`` of all N tokens: groups of positions with
    the same quantised lengths (nK, nV); a group sees ``full`` on its first nK (nV) tokens
    and the exact fp16 tail after. Equal to encoding ``kall[:n]`` afresh (KIVI quantises
    whole key blocks and single value tokens, neither depends on later tokens;
    ``tests/test_report_engine.py`` checks it bitwise), at one encode per layer instead of
    one per group."""
    N = kall.shape[0]
    t = torch.arange(N)[:, None, None]
    groups, last = [], None
    for i in range(count):
        n = first_n + i
        key = (comp.num_quantized(n, K_SIDE), comp.num_quantized(n, V_SIDE))
        if key != last:
            groups.append((i, key))
            last = key
    out = []
    for first, (nk, nv) in groups:
        def mix(q, x, nq):
            return torch.where(t < nq, q, x.to(KV_DTYPE).to(q.dtype))

        def wit(w, nq):
            return torch.where(t < nq, w, torch.zeros((), dtype=w.dtype))

        out.append((first, Stored(mix(full.khat, kall, nk), mix(full.vhat, vall, nv),
                                  wit(full.kwit, nk), wit(full.vwit, nv), None, None), (nk, nv)))
    return out


def _softmax_masked(z: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax(z.masked_fill(~mask, -math.inf), dim=-1)


def _attend(st: _State, layer: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
            sm: float) -> torch.Tensor:
    """q [Hq, T, D], k_new/v_new [Hkv, T, D] (one sequence). Returns out f32 [T, Hq, D]."""
    cfg = st.cfg
    Hq, T, D = q.shape
    Hkv = k_new.shape[0]
    kvh = torch.arange(Hq) // (Hq // Hkv)
    kn, vn = k_new.transpose(0, 1).to(KV_DTYPE).cpu(), v_new.transpose(0, 1).to(KV_DTYPE).cpu()
    if cfg.capture:
        st.captured[layer] = Captured(q.transpose(0, 1).to(torch.float32).cpu().contiguous(), kn, vn, sm)
    stores, full = _new_store(st, layer, kn, vn)
    N = st.P + T
    kx = torch.cat([st.prefix_k[layer], kn])[:, kvh].transpose(0, 1).double()  # [Hq, N, D]
    vx = torch.cat([st.prefix_v[layer], vn])[:, kvh].transpose(0, 1).double()
    q64 = q.double().cpu()
    pos = torch.arange(T)[:, None] + st.P
    mask = (torch.arange(N)[None, :] <= pos)[None].expand(Hq, T, N)  # [Hq, T, N]
    z = sm * torch.einsum("htd,hnd->htn", q64, kx)
    zh = torch.empty_like(z)
    if full is not None:  # block method: stored = full encode on the first nK (nV) tokens, exact after
        zq = sm * torch.einsum("htd,hnd->htn", q64, full.khat[:, kvh].transpose(0, 1).double())
        vd = full.vhat[:, kvh].transpose(0, 1).double() - vx
    tn = torch.arange(N)
    vgroups = []  # (first position, end position, V f64 [Hq, N, D] or (vd, nV)) per store group
    u = {}
    n_tok = (pos + 1).double()
    dl = delta_local(delta=cfg.delta, num_layers=st.num_layers, num_q_heads=st.num_q_heads,
                     allocation="fixed", horizon=max(st.T, 1))
    bounds = [g[0] for g in stores] + [T]
    for (first, s, lens), end in zip(stores, bounds[1:]):
        sl = slice(first, end)
        if lens is None:
            zh[:, sl] = sm * torch.einsum("htd,hnd->htn", q64[:, sl], s.khat[:, kvh].transpose(0, 1).double())
            vgroups.append((first, end, s.vhat[:, kvh].transpose(0, 1).double()))
        else:
            zh[:, sl] = torch.where(tn < lens[0], zq[:, sl], z[:, sl])
            vgroups.append((first, end, (vd, lens[1])))
        if cfg.variant.method != "exact" and cfg.collect | cfg.gated:
            r = radii(cfg.variant, q64[:, sl], s, sm=sm, n_tokens=n_tok[sl], delta_loc=dl)
            for kind, val in r.items():
                u.setdefault(kind, torch.zeros_like(z))[:, sl] = val
    ph = _softmax_masked(zh, mask)
    oh = torch.empty(Hq, T, D, dtype=torch.float64)
    for first, end, vg in vgroups:
        if isinstance(vg, tuple):
            pg = ph[:, first:end]
            oh[:, first:end] = (torch.einsum("htn,hnd->htd", pg, vx)
                                + torch.einsum("htn,hnd->htd", pg * (tn < vg[1]), vg[0]))
        else:
            oh[:, first:end] = torch.einsum("htn,hnd->htd", ph[:, first:end], vg)
    rec = None
    if cfg.collect:
        p = _softmax_masked(z, mask)
        o = torch.einsum("htn,hnd->htd", p, vx)
        tv = 0.5 * (p - ph).abs().sum(-1)
        err = torch.linalg.vector_norm(oh - o, dim=-1) / torch.linalg.vector_norm(o, dim=-1).clamp_min(1e-30)
        certs, exceed = {}, {}
        d = (zh - z).abs()
        for kind, uk in u.items():
            certs[kind] = certificate(zh, uk, mask=mask)[1]
            exceed[kind] = int(((d > uk * (1 + EXCEED_RTOL) + EXCEED_ATOL) & mask).sum())
        rec = LayerRecord(tv=tv, err=err, certs=certs, exceed=exceed)
        if cfg.keep_rows and u:
            _keep_rows(st, layer, zh, u[cfg.variant.reported_radius], z, pos)
    if cfg.gated and cfg.variant.method != "exact":
        oh, gc, frac = gate_positions(cfg, zh, z, u[cfg.variant.reported_radius], mask, vgroups,
                                      vx, kvh, Hkv, oh)
        st.repaired.append(frac)
        if rec is not None:
            rec.gated_cert, rec.repaired_frac = gc, frac
    if rec is not None:
        st.records[layer] = rec
    return oh.transpose(0, 1).float()


def _keep_rows(st: _State, layer: int, zh, u, z, pos) -> None:
    """Keep ``keep_rows`` deterministic (head, position) rows of this layer: (zhat, u, z)."""
    Hq, T, _ = zh.shape
    g = torch.Generator().manual_seed(1000 * layer + 7)
    picks = torch.randperm(Hq * T, generator=g)[: st.cfg.keep_rows].tolist()
    for idx in picks:
        h, i = divmod(idx, T)
        n = int(pos[i, 0]) + 1
        st.rows.append({"layer": layer, "head": h, "pos": i, "zhat": zh[h, i, :n].clone(),
                        "u": u[h, i, :n].clone(), "z": z[h, i, :n].clone()})


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``AttentionInterface`` entry for ``"witcert_report"`` (batch 1, no HF cache)."""
    st = _ENGINE.get()
    if st is None:
        raise RuntimeError("witcert_report attention used outside Engine.run")
    if query.shape[0] != 1:
        raise ValueError("the report engine runs one sequence at a time")
    sm = query.shape[-1] ** -0.5 if scaling is None else scaling
    out = _attend(st, module.layer_idx, query[0], key[0], value[0], sm)
    return out[None].to(query.dtype).to(query.device), None


def _no_mask(*args, **kwargs):
    return None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, _no_mask)
