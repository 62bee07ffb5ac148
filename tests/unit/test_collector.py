"""The collector: survivors frozen between commands, cycles among them still freed by the full pass."""

from __future__ import annotations

import gc
import weakref

from streamtx.server.collector import FREEZE_EVERY, FULL_EVERY, Collector


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_survivors_are_frozen_and_a_frozen_cycle_is_freed_by_the_full_collection() -> None:
    now = [0.0]
    threshold = gc.get_threshold()
    try:
        collector = Collector(clock=lambda: now[0])
        node = _Node()
        gone = weakref.ref(node)
        del node
        gc.freeze()  # as if it had survived until the last freeze
        collector.between()
        assert gone() is not None  # nothing is due yet
        now[0] += FREEZE_EVERY
        collector.between()
        assert gc.get_freeze_count() > 0
        gc.collect()
        assert gone() is not None  # frozen: an ordinary full collection does not see it
        now[0] += FULL_EVERY
        collector.between()
        assert gone() is None
        assert collector.full_collections == 1
        assert gc.get_freeze_count() > 0  # frozen again after the full pass
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
