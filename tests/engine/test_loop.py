"""The engine loop (agent/engine/loop.py): one thread steps every request, most urgent first."""

from __future__ import annotations

import threading

import pytest

from agent.engine import EngineConfig, EngineError, Request, SamplingParams, SpeculativeConfig
from agent.engine.local import LocalEngine
from agent.engine.loop import STEP, EngineLoop
from agent.engine.model_runner import LoadedModel


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
    loop = EngineLoop()
    events: list = []
    relays = {}

    def arrive():  # an editor's completion arrives while the agent turn runs
        relays["interactive"] = loop.stream(_steps("interactive", 3, events), "interactive")

    relays["normal"] = loop.stream(_steps("normal", 4, events, then=arrive), "normal")
    assert _drain(relays["normal"]) == "normal"
    assert _drain(relays["interactive"]) == "interactive"
    loop.close()
    assert events == [
        ("normal", 0),
        ("normal", 1),
        *[("interactive", i) for i in range(3)],
        ("normal", 2),
        ("normal", 3),
    ]


def test_within_a_lane_the_first_request_runs_to_its_end_before_the_next():
    loop = EngineLoop()
    events: list = []
    started = threading.Event()
    gate = threading.Event()

    def first():
        started.set()
        gate.wait()  # holds the loop until the second request is queued
        yield from _steps("first", 3, events)
        return "first"

    relay_a = loop.stream(first(), "normal")
    started.wait()
    relay_b = loop.stream(_steps("second", 3, events), "normal")
    gate.set()
    assert _drain(relay_a) == "first" and _drain(relay_b) == "second"
    loop.close()
    assert [name for name, _ in events] == ["first"] * 3 + ["second"] * 3


def test_outputs_errors_and_calls_come_back_to_the_caller():
    loop = EngineLoop()

    def deltas():
        yield "a"
        yield STEP  # a boundary without output is not handed to the caller
        yield "b"
        return "done"

    relay = loop.stream(deltas())
    assert list(relay) == ["a", "b"]

    def broken():
        yield "a"
        raise ValueError("bad request")

    with pytest.raises(ValueError, match="bad request"):
        list(loop.stream(broken()))
    assert loop.call(lambda: threading.current_thread().name) == "flywheel-engine-loop"
    assert loop.call(lambda: loop.call(lambda: 7)) == 7  # from the loop's thread: inline
    loop.close()


def test_a_caller_that_stops_reading_cancels_its_request_on_the_loop():
    loop = EngineLoop()
    cleaned = threading.Event()
    where: list[str] = []

    def endless():
        try:
            while True:
                yield "token"
        finally:
            where.append(threading.current_thread().name)
            cleaned.set()

    relay = loop.stream(endless())
    assert next(relay) == "token"
    relay.close()
    assert cleaned.wait(60)
    assert where == ["flywheel-engine-loop"]  # its cleanup ran on the loop, not the caller
    loop.close()
    assert loop.pending() == 0


def test_close_lets_open_requests_finish_refuses_new_ones_and_ends_the_thread():
    loop = EngineLoop()
    gate = threading.Event()

    def open_request():
        gate.wait()
        yield "token"
        return "finished"

    relay = loop.stream(open_request())
    loop.close()
    with pytest.raises(EngineError, match="closed"):
        loop.stream(_steps("late", 1, []))
    gate.set()
    assert next(relay) == "token" and _drain(relay) == "finished"
    loop._thread.join(60)
    assert not loop._thread.is_alive()


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
                assert set(threads) == {"flywheel-engine-loop"}, threads
                engine.swap(str(tiny_checkpoint))
                assert threads[-1] == "flywheel-engine-loop"  # the new weights load there too
            engine.close()
            outputs[own] = results
        assert outputs[True] == outputs[False]


def test_an_engine_that_fails_to_load_leaves_no_thread_behind(tmp_path):
    def loops() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "flywheel-engine-loop"}

    before = loops()
    with pytest.raises(EngineError):
        LocalEngine(EngineConfig(model=str(tmp_path / "missing"), own_thread=True))
    for thread in loops() - before:
        thread.join(60)
    assert loops() <= before
