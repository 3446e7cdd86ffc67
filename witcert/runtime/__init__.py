"""The serving runtime, between the adapters (``witcert.hf``, ``witcert.integrations``) and the
fast paths (``witcert.kernels``, ``witcert.native``) over the spec (``witcert.ref``):

- ``dispatch``: the one backend choice (Triton on CUDA, the native C path on CPU, the
  reference otherwise) and the write / decode / extend entry points every adapter calls;
- ``pool``, ``slots``: the paged pool of one model and its slot allocator;
- ``exact``, ``repair``, ``repair_plan``, ``repair_rows``: the exact host copy and the one
  gate (plan, per-row repair) that HF, vLLM, SGLang and the report share;
- ``telemetry``, ``prefill_tally``: certificate logs, counters and Prometheus export.

Calls go down only: the runtime calls the fast paths and the spec, never an adapter.
"""
