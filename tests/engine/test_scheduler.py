"""Priority lanes: the model goes to the most urgent waiter, FIFO within a lane."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest

from agent.engine import BadRequest, Request
from agent.engine.scheduler import PriorityLock


class RecordingLock(PriorityLock):
    """A `PriorityLock` that appends the lane of each hold to `record` once it has the lock."""

    def __init__(self, record: list[str], grace_s: float = 0.05) -> None:
        super().__init__(grace_s)
        self.record = record

    @contextmanager
    def hold(self, lane="normal"):
        with super().hold(lane):
            self.record.append(lane)
            yield


def _wait_until(predicate) -> None:
    """Block until `predicate()` holds, by polling state (no timing assumption)."""
    event = threading.Event()
    while not predicate():
        event.wait(0.001)


def test_waiters_acquire_in_lane_order_then_arrival_order():
    lock = PriorityLock()
    order: list[str] = []
    release = threading.Event()

    def holder():
        with lock.hold("background"):
            release.wait()

    first = threading.Thread(target=holder)
    first.start()
    _wait_until(lambda: lock._held)
    threads = []
    for name, lane in [
        ("rollout", "background"),
        ("turn-1", "normal"),
        ("turn-2", "normal"),
        ("completion", "interactive"),
    ]:

        def waiter(name=name, lane=lane):
            with lock.hold(lane):
                order.append(name)

        thread = threading.Thread(target=waiter)
        thread.start()
        threads.append(thread)
        _wait_until(lambda n=len(threads): lock.waiting() == n)  # queued in this order
    release.set()
    for thread in [first, *threads]:
        thread.join()
    assert order == ["completion", "turn-1", "turn-2", "rollout"]
    assert lock.waiting() == 0 and not lock._held


def _session_with_a_waiter_between_steps(grace_s: float) -> list[str]:
    """An interactive request holds the model twice; a rollout starts waiting after the first
    step. Returns who held the model, in order."""
    lock, order = PriorityLock(grace_s=grace_s), []
    first_done, go_on = threading.Event(), threading.Event()

    def request():
        with lock.session("interactive"):
            with lock.hold("interactive"):
                order.append("step 1")
            first_done.set()
            go_on.wait()
            with lock.hold("interactive"):
                order.append("step 2")

    def rollout():
        with lock.hold("background"):
            order.append("rollout")

    threads = [threading.Thread(target=request), threading.Thread(target=rollout)]
    threads[0].start()
    first_done.wait()
    threads[1].start()
    _wait_until(lambda: lock.waiting() == 1 or "rollout" in order)
    go_on.set()
    for thread in threads:
        thread.join()
    return order


def test_a_waiter_lets_a_more_urgent_request_finish_its_steps_back_to_back():
    assert _session_with_a_waiter_between_steps(grace_s=60) == ["step 1", "step 2", "rollout"]


def test_a_session_that_stops_stepping_holds_the_others_back_no_longer_than_its_grace():
    order = _session_with_a_waiter_between_steps(grace_s=0)
    assert order[:2] == ["step 1", "rollout"]


def test_the_lock_is_released_when_the_block_raises():
    lock = PriorityLock()
    with pytest.raises(RuntimeError), lock.hold():
        raise RuntimeError("forward failed")
    with lock.hold("interactive"):  # free again: no deadlock
        pass


def test_an_unknown_priority_is_refused_with_the_lanes():
    with pytest.raises(BadRequest, match="interactive, prefetch, normal, background"):
        Request(prompt="x", priority="urgent")


def test_the_local_engine_serves_a_waiting_completion_before_a_waiting_agent_turn(
    tiny_checkpoint,
):
    """Both requests wait while the model is busy; the interactive one prefills first."""
    from agent.engine import EngineConfig, SamplingParams, open_engine

    engine = open_engine(EngineConfig(model=str(tiny_checkpoint), backend="local"))
    lanes: list[str] = []
    engine._scheduler = RecordingLock(lanes, grace_s=60)  # a waiting turn waits for the completion
    busy, release = threading.Event(), threading.Event()

    def model_busy():
        with engine._scheduler.hold("background"):
            busy.set()
            release.wait()

    def ask(priority):
        engine.generate(
            Request(
                prompt="def f",
                params=SamplingParams(max_tokens=3, temperature=0),
                priority=priority,
            )
        )

    threads = [threading.Thread(target=model_busy)]
    threads[0].start()
    busy.wait()
    for priority in ("normal", "interactive"):
        threads.append(threading.Thread(target=ask, args=(priority,)))
        threads[-1].start()
        _wait_until(lambda n=len(threads) - 1: engine._scheduler.waiting() == n)
    release.set()
    for thread in threads:
        thread.join()
    engine.close()
    interactive = lanes.count("interactive")
    assert interactive >= 3 and lanes.count("normal") >= 3  # prefill + decodes
    assert lanes[: 1 + interactive] == ["background"] + ["interactive"] * interactive


@pytest.mark.parametrize(
    "value, lane",
    [
        (None, "normal"),
        (-5, "interactive"),
        (0, "normal"),
        (3, "background"),
        ("interactive", "interactive"),
    ],
)
def test_the_served_api_reads_vllms_integer_priority_or_a_lane(value, lane):
    from agent.serve.request_body import chat_request, completion_request

    body = {"prompt": "x"} if value is None else {"prompt": "x", "priority": value}
    assert completion_request(body, threading.Event()).priority == lane
    body["messages"] = [{"role": "user", "content": "hi"}]
    assert chat_request(body, threading.Event()).priority == lane


def _recording_engine(checkpoint):
    """A local engine on `checkpoint` (no prefix cache) whose lock records the lane of each hold."""
    from agent.engine import EngineConfig, open_engine

    engine = open_engine(EngineConfig(model=str(checkpoint), backend="local", prefix_cache_mb=0))
    holds: list[str] = []
    engine._scheduler = RecordingLock(holds)
    return engine, holds


def test_a_long_prompt_is_prefilled_in_chunks_with_the_same_output(tiny_checkpoint, monkeypatch):
    """Each chunk is a hold of its own (a waiting completion goes between two chunks); the
    output is the one the whole prompt in one pass gives."""
    import agent.engine.local.engine as local
    from agent.engine import SamplingParams

    def run(chunk: int) -> tuple[list[int], int]:
        monkeypatch.setattr(local, "PREFILL_CHUNK", chunk)
        engine, holds = _recording_engine(tiny_checkpoint)
        prompt = "def total(values):\n    return sum(v for v in values)\n" * 4
        params = SamplingParams(max_tokens=5, temperature=0)
        result = engine.generate(Request(prompt=prompt, params=params))
        engine.close()
        return result.completions[0].token_ids, len(holds) - 4  # minus the decode steps

    whole, one_pass = run(10_000)
    chunked, passes = run(7)
    assert chunked == whole and one_pass == 2  # the cache lookup, then one forward
    assert passes > 3


def test_a_recent_urgent_lane_is_seen_by_the_less_urgent_ones_only():
    lock = PriorityLock()
    assert not lock.urgent_within("background", 3600)  # nothing has run yet
    with lock.session("interactive"):
        assert lock.urgent_within("normal", 0) and lock.urgent_within("background", 0)
        assert not lock.urgent_within("interactive", 3600)
    with lock.hold("interactive"):
        pass
    assert lock.urgent_within("normal", 3600)  # held within the window
    assert not lock.urgent_within("normal", 0)  # and outside a window of none


def test_an_agent_prefill_runs_in_short_chunks_while_an_editor_is_active(
    tiny_checkpoint, monkeypatch
):
    """After an editor's completion, an agent turn's prompt is prefilled YIELDING_CHUNK tokens
    at a time (a next completion waits for less); the output is the same."""
    import agent.engine.local.engine as local
    from agent.engine import SamplingParams

    monkeypatch.setattr(local, "URGENT_WINDOW_S", 3600.0)  # however slow this machine is now
    engine, holds = _recording_engine(tiny_checkpoint)
    prompt = "def total(values):\n    return sum(v for v in values)\n" * 12
    params = SamplingParams(max_tokens=3, temperature=0)
    alone = engine.generate(Request(prompt=prompt, params=params))
    assert local.PREFILL_CHUNK > alone.metrics.prompt_tokens > local.YIELDING_CHUNK * 2
    alone_holds = len(holds)
    engine.generate(Request(prompt="x = 1", params=params, priority="interactive"))
    holds.clear()
    after = engine.generate(Request(prompt=prompt, params=params))
    engine.close()
    assert after.completions[0].token_ids == alone.completions[0].token_ids
    assert len(holds) > alone_holds + 1  # more, shorter prefill passes
