"""Who runs the model's next step when several requests want it: lanes and sessions.

Vocabulary (used by the local engine):
- *step*: one forward pass of a request (a prefill chunk, a decode or verify step), the unit the
  model is handed out in. A running step is never interrupted.
- *lane*: how urgent a request is (`Request.priority`, `request.LANES`, most urgent first). The
  next step goes to the most urgent lane, and within a lane to the request that arrived first.
- *session*: a request from its first step to its last. A request's steps run back to back while
  its session is open: between two of them it holds nothing (it samples, streams the new text),
  and a less urgent request taking the model then would make an editor's completion alternate
  with an agent turn, paying a step of the turn for each of its own. So an editor's completion
  waits for at most one step of an agent turn, and then runs to its end.

Two schedulers keep that policy, one per way of running requests (`Scheduler`):

- `EngineThread` (servers, `EngineConfig.own_thread`): one thread runs every torch operation.
  torch's CPU backend is OpenMP: every thread that runs a parallel operation gets a team of worker
  threads for its lifetime. Once a process has more of those than CPUs, idle workers stop spinning
  and each parallel region must wake them, so the small products of a decode step cost 2-3x as
  much (`benchmarks/omp_threads.py`). A language server calls the engine from a pool of threads
  (completions, next edit, agent tasks), so each of them would grow a team. Callers hand the
  thread their request's generator and read the deltas it produces; the thread steps the generator
  at each `yield` (a step boundary). A caller that stops reading (closes its stream) cancels its
  request. Batching: a generator may yield a `Step` (a trunk forward pass, local/batched.py
  `Forward`) instead of running it. The thread then runs the most urgent request's step together
  with the waiting steps of the other requests in its lane that share its `key` (the same
  weights), up to BATCH_ROWS token rows, in one `run_batch`: four editors' completions decode in
  one pass. A large step (a prefill chunk) goes first, one at a time, and the small steps ride
  along with it (local/batched.py runs each through the product it would take alone); steps of
  other lanes never ride along: an agent's row would make an editor's step slower.
- `PriorityLock` (requests on their callers' threads): a lock around each step whose waiters
  acquire it in lane order. While a session of a more urgent lane is open, a waiter waits for it
  to end, but no longer than `grace_s` after the session's last step (a consumer that stops
  reading a stream cannot stall the other lanes).

    scheduler = EngineThread()  # or PriorityLock()
    model = scheduler.call(LoadedModel.load, "default")  # on the engine's thread, if it has one
    for delta in scheduler.stream(generator, lane="interactive"):
        ...
    scheduler.close()

Both answer `urgent_within`: whether a more urgent lane is active (the local engine then prefills
an agent's prompt in short chunks).
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from agent.engine.request import LANES, EngineError

T = TypeVar("T")

# What a generator that runs its own work (no `Step`s) yields at a boundary: the scheduler may
# switch there. The engine's request generators yield `Step`s instead.
STEP = object()
_ENDED = object()  # what `EngineThread._next` returns when the generator has ended
# The most token rows of small steps (decode, verify) one batch takes; a larger step (a prefill
# chunk) is large: one per batch, the small ones riding along.
BATCH_ROWS = 32


class Step:
    """Work a request's generator hands to the scheduler to run, alone or batched with other
    requests' steps; the generator reads its result when it resumes."""

    @property
    def key(self) -> object:
        """Steps with equal keys may run in one batch."""
        raise NotImplementedError

    @property
    def rows(self) -> int:
        """Token rows it adds to a batch."""
        raise NotImplementedError

    @classmethod
    def run_batch(cls, steps: list[Step]) -> None:
        """Run every step (equal keys) and keep each one's result or error; never raises."""
        raise NotImplementedError


class Scheduler(Protocol):
    """What the local engine asks of either scheduler."""

    def stream(
        self, generator: Generator[Any, None, T], lane: str = "normal", batchable: bool = True
    ) -> Generator[Any, None, T]:
        """Run `generator` as one session of `lane`: yields what it yields (but `STEP` and
        `Step`s, which the scheduler runs), returns what it returns, raises what it raises.
        Closing the returned generator abandons the request."""
        ...

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` where the model runs."""
        ...

    def hold(self, lane: str = "normal") -> AbstractContextManager[None]:
        """Around model work a request does between its steps (a prefix-cache lookup)."""
        ...

    def urgent_within(self, lane: str, window_s: float) -> bool:
        """Whether a lane more urgent than `lane` has a request open now or ran a step in the
        last `window_s` seconds (an editor being typed into: its next completion is near)."""
        ...

    def close(self) -> None: ...


def lane_rank(lane: str) -> int:
    try:
        return LANES.index(lane)
    except ValueError:
        raise ValueError(f"unknown priority {lane!r}; expected one of {', '.join(LANES)}") from None


class LaneActivity:
    """Sessions open per lane and when each lane last ran a step: what the policy reads. Not
    thread-safe; its owner calls it under its own lock."""

    def __init__(self) -> None:
        self.sessions = [0] * len(LANES)  # open sessions per lane
        self.ran = [0.0] * len(LANES)  # when a step of each lane last ended (monotonic)

    def opened(self, rank: int) -> None:
        self.sessions[rank] += 1
        self.ran[rank] = time.monotonic()

    def closed(self, rank: int) -> None:
        self.sessions[rank] -= 1

    def stepped(self, rank: int) -> None:
        self.ran[rank] = time.monotonic()

    def urgent_within(self, rank: int, window_s: float) -> bool:
        """See `Scheduler.urgent_within`."""
        now = time.monotonic()
        return any(
            self.sessions[urgent] or (self.ran[urgent] and now - self.ran[urgent] < window_s)
            for urgent in range(rank)
        )

    def yield_to(self, rank: int, grace_s: float) -> float:
        """Seconds lane `rank` still leaves the model to a more urgent open session between its
        steps (0: none): up to `grace_s` after that session's last step."""
        now, longest = time.monotonic(), 0.0
        for urgent in range(rank):
            if self.sessions[urgent]:
                longest = max(longest, self.ran[urgent] + grace_s - now)
        return longest


# -- requests on the engine's own thread ---------------------------------------------------


@dataclass(order=True)
class _Task:
    rank: int
    ticket: int
    generator: Generator[Any, None, Any] = field(compare=False)
    out: queue.SimpleQueue = field(compare=False, default_factory=queue.SimpleQueue)
    abandoned: bool = field(compare=False, default=False)
    batchable: bool = field(compare=False, default=True)  # may be stepped to join a batch
    step: Step | None = field(compare=False, default=None)  # yielded, waiting to run


class EngineThread:
    """A thread that steps every request's generator, most urgent lane first (see above)."""

    def __init__(self, name: str = "flywheel-engine") -> None:
        self._condition = threading.Condition(threading.Lock())
        self._tasks: list[_Task] = []  # kept sorted: (lane rank, arrival)
        self._tickets = itertools.count()
        self._lanes = LaneActivity()
        self._closed = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    @property
    def on_thread(self) -> bool:
        """Whether the caller is the engine's own thread."""
        return threading.current_thread() is self._thread

    def stream(self, generator: Generator[Any, None, T], lane: str = "normal", batchable=True):
        """See `Scheduler.stream`. Only `batchable` generators are stepped ahead of their turn
        to join a batch: their work between two steps is light."""
        task = _Task(lane_rank(lane), next(self._tickets), generator, batchable=batchable)
        with self._condition:
            if self._closed:
                generator.close()
                raise EngineError("the engine was closed; open a new one")
            self._tasks.append(task)
            self._tasks.sort()
            self._lanes.opened(task.rank)
            self._condition.notify()
        return self._relay(task)

    def call(self, fn: Callable[..., T], *args: Any, lane: str = "normal") -> T:
        """`fn(*args)` on the engine's thread (now, if the caller is that thread)."""
        if self.on_thread:
            return fn(*args)

        def once() -> Generator[Any, None, T]:
            return fn(*args)
            yield  # a generator function that returns at once

        relay = self.stream(once(), lane, batchable=False)
        try:
            while True:
                next(relay)
        except StopIteration as stop:
            return stop.value

    def hold(self, lane: str = "normal") -> AbstractContextManager[None]:
        """Nothing to hold: the generators that call it run on this thread, alone."""
        return nullcontext()

    def urgent_within(self, lane: str, window_s: float) -> bool:
        with self._condition:
            return self._lanes.urgent_within(lane_rank(lane), window_s)

    def pending(self) -> int:
        """Requests open now."""
        with self._condition:
            return len(self._tasks)

    def close(self) -> None:
        """Take no new requests; the thread ends once the open ones have (a request keeps the
        weights it started on, as through a swap; `Request.cancel` ends one sooner)."""
        with self._condition:
            self._closed = True
            self._condition.notify()

    # -- the engine's thread -----------------------------------------------------------

    def _relay(self, task: _Task):
        try:
            while True:
                kind, value = task.out.get()
                if kind == "item":
                    yield value
                elif kind == "return":
                    return value
                else:
                    raise value
        finally:  # finished, or the caller stopped reading: dropped at the thread's next turn
            with self._condition:
                task.abandoned = True
                self._condition.notify()

    def _main(self) -> None:
        while True:
            with self._condition:
                while not self._tasks and not self._closed:
                    self._condition.wait()
                if not self._tasks:  # closed, nothing left
                    return
                tasks = list(self._tasks)
            head = tasks[0]
            if head.abandoned:
                self._abandon(head)
            elif head.step is None:
                self._next(head)
            else:
                batch = self._batch(head, tasks[1:])
                type(batch[0].step).run_batch([task.step for task in batch])
                for task in batch:
                    task.step = None
            with self._condition:
                self._lanes.stepped(head.rank)

    def _batch(self, head: _Task, others: list[_Task]) -> list[_Task]:
        """What runs next in `head`'s lane: the first large step (a prefill chunk) if any, so
        that new requests join the decoding ones soon, and with it (or else) the small steps
        with its key, first come first, up to BATCH_ROWS rows in all."""
        waiting = [head]
        for task in others:
            if task.rank != head.rank:  # sorted by lane: the rest are less urgent
                break
            if task.abandoned or not task.batchable:
                continue
            if task.step is None:
                self._advance(task)  # its own work up to its next step
            if task.step is not None:
                waiting.append(task)
        large = [task for task in waiting if task.step.rows > BATCH_ROWS]
        first = large[0] if large else head
        batch, rows = [first] if large else [], 0
        for task in waiting:
            step = task.step
            small = step.rows <= BATCH_ROWS and step.key == first.step.key
            if small and rows + step.rows <= BATCH_ROWS:
                batch.append(task)
                rows += step.rows
        return batch

    def _advance(self, task: _Task) -> None:
        """Run the task's generator up to its next `Step` or its end."""
        while task.step is None and self._next(task) is not _ENDED:
            pass

    def _next(self, task: _Task) -> object:
        """One item of the task's generator: relayed, kept (a `Step`), or its end."""
        try:
            item = next(task.generator)
        except StopIteration as stop:
            self._drop(task)
            task.out.put(("return", stop.value))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
            self._drop(task)
            task.out.put(("raise", exc))
        else:
            if isinstance(item, Step):
                task.step = item
            elif item is not STEP:
                task.out.put(("item", item))
            return item
        return _ENDED

    def _abandon(self, task: _Task) -> None:
        self._drop(task)
        task.generator.close()  # its cleanup runs here, on the engine's thread

    def _drop(self, task: _Task) -> None:
        with self._condition:
            if task in self._tasks:
                self._tasks.remove(task)
                self._lanes.closed(task.rank)


# -- requests on their callers' threads ----------------------------------------------------


class PriorityLock:
    """A lock whose waiters acquire it in lane order, FIFO within a lane (see above)."""

    def __init__(self, grace_s: float = 0.05) -> None:
        self.grace_s = grace_s
        self._condition = threading.Condition(threading.Lock())
        self._waiting: list[tuple[int, int]] = []  # heap of (lane rank, ticket)
        self._tickets = itertools.count()
        self._held = False
        self._lanes = LaneActivity()

    def stream(self, generator: Generator[Any, None, T], lane: str = "normal", batchable=True):
        """See `Scheduler.stream`: here, on the caller's thread, each `Step` alone under
        `hold(lane)` (`batchable` has no effect)."""
        with self.session(lane):
            try:
                while True:
                    item = next(generator)
                    if isinstance(item, Step):
                        with self.hold(lane):
                            type(item).run_batch([item])
                    elif item is not STEP:
                        yield item
            except StopIteration as stop:
                return stop.value
            finally:
                generator.close()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)`, here: the model runs on its callers' threads."""
        return fn(*args)

    @contextmanager
    def session(self, lane: str = "normal") -> Iterator[None]:
        """One request of `lane`: less urgent lanes wait between its steps (see above)."""
        rank = lane_rank(lane)
        with self._condition:
            self._lanes.opened(rank)
        try:
            yield
        finally:
            with self._condition:
                self._lanes.closed(rank)
                self._condition.notify_all()

    @contextmanager
    def hold(self, lane: str = "normal") -> Iterator[None]:
        """Hold the lock for the `with` block, after every more urgent waiter and session."""
        ticket = (lane_rank(lane), next(self._tickets))
        with self._condition:
            heapq.heappush(self._waiting, ticket)
            while True:
                if not self._held and self._waiting[0] == ticket:
                    yielding = self._lanes.yield_to(ticket[0], self.grace_s)
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
                self._lanes.stepped(ticket[0])
                self._condition.notify_all()

    def urgent_within(self, lane: str, window_s: float) -> bool:
        with self._condition:
            return self._lanes.urgent_within(lane_rank(lane), window_s)

    def waiting(self) -> int:
        """How many callers wait for the lock now."""
        with self._condition:
            return len(self._waiting)

    def close(self) -> None:
        """Nothing to end: the requests run on their callers' threads."""
