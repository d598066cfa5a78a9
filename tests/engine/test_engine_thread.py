"""The engine's own thread (agent/engine/scheduler.py `EngineThread`): one thread steps every
request, most urgent first."""

from __future__ import annotations

import threading

import pytest

from agent.engine import EngineConfig, EngineError, Request, SamplingParams, SpeculativeConfig
from agent.engine.local.engine import LocalEngine
from agent.engine.local.model_runner import LoadedModel
from agent.engine.scheduler import STEP, EngineThread


def _steps(name: str, count: int, events: list, then=None):
    for i in range(count):
        events.append((name, i))
        if then is not None and i == 1:
            then()
        yield STEP
    return name


def _drain(relay) -> object:
    try:
        while True:
            next(relay)
    except StopIteration as stop:
        return stop.value


def test_a_more_urgent_request_takes_the_next_step_then_the_first_one_resumes():
    scheduler = EngineThread()
    events: list = []
    relays = {}

    def arrive():  # an editor's completion arrives while the agent turn runs
        relays["interactive"] = scheduler.stream(_steps("interactive", 3, events), "interactive")

    relays["normal"] = scheduler.stream(_steps("normal", 4, events, then=arrive), "normal")
    assert _drain(relays["normal"]) == "normal"
    assert _drain(relays["interactive"]) == "interactive"
    scheduler.close()
    assert events == [
        ("normal", 0),
        ("normal", 1),
        *[("interactive", i) for i in range(3)],
        ("normal", 2),
        ("normal", 3),
    ]


def test_within_a_lane_the_first_request_runs_to_its_end_before_the_next():
    scheduler = EngineThread()
    events: list = []
    started = threading.Event()
    gate = threading.Event()

    def first():
        started.set()
        gate.wait()  # holds the scheduler until the second request is queued
        yield from _steps("first", 3, events)
        return "first"

    relay_a = scheduler.stream(first(), "normal")
    started.wait()
    relay_b = scheduler.stream(_steps("second", 3, events), "normal")
    gate.set()
    assert _drain(relay_a) == "first" and _drain(relay_b) == "second"
    scheduler.close()
    assert [name for name, _ in events] == ["first"] * 3 + ["second"] * 3


def test_outputs_errors_and_calls_come_back_to_the_caller():
    scheduler = EngineThread()

    def deltas():
        yield "a"
        yield STEP  # a boundary without output is not handed to the caller
        yield "b"
        return "done"

    relay = scheduler.stream(deltas())
    assert list(relay) == ["a", "b"]

    def broken():
        yield "a"
        raise ValueError("bad request")

    with pytest.raises(ValueError, match="bad request"):
        list(scheduler.stream(broken()))
    assert scheduler.call(lambda: threading.current_thread().name) == "flywheel-engine"
    assert scheduler.call(lambda: scheduler.call(lambda: 7)) == 7  # from its own thread: inline
    scheduler.close()


def test_a_caller_that_stops_reading_cancels_its_request_on_the_engine_thread():
    scheduler = EngineThread()
    cleaned = threading.Event()
    where: list[str] = []

    def endless():
        try:
            while True:
                yield "token"
        finally:
            where.append(threading.current_thread().name)
            cleaned.set()

    relay = scheduler.stream(endless())
    assert next(relay) == "token"
    relay.close()
    assert cleaned.wait(60)
    assert where == ["flywheel-engine"]  # its cleanup ran on the engine's thread, not the caller
    scheduler.close()
    assert scheduler.pending() == 0


def test_close_lets_open_requests_finish_refuses_new_ones_and_ends_the_thread():
    scheduler = EngineThread()
    gate = threading.Event()

    def open_request():
        gate.wait()
        yield "token"
        return "finished"

    relay = scheduler.stream(open_request())
    scheduler.close()
    with pytest.raises(EngineError, match="closed"):
        scheduler.stream(_steps("late", 1, []))
    gate.set()
    assert next(relay) == "token" and _drain(relay) == "finished"
    scheduler._thread.join(60)
    assert not scheduler._thread.is_alive()


def test_an_own_thread_engine_loads_and_runs_the_model_only_on_its_thread(
    tiny_checkpoint, monkeypatch
):
    """Same outputs as an engine on the caller's thread, for plain and speculative decoding,
    with every load and forward call on the engine's thread."""
    threads: list[str] = []
    load, forward = LoadedModel.load.__func__, LoadedModel.forward_parts

    def recording_load(cls, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return load(cls, *args, **kwargs)

    def recording_forward(self, *args, **kwargs):
        threads.append(threading.current_thread().name)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(LoadedModel, "load", classmethod(recording_load))
    monkeypatch.setattr(LoadedModel, "forward_parts", recording_forward)
    prompts = ["def add(a, b):", "class Stack:\n    def push(self, item):", "import os\n"]
    for method in ("none", "ngram"):
        spec = SpeculativeConfig(method)
        outputs = {}
        for own in (False, True):
            config = EngineConfig(model=str(tiny_checkpoint), speculative=spec, own_thread=own)
            engine = LocalEngine(config)
            threads.clear()
            results: dict[int, list[int]] = {}

            def ask(i: int, engine=engine, results=results) -> None:
                params = SamplingParams(max_tokens=12, temperature=0)
                result = engine.generate(Request(prompt=prompts[i], params=params))
                results[i] = result.completions[0].token_ids

            callers = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
            for caller in callers:
                caller.start()
            for caller in callers:
                caller.join()
            if own:
                assert set(threads) == {"flywheel-engine"}, threads
                engine.swap(str(tiny_checkpoint))
                assert threads[-1] == "flywheel-engine"  # the new weights load there too
            engine.close()
            outputs[own] = results
        assert outputs[True] == outputs[False]


def test_an_engine_that_fails_to_load_leaves_no_thread_behind(tmp_path):
    def engine_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "flywheel-engine"}

    before = engine_threads()
    with pytest.raises(EngineError):
        LocalEngine(EngineConfig(model=str(tmp_path / "missing"), own_thread=True))
    for thread in engine_threads() - before:
        thread.join(60)
    assert engine_threads() <= before
