"""Import stand-ins for the lake's libraries (deltalake, duckdb, polars) on a lent GPU machine.

The device image has torch and transformers but not these, and nothing can be fetched there (their wheels, ~100 MB,
are over what one call may carry). ``bench/bench_train.py`` and ``bench/bench_decode.py`` never open a lake, but
``import trajlake`` imports its lake layer, so with ``PYTHONPATH=bench/device`` a module that cannot be found
otherwise is replaced by a stand-in whose every attribute is an empty class. The finder comes last on
``sys.meta_path``: an installed library always wins. Any use of a stand-in beyond import fails at once (calling
a stand-in class yields an object without the library's methods), so a benchmark that touched the lake would
crash rather than measure something else. ``TRAJLAKE_FORCE_LAKE_STUBS=1`` puts the finder first (to check here that
the benchmarks import and run with the stand-ins).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

STUBBED = ("deltalake", "duckdb", "polars")


class _StubMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubMeta(name, (Exception,), {})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _StubMeta(name, (Exception,), {})
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in STUBBED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        print(f"[lake stand-in] {module.__name__}: not installed; imported as a stand-in (bench/device)",
              file=sys.stderr)


if os.environ.get("TRAJLAKE_FORCE_LAKE_STUBS") == "1":
    for _name in [m for m in sys.modules if m.split(".")[0] in STUBBED]:
        del sys.modules[_name]
    sys.meta_path.insert(0, _Finder())
else:
    sys.meta_path.append(_Finder())
