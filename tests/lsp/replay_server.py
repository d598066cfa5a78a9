"""Test-only launcher: `flywheel lsp` with a replay engine in place of the model.

    python -m tests.lsp.replay_server --model replay --db T.db --manual-clock

It runs the shipped server (lsp.cli.main) unchanged, except that the engine host already holds a
`ReplayEngine` (tests/harness/replay.py) for the model setting `replay`, and one extra request
loads the turns the model will emit next:

    flywheel/test/replay  {"turns": [TURN, ...]} -> {"loaded": n}
    flywheel/test/requests  {} -> {"requests": [{priority, maxTokens, prompt}, ...]}: the prompt
                          requests the model received so far
    TURN: the raw text of an assistant turn (tool calls as <tool_call>...</tool_call>), or
          {"error": "message"} (the engine raises EngineError), or
          {"waitForCancel": true} (the turn blocks until the request is cancelled, then answers;
          it prints "replay: waiting for cancel" to stderr when it starts, for tests to wait on,
          and `flywheel/test/held` answers while it runs)
          {"waitForRelease": true, "text": T} (the turn blocks until `flywheel/test/release`,
          then answers T: the test changes the document while the model runs;
          `flywheel/test/held` answers once such a turn is running)

Launcher flags for clients that cannot send that request (the editor tiers):
    --turns FILE        a JSON list of TURNs to load at start
    --completion TEXT   answer inline-completion prompts that end with a block opener (a line
                        ending in ':', where the scripted sessions ask) with TEXT and others with
                        nothing, so that ghost text shows only where a test expects it and the
                        editor's own completion requests do not use up the agent's turns
    --next-edit OLD=>NEW
                        answer every next-edit prompt with its region, OLD replaced by NEW (the
                        first occurrence): the edit a model would predict next
    --requests-log FILE with either of the two: one JSON line per prompt request the model gets
                        ({priority, maxTokens}), for the tiers that cannot ask
                        flywheel/test/requests

The agent harness, tools, workspace, server and telemetry are the real ones. This file lives in
tests/ on purpose: no test double ships in the package.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path

from agent.chat_format import FIM_PREFIX, FIM_SUFFIX
from agent.engine import Completion, EngineError, Request, RequestMetrics, Result
from lsp.cli import main as lsp_main
from lsp.next_edit import REGION_CLOSE, REGION_OPEN
from lsp.protocol import plain
from lsp.server import SERVER
from lsp.settings import ModelSettings
from tests.harness.replay import ReplayEngine

ENGINE = ReplayEngine([], context_length=32_768, version="replay-1")


RELEASE = threading.Event()
HELD = threading.Event()  # a waitForRelease or waitForCancel turn is running


def _wait_for_cancel(request: Request) -> str:
    print("replay: waiting for cancel", file=sys.stderr, flush=True)
    cancel = request.cancel or threading.Event()
    HELD.set()
    cancel.wait(timeout=60)
    HELD.clear()
    return "(stopped)"


def _released(text: str):
    def turn(request: Request) -> str:
        HELD.set()
        RELEASE.wait(timeout=60)
        HELD.clear()
        RELEASE.clear()
        return text

    return turn


@SERVER.feature("flywheel/test/held")
async def held(ls, params) -> dict:
    """Answers once a waitForRelease or waitForCancel turn is running (the model is busy)."""
    await asyncio.get_running_loop().run_in_executor(None, HELD.wait, 60)
    return {"held": HELD.is_set()}


@SERVER.feature("flywheel/test/release")
def release(ls, params) -> dict:
    RELEASE.set()
    return {"released": True}


def _turn(raw):
    if isinstance(raw, dict) and "error" in raw:
        return EngineError(str(raw["error"]))
    if isinstance(raw, dict) and raw.get("waitForCancel"):
        return _wait_for_cancel
    if isinstance(raw, dict) and raw.get("waitForRelease"):
        return _released(str(raw.get("text", "")))
    return str(raw)


@SERVER.feature("flywheel/test/requests")
def requests_seen(ls, params) -> dict:
    """What the model was asked so far: each request's lane, token budget and prompt."""
    with ENGINE._lock:
        seen = list(ENGINE.requests)
    return {
        "requests": [
            {"priority": r.priority, "maxTokens": r.params.max_tokens, "prompt": r.prompt}
            for r in seen
            if isinstance(r.prompt, str)
        ]
    }


@SERVER.feature("flywheel/test/replay")
def load_turns(ls, params) -> dict:
    turns = [_turn(t) for t in (plain(params) or {}).get("turns", [])]
    with ENGINE._lock:
        ENGINE.turns[:] = turns
    return {"loaded": len(turns)}


class _PromptsAnswered:
    """ENGINE, except that prompt requests get fixed answers: `completion` for inline
    completions; for next-edit prompts, the region with `rewrite` (old, new) applied."""

    def __init__(
        self, completion: str | None, rewrite: tuple[str, str] | None, log: str | None = None
    ) -> None:
        self.completion = completion
        self.rewrite = rewrite
        self.log = Path(log) if log else None

    def __getattr__(self, name: str):
        return getattr(ENGINE, name)

    def _answer(self, prompt: str) -> str | None:
        if prompt.endswith(REGION_OPEN + "\n"):  # next_edit.build_prompt: the region, then again
            if self.rewrite is None:
                return None
            region = prompt.rsplit(REGION_OPEN + "\n", 2)[-2].split(REGION_CLOSE)[0]
            return region.replace(*self.rewrite, 1) + REGION_CLOSE
        if self.completion is None:
            return None
        # the text before the cursor: a fill-in-the-middle prompt's prefix, or the whole prompt
        before = prompt.rsplit(FIM_PREFIX, 1)[-1].split(FIM_SUFFIX, 1)[0]
        return self.completion if before.rstrip().endswith(":") else ""

    def generate(self, request: Request) -> Result:
        if self.log is not None and isinstance(request.prompt, str):
            row = {"priority": request.priority, "maxTokens": request.params.max_tokens}
            with self.log.open("a") as f:
                f.write(json.dumps(row) + "\n")
        text = self._answer(request.prompt) if isinstance(request.prompt, str) else None
        if text is None:
            return ENGINE.generate(request)
        ids = list(text.encode("utf-8"))
        comp = Completion(
            text=text,
            token_ids=ids,
            logprobs=None,
            finish_reason="stop",
            model_version=ENGINE.model_version,
        )
        return Result([comp], RequestMetrics(prompt_tokens=1, output_tokens=len(ids)))


def _pop_flag(argv: list[str], flag: str) -> str | None:
    if flag not in argv:
        return None
    i = argv.index(flag)
    value = argv[i + 1]
    del argv[i : i + 2]
    return value


def main(argv: list[str]) -> int:
    argv = list(argv)
    turns_file = _pop_flag(argv, "--turns")
    completion = _pop_flag(argv, "--completion")
    rule = _pop_flag(argv, "--next-edit")
    rewrite = tuple(rule.split("=>", 1)) if rule else None
    log = _pop_flag(argv, "--requests-log")
    if turns_file:
        ENGINE.turns[:] = [_turn(t) for t in json.loads(Path(turns_file).read_text())]
    answered = completion is not None or rewrite is not None
    SERVER.host.engine = _PromptsAnswered(completion, rewrite, log) if answered else ENGINE
    SERVER.host.settings = ModelSettings(name="replay")
    return lsp_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
