"""A small state procedure (used by tests/sim/test_statetx.py): bounded counters.

Each event adds `delta` to counter `key`, unless that would pass `limit`:
then the event's state transaction aborts and the event is reported rejected.
"""

from __future__ import annotations

import pyarrow as pa

from streamtx.procedure import Event, StateProcedure

EVENTS = pa.schema(
    [
        ("event_id", pa.int64()),
        ("key", pa.int64()),
        ("delta", pa.int64()),
        ("limit", pa.int64()),
        ("mirror", pa.int64()),
    ]
)
"""The events the procedures read (stream `counter_events` in the tests' DDL)."""


def reference_add(counters: dict[int, int], key: int, delta: int, limit: int, mirror: int | None) -> bool:
    """One event of `bounded_add` in plain Python, the tests' sequential reference: adds `delta` to `key`
    (and to `mirror`) unless `key` would pass `limit`, and says whether it did."""
    if counters.get(key, 0) + delta > limit:
        return False
    counters[key] = counters.get(key, 0) + delta
    if mirror is not None:
        counters[mirror] = counters.get(mirror, 0) + delta
    return True


class BoundedAdd(StateProcedure):
    emits = ("counter_results",)

    def pre_process(self, ev: Event) -> None:
        delta, limit = ev["delta"], ev["limit"]
        ev.read_modify(
            "counters",
            ev["key"],
            lambda row: {"key": ev["key"], "n": (row["n"] if row else 0) + delta},
            cond=lambda row: (row["n"] if row else 0) + delta <= limit,
        )
        if ev["mirror"] is not None:  # a second key in the same transaction: all or nothing
            ev.read_modify(
                "counters",
                ev["mirror"],
                lambda row: {"key": ev["mirror"], "n": (row["n"] if row else 0) + delta},
            )

    def post_process(self, ev: Event) -> None:
        ev.emit("counter_results", {"event_id": ev["event_id"], "ok": not ev.rejected})


bounded_add = BoundedAdd()


class CheckedAdd(BoundedAdd):
    """`bounded_add` whose bad events abort their whole batch (tests/sim/test_spans.py).

    An event without a delta fails in pre_process, one with a negative id in
    post_process: either aborts the TE, so the batch is rejected and none of
    its events take effect.
    """

    def pre_process(self, ev: Event) -> None:
        if ev["delta"] is None:
            raise ValueError(f"event {ev['event_id']} has no delta")
        super().pre_process(ev)

    def post_process(self, ev: Event) -> None:
        if ev["event_id"] < 0:
            raise ValueError(f"event {ev['event_id']} has a negative id")
        super().post_process(ev)


checked_add = CheckedAdd()


class AlertingAdd(BoundedAdd):
    """`bounded_add` that also emits each rejected event on `counter_alerts` (tests/sim/test_write_behind.py).

    A SQL procedure on that stream is a barrier in some batches only, so
    intervals mix batches whose rows wait in the working set with batches
    that write everything back first.
    """

    emits = ("counter_results", "counter_alerts")

    def post_process(self, ev: Event) -> None:
        super().post_process(ev)
        if ev.rejected:
            ev.emit("counter_alerts", {"event_id": ev["event_id"]})


alerting_add = AlertingAdd()
