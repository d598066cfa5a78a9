"""`flywheel run` against a minimal OpenAI-compatible server: one that lists its model
without a context length, streams or answers in one JSON body, and fails at any point. Every
failure is one line on stderr and a non-zero exit; model text is printed literally."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agent import run

FIX = {
    "name": "edit_file",
    "arguments": {
        "path": "calc.py",
        "hunks": [{"search": "return a - b", "replace": "return a + b"}],
    },
}


class MiniServer:
    """/v1/models (no max_model_len) and /v1/chat/completions answering scripted turns.

    A turn is a str (the final answer) or a dict (one tool call). `stream`: answer with
    server-sent events when the client asks to stream; False answers one JSON body always.
    `models_ok`: how many /v1/models requests succeed before it answers 500.
    """

    def __init__(self, turns: list[Any], stream: bool = True, models_ok: int = 1_000) -> None:
        self.turns = list(turns)
        self.stream = stream
        self.models_ok = models_ok
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path != "/v1/models":
                    return self._send(404, b'{"error": {"message": "not found"}}')
                outer.models_ok -= 1
                if outer.models_ok < 0:
                    return self._send(500, b'{"error": {"message": "the model fell over"}}')
                models = {"object": "list", "data": [{"id": "mini", "object": "model"}]}
                self._send(200, json.dumps(models).encode())

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                if not outer.turns:
                    return self._send(500, b'{"error": {"message": "no more turns"}}')
                turn = outer.turns.pop(0)
                if outer.stream and body.get("stream"):
                    return self._send(200, _sse(turn), "text/event-stream")
                self._send(200, json.dumps(_whole(turn)).encode())

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def __enter__(self) -> MiniServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.http.shutdown()
        self.http.server_close()


def _call(turn: dict) -> dict:
    arguments = json.dumps(turn["arguments"])
    return {
        "id": "call_1",
        "type": "function",
        "function": {"name": turn["name"], "arguments": arguments},
    }


def _whole(turn: Any) -> dict:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": turn if isinstance(turn, str) else None,
    }
    if isinstance(turn, dict):
        message["tool_calls"] = [_call(turn)]
    finish = "stop" if isinstance(turn, str) else "tool_calls"
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "mini",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


def _sse(turn: Any) -> bytes:
    """The turn in pieces, as streaming servers send it: text in two chunks, a tool call's name
    before its arguments, which arrive in two halves."""
    chunks: list[dict] = [{"role": "assistant"}]
    if isinstance(turn, str):
        half = len(turn) // 2
        chunks += [{"content": turn[:half]}, {"content": turn[half:]}]
    else:
        call = _call(turn)
        args = call["function"]["arguments"]
        head = {
            "index": 0,
            "id": call["id"],
            "type": "function",
            "function": {"name": turn["name"]},
        }
        chunks += [
            {"tool_calls": [head]},
            {"tool_calls": [{"index": 0, "function": {"arguments": args[:10]}}]},
            {"tool_calls": [{"index": 0, "function": {"arguments": args[10:]}}]},
        ]
    events = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in chunks]
    finish = "stop" if isinstance(turn, str) else "tool_calls"
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    lines = [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


def _main(workspace, url: str, *extra: str) -> int:
    return run.main(
        ["fix add", "--workspace", str(workspace), "--model", url, "--no-telemetry", *extra]
    )


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "one-json-body"])
def test_a_server_without_a_context_length_completes_a_task(workspace, capsys, stream):
    with MiniServer([FIX, "Fixed add()."], stream=stream) as server:
        code = _main(workspace, server.url)
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "Fixed add()." in out and "+    return a + b" in out
    assert "return a + b" in (workspace / "calc.py").read_text()
    assert server.requests[0]["tools"] and server.requests[0]["model"] == "mini"
    [warning] = [line for line in err.splitlines() if "context length" in line]
    assert warning.startswith("warning: the server at") and "--context-length" in warning
    assert "Traceback" not in out + err


def test_context_length_flag_is_used_without_a_warning(workspace, capsys):
    with MiniServer([FIX, "Fixed add()."]) as server:
        code = _main(workspace, server.url, "--context-length", "32768")
    out, err = capsys.readouterr()
    assert code == 0 and "context length" not in err, out + err


def test_context_length_flag_needs_a_server(workspace, capsys):
    code = run.main(
        ["x", "--workspace", str(workspace), "--context-length", "4096", "--no-telemetry"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "OpenAI-compatible server" in err


@pytest.mark.parametrize(
    "case,models_ok,turns",
    [
        ("unreachable", 0, []),  # /v1/models fails when the engine opens
        ("fails-after-open", 1, [FIX]),  # the next /v1/models (the session's model version)
        ("fails-mid-task", 1_000, [FIX]),  # the second turn answers 500
    ],
)
def test_an_engine_error_at_any_point_is_one_line_and_non_zero(
    workspace, capsys, case, models_ok, turns
):
    with MiniServer(turns, models_ok=models_ok) as server:
        code = _main(workspace, server.url, "-q")
    out, err = capsys.readouterr()
    assert code != 0, out + err
    assert "Traceback" not in out + err
    errors = [line for line in err.splitlines() if line.startswith("flywheel run:")]
    if case == "fails-mid-task":  # the harness ends the task with a stop reason, exit 1
        assert code == 1 and "engine_error" in out and "no more turns" in out and not errors
    else:
        assert len(errors) == 1 and "500" in errors[0], err
        assert "the model fell over" in errors[0]


@pytest.mark.parametrize(
    "answer", ["[/]", "[bold]", ":x:", "list[/] of [red]x[/red] :x: :thumbs_up:"]
)
def test_a_final_answer_prints_literally(workspace, capsys, monkeypatch, answer):
    from tests.harness.replay import ReplayEngine, call

    engine = ReplayEngine([call("run_command", command=f"echo '{answer}'"), answer])
    monkeypatch.setattr("agent.engine.open_engine", lambda config: engine)
    code = run.main(["x", "--workspace", str(workspace), "--no-telemetry", "--approve", "yes"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert f"│ {answer}" in out, out  # inside the answer panel, as written
    assert f"echo '{answer}'" in out and "❌" not in out and "👍" not in out
