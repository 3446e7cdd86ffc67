"""``witcert <subcommand>``: one entry point, each subcommand in ``witcert/commands/``.

Subcommand modules are imported lazily (only the one you run), so ``witcert --help`` is
fast and importing witcert never pulls in transformers. User errors (``UsageError``, an
unsupported model) end as one line on stderr with exit status 2 (``witcert.commands.options``).
"""

from __future__ import annotations

import importlib
import sys

from witcert.commands.options import Parser, UsageError

# name -> (module, one-line help). Each module defines add_arguments(parser) and main(args);
# a module may define DESCRIPTION (the longer text of `witcert NAME --help`).
SUBCOMMANDS = {
    "run": ("witcert.commands.run", "generate on a model with live certificates (the main job)"),
    "demo": ("witcert.commands.demo", "certificate table on synthetic keys (no model needed)"),
    "trace": ("witcert.commands.trace", "write an audit trace anyone can recheck"),
    "recheck": ("witcert.commands.recheck", "recompute TV and A-1 from an audit trace in float64"),
    "eval": ("witcert.commands.eval", "evaluations on real text: teacher-forcing, sweep"),
    "calibrate": ("witcert.commands.calibrate", "choose outlier RoPE pairs per (layer, kv head)"),
    "report": ("witcert.commands.report", "benchmark report: quad table, soundness, needles, budget, quality"),
}


def build_parser(only: str | None = None) -> Parser:
    parser = Parser(
        prog="witcert",
        description="Certified KV-cache compression: dithered INT8 KV with a sound\n"
                    "total-variation certificate per decode step, layer and query head.\n"
                    "The math: docs/MATH.md. Help on one subcommand: witcert CMD --help.")
    sub = parser.add_subparsers(dest="command", metavar="<subcommand>")
    for name, (module, help_text) in SUBCOMMANDS.items():
        if only is not None and only != name:
            sub.add_parser(name, help=help_text, description=help_text)
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            p = sub.add_parser(name, help=help_text, description=help_text)
            p.set_defaults(_missing=module)
            continue
        p = sub.add_parser(name, help=help_text,
                           description=getattr(mod, "DESCRIPTION", help_text))
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
    return parser


def _user_error(exc: BaseException) -> bool:
    """True for exceptions that are the user's input, not a bug (printed as one line)."""
    if isinstance(exc, UsageError):
        return True
    hf_model = sys.modules.get("witcert.hf.model")
    return hf_model is not None and isinstance(exc, hf_model.UnsupportedModelError)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        build_parser().print_help()
        return 0
    if argv[0] not in SUBCOMMANDS:
        print(f"witcert: error: unknown subcommand {argv[0]!r} (choose from "
              f"{', '.join(SUBCOMMANDS)}; see: witcert --help)", file=sys.stderr)
        return 2
    parser = build_parser(argv[0])
    args = parser.parse_args(argv)
    if getattr(args, "_missing", None):
        parser.error(f"subcommand {args.command!r} is not available in this build")
    prog = " ".join(["witcert", args.command] + ([args.evaluation]
                                                   if getattr(args, "evaluation", None) else []))
    try:
        return int(args._main(args) or 0)
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - user errors become one line, bugs re-raise
        if not _user_error(exc):
            raise
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
