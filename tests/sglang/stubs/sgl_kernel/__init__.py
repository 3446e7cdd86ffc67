"""Import-only stand-in for ``sgl_kernel`` (see ../_stub.py): every name raises when called."""
import os as _os
import sys as _sys

_sys.path.insert(0, _os.path.dirname(_os.path.dirname(__file__)))
from _stub import install as _install  # noqa: E402

__version__ = "0.0.0+stand-in"
_install(_sys.modules[__name__], __name__)
