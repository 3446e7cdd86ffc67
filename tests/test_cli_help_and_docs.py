"""The CLI documents itself and the repository stands alone.

- every option of every subcommand has help text that says its default;
- the eval subcommands have descriptions that say what they do;
- ``--method`` help names every method, ``--dither-bits`` explains its name;
- docs/MATH.md has the numbered sections the code cites, and no user-facing text (README,
  docs, --help, ``witcert demo``) cites a file outside the repository or a bare "MATH N".
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path


from witcert.cli import SUBCOMMANDS, build_parser
from witcert.config import BLOCK_METHODS, TOKEN_METHODS, QuantConfig

REPO = Path(__file__).resolve().parents[1]
MATH_SECTIONS = ("1", "2", "2a", "2b", "3", "4", "5", "6", "7")


def _parsers():
    """(name, parser) of every subcommand and nested evaluation."""
    out = []

    def walk(parser, name):
        out.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    walk(p, f"{name} {sub}")

    for name in SUBCOMMANDS:
        top = build_parser(name)
        sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
        walk(sub.choices[name], name)
    return out


def _help(proc_args) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "witcert", *proc_args, "--help"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return " ".join(proc.stdout.split())


def test_every_option_of_every_subcommand_has_help_that_states_its_default():
    missing = []
    for name, parser in _parsers():
        fmt = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help:
                missing.append(f"{name} {action.option_strings or action.dest}: no help")
                continue
            flag = isinstance(action, argparse._StoreTrueAction)
            if action.option_strings and not action.required and not flag:
                if "default" not in fmt._get_help_string(action):
                    missing.append(f"{name} {action.option_strings}: no default shown")
    assert not missing, missing


def test_eval_subcommands_have_descriptions_that_say_what_they_do():
    tf = _help(["eval", "teacher-forcing"])
    assert "Teacher-forcing evaluation" in tf and "violation" in tf
    sweep = _help(["eval", "sweep"])
    assert "outlier-bypass sweep" in sweep and "default 0 4 8 16" in sweep
    assert "method x setting" not in sweep
    assert "outlier-bypass sweep" in _help(["eval"])


def test_eval_sweep_default_budgets_are_the_ones_the_docs_name():
    parser = dict(_parsers())["eval sweep"]
    ms = next(a for a in parser._actions if a.dest == "ms")
    assert ms.default == [0, 4, 8, 16]
    readme = (REPO / "README.md").read_text()
    assert "`--ms` (default 0 4 8 16)" in readme


def test_method_help_names_every_method_and_dither_bits_explains_the_name():
    text = _help(["run"])
    for method in TOKEN_METHODS + BLOCK_METHODS:
        assert method in text, method
    assert "codes stay 8-bit" in text and f"(default {QuantConfig.dither_bits})" in text
    readme = (REPO / "README.md").read_text()
    assert "Naming: `dither8` and `--dither-bits`" in readme


def test_run_help_documents_gate_with_modes_and_the_deprecated_alias():
    text = _help(["run"])
    assert "--gate [{block,head}]" in text and "Bare --gate means block" in text
    assert "deprecated alias" in text


def test_math_md_has_every_section_the_code_cites():
    math = (REPO / "docs" / "MATH.md").read_text()
    heads = re.findall(r"^#{2,3} (\d[ab]?)\. ", math, flags=re.M)
    assert tuple(heads) == ("1", "2", "2a", "2b", "3", "4", "5", "6", "7")
    assert "PROOFS.md) §5" in math
    assert "../shared" not in math and "shared/design" not in math


def _user_facing_texts():
    docs = [p for p in (REPO / "docs").glob("*.md") if p.name not in ("PROOFS.md", "DESIGN.md")]
    files = [REPO / "README.md", REPO / "AUDIT.md", *docs,
             *(REPO / "witcert" / "commands").glob("*.py"), REPO / "witcert" / "cli.py"]
    texts = {str(p.relative_to(REPO)): p.read_text() for p in files}
    for name, parser in _parsers():
        texts[f"witcert {name} --help"] = parser.format_help()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    demo = subprocess.run([sys.executable, "-m", "witcert", "demo", "--tokens", "16",
                           "--queries", "1"], env=env, capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0, demo.stderr
    texts["witcert demo output"] = demo.stdout
    return texts


def test_user_facing_text_cites_only_docs_inside_the_repo():
    bad, cited = [], set()
    for where, text in _user_facing_texts().items():
        for pattern in (r"shared/design", r"\.\./shared", r"(?<![/.])\bMATH \d", r"MATH_NOTES"):
            for m in re.finditer(pattern, text):
                bad.append(f"{where}: {text[max(0, m.start() - 30):m.end() + 10]!r}")
        cited.update(re.findall(r"docs/MATH\.md §(\d[ab]?)", text))
        cited.update(re.findall(r"\(§(\d[ab]?)\)", text))
    assert not bad, bad
    assert cited and cited <= set(MATH_SECTIONS), cited


def test_every_example_in_the_subcommands_help_parses():
    """The ``witcert ...`` lines of each subcommand's help (its examples, which a new user copies)
    name only options that exist, with values they accept: parsed by the CLI's own parser, not run."""
    examples = []
    for name, parser in _parsers():
        text = parser.format_help()
        # an example may continue on the next line after a trailing backslash
        for line in re.sub(r"\\\n\s*", " ", text).splitlines():
            if line.strip().startswith("witcert ") and name.split()[0] in line.split()[:2]:
                examples.append(shlex.split(line, comments=True))
    assert len(examples) >= 3, examples  # at least run's, trace's and calibrate's
    for argv in examples:
        top = build_parser(argv[1])
        try:
            top.parse_args(argv[1:])
        except SystemExit as exc:
            raise AssertionError(f"example does not parse: {' '.join(argv)}") from exc
