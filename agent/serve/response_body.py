"""Engine `Result`s and `Delta`s -> response bodies: whole responses, SSE chunks, error bodies.

OpenAI's wire shapes, plus `metrics` (the engine's `RequestMetrics`) beside `usage`, the model
version as `system_fingerprint` (a stream's last chunks and a whole response name the weights
that wrote it: a fast-apply chat's is the apply adapter's version), and `token_ids` on each
choice when the request asked with `return_token_ids`. Logprob tokens are named `token_id:N`
because the engine speaks token ids. Chat text is cut at the first tool call; the calls become
`tool_calls`.
"""

import time
from collections.abc import Iterator
from typing import Any

from agent.chat_format import END, TOOL_CALL, tool_calls_to_openai
from agent.engine import Completion, Delta, Request, RequestMetrics, Result


def _finish(reason: str | None) -> str | None:
    return "abort" if reason == "cancelled" else reason  # vLLM's word for it


def _usage(metrics: RequestMetrics) -> dict:
    """OpenAI's usage object, with the prefix cache's hits as `prompt_tokens_details`."""
    return {
        "prompt_tokens": metrics.prompt_tokens,
        "completion_tokens": metrics.output_tokens,
        "total_tokens": metrics.prompt_tokens + metrics.output_tokens,
        "prompt_tokens_details": {"cached_tokens": metrics.cached_tokens},
    }


def _logprobs(chat: bool, token_ids: list[int], logprobs: list[float] | None) -> dict | None:
    if logprobs is None:
        return None
    tokens = [f"token_id:{t}" for t in token_ids]
    if chat:
        return {
            "content": [
                {"token": t, "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(tokens, logprobs, strict=False)
            ]
        }
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": None}


class ChatContent:
    """The visible part of one streamed assistant turn: text before its first tool call.

    Text that may be the start of `<tool_call>` or `<|im_end|>` is held back until the next piece
    shows what it is, so that markup never reaches the client; `<tool_call>...` and everything
    after it become `tool_calls` at the end.
    """

    def __init__(self) -> None:
        self.raw = ""
        self.sent = 0

    def feed(self, text: str, final: bool = False) -> str:
        self.raw += text
        visible = self.raw.replace(END, "")
        cut = visible.find(TOOL_CALL)
        if cut >= 0:
            visible = visible[:cut]
        elif not final:
            visible = visible[: len(visible) - _partial_marker(visible)]
        new = visible[self.sent :]
        self.sent = max(self.sent, len(visible))
        return new


def _partial_marker(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    for n in range(min(len(text), len(TOOL_CALL) - 1), 0, -1):
        tail = text[-n:]
        if TOOL_CALL.startswith(tail) or END.startswith(tail):
            return n
    return 0


def chat_content(text: str) -> str:
    return ChatContent().feed(text, final=True)


class ResponseShape:
    """Builds the JSON bodies of one request: a whole response or its stream of chunks."""

    def __init__(self, request: Request, body: dict, model: str, version: str) -> None:
        self.chat = request.messages is not None
        self.id = request.request_id
        self.model = model
        self.version = version
        self.created = int(time.time())
        self.token_ids = bool(body.get("return_token_ids"))
        self.logprobs = request.params.logprobs
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.content: dict[int, ChatContent] = {}

    def _envelope(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (
            ".chunk" if chunk and self.chat else ""
        )
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.version,
        }

    def _choice(self, c: Completion) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": c.index}
        finish = _finish(c.finish_reason)
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": chat_content(c.text)}
            if c.tool_calls:
                message["tool_calls"] = tool_calls_to_openai(c.tool_calls)
                message["content"] = message["content"] or None
                finish = "tool_calls" if c.finish_reason == "stop" else finish
            if c.tool_call_errors:
                message["tool_call_errors"] = c.tool_call_errors
            choice["message"] = message
        else:
            choice["text"] = c.text
        choice["logprobs"] = _logprobs(
            self.chat, c.token_ids, c.logprobs if self.logprobs else None
        )
        choice["finish_reason"] = finish
        if self.token_ids:
            choice["token_ids"] = c.token_ids
        return choice

    def _finished(self, result: Result) -> None:
        """The fingerprint from here on names the weights that wrote the result (a fast-apply
        request is decoded by the model's apply adapter, which has a version of its own)."""
        versions = {c.model_version for c in result.completions if c.model_version}
        if len(versions) == 1:
            self.version = versions.pop()

    def response(self, result: Result) -> dict[str, Any]:
        self._finished(result)
        return {
            **self._envelope(chunk=False),
            "choices": [self._choice(c) for c in result.completions],
            "usage": _usage(result.metrics),
            "metrics": result.metrics.as_dict(),
        }

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        return {**self._envelope(chunk=True), "choices": [choice]}

    def start(self, n: int) -> Iterator[dict[str, Any]]:
        if self.chat:
            for i in range(n):
                yield self._chunk({"index": i, "delta": {"role": "assistant", "content": ""}})

    def delta(self, d: Delta) -> Iterator[dict[str, Any]]:
        logprobs = _logprobs(self.chat, d.token_ids, d.logprobs if self.logprobs else None)
        choice: dict[str, Any] = {"index": d.index}
        if self.chat:  # the finish reason waits for the result, which holds the tool calls
            text = self.content.setdefault(d.index, ChatContent()).feed(d.text)
            choice.update(delta={"content": text} if text else {}, logprobs=logprobs)
            choice["finish_reason"] = None
        else:
            choice.update(text=d.text, logprobs=logprobs, finish_reason=_finish(d.finish_reason))
        if self.token_ids:
            choice["token_ids"] = d.token_ids
        if choice.get("delta") or choice.get("text") or d.token_ids or choice["finish_reason"]:
            yield self._chunk(choice)

    def end(self, result: Result) -> Iterator[dict[str, Any]]:
        self._finished(result)
        if self.chat:
            for c in result.completions:
                delta: dict[str, Any] = {}
                rest = self.content.setdefault(c.index, ChatContent()).feed("", final=True)
                if rest:
                    delta["content"] = rest
                if c.tool_calls:
                    delta["tool_calls"] = [
                        {"index": k, **call}
                        for k, call in enumerate(tool_calls_to_openai(c.tool_calls))
                    ]
                if c.tool_call_errors:
                    delta["tool_call_errors"] = c.tool_call_errors
                finish = _finish(c.finish_reason)
                if c.tool_calls and c.finish_reason == "stop":
                    finish = "tool_calls"
                yield self._chunk({"index": c.index, "delta": delta, "finish_reason": finish})
        if self.include_usage:
            yield {
                **self._envelope(chunk=True),
                "choices": [],
                "usage": _usage(result.metrics),
                "metrics": result.metrics.as_dict(),
            }


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None):
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
