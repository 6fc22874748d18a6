"""The fast appends (``_fastpath.c``): ``Appender``, the base of ``Log``, and
``StreamBase``, the base of its streams.

They are compiled into the cffi module ``storage_c._comet`` with the core
(``_build.py``), so that they call the core directly and the process holds
one copy of it.  Python finds an extension module's init function by the
module's name, so this one is loaded from that shared object under its own
name (PEP 489: several modules in one library).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from . import _comet

NAME = "storage_c._fastpath"


def _load() -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(NAME, _comet.__file__)
    spec = importlib.util.spec_from_loader(NAME, loader, origin=_comet.__file__)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[NAME] = module
    return module


if TYPE_CHECKING:
    from ._fastpath import Appender, StreamBase
else:
    _module = _load()
    Appender, StreamBase = _module.Appender, _module.StreamBase

__all__ = ["Appender", "StreamBase"]
