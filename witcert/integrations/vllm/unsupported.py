"""Backends witcert registers over vLLM's CPU MLA slot so that an MLA model fails loudly.

Without this, a model whose attention vLLM routes to ``CPU_MLA`` (DeepSeek-style latent
attention) would run with the plain vLLM cache while ``WITCERT_VLLM`` is on, and no
certificate would ever appear. The subclass keeps vLLM's backend selection intact and
refuses at the first layer built, during start-up.
"""

from __future__ import annotations

from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend


class UnsupportedMLABackend(CPUMLABackend):
    @staticmethod
    def get_impl_cls():
        raise ValueError("witcert: multi-head latent attention (MLA) models are not supported by "
                         "the witcert vLLM plugin; unset WITCERT_VLLM to serve this model")
