"""A replay engine: it stands in for the model only, emitting a recorded sequence of turns.

Each turn is the raw text of an assistant turn in our chat format (tool calls written with
`<tool_call>...</tool_call>`), parsed exactly as the real backends parse it; or an exception
instance, raised by `generate` to test engine failures. It implements the Engine Protocol, and
records every request it received so tests can check what the model was shown. A warm-up (one
token in the prefetch lane: the language server prefilling a prompt) uses no turn.
"""

from __future__ import annotations

import json
import threading

from agent.chat_format import ARG, TOOL_CALL, TOOL_CALL_END, parse_assistant
from agent.engine import Completion, Request, RequestMetrics, Result, Stream


def call(name: str, **arguments) -> str:
    """One tool call as the model writes it (agent/chat_format.py): raw string values, other
    values as JSON, `hunks` as search/replace pairs."""
    text = f"{TOOL_CALL}{name}\n"
    for key, value in arguments.items():
        if key == "hunks" and isinstance(value, list):
            for hunk in value:
                text += f"{ARG}search\n{hunk['search']}\n{ARG}replace\n{hunk['replace']}\n"
        else:
            shown = value if isinstance(value, str) else json.dumps(value)
            text += f"{ARG}{key}\n{shown}\n"
    return text + TOOL_CALL_END


class ReplayEngine:
    def __init__(
        self, turns: list, context_length: int = 32_768, version: str = "replay-1"
    ) -> None:
        self.turns = list(turns)
        self.requests: list[Request] = []
        self._context_length = context_length
        self._version = version
        self._lock = threading.Lock()

    @property
    def model_version(self) -> str:
        return self._version

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def show_min_confidence(self) -> float | None:
        return None  # recorded turns: every suggestion is shown

    def generate(self, request: Request) -> Result:
        with self._lock:
            self.requests.append(request)
            if request.priority == "prefetch" and request.params.max_tokens == 1:
                return _prefilled(request, self._version)  # a warm-up: it uses no turn
            if not self.turns:
                raise AssertionError("the replay engine ran out of recorded turns")
            turn = self.turns.pop(0)
        if isinstance(turn, BaseException):
            raise turn
        if callable(turn):
            turn = turn(request)
        content, calls, errors = (
            parse_assistant(turn, request.tools) if request.tools else (turn, [], [])
        )
        ids = list(turn.encode("utf-8", "surrogatepass"))[:4096]
        prompt_chars = len(json.dumps(request.messages)) + len(json.dumps(request.tools or []))
        metrics = RequestMetrics(
            prompt_tokens=prompt_chars // 4, output_tokens=len(ids), total_s=0.001
        )
        comp = Completion(
            text=turn,
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            finish_reason="stop",
            tool_calls=calls,
            tool_call_errors=errors,
            model_version=self._version,
        )
        return Result([comp], metrics)

    def stream(self, request: Request) -> Stream:  # pragma: no cover - the harness uses generate
        raise NotImplementedError

    def swap(self, model: str) -> str:
        self._version = model
        return model

    def close(self) -> None:
        pass


def _prefilled(request: Request, version: str) -> Result:
    """The answer to a prompt the server only prefills (lsp/completion.py `warm`): one token."""
    comp = Completion(
        text="", token_ids=[0], logprobs=None, finish_reason="length", model_version=version
    )
    return Result([comp], RequestMetrics(prompt_tokens=len(str(request.prompt)) // 4))
