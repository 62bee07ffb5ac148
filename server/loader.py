"""The procedure loader: 'module:function' names to Python procedures under the procedures path.

Modules are imported only from the procedures path given to the server at
start-up, by file location; a deploy names a function, it never carries code.
What may be bound is what streamtx/procedure.py marks: a `@procedure`
function or a `StateProcedure` instance.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamtx.errors import InvalidArgument, NotFound
from streamtx.server import pandas_probe


class ProcedureLoader:
    """Resolves 'module:function' names to functions under one directory."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self._modules: dict[str, Any] = {}

    def resolve(self, ref: str) -> Callable[..., Any]:
        module_name, sep, func_name = ref.partition(":")
        if not sep or not module_name or not func_name:
            raise InvalidArgument(f"python procedure {ref!r}: expected 'module:function'")
        parts = module_name.split(".")
        if any(not p.isidentifier() for p in parts):
            raise InvalidArgument(f"python procedure {ref!r}: {module_name!r} is not a module name")
        module = self._modules.get(module_name)
        if module is None:
            module = self._import(module_name, parts, ref)
        fn = getattr(module, func_name, None)
        if fn is None or not getattr(fn, "streamtx_procedure", False):
            raise NotFound(f"python procedure {ref!r}: {module_name} has no function {func_name!r} marked @procedure")
        return fn

    def _import(self, module_name: str, parts: list[str], ref: str) -> Any:
        path = self.root.joinpath(*parts).with_suffix(".py")
        if not path.is_file():
            raise NotFound(f"python procedure {ref!r}: no module {module_name} under the procedures path {self.root}")
        qualified = f"streamtx_procedures.{module_name}"
        spec = importlib.util.spec_from_file_location(qualified, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        pandas_probe.restore()  # user code: pyarrow must know pandas objects again
        sys.modules[qualified] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[qualified]
            raise InvalidArgument(f"python procedure {ref!r}: importing {path} failed: {e}") from None
        self._modules[module_name] = module
        return module
