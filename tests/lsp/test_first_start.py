"""A new user's first start: an empty cache, the base converted while the editor waits.

`flywheel lsp` runs as a subprocess (tests/lsp/first_start_server.py: the shipped command with a
tiny stand-in base, converted by the real code path) and is driven by a raw LSP client that
keeps every byte the server writes to stdout. The conversion must show as work-done progress with
percentages (created first) and as log lines, and stdout must hold nothing but well-framed LSP
messages, although the stand-in reader prints to stdout and writes to file descriptor 1.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.lsp import first_start_server
from tests.lsp.first_start_server import NOISE_FD, NOISE_PRINT

pytestmark = pytest.mark.asyncio(loop_scope="function")
WAIT_S = 120  # a hang guard only: every wait below ends on an event


def parse_frames(data: bytes) -> list[dict[str, Any]]:
    """Every message in `data`; fails on any byte that is not part of a well-formed frame."""
    messages, at = [], 0
    while at < len(data):
        end = data.find(b"\r\n\r\n", at)
        assert end >= 0, f"bytes outside any LSP frame at {at}: {data[at : at + 80]!r}"
        headers = dict(line.split(": ", 1) for line in data[at:end].decode("ascii").split("\r\n"))
        assert set(headers) <= {"Content-Length", "Content-Type"}, headers
        length = int(headers["Content-Length"])
        body = data[end + 4 : end + 4 + length]
        assert len(body) == length, "a frame is cut short"
        message = json.loads(body)
        assert message.get("jsonrpc") == "2.0", message
        messages.append(message)
        at = end + 4 + length
    return messages


class RawClient:
    """The editor's side of stdio, keeping the raw bytes; answers the server's requests."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.raw = bytearray()
        self.messages: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self._next_id = 0
        self.reader = asyncio.ensure_future(self._read())

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def request(self, method: str, params: Any) -> int:
        self._next_id += 1
        self.send({"id": self._next_id, "method": method, "params": params})
        return self._next_id

    async def _read(self) -> None:
        try:
            await self._read_frames()
        finally:
            self.changed.set()

    async def _read_frames(self) -> None:
        done = 0
        while chunk := await self.proc.stdout.read(65536):
            self.raw += chunk
            while True:  # hand complete frames on as they arrive; parse_frames checks them all
                end = self.raw.find(b"\r\n\r\n", done)
                if end < 0:
                    break
                headers = dict(h.split(b": ", 1) for h in bytes(self.raw[done:end]).split(b"\r\n"))
                length = int(headers[b"Content-Length"])
                if len(self.raw) < end + 4 + length:
                    break
                message = json.loads(self.raw[end + 4 : end + 4 + length])
                done = end + 4 + length
                self.messages.append(message)
                self._answer(message)
                self.changed.set()

    def _answer(self, message: dict[str, Any]) -> None:
        if "id" not in message or "method" not in message:
            return
        result: Any = None
        if message["method"] == "workspace/configuration":
            result = [None for _ in message["params"]["items"]]
        self.send({"id": message["id"], "result": result})

    async def until(self, check) -> Any:
        """The first message `check` accepts, waiting for more as they arrive."""
        while True:
            self.changed.clear()
            for m in self.messages:
                if check(m):
                    return m
            if self.reader.done():
                self.reader.result()  # a reader that failed fails the test here
                raise AssertionError("the server closed stdout before the awaited message")
            await self.changed.wait()


def is_status(state: str):
    return lambda m: m.get("method") == "flywheel/status" and m["params"]["state"] == state


async def test_first_start_shows_conversion_progress_and_stdout_is_only_lsp(
    tmp_path: Path, tiny_checkpoint: Path
):
    cache = tmp_path / "cache"
    env = {**os.environ, "FLYWHEEL_CACHE": str(cache), "PYTHONPATH": str(Path.cwd())}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        *first_start_server.arguments(tiny_checkpoint, tmp_path / "t.db"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    stderr = asyncio.ensure_future(proc.stderr.read())
    client = RawClient(proc)
    try:
        init = client.request(
            "initialize",
            {
                "processId": os.getpid(),
                "rootUri": None,
                "capabilities": {"window": {"workDoneProgress": True}},
                "clientInfo": {"name": "first-start-test"},
            },
        )
        await asyncio.wait_for(client.until(lambda m: m.get("id") == init), WAIT_S)
        client.send({"method": "initialized", "params": {}})
        await asyncio.wait_for(client.until(is_status("idle")), WAIT_S)  # the model is ready
        bye = client.request("shutdown", None)
        await asyncio.wait_for(client.until(lambda m: m.get("id") == bye), WAIT_S)
        client.send({"method": "exit", "params": None})
        proc.stdin.close()
        await asyncio.wait_for(client.reader, WAIT_S)
        await asyncio.wait_for(proc.wait(), WAIT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
    err = (await stderr).decode()

    messages = parse_frames(bytes(client.raw))  # every byte of stdout is LSP framing
    assert NOISE_PRINT in err and NOISE_FD in err  # the noise went to stderr, not away
    methods = [m.get("method") for m in messages]
    created = methods.index("window/workDoneProgress/create")
    token = messages[created]["params"]["token"]
    progress = [
        m["params"]["value"]
        for m in messages
        if m.get("method") == "$/progress" and m["params"]["token"] == token
    ]
    assert methods.index("$/progress") > created
    kinds = [p["kind"] for p in progress]
    assert kinds[0] == "begin" and kinds[-1] == "end" and "report" in kinds
    percentages = [p["percentage"] for p in progress if "percentage" in p]
    assert percentages == sorted(percentages) and len(set(percentages)) >= 3
    assert all(0 <= p <= 100 for p in percentages)
    logs = [m["params"]["message"] for m in messages if m.get("method") == "window/logMessage"]
    assert any("preparing the model: 100%" in line for line in logs)
    assert (cache / "base" / "tiny-first-base" / "flywheel.json").is_file()
    # the progress ended before the server said the model was ready
    assert methods.index("flywheel/status") < len(methods)
    ready = next(i for i, m in enumerate(messages) if is_status("idle")(m))
    ended = max(i for i, m in enumerate(messages) if m.get("method") == "$/progress")
    assert ended < ready
    # the statuses carry the same preparation while loading (VS Code draws it as a notification)
    statuses = [m["params"] for m in messages if m.get("method") == "flywheel/status"]
    shown = [s["progress"]["percentage"] for s in statuses if "progress" in s]
    assert shown == sorted(shown) and len(set(shown)) >= 3 and max(shown) < 100
    assert all(s["state"] == "loading" for s in statuses if "progress" in s)
    assert "progress" not in statuses[-1]
    assert proc.returncode == 0
