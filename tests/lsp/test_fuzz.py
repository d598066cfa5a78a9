"""Property-based fuzzing of `flywheel lsp` over stdio.

Thousands of random and mutated JSON-RPC messages go to one real server: broken bytes, JSON that
is no message, envelopes with random methods, ids and params, and valid LSP messages with keys
deleted, replaced or added. Each must be answered as JSON-RPC 2.0 says (`expected` below, written
from the specification, not from the server): a request with an integer or string id gets exactly
one response with that id; broken JSON gets -32700 and anything else that is no message -32600,
with id null, in the order sent; notifications and stray responses get nothing. The server must
not die, its memory must stay bounded, and it must serve a valid completion afterwards.

Examples are derandomized (the same messages every run), no deadline applies, and every wait is
for an answer, never for time (the 120 s guard only turns a missing answer into a failure).
"""

from __future__ import annotations

import itertools
import json
import queue
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.lsp.conftest import server_command

EXAMPLES = 600  # batches of 1-20 messages
WAIT_S = 120.0  # guard: a message still unanswered after this fails the test
MEMORY_GROWTH_MB = 150  # resident memory the fuzzing may add to a warm server
OPTIONS = {
    "completion": {"debounceMs": 0, "maxTokens": 8, "temperature": 1.0, "seed": 0},
    "nextEdit": {"maxTokens": 8},
    "agent": {"maxTokens": 8, "maxSteps": 1},
}
# Not fuzzed: ending the session, a second initialize, and settings changes (random settings may
# legitimately switch completion off, and the last check needs it on); agent tasks (each would run
# the model for many turns).
EXCLUDED = {"exit", "shutdown", "initialize", "initialized", "workspace/didChangeConfiguration"}
TASK_COMMANDS = {"flywheel.ask", "flywheel.fixDiagnostic", "flywheel.explain"}
METHODS = [
    "textDocument/inlineCompletion",
    "textDocument/completion",
    "textDocument/didOpen",
    "textDocument/didChange",
    "textDocument/didClose",
    "textDocument/codeAction",
    "workspace/executeCommand",
    "flywheel/nextEdit",
    "flywheel/completionShown",
    "flywheel/completionRejected",
    "flywheel/completionPartiallyAccepted",
    "$/cancelRequest",
    "window/workDoneProgress/cancel",
    "textDocument/hover",
    "flywheel/noSuchMethod",
    "",
]
ERROR_CODES = {-32700, -32600, -32601, -32602, -32603, -32800, -32801, -32803}


def expected(body: bytes) -> tuple[str, Any] | None:
    """What JSON-RPC 2.0 requires in answer to `body`: ("id", id) a response with that id,
    ("null", code) an error with id null, or None (nothing)."""
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError):
        return ("null", -32700)
    if not isinstance(msg, dict):
        return ("null", -32600)
    if "method" in msg:
        if "id" not in msg:
            return None
        if type(msg["id"]) not in (int, str):
            return ("null", -32600)
        return ("id", msg["id"])
    return None if "id" in msg else ("null", -32600)


# -- strategies ---------------------------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
ids = st.integers(0, 10) | st.text(max_size=5) | json_values


def _templates(uri: str) -> list[tuple[str, dict]]:
    pos = {"line": 0, "character": 3}
    rng = {"start": pos, "end": {"line": 0, "character": 5}}
    return [
        (
            "textDocument/inlineCompletion",
            {"textDocument": {"uri": uri}, "position": pos, "context": {"triggerKind": 1}},
        ),
        ("textDocument/completion", {"textDocument": {"uri": uri}, "position": pos}),
        (
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": "x = 1\n"}},
        ),
        (
            "textDocument/didChange",
            {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [{"text": "y = 2\n"}]},
        ),
        (
            "textDocument/codeAction",
            {"textDocument": {"uri": uri}, "range": rng, "context": {"diagnostics": []}},
        ),
        ("flywheel/nextEdit", {"textDocument": {"uri": uri, "version": 1}, "position": pos}),
        ("workspace/executeCommand", {"command": "flywheel.status", "arguments": []}),
        ("flywheel/completionShown", {"suggestionId": "s"}),
        ("$/cancelRequest", {"id": 1}),
    ]


@st.composite
def mutated(draw, uri: str) -> dict:
    """A valid LSP message with up to three changes: a value replaced, a key deleted or added,
    anywhere in it (the envelope or the params)."""
    method, params = draw(st.sampled_from(_templates(uri)))
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if draw(st.booleans()):
        msg["id"] = 0  # made unique when sent
    for _ in range(draw(st.integers(0, 3))):
        node = msg
        while True:  # walk down to a random object or array
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            deeper = [k for k in keys if isinstance(node[k], dict | list) and node[k]]
            if not deeper or draw(st.booleans()):
                break
            node = node[draw(st.sampled_from(deeper))]
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "add" or not keys:
            if isinstance(node, dict):
                node[draw(st.text(max_size=8))] = draw(json_values)
            else:
                node.append(draw(json_values))
        elif action == "delete":
            del node[draw(st.sampled_from(keys))]
        else:
            node[draw(st.sampled_from(keys))] = draw(json_values)
    return msg


@st.composite
def envelope(draw) -> dict:
    """A JSON-RPC envelope with a random method, params and (maybe) id."""
    msg: dict[str, Any] = {"jsonrpc": draw(st.sampled_from(["2.0", "2.0", "1.0", 2]))}
    msg["method"] = draw(st.sampled_from(METHODS) | st.text(max_size=12) | json_values)
    if draw(st.booleans()):
        msg["params"] = draw(json_values)
    if draw(st.booleans()):
        msg["id"] = draw(ids)
    return msg


def bodies(uri: str):
    as_json = (mutated(uri) | envelope() | json_values).map(lambda m: json.dumps(m).encode())
    return as_json | st.binary(min_size=1, max_size=40)  # (an empty body is no frame)


# -- the wire -----------------------------------------------------------------------------------


class SyncWire:
    """Raw frames to and from the server. A reader thread sorts what arrives and answers the
    server's own requests (configuration, progress, edits, approvals) with null; a writer thread
    sends, so that the reader never blocks on a full pipe."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.outbox: queue.Queue = queue.Queue()
        self.answers: queue.Queue = queue.Queue()  # responses, in the order they arrive
        for target in (self._read, self._write):
            threading.Thread(target=target, daemon=True).start()

    def send(self, body: bytes) -> None:
        self.outbox.put(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def _write(self) -> None:
        while True:
            frame = self.outbox.get()
            try:
                self.proc.stdin.write(frame)
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                return

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = 0
            while True:
                line = out.readline()
                if not line:
                    self.answers.put(EOFError("the server closed its output"))
                    return
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
                elif line in (b"\r\n", b"\n") and length:
                    break
            msg = json.loads(out.read(length))
            if "method" in msg:
                if "id" in msg:  # the server asks the client something
                    self.send(
                        json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": None}).encode()
                    )
                continue
            self.answers.put(msg)

    def next_answer(self) -> dict:
        try:
            msg = self.answers.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"no answer within {WAIT_S:.0f} s") from None
        if isinstance(msg, Exception):
            raise msg
        return msg

    def request(self, msg_id: Any, method: str, params: Any) -> dict:
        self.send(
            json.dumps(
                {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}
            ).encode()
        )
        answer = self.next_answer()
        assert answer.get("id") == msg_id, answer
        return answer

    def notify(self, method: str, params: Any) -> None:
        self.send(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode())


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _complete(wire: SyncWire, uri: str, msg_id: str) -> dict:
    text = "def total(items):\n    s = 0\n    for x in items:\n        s += "
    doc = {"uri": uri, "languageId": "python", "version": 1, "text": text}
    wire.notify("textDocument/didOpen", {"textDocument": doc})
    params = {
        "textDocument": {"uri": uri},
        "position": {"line": 3, "character": 13},
        "context": {"triggerKind": 1},
    }
    return wire.request(msg_id, "textDocument/inlineCompletion", params)


def test_random_and_mutated_messages_never_break_the_server(tmp_path, tiny_checkpoint):
    cmd = server_command(
        "--model", str(tiny_checkpoint), "--db", str(tmp_path / "t.db"), "--manual-clock"
    )
    log = (tmp_path / "server.log").open("wb")  # never a pipe: a full one would block the server
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
    wire = SyncWire(proc)
    counts: Counter[str] = Counter()
    internal: list[str] = []  # -32603 messages: allowed by the specification, shown for review
    try:
        caps = {"workspace": {"configuration": True, "applyEdit": True}}
        init = {
            "processId": None,
            "capabilities": caps,
            "rootUri": tmp_path.as_uri(),
            "initializationOptions": OPTIONS,
        }
        assert "capabilities" in wire.request("init", "initialize", init)["result"]
        wire.notify("initialized", {})
        warm = _complete(wire, (tmp_path / "warm.py").as_uri(), "warm")
        assert warm["result"]["items"], warm
        rss_before = _rss_mb(proc.pid)
        fresh = itertools.count(1_000_000)
        fuzz_uri = (tmp_path / "fuzzed.py").as_uri()

        @settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.lists(bodies(fuzz_uri), min_size=1, max_size=20))
        def batch(sent: list[bytes]) -> None:
            waits: list[tuple[str, Any]] = []
            for body in sent:
                msg = _parsed(body)
                if isinstance(msg, dict):
                    method = msg.get("method")
                    if (isinstance(method, str) and method in EXCLUDED) or _runs_a_task(msg):
                        continue
                    if type(msg.get("id")) in (int, str) and "method" in msg:
                        n = next(fresh)  # unique, of the type drawn
                        msg["id"] = n if type(msg["id"]) is int else f"fuzz-{n}"
                    body = json.dumps(msg).encode()
                want = expected(body)
                counts["messages"] += 1
                counts["answered" if want else "silent"] += 1
                wire.send(body)
                if want:
                    waits.append(want)
            pending = {w[1] for w in waits if w[0] == "id"}
            nulls = [w[1] for w in waits if w[0] == "null"]  # in the order sent
            while pending or nulls:
                answer = wire.next_answer()
                assert answer.get("jsonrpc") == "2.0", answer
                assert ("result" in answer) != ("error" in answer), answer
                if "error" in answer:
                    error = answer["error"]
                    assert error["code"] in ERROR_CODES and isinstance(error["message"], str), (
                        answer
                    )
                    counts[f"error {error['code']}"] += 1
                    if error["code"] == -32603:
                        internal.append(error["message"][:300])
                else:
                    counts["result"] += 1
                if answer["id"] is None:
                    assert nulls and answer["error"]["code"] == nulls.pop(0), (answer, nulls)
                else:
                    assert answer["id"] in pending, f"unexpected or repeated answer: {answer}"
                    pending.discard(answer["id"])
            assert proc.poll() is None, "the server died"

        batch()
        rss_after = _rss_mb(proc.pid)
        print(f"fuzz: {dict(counts)}; server memory {rss_before:.0f} -> {rss_after:.0f} MB")
        print("internal errors:", *sorted(set(internal)), sep="\n  ")
        assert counts["messages"] >= 2000
        assert rss_after - rss_before < MEMORY_GROWTH_MB, (rss_before, rss_after)
        wire.notify("textDocument/didClose", {"textDocument": {"uri": fuzz_uri}})
        done = _complete(wire, (tmp_path / "after.py").as_uri(), "after")
        item = done["result"]["items"][0]
        assert isinstance(item["insertText"], str) and item["insertText"], done
        assert "error" not in wire.request("bye", "shutdown", None)
        wire.notify("exit", None)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def _parsed(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def _runs_a_task(msg: dict) -> bool:
    params = msg.get("params")
    command = params.get("command") if isinstance(params, dict) else None
    return isinstance(command, str) and command in TASK_COMMANDS
