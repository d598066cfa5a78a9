"""The JSON-RPC envelope: every request with an id gets an answer with the code the
specification names, and a client whose workspace/configuration reply does not fit leaves the
settings as they are, logged once, with nothing waiting for a timeout. Raw frames over stdio."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.lsp.conftest import server_command
from tests.lsp.test_bad_input import Wire, inline


async def _start(tmp_path, configuration_reply=None) -> tuple[asyncio.subprocess.Process, Wire]:
    """A server with a model that cannot open (no weights load); `configuration_reply`: the raw
    JSON-RPC reply (without id) given to workspace/configuration."""
    cmd = server_command("--model", str(tmp_path / "no-such-checkpoint"), "--consent", "off")
    wire = await Wire.spawn(*cmd)
    proc = wire.proc
    caps = {"workspace": {"configuration": configuration_reply is not None}}
    rid = wire.send("initialize", {"processId": None, "capabilities": caps, "rootUri": None})
    assert "capabilities" in (await wire.answer(rid))["result"]
    wire.send("initialized", {}, request=False)
    return proc, wire


async def _stop(proc: asyncio.subprocess.Process, wire: Wire) -> str:
    rid = wire.send("shutdown", None)
    assert "error" not in await wire.answer(rid)
    wire.send("exit", None, request=False)
    await asyncio.wait_for(proc.wait(), timeout=60)
    return (await proc.stderr.read()).decode()


async def test_invalid_params_and_bad_envelopes_get_an_answer(tmp_path):
    """`textDocument/inlineCompletion` with `{"garbage": true}` was never answered: pygls lost
    the id while decoding and the client waited forever."""
    proc, wire = await _start(tmp_path)
    try:
        rid = wire.send("textDocument/inlineCompletion", {"garbage": True})
        error = (await wire.answer(rid))["error"]
        assert error["code"] == -32602 and "textDocument/inlineCompletion" in error["message"]

        rid = wire.send("textDocument/hover", {"garbage": True})  # a method we do not have
        assert (await wire.answer(rid))["error"]["code"] == -32601

        def raw(message) -> None:
            wire.send_raw(json.dumps(message).encode())

        raw({"jsonrpc": "2.0", "id": [1], "method": "flywheel/debug/flush", "params": {}})
        assert (await wire.answer(None))["error"]["code"] == -32600  # an id that is no id
        raw({"jsonrpc": "1.0", "id": 9001, "method": "workspace/executeCommand", "params": {}})
        assert (await wire.answer(9001))["error"]["code"] == -32600
        raw({"jsonrpc": "2.0", "id": 9002, "method": 42})
        assert (await wire.answer(9002))["error"]["code"] == -32600
        raw({"jsonrpc": "2.0", "id": 9003, "method": "textDocument/didClose", "params": {}})
        answer = await wire.answer(9003)  # a notification's method sent as a request
        assert answer["error"]["code"] in (-32600, -32602)
        for message in ([1, 2], "text", {"jsonrpc": "2.0"}):
            raw(message)
            assert (await wire.answer(None))["error"]["code"] == -32600
        wire.send_raw(b"\xff\xfe not utf-8")
        assert (await wire.answer(None))["error"]["code"] == -32700
        wire.send_raw(b"[" * 100_000)  # deeper than the parser goes
        assert (await wire.answer(None))["error"]["code"] == -32700
        raw({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"x": 1}})  # dropped

        rid = wire.send("textDocument/inlineCompletion", inline((tmp_path / "a.py").as_uri()))
        assert (await wire.answer(rid))["result"] is None  # still serving

        rid = wire.send("shutdown", None)
        assert "error" not in await wire.answer(rid)
        rid = wire.send("workspace/executeCommand", {"command": "flywheel.status"})
        assert (await wire.answer(rid))["error"]["code"] == -32600  # after shutdown
        wire.send("exit", None, request=False)
        await asyncio.wait_for(proc.wait(), timeout=60)
        stderr = (await proc.stderr.read()).decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert "Unable to deserialize" not in stderr, stderr  # pygls' traceback per unfit message


@pytest.mark.parametrize(
    "reply",
    [{"result": None}, {"error": "garbage"}, {"result": [5]}, {"result": {"a": 1}}],
    ids=["null", "bad-error", "not-an-object", "not-a-list"],
)
async def test_a_configuration_reply_that_does_not_fit_means_defaults(tmp_path, reply):
    """A client answering workspace/configuration with `null` made initialization wait 10 s and
    log an empty warning with a traceback."""
    proc, wire = await _start(tmp_path, configuration_reply=reply)
    try:
        while True:  # answer the server's requests until its first status: initialized is done
            msg = await wire.read()
            if msg.get("method") == "workspace/configuration":
                body = {"jsonrpc": "2.0", "id": msg["id"], **reply}
                wire.send_raw(json.dumps(body).encode())
            elif msg.get("method") == "flywheel/status":
                break
            elif "id" in msg and "method" in msg:
                wire.send_raw(
                    json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": None}).encode()
                )
        stderr = await _stop(proc, wire)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    lines = [line for line in stderr.splitlines() if "workspace/configuration" in line]
    assert len(lines) == 1 and "using the defaults" in lines[0], stderr
    assert "no answer within" not in lines[0]  # it failed at once, not at the timeout
    assert "Traceback" not in stderr, stderr
