"""Exact total variation for the soundness tests: a re-export of ``witcert.report.exact_tv``
(one copy, shared with the report and ``benchmarks/soundness_sweep.py``)."""

from witcert.report.exact_tv import _tv_mp, exact_shifted_logits, tv  # noqa: F401
