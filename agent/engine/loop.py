"""One thread that runs every torch operation of an engine: for servers whose requests arrive on
many threads.

torch's CPU backend is OpenMP: every thread that runs a parallel operation gets a team of worker
threads for its lifetime. Once a process has more of those than CPUs, idle workers stop spinning
and each parallel region must wake them, so the small products of a decode step cost 2-3x as
much (`benchmarks/omp_threads.py`). A language server calls the engine from a pool of threads
(completions, next edit, agent tasks), so each of them would grow a team. `EngineLoop` keeps the
model on one thread: callers hand it their request's generator and read the deltas it produces.

Scheduling happens at step boundaries (each `yield` of a request's generator: a decode or verify
step, a prefill chunk). The next step always goes to the most urgent lane (`priority.LANES`), and
within a lane to the request that arrived first, so a request's steps run back to back (as a
session) until a more urgent one arrives: an editor's completion waits for at most one step of an
agent turn. A caller that stops reading (closes its stream) cancels its request.

Batching: a generator may yield a `Step` (a trunk forward pass: batched.Forward) instead of
running it. The loop then runs the most urgent request's step together with the waiting steps of
the other requests in its lane that share its `key` (the same weights), up to BATCH_ROWS token
rows, in one `run_batch`: four editors' completions decode in one pass. A large step (a prefill
chunk) goes first, one at a time, and the small steps ride along with it (batched.py runs each
through the product it would take alone); steps of other lanes never ride along: an agent's
row would make an editor's step slower.

    loop = EngineLoop()
    model = loop.call(LoadedModel.load, "default")  # loaded on the loop's thread too
    for delta in loop.stream(generator, lane="interactive"):
        ...
    loop.close()
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent.engine.priority import LANES, lane_rank
from agent.engine.request import EngineError

T = TypeVar("T")

# What a generator that runs its own work (no `Step`s) yields at a boundary: the loop may switch
# there. The engine's request generators yield `Step`s instead.
STEP = object()
_ENDED = object()  # what `_next` returns when the generator has ended
# The most token rows of small steps (decode, verify) one batch takes; a larger step (a prefill
# chunk) is large: one per batch, the small ones riding along.
BATCH_ROWS = 32


class Step:
    """Work a request's generator hands to the loop to run, alone or batched with other
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


@dataclass(order=True)
class _Task:
    rank: int
    ticket: int
    generator: Generator[Any, None, Any] = field(compare=False)
    out: queue.SimpleQueue = field(compare=False, default_factory=queue.SimpleQueue)
    abandoned: bool = field(compare=False, default=False)
    batchable: bool = field(compare=False, default=True)  # may be stepped to join a batch
    step: Step | None = field(compare=False, default=None)  # yielded, waiting to run


class EngineLoop:
    """A thread that steps every request's generator, most urgent lane first (see above)."""

    def __init__(self, name: str = "flywheel-engine-loop") -> None:
        self._condition = threading.Condition(threading.Lock())
        self._tasks: list[_Task] = []  # kept sorted: (lane rank, arrival)
        self._tickets = itertools.count()
        self._ran = [0.0] * len(LANES)  # when a step of each lane last ended (monotonic)
        self._closed = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    @property
    def on_loop(self) -> bool:
        """Whether the caller is the loop's own thread."""
        return threading.current_thread() is self._thread

    def stream(self, generator: Generator[Any, None, T], lane: str = "normal", batchable=True):
        """Run `generator` on the loop; yields what it yields (but `STEP` and `Step`s), returns
        what it returns, raises what it raises. Closing the returned generator abandons the
        task. Only `batchable` generators are stepped ahead of their turn to join a batch: their
        work between two steps is light."""
        task = _Task(lane_rank(lane), next(self._tickets), generator, batchable=batchable)
        with self._condition:
            if self._closed:
                generator.close()
                raise EngineError("the engine was closed; open a new one")
            self._tasks.append(task)
            self._tasks.sort()
            self._condition.notify()
        return self._relay(task)

    def call(self, fn: Callable[..., T], *args: Any, lane: str = "normal") -> T:
        """`fn(*args)` on the loop's thread (now, if the caller is that thread)."""
        if self.on_loop:
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

    def urgent_within(self, lane: str, window_s: float) -> bool:
        """Whether a lane more urgent than `lane` has a request open now or ran a step in the
        last `window_s` seconds (an editor being typed into: its next completion is near)."""
        rank, now = lane_rank(lane), time.monotonic()
        with self._condition:
            open_ranks = {task.rank for task in self._tasks}
            return any(
                urgent in open_ranks or (self._ran[urgent] and now - self._ran[urgent] < window_s)
                for urgent in range(rank)
            )

    def pending(self) -> int:
        """Requests open on the loop now."""
        with self._condition:
            return len(self._tasks)

    def close(self) -> None:
        """Take no new requests; the thread ends once the open ones have (a request keeps the
        weights it started on, as through a swap; `Request.cancel` ends one sooner)."""
        with self._condition:
            self._closed = True
            self._condition.notify()

    # -- the loop's thread -------------------------------------------------------------

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
        finally:  # finished, or the caller stopped reading: the loop drops it at its next turn
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
                self._ran[head.rank] = time.monotonic()

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
        task.generator.close()  # its cleanup runs here, on the loop's thread

    def _drop(self, task: _Task) -> None:
        with self._condition:
            if task in self._tasks:
                self._tasks.remove(task)
