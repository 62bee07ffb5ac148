"""Python stored procedures: the decorator, the loader, the transaction context.

A Python procedure is a function in a module under the server's procedures
path, marked with `@procedure`. A deploy script binds it to a name:

    CREATE PROCEDURE vote ON STREAM votes_in AS PYTHON 'voter.procs:vote';

Modules are imported only from the procedures path given to the server at
start-up, by file location; a deploy names a function, it never carries code.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from streamtx.errors import Aborted, InvalidArgument, NotFound


def procedure(fn: Callable[..., Any] | None = None, *, emits: Iterable[str] = ()) -> Any:
    """Marks a function as a streamtx procedure; `emits` lists the streams it emits on.

    The function receives a `Tx` first; an OLTP procedure also receives its
    parameters as keyword arguments. It may return a pyarrow Table (or a list
    of them): the result tables of an OLTP call.
    """

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        f.streamtx_procedure = True  # type: ignore[attr-defined]
        f.emits = tuple(emits)  # type: ignore[attr-defined]
        return f

    return mark(fn) if fn is not None else mark


class Tx(Protocol):
    """What a Python procedure can do inside its transaction."""

    batch: pa.Table | None
    """The atomic batch being processed (None for an OLTP call)."""

    batch_id: int
    """The batch id (the global timestamp of the batch, or of the call)."""

    def sql(self, sql: str, params: dict[str, Any] | None = None) -> pa.Table:
        """Runs one statement with bound `$name` parameters; the input stream's name is the batch."""
        ...

    def emit(self, stream: str, rows: pa.Table) -> None:
        """Appends tuples to an output stream declared in `emits`."""
        ...

    def abort(self, reason: str) -> None:
        """Undoes the transaction; the batch or call is rejected with `reason`."""
        ...


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
        sys.modules[qualified] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[qualified]
            raise InvalidArgument(f"python procedure {ref!r}: importing {path} failed: {e}") from None
        self._modules[module_name] = module
        return module


def abort(reason: str) -> None:
    """Aborts the current transaction from anywhere inside a procedure."""
    raise Aborted(reason)
