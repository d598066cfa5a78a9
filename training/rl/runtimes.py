"""Where rollout workers run: threads in this process, processes on this machine, or Ray actors.

Every runtime runs the same `RolloutWorker` (one local engine + the environment) and offers the
same four calls to the loop in run.py:

    submit(job)        queue a job; it goes to the next idle worker
    poll(timeout)      the `GroupResult`s that arrived (waits up to `timeout` for the first one)
    push(path)         new weights for every worker, applied before its next job
    drop_waiting()     take back the jobs no worker has started (a run that stops early)
    close()

- `inline`: `workers` threads share ONE engine in the trainer's process; `push` is the engine's
  in-process `swap` (requests already running finish on the old weights).
- `processes`: one spawned process per worker, each with its own engine, talking over
  multiprocessing queues; `push` sends the checkpoint path, the worker swaps between jobs.
- `ray`: one Ray actor per worker (`ray` is an optional extra, imported only here, only when
  chosen); `push` is an actor call ordered before the worker's next job.

Failures (processes and ray): a worker that dies is restarted with a log line naming it and its
exit; a job that runs past `rollout_timeout_s` gets its worker killed and restarted. The job in
flight comes back as a `GroupResult` with `error` set (never silently lost). More than
`max_worker_restarts` restarts stop the run with the reason. An exception inside a rollout never
kills a worker: it comes back as that job's error.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from training.rl.trajectory import GroupResult, Job


class RuntimeFailure(RuntimeError):
    """The rollout workers cannot continue (too many restarts, ray missing, ...)."""


class RolloutWorker:
    """One engine and one environment; what every runtime runs."""

    def __init__(
        self,
        env,
        model_path: str,
        device: str,
        worker_id: int,
        threads: int = 0,
        dtype: str = "float32",
    ):
        import torch

        from agent.engine import EngineConfig, open_engine

        if threads:
            torch.set_num_threads(threads)
        self.env = env
        self.id = worker_id
        # on its own thread: a group's samples (and the inline runtime's workers) call at once,
        # and the engine batches their steps
        config = EngineConfig(
            model=model_path, backend="local", device=device, dtype=dtype, own_thread=True
        )
        self.engine = open_engine(config)
        self._tokenizer = None
        self._model_path = model_path

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._model_path)
        return self._tokenizer

    def swap(self, path: str) -> str:
        return self.engine.swap(path)

    def run(self, job: Job) -> GroupResult:
        try:
            trajectories = self.env.rollout(
                self.engine, self.tokenizer, job.task, job.group_size, job.seed
            )
        except Exception as exc:  # a crashed rollout is reported, the worker lives on
            return GroupResult(job, [], error=f"{type(exc).__name__}: {exc}", worker=self.id)
        return GroupResult(job, trajectories, worker=self.id)

    def ping(self) -> int:
        return self.id


# --- inline: threads, one engine ------------------------------------------------------------


class InlineRuntime:
    def __init__(self, env, model_path: str, recipe, log: Callable[[str], None]) -> None:
        self.worker = RolloutWorker(env, model_path, recipe.device, 0, dtype=recipe.dtype)
        self.jobs: queue.Queue = queue.Queue()
        self.results: queue.Queue = queue.Queue()
        self.threads = [
            threading.Thread(target=self._loop, name=f"rollout-{i}", daemon=True)
            for i in range(recipe.workers)
        ]
        for thread in self.threads:
            thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            self.results.put(self.worker.run(job))

    def submit(self, job: Job) -> None:
        self.jobs.put(job)

    def drop_waiting(self) -> list[Job]:
        dropped = []
        with contextlib.suppress(queue.Empty):
            while True:
                dropped.append(self.jobs.get_nowait())
        return dropped

    def poll(self, timeout: float) -> list[GroupResult]:
        out = []
        try:
            out.append(self.results.get(timeout=timeout))
        except queue.Empty:
            return out
        while True:
            try:
                out.append(self.results.get_nowait())
            except queue.Empty:
                return out

    def push(self, path: str) -> None:
        self.worker.swap(path)

    def close(self) -> None:
        for _ in self.threads:
            self.jobs.put(None)
        for thread in self.threads:
            thread.join(timeout=30)
        self.worker.engine.close()


# --- processes and ray: slots with restarts ---------------------------------------------------


@dataclass
class _Slot:
    index: int
    handle: Any = None  # Process or Ray actor
    inbox: Any = None  # processes: the worker's queue
    job: Job | None = None
    since: float = 0.0  # when the current job was handed over (or the worker became ready)
    ready: bool = False
    future: Any = None  # ray: the running call
    extra: dict = field(default_factory=dict)


class _Restarts:
    def __init__(self, limit: int, log: Callable[[str], None]) -> None:
        self.limit = limit
        self.count = 0
        self.log = log

    def note(self, what: str) -> None:
        self.count += 1
        self.log(f"rollout {what}; restarting it ({self.count} of {self.limit} restarts allowed)")
        if self.count > self.limit:
            raise RuntimeFailure(
                f"rollout workers were restarted {self.count} times (max_worker_restarts="
                f"{self.limit}); the last: {what}. Check the log above for the cause"
            )


class _SlotRuntime:
    """What processes and Ray share: a queue of pending jobs handed to idle slots, and a failed or
    timed-out slot answered with an error result, killed and restarted. Subclasses say how a
    worker starts (`_start`), gets a job (`_hand`) and dies (`_kill`)."""

    def __init__(self, env, model_path: str, recipe, log: Callable[[str], None]) -> None:
        self.env = env
        self.recipe = recipe
        self.weights = model_path  # restarted workers start from the newest pushed weights
        self.log = log
        self.restarts = _Restarts(recipe.max_worker_restarts, log)
        self.pending: deque[Job] = deque()
        self.slots = [_Slot(i) for i in range(recipe.workers)]

    def _start(self, slot: _Slot) -> None:
        raise NotImplementedError

    def _hand(self, slot: _Slot) -> None:
        raise NotImplementedError

    def _kill(self, slot: _Slot) -> None:
        raise NotImplementedError

    def _dispatch(self) -> None:
        for slot in self.slots:
            if slot.job is None and self.pending:
                slot.job = self.pending.popleft()
                slot.since = time.monotonic()
                self._hand(slot)

    def submit(self, job: Job) -> None:
        self.pending.append(job)
        self._dispatch()

    def drop_waiting(self) -> list[Job]:
        dropped = list(self.pending)
        self.pending.clear()
        return dropped

    def _fail(self, slot: _Slot, what: str, out: list[GroupResult]) -> None:
        if slot.job is not None:
            out.append(GroupResult(slot.job, [], error=what, worker=slot.index))
        with contextlib.suppress(Exception):
            self._kill(slot)
        self.restarts.note(f"worker {slot.index}: {what}")
        self._start(slot)

    def _check_timeouts(self, out: list[GroupResult]) -> None:
        now = time.monotonic()
        limit = self.recipe.rollout_timeout_s
        for slot in self.slots:
            if slot.job is not None and slot.ready and now - slot.since > limit:
                self._fail(slot, f"rollout timed out after {limit:.0f} s", out)


def _process_main(worker_id, env, model_path, device, threads, dtype, inbox, outbox) -> None:
    worker = RolloutWorker(env, model_path, device, worker_id, threads, dtype)
    outbox.put(("ready", worker_id, None))
    while True:
        msg = inbox.get()
        if msg is None:
            return
        kind, payload = msg
        if kind == "swap":
            worker.swap(payload)
        elif kind == "job":
            outbox.put(("result", worker_id, worker.run(payload)))


class ProcessRuntime(_SlotRuntime):
    def __init__(self, env, model_path: str, recipe, log: Callable[[str], None]) -> None:
        import multiprocessing

        super().__init__(env, model_path, recipe, log)
        self.ctx = multiprocessing.get_context("spawn")
        self.outbox = self.ctx.Queue()
        for slot in self.slots:
            self._start(slot)

    def _start(self, slot: _Slot) -> None:
        slot.inbox = self.ctx.Queue()
        recipe = self.recipe
        args = (
            slot.index,
            self.env,
            self.weights,
            recipe.device,
            recipe.worker_threads,
            recipe.dtype,
        )
        slot.handle = self.ctx.Process(
            target=_process_main,
            args=(*args, slot.inbox, self.outbox),
            name=f"flywheel-rollout-{slot.index}",
            daemon=True,
        )
        slot.handle.start()
        slot.job, slot.ready = None, False

    def _hand(self, slot: _Slot) -> None:
        slot.inbox.put(("job", slot.job))

    def _kill(self, slot: _Slot) -> None:
        slot.handle.kill()
        slot.handle.join(timeout=10)

    def _health(self, out: list[GroupResult]) -> None:
        for slot in self.slots:
            if not slot.handle.is_alive():
                self._fail(slot, f"worker died (exit code {slot.handle.exitcode})", out)
        self._check_timeouts(out)
        self._dispatch()

    def poll(self, timeout: float) -> list[GroupResult]:
        out: list[GroupResult] = []
        deadline = time.monotonic() + timeout
        while True:
            wait = max(0.0, min(deadline - time.monotonic(), 1.0))
            try:
                kind, wid, payload = (
                    self.outbox.get(timeout=wait) if wait else self.outbox.get_nowait()
                )
            except queue.Empty:
                kind = None
            if kind is not None:
                slot = self.slots[wid]
                if kind == "ready":
                    slot.ready = True
                    slot.since = time.monotonic()
                elif slot.job is not None and payload.job.id == slot.job.id:
                    slot.job = None
                    out.append(payload)
                self._dispatch()
                continue  # drain whatever else is there before returning
            self._health(out)
            if out or time.monotonic() >= deadline:
                return out

    def push(self, path: str) -> None:
        self.weights = path
        for slot in self.slots:
            slot.inbox.put(("swap", path))

    def close(self) -> None:
        for slot in self.slots:
            with contextlib.suppress(Exception):
                slot.inbox.put(None)
        for slot in self.slots:
            slot.handle.join(timeout=10)
            if slot.handle.is_alive():
                slot.handle.kill()
                slot.handle.join(timeout=5)


class RayRuntime(_SlotRuntime):
    def __init__(self, env, model_path: str, recipe, log: Callable[[str], None]) -> None:
        try:
            import ray
        except ImportError:
            raise RuntimeFailure(
                "runtime 'ray' needs Ray: pip install 'flywheel[ray]' (or set runtime = "
                '"processes" in the recipe)'
            ) from None
        super().__init__(env, model_path, recipe, log)
        self.ray = ray
        self.owns = not ray.is_initialized()
        if self.owns:
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        self.actor_cls = ray.remote(num_cpus=0)(RolloutWorker)
        for slot in self.slots:
            self._start(slot)

    def _start(self, slot: _Slot) -> None:
        slot.handle = self.actor_cls.remote(
            self.env,
            self.weights,
            self.recipe.device,
            slot.index,
            self.recipe.worker_threads,
            self.recipe.dtype,
        )
        slot.job, slot.future, slot.ready = None, None, True

    def _hand(self, slot: _Slot) -> None:
        slot.future = slot.handle.run.remote(slot.job)

    def _kill(self, slot: _Slot) -> None:
        self.ray.kill(slot.handle)

    def poll(self, timeout: float) -> list[GroupResult]:
        out: list[GroupResult] = []
        running = {slot.future: slot for slot in self.slots if slot.future is not None}
        if running:
            ready, rest = self.ray.wait(list(running), num_returns=1, timeout=timeout)
            if ready and rest:  # collect whatever else has finished too
                ready += self.ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            for future in ready:
                slot = running[future]
                try:
                    out.append(self.ray.get(future))
                    slot.job, slot.future = None, None
                except self.ray.exceptions.RayActorError as exc:
                    self._fail(slot, f"worker died ({type(exc).__name__})", out)
                except self.ray.exceptions.RayTaskError as exc:
                    out.append(GroupResult(slot.job, [], error=str(exc)[:500], worker=slot.index))
                    slot.job, slot.future = None, None
        self._check_timeouts(out)
        self._dispatch()
        return out

    def push(self, path: str) -> None:
        self.weights = path
        for slot in self.slots:
            slot.handle.swap.remote(path)

    def close(self) -> None:
        for slot in self.slots:
            with contextlib.suppress(Exception):
                self.ray.kill(slot.handle)
        if self.owns:
            self.ray.shutdown()


def make_runtime(recipe, env, model_path: str, log: Callable[[str], None]):
    kinds = {"inline": InlineRuntime, "processes": ProcessRuntime, "ray": RayRuntime}
    return kinds[recipe.runtime](env, model_path, recipe, log)
