"""Test-only launcher: `flywheel lsp` with a replay engine in place of the model.

    python -m tests.lsp.replay_server --model replay --db T.db --manual-clock

It runs the shipped server (lsp.cli.main) unchanged, except that the engine host already holds a
`ReplayEngine` (tests/harness/replay.py) for the model setting `replay`, and one extra request
loads the turns the model will emit next:

    flywheel/test/replay  {"turns": [TURN, ...]} -> {"loaded": n}
    TURN: the raw text of an assistant turn (tool calls as <|tool_call|>...<|/tool_call|>), or
          {"error": "message"} (the engine raises EngineError), or
          {"waitForCancel": true} (the turn blocks until the request is cancelled, then answers)

The agent harness, tools, workspace, server and telemetry are the real ones. This file lives in
tests/ on purpose: no test double ships in the package.
"""

from __future__ import annotations

import sys
import threading

from agent.engine import EngineError, Request
from lsp.cli import main as lsp_main
from lsp.server import SERVER, plain
from lsp.settings import ModelSettings
from tests.harness.replay import ReplayEngine

ENGINE = ReplayEngine([], context_length=32_768, version="replay-1")


def _wait_for_cancel(request: Request) -> str:
    cancel = request.cancel or threading.Event()
    cancel.wait(timeout=60)
    return "(stopped)"


def _turn(raw):
    if isinstance(raw, dict) and "error" in raw:
        return EngineError(str(raw["error"]))
    if isinstance(raw, dict) and raw.get("waitForCancel"):
        return _wait_for_cancel
    return str(raw)


@SERVER.feature("flywheel/test/replay")
def load_turns(ls, params) -> dict:
    turns = [_turn(t) for t in (plain(params) or {}).get("turns", [])]
    with ENGINE._lock:
        ENGINE.turns[:] = turns
    return {"loaded": len(turns)}


def main(argv: list[str]) -> int:
    SERVER.host.engine = ENGINE
    SERVER.host.settings = ModelSettings(name="replay")
    return lsp_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
