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
