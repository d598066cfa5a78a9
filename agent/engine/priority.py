"""Priority lanes for the model: who runs the next forward pass when several requests wait.

A CPU runs one forward pass at a time, so the local engine serialises them; with a plain lock
an editor's completion competes on equal terms with an agent turn or an RL rollout that takes
the lock again after every decode step, and waits behind it for seconds. `PriorityLock` hands
the model to the most urgent waiter instead: lower lane first, first come first served within a
lane. A running step is never interrupted; the wait is at most one step of the request ahead.

Between two of its steps a request holds nothing (it samples, streams the new text), and a less
urgent waiter would take the model then: a completion would alternate with the agent turn,
paying a step of it for each of its own. So a request runs as a *session*: while a session of a
more urgent lane is open, a waiter waits for it to end, but no longer than `grace_s` after the
session's last step (a consumer that stops reading a stream cannot stall the other lanes).

    lock = PriorityLock()
    with lock.session("interactive"):  # one request
        with lock.hold("interactive"):
            ...  # one forward pass
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# Lanes, most urgent first: an editor waiting on a keystroke (inline completion); an editor's
# work done ahead of need (a next edit: it must never hold up the ghost text of the next
# keystroke, which within one lane it would, first come first served); an agent turn; RL
# rollouts and benchmarks.
LANES = ("interactive", "prefetch", "normal", "background")


class PriorityLock:
    """A lock whose waiters acquire it in lane order (see `LANES`), FIFO within a lane."""

    def __init__(self, grace_s: float = 0.05) -> None:
        self.grace_s = grace_s
        self._condition = threading.Condition(threading.Lock())
        self._waiting: list[tuple[int, int]] = []  # heap of (lane rank, ticket)
        self._tickets = itertools.count()
        self._held = False
        self._sessions = [0] * len(LANES)  # open sessions per lane
        self._released = [0.0] * len(LANES)  # when a hold of each lane last ended (monotonic)

    @contextmanager
    def session(self, lane: str = "normal") -> Iterator[None]:
        """One request of `lane`: less urgent lanes wait between its steps (see above)."""
        rank = lane_rank(lane)
        with self._condition:
            self._sessions[rank] += 1
            self._released[rank] = time.monotonic()
        try:
            yield
        finally:
            with self._condition:
                self._sessions[rank] -= 1
                self._condition.notify_all()

    @contextmanager
    def hold(self, lane: str = "normal") -> Iterator[None]:
        """Hold the lock for the `with` block, after every more urgent waiter and session."""
        ticket = (lane_rank(lane), next(self._tickets))
        with self._condition:
            heapq.heappush(self._waiting, ticket)
            while True:
                if not self._held and self._waiting[0] == ticket:
                    yielding = self._yield_to(ticket[0])
                    if yielding <= 0:
                        break
                    self._condition.wait(yielding)
                else:
                    self._condition.wait()
            heapq.heappop(self._waiting)
            self._held = True
        try:
            yield
        finally:
            with self._condition:
                self._held = False
                self._released[ticket[0]] = time.monotonic()
                self._condition.notify_all()

    def _yield_to(self, rank: int) -> float:
        """Seconds a waiter of lane `rank` still leaves the model to a more urgent open session
        between its steps (0: none)."""
        now, longest = time.monotonic(), 0.0
        for urgent in range(rank):
            if self._sessions[urgent]:
                longest = max(longest, self._released[urgent] + self.grace_s - now)
        return longest

    def urgent_within(self, lane: str, window_s: float) -> bool:
        """Whether a lane more urgent than `lane` has a request open now or held the model in
        the last `window_s` seconds: an editor someone is typing into, whose next completion
        will wait for whatever step of `lane` runs then."""
        rank, now = lane_rank(lane), time.monotonic()
        with self._condition:
            return any(
                self._sessions[urgent]
                or (self._released[urgent] and now - self._released[urgent] < window_s)
                for urgent in range(rank)
            )

    def waiting(self) -> int:
        """How many callers wait for the lock now."""
        with self._condition:
            return len(self._waiting)


def lane_rank(lane: str) -> int:
    try:
        return LANES.index(lane)
    except ValueError:
        raise ValueError(f"unknown priority {lane!r}; expected one of {', '.join(LANES)}") from None
