"""`flywheel serve` as a real subprocess over a tiny checkpoint, driven over HTTP.

The checkpoint is the tiny test model taught by a few dozen optimizer steps to answer one chat
(`TOOL_CHAT` with `TOOLS`) with a tool call, so that tool calls cross the wire for real; for any
other prompt it is as arbitrary as the untrained tiny model. The server runs `--speculative ngram`
so that /metrics has draft counters to count.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agent.engine import EngineConfig, EngineError, Request, SamplingParams
from tests.flywheel_server import free_port, running_server

TOOLS = [{"type": "function", "function": {"name": "list_files", "parameters": {}}}]
TOOL_CHAT = [{"role": "user", "content": "ls"}]
TOOL_ANSWER = "<tool_call>list_files\n</tool_call><|im_end|>"
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def tool_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """The tiny model, overfitted until greedy decoding of TOOL_CHAT gives TOOL_ANSWER."""
    import torch

    from agent.model import build_trunk, save_checkpoint

    trunk = build_trunk("test", vocab_size=len(tokenizer), seed=0)
    prompt = tokenizer.apply_chat_template(
        TOOL_CHAT, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    answer_ids = tokenizer.encode(TOOL_ANSWER, add_special_tokens=False)
    ids = torch.tensor([prompt_ids + answer_ids])  # [1, seq]
    targets = ids[0, len(prompt_ids) :]  # [answer]
    optimizer = torch.optim.AdamW(trunk.parameters(), lr=2e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 0.6M model trains fastest on one thread, above all on a busy CPU
    for _ in range(400):
        logits = trunk(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]  # [answer, vocab]
        if torch.equal(logits.argmax(-1), targets):  # teacher-forced argmax = greedy output
            break
        loss = torch.nn.functional.cross_entropy(logits, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    else:
        raise AssertionError("the tiny model did not learn the tool-call answer")
    torch.set_num_threads(threads)
    folder = tmp_path_factory.mktemp("tools")
    return save_checkpoint(folder, trunk.eval(), tokenizer, meta={"version": "tiny-tools"})


@pytest.fixture(scope="module")
def server(tool_checkpoint) -> str:
    with running_server(tool_checkpoint, "--speculative", "ngram") as url:
        yield url


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server, timeout=120) as c:
        yield c


def metrics(client: httpx.Client) -> dict[tuple[str, tuple], float]:
    """/metrics parsed by Prometheus' own parser: (sample name, sorted labels) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def events(response: httpx.Response) -> list[dict | str]:
    """The `data:` payloads of a server-sent-event response (JSON objects, and "[DONE]")."""
    out: list[dict | str] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def greedy(**fields) -> dict:
    return {"temperature": 0, "max_tokens": 16, **fields}


def test_health_and_models(client):
    health = client.get("/health").json()
    assert health == {"status": "ok", "model_version": "tiny-tools"}
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    [card] = models["data"]
    assert card["id"] == "flywheel" and card["object"] == "model"
    assert card["max_model_len"] == 2048 and card["version"] == "tiny-tools"


def test_completion_is_the_engines_own_greedy_output(client, tool_checkpoint):
    from agent.engine.local.engine import LocalEngine

    body = greedy(prompt=PROMPT, logprobs=0, return_token_ids=True)
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "text_completion" and data["model"] == "flywheel"
    assert data["system_fingerprint"] == "tiny-tools"
    [choice] = data["choices"]
    engine = LocalEngine(EngineConfig(model=str(tool_checkpoint)))  # no speculation: the reference
    expected = engine.generate(
        Request(prompt=PROMPT, params=SamplingParams(temperature=0, max_tokens=16))
    )
    engine.close()
    [reference] = expected.completions
    assert choice["text"] == reference.text
    assert choice["token_ids"] == reference.token_ids
    assert choice["finish_reason"] == reference.finish_reason
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in reference.token_ids]
    assert logprobs["token_logprobs"] == pytest.approx(reference.logprobs, abs=1e-4)
    usage = data["usage"]
    assert usage["completion_tokens"] == len(reference.token_ids)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert data["metrics"]["output_tokens"] == usage["completion_tokens"]
    assert data["metrics"]["verify_steps"] > 0, "the server speculates with ngram"


def test_streamed_completion_equals_the_whole_response(client):
    whole = client.post("/v1/completions", json=greedy(prompt=PROMPT, n=2, return_token_ids=True))
    body = greedy(prompt=PROMPT, n=2, return_token_ids=True, stream=True)
    body["stream_options"] = {"include_usage": True}
    with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = events(response)
    assert chunks[-1] == "[DONE]"
    usage_chunk = chunks[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"] == whole.json()["usage"]
    assert usage_chunk["metrics"]["output_tokens"] == usage_chunk["usage"]["completion_tokens"]
    for expected in whole.json()["choices"]:
        mine = [
            c["choices"][0] for c in chunks[:-2] if c["choices"][0]["index"] == expected["index"]
        ]
        assert "".join(c["text"] for c in mine) == expected["text"]
        assert sum((c["token_ids"] for c in mine), []) == expected["token_ids"]
        assert [c["finish_reason"] for c in mine][-1] == expected["finish_reason"]
        assert all(c["finish_reason"] is None for c in mine[:-1])


def test_chat_answers_with_a_tool_call_in_openai_shape(client):
    body = greedy(messages=TOOL_CHAT, tools=TOOLS, max_tokens=32)
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "chat.completion"
    [choice] = data["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["role"] == "assistant" and message["content"] is None
    [call] = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "list_files", "arguments": "{}"}


def test_streamed_chat_sends_tool_calls_not_markup(client):
    body = greedy(messages=TOOL_CHAT, tools=TOOLS, max_tokens=32, stream=True)
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        chunks = events(response)
    assert chunks[-1] == "[DONE]"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks[:-1])
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content") or "" for d in deltas) == ""  # the markup never leaks
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    assert [(c["index"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        (0, "list_files", "{}")
    ]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_openai_engine_reads_tool_calls_from_the_server(server):
    from agent.engine.backends.openai import OpenAIEngine

    engine = OpenAIEngine(EngineConfig(model=server))
    try:
        request = Request(messages=TOOL_CHAT, tools=TOOLS, params=SamplingParams(temperature=0))
        [completion] = engine.generate(request).completions
        assert [(c.name, c.arguments) for c in completion.tool_calls] == [("list_files", {})]
        assert completion.tool_call_errors == [] and completion.text == ""
        assert completion.finish_reason == "stop"
        assert completion.model_version == "tiny-tools" == engine.model_version
        with pytest.raises(EngineError, match="cannot swap"):
            engine.swap("other/checkpoint")
    finally:
        engine.close()


def test_stop_strings_skip_the_start_of_the_output_over_http_as_locally(server, tool_checkpoint):
    """`stop_after` (a token-healed prompt's output starts with text that may hold a stop
    string): the openai backend cuts where the local engine does."""
    from agent.engine.backends.openai import OpenAIEngine
    from agent.engine.local.engine import LocalEngine

    local = LocalEngine(EngineConfig(model=str(tool_checkpoint)))
    remote = OpenAIEngine(EngineConfig(model=server))
    try:

        def text(engine, **stop) -> str:
            params = SamplingParams(temperature=0, max_tokens=16, **stop)
            return engine.generate(Request(prompt=PROMPT, params=params)).completions[0].text

        whole = text(local)
        first = whole[0]  # a stop string that the output begins with
        cut = whole.find(first, 1)
        expected = whole[:cut] if cut > 0 else whole
        for engine in (local, remote):
            assert text(engine, stop=[first]) == ""
            assert text(engine, stop=[first], stop_after=1) == expected
    finally:
        local.close()
        remote.close()


def test_openai_engine_names_an_unreachable_server():
    from agent.engine.backends.openai import OpenAIEngine

    port = free_port()  # nothing listens there
    with pytest.raises(EngineError, match=rf"127\.0\.0\.1:{port}/v1.*running"):
        OpenAIEngine(EngineConfig(model=f"http://127.0.0.1:{port}"))


TOO_LONG = json.dumps({"prompt": "x " * 5000})
BAD_REQUESTS = [
    ("/v1/completions", '{"prompt": ""}', 400, "prompt is empty"),
    ("/v1/completions", '{"prompt": "x", "top_p": 0}', 400, "top_p must be in"),
    ("/v1/completions", '{"prompt": "x", "temperature": -1}', 400, "temperature must be >= 0"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": "many"}', 400, "max_tokens` must be"),
    ("/v1/completions", '{"prompt": "x",', 400, "not valid JSON"),
    ("/v1/completions", b'{"prompt": "\xff\xfeabc"}', 400, "not valid UTF-8"),
    ("/v1/completions", TOO_LONG, 400, "context"),
    ("/v1/completions", json.dumps({"prompt": "x " * 5000, "stream": True}), 400, "context"),
    ("/v1/completions", '{"prompt": ["a", "b"]}', 400, "one prompt per request"),
    ("/v1/completions", '{"prompt": "x", "model": "gpt-4"}', 404, "not served here"),
    ("/v1/chat/completions", '{"messages": []}', 400, "non-empty list"),
    ("/v1/chat/completions", '{"messages": [{"role": "robot"}]}', 400, "role must be"),
    ("/v1/chat/completions", "[1, 2]", 400, "must be a JSON object"),
    ("/v1/completions", '{"prompt": "x", "priority": "urgent"}', 400, "`priority` must be"),
]


@pytest.mark.parametrize("route, body, status, message", BAD_REQUESTS)
def test_bad_requests_get_a_clear_error_and_the_server_keeps_serving(
    client, route, body, status, message
):
    response = client.post(route, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert message in error["message"]
    assert error["type"] == "invalid_request_error"
    ok = client.post("/v1/completions", json=greedy(prompt="x", max_tokens=2))
    assert ok.status_code == 200


def test_metrics_count_requests_tokens_and_drafts(client):
    before = metrics(client)
    response = client.post("/v1/completions", json=greedy(prompt=PROMPT, max_tokens=48))
    assert response.status_code == 200
    usage, used = response.json()["usage"], response.json()["metrics"]
    after = metrics(client)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert grew("flywheel_requests_total", route="/v1/completions", status="200") == 1
    assert grew("flywheel_prompt_tokens_total") == usage["prompt_tokens"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert grew("flywheel_prefix_cache_hit_tokens_total") == cached == used["cached_tokens"]
    assert grew("flywheel_generation_tokens_total") == usage["completion_tokens"]
    assert grew("flywheel_spec_decode_draft_tokens_total") == used["drafts_proposed"] > 0
    assert grew("flywheel_spec_decode_accepted_tokens_total") == used["drafts_accepted"]
    assert grew("flywheel_spec_decode_verify_steps_total") == used["verify_steps"] > 0
    accepted = after[("flywheel_spec_decode_accepted_tokens_total", ())]
    steps = after[("flywheel_spec_decode_verify_steps_total", ())]
    mean = after[("flywheel_spec_decode_mean_acceptance_length", ())]
    assert mean == pytest.approx((accepted + steps) / steps)
    assert after[("flywheel_model_info", (("version", "tiny-tools"),))] == 1
    assert after[("flywheel_requests_running", ())] == 0
    long = PROMPT + "\n    return a + b\n" * 8  # longer than the cache's shortest match
    for _ in range(2):
        again = client.post("/v1/completions", json=greedy(prompt=long, max_tokens=4)).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the same prompt


def test_client_disconnect_cancels_the_request(client, server):
    cancelled = ("flywheel_requests_cancelled_total", ())
    before = metrics(client)[cancelled]
    body = greedy(prompt=PROMPT, max_tokens=2000, stream=True)
    with (
        httpx.Client(base_url=server, timeout=60) as other,
        other.stream("POST", "/v1/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        # the engine runs in a worker thread: the event loop answers others meanwhile
        assert client.get("/health").status_code == 200
    # leaving the block closed the connection mid-stream
    deadline = time.monotonic() + 60
    while metrics(client)[cancelled] == before:
        assert time.monotonic() < deadline, "the server never noticed the disconnect"
        time.sleep(0.05)  # poll interval
    assert metrics(client)[("flywheel_requests_running", ())] == 0
    assert client.get("/health").status_code == 200


def test_api_key_guards_everything_but_health(tool_checkpoint):
    from fastapi.testclient import TestClient

    from agent.engine.local.engine import LocalEngine
    from agent.serve import ServerConfig, build_app

    engine = LocalEngine(EngineConfig(model=str(tool_checkpoint)))
    try:
        with TestClient(build_app(engine, ServerConfig(api_key="s3cret"))) as http:
            assert http.get("/health").status_code == 200
            for bad in ({}, {"Authorization": "Bearer wrong"}):
                refused = http.get("/v1/models", headers=bad)
                assert refused.status_code == 401
                assert "--api-key" in refused.json()["error"]["message"]
            assert http.get("/metrics").status_code == 401
            key = {"Authorization": "Bearer s3cret"}
            assert http.get("/v1/models", headers=key).status_code == 200
            body = greedy(prompt=PROMPT, max_tokens=4)
            assert http.post("/v1/completions", json=body).status_code == 401
            answer = http.post("/v1/completions", json=body, headers=key)
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] > 0
    finally:
        engine.close()


def test_serve_refuses_a_missing_checkpoint_clearly(tmp_path):
    missing = tmp_path / "nope"
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli", "serve", "--model", str(missing), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "does not exist" in out.stderr and str(missing) in out.stderr
