"""Backend dispatch: Triton kernels for CUDA tensors, the native C path for CPU tensors,
else the reference.

``WITCERT_BACKEND`` (read here and nowhere else): ``ref`` forces the pure-torch reference,
``triton`` forces the kernels (CPU tensors then need ``TRITON_INTERPRET=1``), ``native``
forces the C path of ``witcert.native`` (error if it cannot be built or cannot serve the
pool), unset or ``auto`` picks Triton for CUDA tensors of a ``dither8`` pool and the native
path for CPU tensors of a ``dither8`` pool (outlier bypass included) when the library builds
(one log line, ``witcert.native.warn_unavailable``, when it does not). The native path serves
``write_kv_`` and ``decode_attention`` (one split; a call that asks for the radii, or that
the C code does not support, runs the reference) and ``extend_attention`` with a
certificate (the C extend; without a certificate the reference). All backends honour the same contract (tests/test_kernels_*.py,
tests/test_native_decode.py, tests/test_backend_native.py), so callers never branch on the
backend. A gate's exact entries come down per call as ``exact_copy=`` (a
``witcert.runtime.exact.ExactCopy``, from whoever owns the gate: the HF cache, the vLLM and SGLang
adapters; the pool never carries them) and are read by the reference and the native decode
(``reads_exact``), not by the kernels: the C decode reads the copy's layout, the reference
takes the live entries as plain data (``exact_entries``, passed as ``exact=``).
"""

from __future__ import annotations

import functools

import torch

from witcert import native, settings
from witcert.kernels.plan import interpreting
from witcert.native import decode as native_decode, support as native_support
from witcert.ref.attention import DecodeOut, check_decode_tensors
from witcert.ref.validate import check_delta_loc

BACKENDS = settings.BACKENDS


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _choice() -> str:
    return settings.backend_choice()


def _native_why_not(t: torch.Tensor, layer_kv) -> str | None:
    """Why the native path cannot serve an op on ``t`` over ``layer_kv`` (None if it can).
    Builds the library on the first call."""
    if t.device.type != "cpu":
        return f"tensor on {t.device}"
    if not native.available():
        return native.reason()
    return native_support.unsupported(layer_kv, t)


def backend_for(t: torch.Tensor, layer_kv, *, choice: str | None = None) -> str:
    """``"triton"``, ``"native"`` or ``"ref"`` for an op on tensor ``t`` over ``layer_kv``.
    choice: one of ``BACKENDS`` for this call (an engine plugin's own setting), None:
    ``WITCERT_BACKEND``."""
    src = settings.ENV_BACKEND if choice is None else "backend"
    choice = _choice() if choice is None else choice
    if choice not in BACKENDS:
        raise ValueError(f"backend {choice!r} must be one of {BACKENDS}")
    if choice == "ref":
        return "ref"
    if choice == "triton":
        if not triton_available():
            raise RuntimeError(f"{src}=triton but triton does not import")
        if t.device.type == "cpu" and not interpreting():
            raise RuntimeError(f"{src}=triton but the tensors are on the CPU: the compiled kernels "
                               "need CUDA tensors (TRITON_INTERPRET=1 runs them on the CPU in "
                               "Triton's interpreter)")
        return "triton"
    if choice == "native":
        why = _native_why_not(t, layer_kv)
        if why:
            raise RuntimeError(f"{src}=native but the native path cannot serve this: {why}")
        return "native"
    if t.is_cuda:
        ok = layer_kv.quant.method == "dither8" and triton_available()
        return "triton" if ok else "ref"
    if t.device.type == "cpu" and layer_kv.quant.method == "dither8":
        why = _native_why_not(t, layer_kv)
        if why is None:
            return "native"
        if not native.available():
            native.warn_unavailable(why)  # one log line per process and reason
    return "ref"


def reads_exact(t: torch.Tensor, layer_kv) -> bool:
    """Whether ``decode_attention`` on ``t`` over ``layer_kv`` reads the exact entries of its
    ``exact_copy=`` (the reference and the native path do; the Triton kernels do not)."""
    return backend_for(t, layer_kv) in ("ref", "native")


def write_kv_(layer_kv, k: torch.Tensor, v: torch.Tensor, *, slots: torch.Tensor) -> None:
    """Store T new tokens (k, v float [T, Hkv, D]) in ``slots`` (int64 [T]) of ``layer_kv``."""
    which = backend_for(k, layer_kv)
    if which == "triton":
        from witcert.kernels.write import write_kv_ as impl
    elif which == "native" and _native_write_ok(layer_kv, k, v, slots):
        from witcert.native.write import write_ as impl
    else:
        from witcert.ref.pool import write_ as impl
    impl(layer_kv, k, v, slots=slots)


def _native_write_ok(layer_kv, k, v, slots) -> bool:
    """The C writer takes CPU f32 / f16 / bf16 [T, Hkv, D] and int64 slots; anything else
    (including the shape errors the reference reports) goes to the reference."""
    from witcert.native.write import X_DTYPES
    shape = (slots.shape[0], layer_kv.num_kv_heads, layer_kv.head_dim) if slots.dim() == 1 else None
    return (slots.dtype == torch.int64 and shape is not None and slots.device.type == "cpu"
            and all(x.dtype in X_DTYPES and tuple(x.shape) == shape and x.device.type == "cpu"
                    for x in (k, v)))


def _native_threads(num_threads: int | None = None) -> int:
    return max(1, num_threads or torch.get_num_threads())


def _native_decode(q, layer_kv, block_table, seq_lens, *, page_size, sm_scale, cert, delta_loc,
                   exact_copy=None, terms=None, num_threads=None, lse_vbound=True, terms_tau=None):
    """DecodeOut from the C decode, or None when the C code does not serve this call. The
    gate's ``exact_copy`` (None: no gate) is read as the C overlay.

    Checked here: the tensors (``check_decode_tensors``) and the budget's shape; the launcher
    checks sm_scale and C refuses a budget outside (0, 1) (the reference's check then says
    which, in its words), so no value is scanned twice per call."""
    # (backend_for checked unsupported(layer_kv, q))
    if block_table.device.type != "cpu" or seq_lens.device.type != "cpu" or (
            exact_copy is not None
            and native_support.exact_unsupported(exact_copy, layer_kv) is not None):
        return None
    check_decode_tensors(q, layer_kv, block_table, seq_lens, page_size=page_size)
    B = q.shape[0]
    if isinstance(delta_loc, torch.Tensor) and tuple(delta_loc.shape) not in ((), (B,)):
        raise ValueError(f"delta_loc must be a float or [B={B}], got {tuple(delta_loc.shape)}")
    dl = None
    if cert.enabled and cert.radius != "det":
        dl = torch.as_tensor(delta_loc, dtype=torch.float64).cpu().expand(B).contiguous()
    bt = block_table if block_table.shape[1] <= 1 or block_table.stride(1) == 1 \
        else block_table.contiguous()
    fired_only = terms is not None and terms_tau is not None and cert.enabled
    if terms is not None:
        terms["fired_only"] = fired_only
    try:
        out, lse, c, vb = native_decode.decode_attention_full(
            q, layer_kv, bt, seq_lens, page_size=page_size, sm_scale=sm_scale,
            radius=cert.radius, delta_loc=dl, num_threads=_native_threads(num_threads),
            with_cert=cert.enabled, with_lse_vbound=lse_vbound, exact=exact_copy, debug=terms,
            debug_tau=native_decode.debug_threshold(terms_tau) if fired_only else None)
    except ValueError:
        if dl is not None:  # C refuses a budget outside (0, 1): say so as the reference does
            check_delta_loc(delta_loc, batch=B)
        raise
    return DecodeOut(out=out, lse=lse, cert=c, vbound=vb, radius=None,
                     radius_kind=cert.radius if cert.enabled else "none")


def decode_attention(q: torch.Tensor, layer_kv, block_table: torch.Tensor, seq_lens: torch.Tensor, *,
                     page_size: int, sm_scale: float, cert, delta_loc, num_splits: int | None = None,
                     return_radius: bool = False, terms: dict | None = None, backend: str | None = None,
                     num_threads: int | None = None, lse_vbound: bool = True, exact_copy=None,
                     terms_tau: float | None = None):
    """One decode step (see ``witcert.ref.attention.decode_attention``) -> ``DecodeOut``.

    num_splits None: the kernel plans splits per request from its own length
    (``witcert.kernels.decode.plan_splits``); the reference then uses one split. The
    native path always computes one split (num_splits is ignored there); with
    ``return_radius`` it hands the call to the reference, which returns the radii.
    terms: None, or a dict that receives ``backend``, the path that decoded (``triton``,
    ``native`` or ``ref``), and on the native path ``logits`` f64 [B, Hq, Nmax] (the logits
    it used) and ``radius`` f32 [B, Hq, Nmax] (their whole radii, rounded up; NaN past each
    seq_len): what the gate's repair plans with. terms_tau: None, or the gate's threshold: the
    native path then writes ``logits`` / ``radius`` only for the query heads whose certificate
    exceeds it (the rows the C repair reads; the other heads' entries are unset memory) and
    sets ``terms["fired_only"]``.
    backend: this call's choice (one of ``BACKENDS``; an engine plugin's setting), None:
    ``WITCERT_BACKEND``. num_threads: the C path's threads (None: torch's). lse_vbound=False
    lets the C path skip lse and vbound (None in the result; the other paths return them).
    exact_copy: None, or the gate's ``witcert.runtime.exact.ExactCopy`` of this layer: its live
    entries are read exactly by the reference and the C decode (the Triton kernels ignore it;
    ``reads_exact`` says which path runs).
    """
    kw = dict(page_size=page_size, sm_scale=sm_scale, cert=cert, delta_loc=delta_loc,
              return_radius=return_radius)
    which = backend_for(q, layer_kv, choice=backend)
    if terms is not None:
        terms["backend"] = which if which != "native" or not return_radius else "ref"
    if which == "triton":
        from witcert.kernels.decode import decode_attention as impl
        return impl(q, layer_kv, block_table, seq_lens, num_splits=num_splits, **kw)
    if which == "native" and not return_radius:
        res = _native_decode(q, layer_kv, block_table, seq_lens, page_size=page_size,
                             sm_scale=sm_scale, cert=cert, delta_loc=delta_loc,
                             exact_copy=exact_copy, terms=terms, num_threads=num_threads,
                             lse_vbound=lse_vbound, terms_tau=terms_tau)
        if res is not None:
            return res
        if terms is not None:
            terms["backend"] = "ref"
    from witcert.ref.attention import decode_attention as impl
    return impl(q, layer_kv, block_table, seq_lens, num_splits=num_splits or 1,
                exact=exact_entries(exact_copy, block_table, seq_lens, page_size=page_size,
                                    device=q.device), **kw)


def exact_entries(exact_copy, block_table: torch.Tensor, seq_lens: torch.Tensor, *, page_size: int,
                  device: torch.device | str | None = None):
    """The reference decode's ``exact=``: the live entries of a gate's ``exact_copy`` (a
    ``witcert.runtime.exact.ExactCopy``, or None: no gate -> None) among the slots the batch
    reads (block_table int32 [B, pages], seq_lens [B]), as ``witcert.ref.overlay.ExactEntries``."""
    if exact_copy is None:
        return None
    return exact_copy.batch_entries(block_table, seq_lens, page_size=page_size, device=device)


def extend_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, layer_kv,
                     prefix_slots: torch.Tensor, *, sm_scale: float, causal: bool = True,
                     cert=None, delta_loc=None):
    """Prefill/extend of one sequence over its compressed prefix.

    cert None: f32 [T, Hq, D] (no certificate). cert a ``CertConfig``: an ``ExtendOut``
    (``witcert.ref.extend``: out, lse, cert [T, Hq] per new token and query head) from the
    native C extend on CPU, the tensor-core extend on CUDA (``witcert.kernels.extend``: its
    prefix phase in the CUDA C++ kernel where that serves the shape, the rest in Triton; scale
    groups of >= 32 channels: the int8 tensor-core dots need K >= 32; smaller groups take the
    reference spec on the GPU), else the reference spec. delta_loc: a float or f64 [T], the budget of each new token
    (needed for the prob / min radius; docs/MATH.md §4).
    """
    which = backend_for(q, layer_kv)
    if which == "triton":
        from witcert.kernels.extend import supports
        which = "triton" if supports(layer_kv) else "ref"
    if cert is not None:
        if cert.enabled and cert.radius != "det" and delta_loc is None:
            raise ValueError(f"delta_loc: radius {cert.radius!r} needs the budget of each new "
                             "token (a float or [T]; docs/MATH.md §4)")
        if which == "native":
            from witcert.native.extend import extend_one
            res = extend_one(q, k_new, v_new, layer_kv, prefix_slots, sm_scale=sm_scale, cert=cert,
                             delta_loc=delta_loc, causal=causal, num_threads=_native_threads())
            if res is not None:
                return res
        if which == "triton":
            from witcert.kernels.extend import extend_attention as impl
            return impl(q, k_new, v_new, layer_kv, prefix_slots, sm_scale=sm_scale, causal=causal,
                        cert=cert, delta_loc=delta_loc if delta_loc is not None else 0.5)
        from witcert.ref.extend import extend_attention_cert
        return extend_attention_cert(q, k_new, v_new, layer_kv, prefix_slots, sm_scale=sm_scale,
                                     cert=cert, delta_loc=delta_loc, causal=causal)
    if which == "triton":
        from witcert.kernels.extend import extend_attention as impl
    else:
        from witcert.ref.attention import extend_attention as impl
    return impl(q, k_new, v_new, layer_kv, prefix_slots, sm_scale=sm_scale, causal=causal)


def extend_batch(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_kv, *,
                 q_start: list[int], q_len: list[int], prefix_len: list[int],
                 block_table: torch.Tensor, page_size: int, sm_scale: float, cert,
                 delta_loc: torch.Tensor, pool_read: bool = False, backend: str | None = None,
                 num_threads: int | None = None):
    """Extend of several sequences of one engine batch over their paged prefixes, with a
    certificate per (new token, query head) when ``cert.enabled``.

    Sequence i's new tokens are query / key / value rows ``q_start[i] .. + q_len[i]``
    (query [T, Hq, D], key / value [T, Hkv, D], other rows untouched); its prefix is the
    first ``prefix_len[i]`` tokens of block-table row i (int32 [S, pages]). pool_read: the
    new tokens are already stored and are read back compressed, causally, as a decode query
    at their position would read them (``prefix_len`` then counts them too). delta_loc: f64
    [T] the budget of each new token (rows outside the sequences unread). Returns (out f32
    [T, Hq, D], cert f32 [T, Hq] or None): only the sequences' rows are defined. The native
    path is one C call for every sequence; the reference runs the spec one sequence at a
    time; backend, num_threads: as ``decode_attention``.
    """
    which = backend_for(query, layer_kv, choice=backend)
    if which == "native":
        from witcert.native.extend import extend_attention, unsupported
        why = unsupported(layer_kv, query)
        if why is None and block_table.dtype == torch.int32:
            o, _, c = extend_attention(
                query, key, value, layer_kv, q_start=q_start, q_len=q_len, prefix_len=prefix_len,
                block_table=block_table, page_size=page_size, sm_scale=sm_scale,
                radius=cert.radius, delta_loc=delta_loc, with_cert=cert.enabled,
                num_threads=_native_threads(num_threads), pool_read=pool_read)
            return o, c
    from witcert.ref.attention import token_slots
    from witcert.ref.extend import extend_attention_cert
    T, Hq, D = query.shape
    out = torch.zeros(T, Hq, D, dtype=torch.float32, device=query.device)
    c = torch.zeros(T, Hq, dtype=torch.float32, device=query.device) if cert.enabled else None
    for i, (lo, n, p) in enumerate(zip(q_start, q_len, prefix_len)):
        slots = token_slots(block_table[i], p, page_size=page_size)
        r = extend_attention_cert(query[lo:lo + n], key[lo:lo + n], value[lo:lo + n], layer_kv,
                                  slots, sm_scale=sm_scale, cert=cert,
                                  delta_loc=delta_loc[lo:lo + n], new_from_pool=pool_read)
        out[lo:lo + n] = r.out.to(torch.float32)
        if c is not None:
            c[lo:lo + n] = r.cert
    return out, c
