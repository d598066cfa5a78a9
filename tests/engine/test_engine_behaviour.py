"""Behaviour every engine backend shares, tested through the `Engine` Protocol only.

The `engine` fixture (conftest.py) runs each test on every backend over the tiny checkpoint.
"""

from __future__ import annotations

import threading

import pytest

from agent.chat_format import parse_assistant
from agent.engine import BadRequest, Engine, Request, SamplingParams

PROMPT = "def parse(text):\n    return json.loads(text)\n"


def greedy(max_tokens: int = 24, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


def test_implements_the_protocol(engine):
    assert isinstance(engine, Engine)
    assert engine.context_length > 0
    assert engine.model_version


def test_greedy_is_deterministic_and_reports_metrics(engine):
    a = engine.generate(Request(prompt=PROMPT, params=greedy()))
    b = engine.generate(Request(prompt=PROMPT, params=greedy()))
    assert a.completions[0].token_ids == b.completions[0].token_ids
    assert a.completions[0].text == b.completions[0].text
    m = a.metrics
    assert m.prompt_tokens > 0
    assert m.output_tokens == len(a.completions[0].token_ids) > 0
    assert 0 < m.ttft_s <= m.total_s
    assert m.tokens_per_s > 0
    assert len(a.completions[0].logprobs) == len(a.completions[0].token_ids)
    assert all(lp <= 0 for lp in a.completions[0].logprobs)


def test_max_tokens_and_finish_reason_length(engine):
    result = engine.generate(Request(prompt=PROMPT, params=greedy(max_tokens=5)))
    completion = result.completions[0]
    assert completion.finish_reason in ("length", "stop")
    if completion.finish_reason == "length":
        assert len(completion.token_ids) == 5
    assert len(completion.token_ids) <= 5


def test_stop_string_spanning_tokens_is_cut_and_not_streamed(engine):
    full = engine.generate(Request(prompt=PROMPT, params=greedy(max_tokens=30))).completions[0]
    assert len(full.text) >= 6, "the tiny model should produce some text"
    stop = full.text[2:6]  # several characters, usually several tokens
    first = full.text.find(stop)
    params = greedy(max_tokens=30, stop=[stop])
    cut = engine.generate(Request(prompt=PROMPT, params=params)).completions[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[:first]
    assert stop not in cut.text
    stream = engine.stream(Request(prompt=PROMPT, params=params))
    pieces = [d.text for d in stream]
    assert "".join(pieces) == cut.text
    assert all(stop not in p for p in pieces)


def test_stop_token_ids_end_the_sample(engine):
    full = engine.generate(Request(prompt=PROMPT, params=greedy(max_tokens=10))).completions[0]
    stop_id = full.token_ids[3]
    first = full.token_ids.index(stop_id)
    cut = engine.generate(
        Request(prompt=PROMPT, params=greedy(max_tokens=10, stop_token_ids=[stop_id]))
    ).completions[0]
    assert cut.finish_reason == "stop"
    assert cut.token_ids == full.token_ids[: first + 1]  # the stop token is reported, not its text


def test_streaming_equals_generate(engine):
    params = SamplingParams(temperature=0.8, max_tokens=20, seed=7, n=2)
    result = engine.generate(Request(prompt=PROMPT, params=params))
    stream = engine.stream(Request(prompt=PROMPT, params=params))
    texts, ids, reasons = {0: "", 1: ""}, {0: [], 1: []}, {}
    for delta in stream:
        texts[delta.index] += delta.text
        ids[delta.index] += delta.token_ids
        if delta.finish_reason:
            reasons[delta.index] = delta.finish_reason
    assert stream.result is not None
    for c in result.completions:
        assert texts[c.index] == c.text
        assert ids[c.index] == c.token_ids
        assert reasons[c.index] == c.finish_reason


def test_seed_reproduces_samples_and_n_gives_n_samples(engine):
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=123, n=4)
    a = engine.generate(Request(prompt=PROMPT, params=params))
    b = engine.generate(Request(prompt=PROMPT, params=params))
    assert [c.index for c in a.completions] == [0, 1, 2, 3]
    assert [c.token_ids for c in a.completions] == [c.token_ids for c in b.completions]
    assert len({tuple(c.token_ids) for c in a.completions}) > 1, "samples should differ"
    assert a.metrics.output_tokens == sum(len(c.token_ids) for c in a.completions)
    other = engine.generate(
        Request(prompt=PROMPT, params=SamplingParams(temperature=1.0, max_tokens=12, seed=124))
    )
    assert other.completions[0].token_ids != a.completions[0].token_ids


def test_cancel_from_another_thread_stops_within_a_step(engine):
    cancel = threading.Event()
    first_delta = threading.Event()
    deltas = []

    def consume():
        request = Request(prompt=PROMPT, params=greedy(max_tokens=500), cancel=cancel)
        for delta in engine.stream(request):  # consume to the end: the engine must stop it
            deltas.append(delta)
            first_delta.set()

    worker = threading.Thread(target=consume)
    worker.start()
    assert first_delta.wait(timeout=60)
    cancel.set()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert deltas[-1].finish_reason == "cancelled"
    assert sum(len(d.token_ids) for d in deltas) < 500


def test_cancel_during_stream_is_effective_next_step(engine):
    cancel = threading.Event()
    request = Request(prompt=PROMPT, params=greedy(max_tokens=200), cancel=cancel)
    stream = engine.stream(request)
    first = next(stream)
    tokens_before = len(first.token_ids)
    cancel.set()
    rest = list(stream)
    assert rest[-1].finish_reason == "cancelled"
    # within one step: at most one more decode or verify step's worth of tokens
    assert sum(len(d.token_ids) for d in rest) <= 16
    assert tokens_before >= 1


def test_chat_request_renders_and_parses_tool_calls(engine):
    tools = [{"name": "read_file", "description": "read a file", "parameters": {"type": "object"}}]
    messages = [
        {"role": "system", "content": "You are Flywheel."},
        {"role": "user", "content": "Open a.py"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "read_file", "arguments": {"path": "a.py"}}}],
        },
        {"role": "tool", "content": "x = 1"},
    ]
    result = engine.generate(Request(messages=messages, tools=tools, params=greedy(16)))
    completion = result.completions[0]
    assert completion.finish_reason in ("stop", "length")
    content, calls, errors = parse_assistant(completion.text)
    assert [c.name for c in completion.tool_calls] == [c.name for c in calls]
    assert completion.tool_call_errors == errors


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Request(prompt=""), "empty"),
        (lambda: Request(prompt="x", params=SamplingParams(top_p=0)), "top_p"),
        (lambda: Request(prompt="x", params=SamplingParams(temperature=-1)), "temperature"),
        (lambda: Request(prompt="x", params=SamplingParams(max_tokens=0)), "max_tokens"),
        (lambda: Request(prompt="x", params=SamplingParams(n=0)), "n must"),
        (lambda: Request(), "exactly one"),
    ],
)
def test_invalid_requests_are_refused_clearly(make, message):
    with pytest.raises(BadRequest, match=message):
        make()


def test_bad_prompts_raise_bad_request(engine):
    too_long = [5] * (engine.context_length + 10)
    with pytest.raises(BadRequest, match="context"):
        engine.generate(Request(prompt=too_long, params=greedy()))
    with pytest.raises(BadRequest, match="vocabulary"):
        engine.generate(Request(prompt=[1, 2, 10**9], params=greedy()))
    with pytest.raises(BadRequest, match="surrogate"):
        engine.generate(Request(prompt="abc\ud800def", params=greedy()))
    # the engine still works afterwards
    assert engine.generate(Request(prompt=PROMPT, params=greedy(4))).completions[0].token_ids


def test_max_tokens_is_clipped_to_the_context(engine):
    prompt = [5] * (engine.context_length - 3)
    result = engine.generate(Request(prompt=prompt, params=greedy(max_tokens=50)))
    assert len(result.completions[0].token_ids) <= 3
