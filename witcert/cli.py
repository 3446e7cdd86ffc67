"""``witcert <subcommand>``: one entry point, each subcommand in ``witcert/commands/``.

Subcommand modules are imported lazily (only the one you run), so ``witcert --help`` is
fast and importing witcert never pulls in transformers.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Each module defines add_arguments(parser) and main(args).
SUBCOMMANDS = {
    "run": ("witcert.commands.run", "generate on a model with live certificates (the main job)"),
    "demo": ("witcert.commands.demo", "certificate table on synthetic keys (no model needed)"),
    "trace": ("witcert.commands.trace", "write an audit trace anyone can recheck"),
    "recheck": ("witcert.commands.recheck", "recompute TV and A-1 from an audit trace in float64"),
    "eval": ("witcert.commands.eval", "evaluations: teacher-forcing, sweep"),
    "calibrate": ("witcert.commands.calibrate", "choose outlier RoPE pairs per (layer, kv head)"),
    "report": ("witcert.commands.report", "benchmark report: quad table, soundness, needles, budget, quality"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="witcert",
        description="Certified KV-cache compression: dithered INT8 KV with a sound "
                    "total-variation certificate per decode step, layer and query head.")
    sub = parser.add_subparsers(dest="command", metavar="<subcommand>")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or only == name:
            try:
                mod = importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name != module:
                    raise
                p.set_defaults(_missing=module)
                continue
            mod.add_arguments(p)
            p.set_defaults(_main=mod.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    parser = build_parser(only)
    if only is None:
        parser.print_help()
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    args = parser.parse_args(argv)
    if getattr(args, "_missing", None):
        parser.error(f"subcommand {args.command!r} is not available in this build")
    return int(args._main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
