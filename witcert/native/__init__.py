"""witcert's native CPU path: plain C compiled on first use, loaded with ctypes.

Sources: ``decode.c`` and ``decode.h`` (fused decode), ``extend.c`` and ``extend_math.h`` (fused
extend / chunked prefill), ``write.c`` (encode), ``plan.c`` (the gate's block plan),
``repair.c`` (the gate's repair of a gated decode call), ``probe.c`` (test probes),
``common.h`` (fp16, Philox, dither, dequantization, radii).

Nothing happens at import. The first call of ``lib()`` (or ``available()``) compiles the
sources with the system ``gcc`` into a per-user cache (``$WITCERT_NATIVE_CACHE``, else
``$XDG_CACHE_HOME/witcert/native``, else ``~/.cache/witcert/native``), keyed by a hash of
the sources, the compiler's version and target, and the flags, and written through an
atomic rename so concurrent processes (vLLM starts several) never load a half-written
library. The flags keep IEEE semantics: ``-O3 -ffp-contract=off`` (no FMA contraction),
no ``-ffast-math``, no ``-march=native`` (the AVX2 clone is chosen at load time by the
CPU, ``target_clones``; both clones give the same bits; the extend also has an AVX-512
instantiation chosen at run time, same bits again, ``-DWCX_NO_WIDE`` leaves it out). ``-fno-math-errno`` only stops
libm from setting ``errno`` (``sqrt`` becomes one instruction, same result).

No OpenMP (torch ships its own runtime); the decode parallelizes with pthreads when
asked (``num_threads``). If gcc is missing or the build fails, ``available()`` is False
and ``reason()`` says why; callers fall back to the torch reference path and call
``warn_unavailable()`` (one log line per process).

The launchers live in ``witcert.native.decode`` (fused decode attention with the
certificate), ``witcert.native.extend`` (extend / chunked prefill with a certificate per
new token) and ``witcert.native.write`` (encode new tokens into the pool).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from witcert.settings import ENV_NATIVE_CACHE as ENV_CACHE
SOURCES = ("common.h", "decode.h", "decode.c", "repair.c", "write.c", "probe.c", "extend.c", "extend_math.h", "plan.c")
COMPILE = ("decode.c", "repair.c", "write.c", "probe.c", "extend.c", "plan.c")
CFLAGS = ("-O3", "-std=c11", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared",
          "-pthread")
BUILD_TIMEOUT_S = 300

_HERE = Path(__file__).resolve().parent
_LOG = logging.getLogger("witcert.native")
_LOCK = threading.Lock()
_STATE: dict[tuple, tuple[ctypes.CDLL | None, str | None]] = {}
_WARNED: set[str] = set()


class NativeUnavailable(RuntimeError):
    """The native library could not be built or loaded; the message says why."""


def cache_dir() -> Path:
    """Where built libraries live (``witcert.settings.native_cache_dir``, read at call time)."""
    from witcert.settings import native_cache_dir

    return native_cache_dir()


def _compiler() -> tuple[str, str]:
    """(path of gcc, its identity: version line and target triple)."""
    cc = shutil.which("gcc")
    if cc is None:
        raise NativeUnavailable("gcc not found on PATH")
    ver = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    tgt = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True, timeout=30)
    if ver.returncode or tgt.returncode:
        raise NativeUnavailable(f"{cc} --version failed: {ver.stderr.strip() or tgt.stderr.strip()}")
    return cc, ver.stdout.splitlines()[0].strip() + " / " + tgt.stdout.strip()


def _key(cc_id: str, flags: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (_HERE / name).read_bytes() + b"\0")
    h.update("\0".join((cc_id, platform.machine(), *flags)).encode())
    return h.hexdigest()[:20]


def build(*, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile (if not cached) and return the library path; ``NativeUnavailable`` on failure.

    extra_flags: appended to ``CFLAGS`` (and part of the cache key); tests use
    ``("-DWC_NO_CLONES",)`` to build the portable variant next to the default one."""
    missing = [n for n in SOURCES if not (_HERE / n).is_file()]
    if missing:
        raise NativeUnavailable(f"sources missing from the install: {missing} in {_HERE}")
    cc, cc_id = _compiler()
    flags = CFLAGS + tuple(extra_flags)
    out_dir = cache_dir()
    path = out_dir / f"witcert_native_{_key(cc_id, flags)}.so"
    if path.is_file():
        return path
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".tmp.so", dir=out_dir)
        os.close(fd)
    except OSError as e:
        raise NativeUnavailable(f"cache dir {out_dir} not writable ({e}); set {ENV_CACHE}") from e
    try:
        cmd = [cc, *flags, "-I", str(_HERE), *(str(_HERE / s) for s in COMPILE), "-o", tmp, "-lm"]
        # a first use waits on gcc for a while: say so (stderr, so piped output stays clean)
        print(f"witcert: compiling the native CPU kernels with gcc into {out_dir} (once per "
              "version of the sources)...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise NativeUnavailable(f"gcc timed out after {BUILD_TIMEOUT_S} s") from e
        if proc.returncode:
            raise NativeUnavailable(f"gcc failed ({' '.join(cmd)}): {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, path)  # atomic: a concurrent loader sees no file or the whole file
        print(f"witcert: native CPU kernels built in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr, flush=True)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _load(extra_flags: tuple[str, ...]) -> tuple[ctypes.CDLL | None, str | None]:
    key = tuple(extra_flags)
    with _LOCK:
        if key not in _STATE:
            try:
                _STATE[key] = (ctypes.CDLL(str(build(extra_flags=key))), None)
            except NativeUnavailable as e:
                _STATE[key] = (None, str(e))
            except OSError as e:  # dlopen of a built library failed
                _STATE[key] = (None, f"loading the built library failed: {e}")
        return _STATE[key]


def lib(*, extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The loaded library (built on first call); ``NativeUnavailable`` with the reason."""
    handle, why = _load(tuple(extra_flags))
    if handle is None:
        raise NativeUnavailable(why)
    return handle


def available() -> bool:
    """True when the library builds and loads (builds it on first call)."""
    return _load(())[0] is not None


def reason() -> str | None:
    """Why the native path is unavailable, or None when it is available."""
    return _load(())[1]


def warn_unavailable(why: str) -> None:
    """Log once per process and reason that the torch reference path is used instead."""
    with _LOCK:
        if why in _WARNED:
            return
        _WARNED.add(why)
    _LOG.warning("witcert: native CPU decode unavailable (%s); using the torch reference path "
                 "(several times slower)", why)
