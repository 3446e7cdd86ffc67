"""Shared test settings: hypothesis runs derandomized in CI so a run is reproducible.

The engine venvs (tests/vllm, tests/sglang) may not have hypothesis: then there is
nothing to configure.
"""

import os

try:
    from hypothesis import settings
except ModuleNotFoundError:  # engine venvs: their tests do not use hypothesis
    settings = None

if settings is not None:
    settings.register_profile("ci", derandomize=True, print_blob=True)
    settings.register_profile("dev", print_blob=True)
    settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_collection_modifyitems(config, items):
    """``WITCERT_SHARD=i/n`` keeps every n-th collected test starting at i (0-based), so a
    machine with many cores can run one file's matrix in n processes; unset: all tests."""
    shard = os.environ.get("WITCERT_SHARD")
    if not shard:
        return
    try:
        i, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise ValueError(f"WITCERT_SHARD={shard!r}: expected i/n, e.g. 0/4") from None
    if not 0 <= i < n:
        raise ValueError(f"WITCERT_SHARD={shard!r}: need 0 <= i < n")
    keep = [it for k, it in enumerate(items) if k % n == i]
    config.hook.pytest_deselected(items=[it for k, it in enumerate(items) if k % n != i])
    items[:] = keep
