"""Import-only stand-ins for native packages SGLang imports by name at import time on CPU.

SGLang 0.5.23 imports names from ``sgl_kernel`` (CUDA/CPU kernels) and ``torchvision``
(multimodal paths) at module import, even when the code path that uses them never runs.
Neither can be installed here: ``sgl_kernel`` has no CPU wheel for this torch and
``torchvision`` pulls a CUDA torch. These stand-ins make ``import`` succeed and nothing
else: every attribute is a stand-in that raises ``RuntimeError`` when called, so a test
that reaches a native kernel fails loudly instead of computing something. They are put
on ``sys.path`` only by tests/sglang (conftest and the server test's PYTHONPATH).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _Unavailable:
    """A name of a package that is not installed; calling or instantiating it raises."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._qualname} is an import-only stand-in (tests/sglang/stubs); "
                           "the tested path must not call it")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self._qualname}.{name}")

    def __repr__(self) -> str:
        return f"<stand-in {self._qualname}>"


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self.__name__}.{name}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StubModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


def install(module: types.ModuleType, root: str) -> None:
    """Turn ``module`` (the package ``root``) into a stand-in whose submodules are too."""
    module.__class__ = _StubModule
    sys.meta_path.append(_Finder(root))
