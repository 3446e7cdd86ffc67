"""The two text domains of the report, both read from the local Python installation.

- ``docs``: English prose, the Python documentation topics shipped with CPython
  (``pydoc_data.topics``, sorted keys, joined by blank lines).
- ``code``: Python source code, ``inspect.getsource`` of a fixed list of standard-library
  modules (syntax, identifiers and indentation instead of prose).
No download: every run on the same Python version sees the same text.
"""

from __future__ import annotations

import importlib
import inspect

CODE_MODULES = ("argparse", "textwrap", "dataclasses", "json.decoder", "json.encoder",
                "collections", "fractions", "string", "shlex", "heapq")
DOMAINS = ("docs", "code")


def docs_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k].strip() for k in sorted(topics))


def code_text() -> str:
    return "\n\n".join(inspect.getsource(importlib.import_module(m)) for m in CODE_MODULES)


def domain_text(domain: str) -> str:
    if domain == "docs":
        return docs_text()
    if domain == "code":
        return code_text()
    raise ValueError(f"domain {domain!r} not in {DOMAINS}")


def domain_source(domain: str) -> str:
    return {"docs": "pydoc_data.topics (CPython documentation topics, English prose)",
            "code": "inspect.getsource of stdlib modules " + ", ".join(CODE_MODULES)}[domain]
