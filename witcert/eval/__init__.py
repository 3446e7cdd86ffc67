"""Evaluation beside serving: audit traces and their recheck (``trace``), the gating and
outlier sweep (``sweep``), outlier-channel calibration (``calibrate``). The evaluation report
lives in ``witcert.report``; the CLI commands in ``witcert.commands``.
"""
