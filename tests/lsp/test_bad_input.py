"""Bad input over the wire: the server answers with the right error code or nothing, says so
once, and keeps serving. Driven by raw JSON-RPC frames, so malformed bytes can be sent."""

from __future__ import annotations

import asyncio
import json

from tests.lsp.conftest import server_command


class Wire:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.next_id = 0
        self.seen: list[dict] = []

    @classmethod
    async def spawn(cls, *cmd: str) -> Wire:
        """The server `cmd` starts, its stdio piped to a new Wire (`.proc` is the process)."""
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    def send_raw(self, body: bytes) -> None:
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def send(self, method: str, params=None, request: bool = True) -> int | None:
        msg = {"jsonrpc": "2.0", "method": method, "params": params}
        if request:
            self.next_id += 1
            msg["id"] = self.next_id
        self.send_raw(json.dumps(msg).encode())
        return msg.get("id")

    async def read(self) -> dict:
        length = 0
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                raise EOFError("server closed its output")
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
            elif line in (b"\r\n", b"\n") and length:
                msg = json.loads(await self.proc.stdout.readexactly(length))
                self.seen.append(msg)
                return msg

    async def answer(self, msg_id) -> dict:
        """Read until the response to `msg_id` (id None: the parse error) arrives."""
        while True:
            msg = await self.read()
            if "method" not in msg and "id" in msg and msg["id"] == msg_id:
                return msg
            if msg.get("method") in ("window/workDoneProgress/create", "workspace/configuration"):
                self.send_raw(
                    json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": None}).encode()
                )


def inline(uri: str, line: int = 0, character: int = 0) -> dict:
    return {
        "textDocument": {"uri": uri},
        "position": {"line": line, "character": character},
        "context": {"triggerKind": 1},
    }


async def test_bad_input_never_stops_the_server(tmp_path):
    cmd = server_command("--model", str(tmp_path / "no-such-checkpoint"), "--consent", "off")
    wire = await Wire.spawn(*cmd)
    proc = wire.proc
    try:
        await asyncio.wait_for(_scenario(wire, tmp_path), timeout=120)
    finally:
        proc.kill()
        await proc.wait()
    stderr = (await proc.stderr.read()).decode()
    assert stderr.count("not valid JSON") == 1, "a malformed message is logged once"
    assert stderr.count("cannot open model") == 1, "an engine failure is logged once"


async def _scenario(wire: Wire, tmp_path) -> None:
    rid = wire.send("initialize", {"processId": None, "capabilities": {}, "rootUri": None})
    assert "capabilities" in (await wire.answer(rid))["result"]
    wire.send("initialized", {}, request=False)

    wire.send_raw(b"{this is not json")
    wire.send_raw(b"{also not json")
    err = await wire.answer(None)
    assert err["error"]["code"] == -32700

    rid = wire.send("flywheel/noSuchMethod", {})
    assert (await wire.answer(rid))["error"]["code"] == -32601

    rid = wire.send("textDocument/inlineCompletion", inline((tmp_path / "never.py").as_uri()))
    assert (await wire.answer(rid))["result"] is None

    rid = wire.send(
        "workspace/executeCommand",
        {"command": "flywheel.ask", "arguments": [{"uri": "file:///nope.py"}]},
    )
    answer = await wire.answer(rid)
    assert answer["error"]["code"] == -32602 and "not open" in answer["error"]["message"]

    big = (tmp_path / "big.py").as_uri()
    text = ("x = 1  # 中文😀\n" * 400_000)[:5_000_000]
    wire.send(
        "textDocument/didOpen",
        {"textDocument": {"uri": big, "languageId": "python", "version": 1, "text": text}},
        request=False,
    )
    binary = (tmp_path / "blob.bin").as_uri()
    wire.send(
        "textDocument/didOpen",
        {
            "textDocument": {
                "uri": binary,
                "languageId": "",
                "version": 1,
                "text": "\x00\x01\x02ELF",
            }
        },
        request=False,
    )
    rid = wire.send("textDocument/inlineCompletion", inline(binary, 0, 3))
    assert (await wire.answer(rid))["result"] is None
    for _ in range(2):  # the engine cannot open: nothing, and the user is told once
        rid = wire.send("textDocument/inlineCompletion", inline(big, 200_000, 5))
        assert (await wire.answer(rid))["result"] is None

    rid = wire.send("workspace/executeCommand", {"command": "flywheel.status", "arguments": []})
    status = (await wire.answer(rid))["result"]
    assert status["state"] == "error" and "cannot open model" in status["message"]
    shown = [m for m in wire.seen if m.get("method") == "window/showMessage"]
    assert sum("cannot open model" in m["params"]["message"] for m in shown) == 1

    rid = wire.send("shutdown", None)
    assert "error" not in await wire.answer(rid)
    wire.send("exit", None, request=False)
