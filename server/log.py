"""The server's log: one line on stderr per notable event, as text or as JSON (`--log-format`).

Text lines read `streamtx: <message>` (a partition's: `streamtx: partition
<i>: <message>`). JSON lines are one object each: `time` (UTC, ISO 8601),
`level` (`info`, `warning`, `error`), `event` (a stable name an operator can
filter on: `start`, `recovery`, `restart`, `shutdown`, ...), `message`, and
`partition` plus the event's own fields where it has them. The front and
every worker write to the same stderr; each line is written whole.
"""

from __future__ import annotations

import datetime
import json
import sys
from typing import Any

from streamtx.server.config import LOG_FORMATS

_format = "text"


def configure(log_format: str) -> None:
    """Chooses the format for this process (the front and each worker call it with the server's setting)."""
    global _format
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r}: must be one of {', '.join(LOG_FORMATS)}")
    _format = log_format


def event(
    name: str,
    message: str,
    *,
    level: str = "info",
    partition: int | None = None,
    detail: str | None = None,
    **fields: Any,
) -> None:
    """Writes one line for the event `name`; `message` is what a person reads.

    `detail` (a traceback) goes before the line as text, into the object as JSON.
    """
    if _format == "json":
        record: dict[str, Any] = {
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds"),
            "level": level,
            "event": name,
            "message": message,
        }
        if partition is not None:
            record["partition"] = partition
        if detail is not None:
            record["detail"] = detail
        record.update(fields)
        line = json.dumps(record, default=str)
    else:
        line = f"streamtx: {'' if partition is None else f'partition {partition}: '}{message}"
        if detail is not None:
            line = detail.rstrip("\n") + "\n" + line
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
