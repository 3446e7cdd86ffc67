"""Outlier calibration: which channels each (layer, KV head) stores exactly (docs/MATH.md §3, bypass).

Keys: a fixed set of ``m`` RoPE pairs per (layer, KV head). In HF Llama-family models
(``rotate_half``) pair ``i`` is channels ``(i, i + D/2)``; its magnitude at token ``t`` is
``sqrt(k_i^2 + k_{i+D/2}^2)``, which RoPE does not change, so a pair chosen on one stretch
of text stays large wherever its token sits. Score = the largest magnitude over the
calibration tokens (the amax a group scale has to cover), pairs taken by descending score.
Values: there is no rotation, so the ``2m`` channels of largest ``|v_c|`` are taken.

Stability: the same choice made on the first and on the second half of the calibration
tokens, compared with the Jaccard index ``|A n B| / |A u B|`` per (layer, KV head).

A profile is calibrated once for the largest ``m`` wanted: the sets are stored in score
order, so ``outlier_idx(m)`` for a smaller ``m`` is the top-``m`` prefix (the same sets a
calibration with that ``m`` would choose). Pure torch; ``collect_kv`` runs the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

PROFILE_FORMAT = "witcert-outlier-profile"
PROFILE_VERSION = 1


def pair_magnitude(k: torch.Tensor) -> torch.Tensor:
    """k [..., D] -> RoPE pair magnitudes [..., D/2] (pair i = channels i, i + D/2)."""
    D = k.shape[-1]
    if D % 2:
        raise ValueError(f"head_dim {D} must be even (RoPE pairs)")
    k = k.to(torch.float32)
    return torch.hypot(k[..., : D // 2], k[..., D // 2:])


def _top(score: torch.Tensor, n: int) -> torch.Tensor:
    """score [H, C] -> int64 [H, n], indices by descending score (ties: lower index first)."""
    if n == 0:
        return torch.zeros(score.shape[0], 0, dtype=torch.int64)
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices
    return order[:, :n].to(torch.int64)


def _jaccard(a: torch.Tensor, b: torch.Tensor) -> list[float | None]:
    """Row-wise Jaccard of index sets a, b [H, n]; None for empty sets."""
    out = []
    for ra, rb in zip(a.tolist(), b.tolist()):
        sa, sb = set(ra), set(rb)
        out.append(len(sa & sb) / len(sa | sb) if sa | sb else None)
    return out


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


@dataclass
class OutlierProfile:
    """Calibrated bypass sets of one model.

    k_pairs: int64 [L, Hkv, m] RoPE pair indices in ``[0, D/2)``, descending score.
    v_channels: int64 [L, Hkv, 2m] value channels, descending score.
    k_jaccard, v_jaccard: [L][Hkv] stability (first vs second half), None when m = 0.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    m: int
    tokens: int
    k_pairs: torch.Tensor
    v_channels: torch.Tensor
    k_jaccard: list[list[float | None]] = field(default_factory=list)
    v_jaccard: list[list[float | None]] = field(default_factory=list)
    source: str = ""
    k_halves: torch.Tensor | None = None  # int64 [2, L, Hkv, m]: the choice on each half
    v_halves: torch.Tensor | None = None  # int64 [2, L, Hkv, 2m]

    def __post_init__(self) -> None:
        L, H, D, m = self.num_layers, self.num_kv_heads, self.head_dim, self.m
        if D % 2 or not 0 <= 2 * m <= D:
            raise ValueError(f"m={m} RoPE pairs do not fit head_dim={D}")
        if tuple(self.k_pairs.shape) != (L, H, m) or tuple(self.v_channels.shape) != (L, H, 2 * m):
            raise ValueError(f"k_pairs {tuple(self.k_pairs.shape)} / v_channels "
                             f"{tuple(self.v_channels.shape)} must be [{L}, {H}, {m}] / [{L}, {H}, {2 * m}]")
        if m and (int(self.k_pairs.min()) < 0 or int(self.k_pairs.max()) >= D // 2
                  or int(self.v_channels.min()) < 0 or int(self.v_channels.max()) >= D):
            raise ValueError("profile indices out of range")

    # ---- what the pool takes ---------------------------------------------------------------
    def outlier_idx(self, m: int | None = None, *, device: torch.device | str = "cpu"
                    ) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Per layer ``(k_idx, v_idx)``, each int64 ``[Hkv, 2m]``, the top-``m`` prefix
        (``m=None``: all). K channels are ``[i_1, i_1 + D/2, i_2, i_2 + D/2, ...]``.
        Returns None for m = 0 (``PagedPool(outlier_idx=None)``)."""
        m = self.m if m is None else m
        if not 0 <= m <= self.m:
            raise ValueError(f"m={m}: this profile was calibrated for at most m={self.m} pairs")
        if m == 0:
            return None
        half = self.head_dim // 2
        pairs = self.k_pairs[:, :, :m]
        k_idx = torch.stack([pairs, pairs + half], dim=-1).reshape(self.num_layers, self.num_kv_heads, 2 * m)
        v_idx = self.v_channels[:, :, :2 * m]
        return [(k_idx[i].to(device), v_idx[i].to(device)) for i in range(self.num_layers)]

    def check_geometry(self, *, num_layers: int, num_kv_heads: int, head_dim: int) -> None:
        got = (self.num_layers, self.num_kv_heads, self.head_dim)
        if got != (num_layers, num_kv_heads, head_dim):
            raise ValueError(f"outlier profile is for (layers, kv heads, head dim) = {got}, "
                             f"the model has {(num_layers, num_kv_heads, head_dim)}")

    def stability(self, m: int | None = None) -> dict:
        """Mean and min Jaccard over (layer, KV head), K and V sides, of the top-``m``
        sets (default: the profile's m; a smaller m needs the stored half choices)."""
        flat = lambda rows: [x for r in rows for x in r if x is not None]  # noqa: E731
        if m is None or m == self.m:
            kj, vj = self.k_jaccard, self.v_jaccard
        elif self.k_halves is None or not 0 <= m < self.m:
            raise ValueError(f"stability for m={m} needs the half choices of a profile with m >= {m}")
        else:
            kh, vh = self.k_halves[..., :m], self.v_halves[..., :2 * m]
            kj = [_jaccard(a, b) for a, b in zip(kh[0], kh[1])]
            vj = [_jaccard(a, b) for a, b in zip(vh[0], vh[1])]
        k, v = flat(kj), flat(vj)
        return {"k_jaccard_mean": _mean(k), "k_jaccard_min": min(k, default=None),
                "v_jaccard_mean": _mean(v), "v_jaccard_min": min(v, default=None)}

    # ---- JSON --------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, "source": self.source,
                "num_layers": self.num_layers, "num_kv_heads": self.num_kv_heads,
                "head_dim": self.head_dim, "m": self.m, "tokens": self.tokens,
                "rope_pairs": "i, i + head_dim/2 (rotate_half)",
                "k_pairs": self.k_pairs.tolist(), "v_channels": self.v_channels.tolist(),
                "k_jaccard": self.k_jaccard, "v_jaccard": self.v_jaccard,
                "k_halves": None if self.k_halves is None else self.k_halves.tolist(),
                "v_halves": None if self.v_halves is None else self.v_halves.tolist(),
                "stability": self.stability()}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json()))
        return path

    @staticmethod
    def from_json(d: dict) -> "OutlierProfile":
        if d.get("format") != PROFILE_FORMAT or d.get("version") != PROFILE_VERSION:
            raise ValueError(f"not a {PROFILE_FORMAT} v{PROFILE_VERSION} file "
                             f"(format={d.get('format')!r}, version={d.get('version')!r})")
        L, H, m = d["num_layers"], d["num_kv_heads"], d["m"]
        k = torch.tensor(d["k_pairs"], dtype=torch.int64).reshape(L, H, m)
        v = torch.tensor(d["v_channels"], dtype=torch.int64).reshape(L, H, 2 * m)
        halves = lambda key, n: (None if d.get(key) is None  # noqa: E731
                                 else torch.tensor(d[key], dtype=torch.int64).reshape(2, L, H, n))
        return OutlierProfile(num_layers=L, num_kv_heads=H, head_dim=d["head_dim"], m=m,
                              tokens=d["tokens"], k_pairs=k, v_channels=v,
                              k_jaccard=d.get("k_jaccard", []), v_jaccard=d.get("v_jaccard", []),
                              source=d.get("source", ""), k_halves=halves("k_halves", m),
                              v_halves=halves("v_halves", 2 * m))

    @staticmethod
    def load(path: str | Path) -> "OutlierProfile":
        return OutlierProfile.from_json(json.loads(Path(path).read_text()))


def calibrate_from_kv(keys: list[torch.Tensor], values: list[torch.Tensor], *, m: int,
                      source: str = "") -> OutlierProfile:
    """Choose the bypass sets from post-RoPE keys and values.

    keys, values: one tensor per layer, float ``[N, Hkv, D]`` (calibration tokens in text
    order; N >= 2 so both halves are non-empty). Returns the profile with stability.
    """
    if not keys or len(keys) != len(values):
        raise ValueError("keys and values: one [N, Hkv, D] tensor per layer, same count")
    N, H, D = keys[0].shape
    if N < 2:
        raise ValueError(f"need at least 2 calibration tokens, got {N}")
    if 2 * m > D:
        raise ValueError(f"m={m} RoPE pairs exceed head_dim={D}")
    half = N // 2
    k_sel, v_sel, kj, vj, kh, vh = [], [], [], [], [], []
    for k, v in zip(keys, values):
        if tuple(k.shape) != (N, H, D) or tuple(v.shape) != (N, H, D):
            raise ValueError(f"every layer must give [N={N}, Hkv={H}, D={D}] keys and values")
        pk = pair_magnitude(torch.nan_to_num(k.float(), nan=0.0, posinf=0.0, neginf=0.0))
        av = torch.nan_to_num(v.float(), nan=0.0, posinf=0.0, neginf=0.0).abs()
        k_sel.append(_top(pk.amax(0), m))
        v_sel.append(_top(av.amax(0), 2 * m))
        kh.append(torch.stack([_top(pk[:half].amax(0), m), _top(pk[half:].amax(0), m)]))
        vh.append(torch.stack([_top(av[:half].amax(0), 2 * m), _top(av[half:].amax(0), 2 * m)]))
        kj.append(_jaccard(kh[-1][0], kh[-1][1]))
        vj.append(_jaccard(vh[-1][0], vh[-1][1]))
    return OutlierProfile(num_layers=len(keys), num_kv_heads=H, head_dim=D, m=m, tokens=N,
                          k_pairs=torch.stack(k_sel), v_channels=torch.stack(v_sel),
                          k_jaccard=kj, v_jaccard=vj, source=source,
                          k_halves=torch.stack(kh, 1), v_halves=torch.stack(vh, 1))


def _cache_kwarg(model) -> str:
    """transformers >= 5.2x names the forward's cache argument ``cache``; older ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def collect_kv(model, tokenizer, text: str, *, max_tokens: int = 4096, window: int = 512
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Post-RoPE keys and values of ``text`` (its first ``max_tokens`` tokens), per layer
    ``[N, Hkv, D]`` float32 on the CPU, in text order.

    The text is cut into windows of ``window`` tokens, each run as its own prefill with a
    plain ``DynamicCache`` (whose layers hold the post-RoPE keys); the model must not be
    set to the ``witcert`` attention (any exact implementation works).
    """
    from transformers import DynamicCache

    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    ids = ids[:max_tokens]
    if ids.numel() < 2:
        raise ValueError("calibration text has fewer than 2 tokens")
    keys, values = None, None
    for start in range(0, ids.numel(), window):
        chunk = ids[start:start + window][None].to(model.device)
        cache = DynamicCache(config=model.config)
        model(input_ids=chunk, **{_cache_kwarg(model): cache}, use_cache=True)
        ks = [layer.keys[0].transpose(0, 1).float().cpu() for layer in cache.layers]
        vs = [layer.values[0].transpose(0, 1).float().cpu() for layer in cache.layers]
        if keys is None:
            keys, values = [[k] for k in ks], [[v] for v in vs]
        else:
            for i, (k, v) in enumerate(zip(ks, vs)):
                keys[i].append(k)
                values[i].append(v)
    return [torch.cat(k) for k in keys], [torch.cat(v) for v in values]


def calibrate_model(model, tokenizer, text: str, *, m: int, max_tokens: int = 4096,
                    window: int = 512, source: str = "") -> OutlierProfile:
    """``collect_kv`` then ``calibrate_from_kv``."""
    keys, values = collect_kv(model, tokenizer, text, max_tokens=max_tokens, window=window)
    return calibrate_from_kv(keys, values, m=m, source=source)
