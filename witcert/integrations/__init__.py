"""Integrations of witcert into serving engines.

Nothing here is imported by ``witcert`` itself and nothing registers anything at import
time: each engine loads its integration on purpose (for vLLM, through the entry points
declared in pyproject.toml; see ``witcert.integrations.vllm``).
"""
