"""Priority lanes for the model: who runs the next forward pass when several requests wait.

A CPU runs one forward pass at a time, so the local engine serialises them; with a plain lock
an editor's completion competes on equal terms with an agent turn or an RL rollout that takes
the lock again after every decode step, and waits behind it for seconds. `PriorityLock` hands
the model to the most urgent waiter instead: lower lane first, first come first served within a
lane. A running step is never interrupted; the wait is at most one step of the request ahead.

    lock = PriorityLock()
    with lock.hold("interactive"):
        ...  # one forward pass
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Lanes, most urgent first: an editor waiting on a keystroke, an agent turn, RL rollouts and
# benchmarks.
LANES = ("interactive", "normal", "background")


class PriorityLock:
    """A lock whose waiters acquire it in lane order (see `LANES`), FIFO within a lane."""

    def __init__(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._waiting: list[tuple[int, int]] = []  # heap of (lane rank, ticket)
        self._tickets = itertools.count()
        self._held = False

    @contextmanager
    def hold(self, lane: str = "normal") -> Iterator[None]:
        """Hold the lock for the `with` block, after every more urgent waiter."""
        ticket = (lane_rank(lane), next(self._tickets))
        with self._condition:
            heapq.heappush(self._waiting, ticket)
            while self._held or self._waiting[0] != ticket:
                self._condition.wait()
            heapq.heappop(self._waiting)
            self._held = True
        try:
            yield
        finally:
            with self._condition:
                self._held = False
                self._condition.notify_all()

    def waiting(self) -> int:
        """How many callers wait for the lock now."""
        with self._condition:
            return len(self._waiting)


def lane_rank(lane: str) -> int:
    try:
        return LANES.index(lane)
    except ValueError:
        raise ValueError(f"unknown priority {lane!r}; expected one of {', '.join(LANES)}") from None
