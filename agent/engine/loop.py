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

# What a request's generator yields at a step boundary that produced no output (a prefill
# chunk, or a step whose tokens do not complete a character yet): the loop may switch there.
STEP = object()


@dataclass(order=True)
class _Task:
    rank: int
    ticket: int
    generator: Generator[Any, None, Any] = field(compare=False)
    out: queue.SimpleQueue = field(compare=False, default_factory=queue.SimpleQueue)
    abandoned: bool = field(compare=False, default=False)


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

    def stream(self, generator: Generator[Any, None, T], lane: str = "normal"):
        """Run `generator` on the loop; yields what it yields (but `STEP`), returns what it
        returns, raises what it raises. Closing the returned generator abandons the task."""
        task = _Task(lane_rank(lane), next(self._tickets), generator)
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

        relay = self.stream(once(), lane)
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
                task = self._tasks[0]
                if task.abandoned:
                    self._tasks.pop(0)
            if task.abandoned:
                task.generator.close()  # its cleanup runs here, on the loop's thread
                continue
            try:
                item = next(task.generator)
            except StopIteration as stop:
                self._drop(task)
                task.out.put(("return", stop.value))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
                self._drop(task)
                task.out.put(("raise", exc))
            else:
                if item is not STEP:
                    task.out.put(("item", item))
            with self._condition:
                self._ran[task.rank] = time.monotonic()

    def _drop(self, task: _Task) -> None:
        with self._condition:
            if task in self._tasks:
                self._tasks.remove(task)
