# Sourced (not run) by scripts/test.sh and scripts/setup_{vllm,sglang}_env.sh: the one place
# that reads the engine-venv settings and holds the helpers the three scripts share.
#
#   WITCERT_VLLM_VENV     vLLM venv    (default ${XDG_CACHE_HOME:-~/.cache}/witcert/venvs/vllm)
#   WITCERT_SGLANG_VENV   SGLang venv  (default ${XDG_CACHE_HOME:-~/.cache}/witcert/venvs/sglang)
#   WITCERT_VLLM_BASE_PYTHON, WITCERT_SGLANG_BASE_PYTHON
#                         interpreter that creates each venv (default python3.11)
#
# The venvs live in a per-user cache, outside the clone, and are shared by every clone of
# the same user (about 3.5 GB for vLLM and 2.7 GB for SGLang); remove them with
# `rm -rf "${XDG_CACHE_HOME:-$HOME/.cache}/witcert/venvs"`.

WITCERT_VENV_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/witcert/venvs"
VLLM_VENV="${WITCERT_VLLM_VENV:-$WITCERT_VENV_ROOT/vllm}"
SGLANG_VENV="${WITCERT_SGLANG_VENV:-$WITCERT_VENV_ROOT/sglang}"
VLLM_BASE_PYTHON="${WITCERT_VLLM_BASE_PYTHON:-python3.11}"
SGLANG_BASE_PYTHON="${WITCERT_SGLANG_BASE_PYTHON:-python3.11}"

# need_python INTERPRETER ENGINE VARIABLE: one line and status 1 if INTERPRETER is missing.
need_python() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "error: creating the $2 venv needs '$1' on PATH (the $2 build tested here runs on" \
         "CPython 3.11): install Python 3.11, or set $3=/path/to/python3.11, or run only the" \
         "main suite with WITCERT_SKIP_ENGINES=1" >&2
    return 1
  fi
}

# pip_step LOG WHAT ARGS...: run `pip install ARGS` quietly into LOG, one line of progress;
# on failure print the log's tail and where the whole log is.
pip_step() {
  local log="$1" what="$2" start=$SECONDS
  shift 2
  echo "  - $what" >&2
  if ! "$@" >>"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "error: '$what' failed; full log: $log" >&2
    return 1
  fi
  echo "    done in $((SECONDS - start)) s" >&2
}

# link_checkout VENV REPO: install this checkout's witcert (editable, no deps) into VENV unless
# the venv already imports a witcert (a venv shared with another clone keeps its own; the test
# command puts this checkout first on PYTHONPATH, so the tests always run this checkout).
link_checkout() {
  local venv="$1" repo="$2" where
  where="$(cd / && env -u PYTHONPATH "$venv/bin/python" -c \
           'import witcert, os; print(os.path.dirname(os.path.dirname(witcert.__file__)))' \
           2>/dev/null)" || where=""
  if [ -z "$where" ]; then
    "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-deps -e "$repo" >&2
    where="$repo"
  fi
  echo "  - witcert in this venv: editable from $where" >&2
}
