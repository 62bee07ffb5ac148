"""The collector: survivors frozen between commands, cycles among them freed by a full collection, which
starts when the frozen objects have grown by a quarter, or after FULL_EVERY at the latest."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from streamtx.server.collector import FREEZE_EVERY, FULL_EVERY, FULL_GROWTH, Collector


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture
def clock() -> Iterator[list[float]]:
    threshold = gc.get_threshold()
    gc.unfreeze()  # what another test in this process froze (a benchmark run in-process) is no baseline here
    try:
        yield [0.0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def _settled(now: list[float]) -> Collector:
    """A collector past its first full collection (the process's objects so far are its baseline)."""
    collector = Collector(clock=lambda: now[0])
    now[0] += FREEZE_EVERY
    collector.between()
    assert collector.full_collections == 1
    return collector


def test_a_frozen_cycle_is_freed_by_the_full_collection_due_after_full_every(clock: list[float]) -> None:
    collector = _settled(clock)
    node = _Node()
    gone = weakref.ref(node)
    del node
    gc.freeze()  # as if it had survived until the last freeze
    collector.between()
    assert gone() is not None  # nothing is due yet
    clock[0] += FREEZE_EVERY
    collector.between()
    gc.collect()
    assert gone() is not None  # frozen, and too few to start a full collection: an ordinary one does not see it
    assert collector.full_collections == 1
    clock[0] += FULL_EVERY
    collector.between()
    assert gone() is None
    assert collector.full_collections == 2
    assert gc.get_freeze_count() > 0  # frozen again after the full pass


def test_frozen_objects_grown_by_a_quarter_start_a_full_collection(clock: list[float]) -> None:
    collector = _settled(clock)
    baseline = collector.frozen_after_full
    garbage = [_Node() for _ in range(int(baseline * (FULL_GROWTH - 1)) + 1_000)]
    gone = weakref.ref(garbage[-1])
    del garbage
    gc.freeze()  # the cycles are garbage, but frozen: only a full collection finds them
    clock[0] += FREEZE_EVERY
    collector.between()
    assert gone() is None
    assert collector.full_collections == 2
    assert collector.frozen_after_full < baseline * FULL_GROWTH
