"""One registry over every KV compressor the reference knows (``config.METHODS``).

``get_compressor(QuantConfig)`` is the only way the rest of the code builds one; it
raises ``ValueError`` naming the method for anything it cannot build. Nothing is
registered at import time: the table below is a plain dict of constructors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from witcert.config import QuantConfig
from witcert.ref import quant as _quant
from witcert.ref.baselines import FP8, FP16, KIVI, RTN, StochasticRounding8
from witcert.ref.types import Compressor, EncodeCtx

_FACTORIES: dict[str, Callable[[QuantConfig], Compressor]] = {
    "dither8": lambda q: _quant.DitherInt8.from_config(q),
    "dither8_block": lambda q: _quant.DitherInt8Block.from_config(q),
    "rtn8": lambda q: RTN(bits=8, group_size=q.group_size),
    "rtn4": lambda q: RTN(bits=4, group_size=q.group_size),
    "sr8": lambda q: StochasticRounding8(group_size=q.group_size, dither_bits=q.dither_bits),
    "fp8": lambda q: FP8(scaled=False, group_size=q.group_size),
    "fp8_scaled": lambda q: FP8(scaled=True, group_size=q.group_size),
    "fp16": lambda q: FP16(group_size=q.group_size),
    "kivi2": lambda q: KIVI(bits=2, group_size=q.group_size, residual=q.kivi_residual,
                            block=q.block_size),
    "kivi4": lambda q: KIVI(bits=4, group_size=q.group_size, residual=q.kivi_residual,
                            block=q.block_size),
}


def get_compressor(quant: QuantConfig) -> Compressor:
    """Build the compressor ``quant.method`` names.

    Raises ``ValueError`` (message starts with the method name) for an unknown method,
    or for outlier bypass (``outliers > 0``) on a method that does not implement it.
    """
    method = quant.method
    factory = _FACTORIES.get(method)
    if factory is None:
        raise ValueError(f"{method!r}: unknown compressor; known: {sorted(_FACTORIES)}")
    if quant.outliers > 0 and not quant.is_dither:
        raise ValueError(f"{method!r}: outlier bypass (outliers={quant.outliers}) is only "
                         "implemented for dither8 and dither8_block")
    return factory(quant)


def bytes_per_token_head(quant: QuantConfig, head_dim: int) -> int:
    """Stored bytes per (token, KV head) of one side (K or V) for ``quant``.

    Token methods: exactly the sum over ``storage_spec``. Block methods: the steady-state
    amortised cost (see each class), the exact recent-token tail excluded.
    """
    return get_compressor(quant).bytes_per_token_head(head_dim)


def compress_roundtrip(x: torch.Tensor, *, quant: QuantConfig,
                       ctx: EncodeCtx) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode then decode ``x`` [T, H, D] (offline evaluation).

    Returns ``(xhat f32 [T, H, D], wit fp16 [T, H, D/G])``, ``wit >= ||xhat_g - x_g||_2``.
    """
    comp = get_compressor(quant)
    packed = comp.encode(x, ctx=ctx)
    return comp.decode(packed, ctx=ctx), packed["wit"]
