"""What the CUDA extend's aligned keys cost in tightness: T_r U_t against the radius (issue 19; CPU).

The CUDA extend forms each (row, token) logit from aligned keys (docs/PROOFS.md 5.4, "the CUDA
extend's aligned keys") and adds ``T_r U_t`` to that (row, token)'s radius: the key's rounding to
its integer ``K``, the three integer dots left out and the route's fp32 roundings. This study writes
model-like keys (unit scale with a few large channels, as the tests' ``random_kv``) into a dither8
pool through the reference writer, takes Gaussian queries (times 3, as the CUDA extend's tests) and
prints, for the deterministic, probabilistic and minimum radius of the reference (no arithmetic
slack), the median and largest ratio ``T_r U_t / radius`` over every (query head, token), and the
same for the query's residual below its digits (``sum_g W_g s_g``, the rest of the route's slack). ``T_r``
and ``U_t`` are the kernel's, from ``witcert.kernels.aligned`` (the digits' l1 norms, the row factor
and the tokens' group scales; no fp32 rounding of ``T_r`` itself).

    PYTHONPATH=<checkout> python benchmarks/aligned_slack_study.py [--tokens 512] [--heads 8] [--bits 16]

``--digit-schemes`` prints instead the query's residual part for digit schemes the kernel does not
use (BENCHMARKS.md 13v), at fp32, fp16 and bf16 queries: two digits (d_0 in units of 2^(e-7), d_1 in
base 256) and three (d_1, d_2 in base 256), each with d_1's rounding to 128 clamped to 127 or carried
into d_0; beside them the shipped three digits in base 128.

``--fp16-keys`` prints instead what a q.k on fp16 tensor cores would add to each radius (a route the
kernel does not have, BENCHMARKS.md 13ai): the query in fp16 (a model's own), the exact key k^ as
one fp16 key or as hi + lo fp16 keys, the accumulation under the signed model of PROOFS 5.4
(``witcert.ref.arith.tc_dot_slack``: ``3 K 2^-23 (1 + 2^-10) sum_i |q_i k_i|`` a dot, K = 128, and
the scale's rounding). Each term per (row, token) exactly
(``sum_i |q_i| |e_i|``, the best a bound could do) and as the per-group form a kernel's radius sums
could carry (``sum_g ||q_g||_1 max_{i in g} |e_i|``, or ``sum_g ||q_g||_2 ||e_g||_2`` by
Cauchy-Schwarz: the CUDA extend's form since 2026-12-07e), over the radius: median / largest.
With ``--model-keys`` the keys and queries are the bundled model's own (SmolLM2-135M, D 64: layer
``--layer``'s key and query projections over the first ``--tokens`` tokens of CPython's pydoc
topics, before RoPE, one KV head ``--kv-head`` and its query heads at the last ``--rows``
positions) instead of model-like random ones.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from witcert.config import QuantConfig
from aligned_keys_spec import f32bits_exp, row_factor, row_slack, split_row, unit_exponent
from witcert.ref.cert import combine_radius, radius_det, radius_prob
from witcert.ref.pool import LayerKV, gather, write_
from witcert.ref.types import K_SIDE
from witcert.kernels.dequant import combine_roundings
from witcert.ref.arith import U32, gamma, tc_dot_slack


def pieces_slack(q: np.ndarray, bits: int, group: int) -> np.ndarray:
    """Per group, sm-free: gamma_K 128 A_g + O_g of the integer-pieces route (digits at each group's
    own exponent, the dots of weight <= 2^-22 dropped), [NG]."""
    gk = gamma(combine_roundings(qdig=3, bits=bits, groups=128 // group), U32)
    drop = [(j, p) for j in range(3) for p in range(bits // 8) if 8 * p - 7 * j - bits <= -22]
    out = []
    for g in range(128 // group):
        # the group alone (the rest of the row 0): split_row then takes the group's own exponent, as
        # q_row does per group in that route (sm 1 moves the exponent only below 2^-105)
        x = np.zeros(128, np.float32)
        x[:group] = q[g * group:(g + 1) * group]
        d, e, _ = split_row(x, 1.0, residuals=False)
        l1 = [float(np.abs(d[j]).sum()) for j in range(3)]
        a_g = 2.0 ** e * sum(l1[j] / 128 ** (j + 1) for j in range(3))
        o_g = 2.0 ** (e - bits + 7) * sum(256 ** p / 128 ** (j + 1) * l1[j] for j, p in drop)
        out.append(gk * 128 * a_g + o_g)
    return np.array(out)


def residual_slack(res, scales: torch.Tensor, sm: float) -> torch.Tensor:
    """sum_g 127.5 ||delta_g||_1 sm s_g, the query's residual part of the slack (the group slack
    weights W_g s_g): res [H, NG] (each row's group residuals), scales [N, NG] -> [H, N]."""
    res = torch.as_tensor(np.asarray(res, dtype=np.float64))
    return 127.5 * sm * (res.unsqueeze(1) * scales.double().unsqueeze(0)).sum(-1)


def scheme_residual(q: np.ndarray, nd: int, carry: bool) -> np.ndarray:
    """|q - q_d| per channel [D] for a digit scheme in base 256 after the first digit (float64: every
    step exact), at the row exponent split_row takes where sm does not move it."""
    e = min(max(f32bits_exp(float(np.abs(q).max())) - 125, -125), 125)
    y0 = q.astype(np.float64) * 2.0 ** -e * 128
    d0 = np.clip(np.rint(y0), -64, 64)
    y1 = (y0 - d0) * 256
    r1 = np.rint(y1)
    c = (r1 == 128) & carry  # carried: d_0 + 1, d_1 = -128
    d0, d1 = d0 + c, np.where(c, -128, np.clip(r1, -128, 127))
    rec = d0 / 128 + d1 / 2 ** 15
    if nd == 3:
        rec = rec + np.clip(np.rint((y1 - np.where(c, 128, d1)) * 256), -127, 127) / 2 ** 23
    return np.abs(q.astype(np.float64) - rec * 2.0 ** e)


def digit_schemes(q, scales, u, sm, group) -> None:
    """The residual slack sum_g 127.5 ||delta_g||_1 sm s_g over the radius u [H, N] per scheme and
    query dtype."""
    print("| query dtype | digits | median / largest residual slack over the radius |")
    print("|---|---|---|")
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        qd = q.to(dt).float().numpy()
        schemes = {"3, base 128 (shipped)": None, "2, base 256, clamped": (2, False),
                   "2, base 256, carried": (2, True), "3, base 256, clamped": (3, False), "3, base 256, carried": (3, True)}
        for name, sch in schemes.items():
            if sch is None:
                res = np.array([[float(r) for r in split_row(x, sm, group)[2]] for x in qd])
            else:
                res = np.array([scheme_residual(x, *sch).reshape(-1, group).sum(1) for x in qd])
            ratio = (residual_slack(res, scales, sm) / u).flatten().numpy()
            print(f"| {str(dt).split('.')[-1]} | {name} | {np.median(ratio):.2e} / {ratio.max():.2e} |")


def fp16_route_slack(q: torch.Tensor, khat: torch.Tensor, sm: float, group: int) -> dict:
    """What each fp16 q.k route adds to a (row, token)'s radius: {(route, form): [H, N] float64}
    for q [H, D] (taken in fp16) and the exact keys khat [N, D]; form ``exact`` (per token) or
    ``folded`` (per group of ``group`` channels, >= exact) or ``cs`` (per group by Cauchy-Schwarz,
    ``||q_g||_2 ||e_g||_2``, >= exact: a row entry times a token entry, foldable too)."""
    qa = q.half().double().abs()  # [H, D]
    k = khat.double()
    hi = k.half().double()
    lo = (k - hi).half().double()
    beta = tc_dot_slack(k.shape[1], sm)[0]  # one dot of D products: the signed model (its flush term, < 2^-117, left out)

    def exact(e):  # sm sum_i |q_i| |e_i| -> [H, N]
        return sm * qa @ e.abs().T

    def folded(e):  # sm sum_g ||q_g||_1 max_{i in g} |e_i| -> [H, N]
        ng = e.shape[1] // group
        return sm * qa.view(-1, ng, group).sum(-1) @ e.abs().view(-1, ng, group).amax(-1).T

    def cs(e):  # sm sum_g ||q_g||_2 ||e_g||_2 (Cauchy-Schwarz per group) -> [H, N]
        ng = e.shape[1] // group
        return sm * qa.view(-1, ng, group).norm(dim=-1) @ e.view(-1, ng, group).norm(dim=-1).T

    routes = {"one fp16 key (8 dots a 16 x 8)": lambda f: f(k - hi) + beta * f(hi),
              "hi + lo fp16 keys (16 dots)": lambda f: f(k - hi - lo) + beta * (f(hi) + f(lo))}
    return {(name, form): route(f) for name, route in routes.items()
            for form, f in (("exact", exact), ("folded", folded), ("cs", cs))}


def fp16_keys(q: torch.Tensor, khat: torch.Tensor, u: dict, sm: float, group: int) -> None:
    """Prints fp16_route_slack over the radius u {mode: [H, N]}: median / largest."""
    print("| route | form | det: median / largest | prob: median / largest | min: median / largest |")
    print("|---|---|---|---|---|")
    for (name, form), slack in fp16_route_slack(q, khat, sm, group).items():
        cells = []
        for mode in ("det", "prob", "min"):
            r = (slack / u[mode]).flatten().numpy()
            cells.append(f"{np.median(r):.2e} / {r.max():.2e}")
        label = {"exact": "per token, exact", "folded": "per group, foldable",
                 "cs": "per group by Cauchy-Schwarz, foldable"}[form]
        print(f"| {name} | {label} | " + " | ".join(cells) + " |")


def model_keys(tokens: int, layer: int, kv_head: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The bundled model's keys [N, 1, D] of one KV head and its query heads' rows [H rows, D] (the
    last ``rows`` positions of each head) at ``layer``, from the projections (before RoPE) over the
    first ``tokens`` tokens of the pydoc topics (fp32)."""
    from witcert.hf.model import load_model
    from witcert.report.texts import docs_text

    model, tok = load_model()
    ids = tok(docs_text(), return_tensors="pt").input_ids[:, :tokens]
    if ids.shape[1] < tokens:
        raise SystemExit(f"--tokens {tokens}: the text has {ids.shape[1]}")
    cfg = model.config
    d = cfg.hidden_size // cfg.num_attention_heads
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    caps: dict[str, torch.Tensor] = {}
    att = model.model.layers[layer].self_attn
    for side in "qk":
        getattr(att, f"{side}_proj").register_forward_hook(
            lambda mod, inp, out, key=side: caps.__setitem__(key, out.detach().float()))
    with torch.no_grad():
        model(ids)
    k = caps["k"][0].view(-1, hkv, d)[:, kv_head: kv_head + 1]
    g = hq // hkv
    q = caps["q"][0].view(-1, hq, d)[-rows:, kv_head * g: (kv_head + 1) * g]  # [rows, g, D]
    return k.contiguous(), q.transpose(0, 1).reshape(-1, d).contiguous()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8, help="query heads (one KV head)")
    ap.add_argument("--bits", type=int, default=16)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--digit-schemes", action="store_true", help="the residual of other digit schemes")
    ap.add_argument("--fp16-keys", action="store_true", help="the slack of a q.k on fp16 tensor cores")
    ap.add_argument("--model-keys", action="store_true", help="with --fp16-keys: the bundled model's keys and queries")
    ap.add_argument("--layer", type=int, default=15)
    ap.add_argument("--kv-head", type=int, default=0)
    ap.add_argument("--rows", type=int, default=16, help="query positions (the last ones) per query head")
    args = ap.parse_args()
    if args.model_keys:
        k, q = model_keys(args.tokens, args.layer, args.kv_head, args.rows)
        d = k.shape[-1]
        args.heads = q.shape[0]
    else:
        d = 128
    n, sm = args.tokens, d ** -0.5
    gen = torch.Generator().manual_seed(args.seed)
    quant = QuantConfig(method="dither8", group_size=args.group, dither_bits=args.bits)
    layer = LayerKV.allocate(num_slots=n, num_kv_heads=1, head_dim=d, quant=quant, layer=3, seed=12345,
                             epochs=torch.randint(0, 2**32, (n,), generator=gen, dtype=torch.int64),
                             device="cpu")
    if not args.model_keys:
        k = torch.randn(n, 1, d, generator=gen) * torch.exp(torch.randn(1, 1, d, generator=gen))
    v = torch.randn(n, 1, d, generator=gen)
    slots = torch.arange(n)
    write_(layer, k.half(), v.half(), slots=slots)
    khat, kp = gather(layer, K_SIDE, slots)
    scales = kp["scales"][:, 0].float()  # [N, NG]
    units = torch.tensor([2.0 ** unit_exponent([float(s) for s in row], args.bits) for row in scales],
                         dtype=torch.float64)
    if not args.model_keys:
        q = (torch.randn(args.heads, d, generator=gen) * 3).float()
    ud = radius_det(q.double(), kp["wit"][:, 0].unsqueeze(0).expand(args.heads, -1, -1), sm_scale=sm,
                    group_size=args.group)
    up = radius_prob(q.double(), scales.unsqueeze(0).expand(args.heads, -1, -1), sm_scale=sm,
                     group_size=args.group, bits=args.bits, n_tokens=n, delta_loc=1e-6)
    if args.fp16_keys:
        fp16_keys(q, khat[:, 0], {m: combine_radius(ud, up, m) for m in ("det", "prob", "min")}, sm, args.group)
        return
    if args.digit_schemes:
        digit_schemes(q, scales, combine_radius(ud, up, "prob"), sm, args.group)
        return
    rows = [split_row(qh.numpy(), sm, args.group) for qh in q]
    slack = torch.stack([float(row_slack(dg, row_factor(e, sm))) * units for dg, e, _ in rows])  # [H, N]
    resid = residual_slack([[float(x) for x in r] for _, _, r in rows], scales, sm)  # [H, N]
    old = torch.tensor(np.stack([pieces_slack(qh.numpy(), args.bits, args.group) for qh in q]))  # [H, NG]
    old = sm * (old.unsqueeze(1) * scales.double().unsqueeze(0)).sum(-1)  # [H, N]
    print(f"aligned keys: T_r U_t against the reference radius, {args.heads} query heads x {n} tokens, "
          f"b {args.bits}, groups of {args.group}")
    print("| radius | median radius | aligned keys: median T_r U_t | median / largest ratio | "
          "integer pieces: median slack | median / largest ratio | median residual slack | median / largest ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in ("det", "prob", "min"):
        u = combine_radius(ud, up, mode)
        ratio, rold, rres = ((x / u).flatten().numpy() for x in (slack, old, resid))
        print(f"| {mode} | {u.median().item():.4g} | {slack.median().item():.3g} | "
              f"{np.median(ratio):.2e} / {ratio.max():.2e} | {old.median().item():.3g} | "
              f"{np.median(rold):.2e} / {rold.max():.2e} | {resid.median().item():.3g} | "
              f"{np.median(rres):.2e} / {rres.max():.2e} |")


if __name__ == "__main__":
    main()
