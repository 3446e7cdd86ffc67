"""Triton kernels (optional; need ``triton``). Tested against ``witcert.ref``."""
