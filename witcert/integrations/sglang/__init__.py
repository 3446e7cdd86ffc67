"""witcert inside SGLang: certified dithered-INT8 KV cache for ``sglang.launch_server``.

Entry point (pyproject.toml), loaded by SGLang on purpose in every process:
``sglang.srt.plugins: witcert = witcert.integrations.sglang:register``. Importing this
package registers nothing; ``register()`` is the only action, and what it registers is
inert unless the server selects ``--attention-backend witcert`` (off = stock SGLang):

- ``add_attention_backend_choices`` + ``register_attention_backend("witcert")``: the CLI
  accepts the name and SGLang's registry builds ``backend.WitcertTritonAttnBackend``;
- ``HookRegistry`` AROUND ``SRTPlatform.get_kv_pool_cls``: for ``kind="mha"`` the platform
  hands SGLang's configurator ``pool.WitcertMHATokenToKVPool`` (witcert-packed K/V keyed by
  SGLang's slots, exact copy on the host);
- ``HookRegistry`` AROUND ``DefaultPoolConfigurator._compute_cell_size``: the per-token
  cell SGLang divides its KV budget by is witcert's byte account
  (``accounting.witcert_cell_size``), so saved bytes become KV capacity; the capacity
  with and without witcert at the same budget is logged.

Each hook checks that witcert is the configured backend for both prefill and decode
(``runtime_context.attention_backends()``) and otherwise calls SGLang's original.
"""

from __future__ import annotations

import logging

from witcert.integrations.sglang.settings import BACKEND_NAME

logger = logging.getLogger(__name__)

POOL_CLS_TARGET = "sglang.srt.platforms.interface.SRTPlatform.get_kv_pool_cls"
CELL_SIZE_TARGET = ("sglang.srt.model_executor.pool_configurator."
                    "DefaultPoolConfigurator._compute_cell_size")


def selected() -> bool:
    """True when SGLang is configured with ``--attention-backend witcert``. A split
    configuration (witcert for only one of prefill/decode) is refused: both read the pool."""
    from sglang.srt.runtime_context import attention_backends

    pair = tuple(attention_backends())
    if BACKEND_NAME not in pair:
        return False
    if pair != (BACKEND_NAME, BACKEND_NAME):
        raise ValueError(f"witcert: prefill/decode backends are {pair}; witcert's INT8 pool "
                         f"can only be read by {BACKEND_NAME!r} for both")
    return True


def create_backend(runner):
    """SGLang attention-registry factory for ``--attention-backend witcert``."""
    from witcert.integrations.sglang.backend import WitcertTritonAttnBackend

    return WitcertTritonAttnBackend(runner)


def kv_pool_cls_hook(original, platform, *, kind):
    """AROUND ``SRTPlatform.get_kv_pool_cls``: witcert's pool for MHA when selected."""
    if kind == "mha" and selected():
        from witcert.integrations.sglang.pool import WitcertMHATokenToKVPool

        theirs = original(platform, kind=kind)
        if theirs is not None:
            raise NotImplementedError(f"witcert: the platform brings its own MHA pool "
                                      f"{theirs.__name__}; witcert cannot replace it")
        return WitcertMHATokenToKVPool
    return original(platform, kind=kind)


def cell_size_hook(original, configurator, kvc, num_layers):
    """AROUND ``DefaultPoolConfigurator._compute_cell_size``: witcert's byte account."""
    stock = original(configurator, kvc, num_layers)
    if not selected():
        return stock
    from sglang.srt.runtime_context import get_parallel

    from witcert.integrations.sglang import settings
    from witcert.integrations.sglang.accounting import witcert_cell_size

    mc = kvc.model_config
    if kvc.use_mla_backend or mc.head_dim != mc.v_head_dim:
        raise NotImplementedError("witcert: MLA / head_dim != v_head_dim models are not supported")
    heads = mc.get_num_kv_heads(get_parallel().attn_tp_size, get_parallel().attn_dcp_size)
    cell = witcert_cell_size(num_layers=num_layers, num_kv_heads=heads, head_dim=mc.head_dim,
                             quant=settings.load().quant)
    configurator.witcert_stock_cell_size = stock
    logger.info("witcert: KV cell size %d B/token (stock SGLang: %d B/token, x%.3f tokens "
                "for the same memory)", cell, stock, stock / cell)
    return cell


_registered = False


def register() -> None:
    """SGLang general plugin (``sglang.srt.plugins``): registers the backend name and the
    two hooks (once per process). Inert unless ``--attention-backend witcert`` is configured."""
    global _registered
    if _registered:
        return
    _registered = True
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import register_attention_backend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    register_attention_backend(BACKEND_NAME)(create_backend)
    HookRegistry.register(POOL_CLS_TARGET, kv_pool_cls_hook, HookType.AROUND)
    HookRegistry.register(CELL_SIZE_TARGET, cell_size_hook, HookType.AROUND)
