"""pyarrow's probe for pandas, left out of server processes until user code may need it.

The first `pa.array` of a Python list imports pandas (0.6-0.9 s of CPU on a 2-core
machine, a third of a process's start-up) only to ask whether the list is a pandas
object. The server's own code never hands pyarrow a pandas object, so the front and
every worker let that probe find no pandas (`skip`). Procedure modules may (rows
emitted as a dict of pandas Series): `restore`, called before the first one is
imported, makes pyarrow recognize pandas objects again, exactly as in any process.
"""

from __future__ import annotations

import sys

import pyarrow as pa


class _Hidden:
    @staticmethod
    def find_spec(name: str, path: object = None, target: object = None) -> None:
        if name == "pandas":
            raise ImportError("pandas is not probed by the server's own code")


_skipped = False


def skip() -> None:
    """pyarrow's probe runs now and finds no pandas (pandas stays importable)."""
    global _skipped
    if "pandas" in sys.modules:
        return  # imported already: nothing to save
    sys.meta_path.insert(0, _Hidden)  # type: ignore[arg-type]
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(_Hidden)  # type: ignore[arg-type]
    _skipped = True


def restore() -> None:
    """pyarrow converts pandas objects again (importing pandas), if `skip` left them out."""
    global _skipped
    if _skipped:
        _skipped = False
        pa.lib._pandas_api.is_array_like(None)  # its check imports pandas and turns the integration on
