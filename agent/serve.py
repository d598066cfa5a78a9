"""`flywheel serve`: an OpenAI-compatible HTTP server over any engine backend.

    flywheel serve --model path/to/checkpoint --speculative ngram --port 8000
    curl http://127.0.0.1:8000/v1/completions -d '{"prompt": "def add(a, b):", "max_tokens": 32}'

Endpoints: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions` (both with SSE
streaming; chat with tools and tool calls in OpenAI's wire shape), `GET /metrics` (Prometheus text:
requests, tokens, speculative-decoding counters) and `GET /health`. With `--api-key`, every route
but `/health` needs `Authorization: Bearer KEY`. It binds 127.0.0.1 unless told otherwise.

Beyond OpenAI's fields, requests may carry `speculation` (text the output should resemble, e.g. the
original file of an apply request), `top_k`, `stop_token_ids` and `return_token_ids` (vLLM's name:
adds `token_ids` to each choice). Responses add `metrics` (the engine's `RequestMetrics`) beside
`usage`, `system_fingerprint` is the model version, and `/v1/models` entries carry `max_model_len`
and `version`. Logprob tokens are named `token_id:N` (vLLM's `return_tokens_as_token_ids`
convention) because the engine interface speaks token ids, not token strings.

Bad requests get OpenAI-style JSON errors with status 400 and a message naming the problem; engine
failures get 500; neither stops the server. The engine's blocking calls run in worker threads, and a
client that disconnects cancels its request (`Request.cancel`).

Not here: several prompts in one request (send one request per prompt; `n` samples are fine),
penalties and `logit_bias` (rejected with 400), embeddings, swapping weights over HTTP.

`--model registry` serves the promoted version of the model registry (agent/registry.py) and
follows it: a promotion or rollback is picked up within `--reload-interval` seconds, and before
the next request at the latest; requests already running finish on the old weights. Only a
version whose files verify against its manifest is loaded.
"""

# No `from __future__ import annotations`: FastAPI resolves the handlers' annotations, and the
# handlers live inside `build_app` so that `flywheel serve --help` does not import FastAPI.

import argparse
import errno
import json
import logging
import secrets
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from agent.chat_format import END, TOOL_CALL, tool_calls_to_openai
from agent.engine import (
    BadRequest,
    Cancelled,
    Completion,
    Delta,
    Engine,
    EngineConfig,
    EngineError,
    Request,
    RequestMetrics,
    Result,
    SamplingParams,
    SpeculativeConfig,
    Stream,
)
from agent.registry import Registry, RegistryError, RegistryWatcher, path_from_cli

log = logging.getLogger("flywheel.serve")

ROLES = {"system", "user", "assistant", "tool"}
# OpenAI fields we cannot honour; a request that sets them to a non-default value gets a 400
# rather than silently different behaviour.
UNSUPPORTED = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": None,
    "echo": False,
    "best_of": None,
}


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"  # interface to bind; 0.0.0.0 exposes the server to the network
    port: int = 8000  # TCP port
    api_key: str | None = None  # if set, clients must send `Authorization: Bearer <api_key>`
    served_model_name: str = "flywheel"  # the model id in /v1/models and in responses

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise BadRequest(f"port must be in [0, 65535], got {self.port}")


# ---------------------------------------------------------------- request bodies -> Request


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body, or BadRequest naming what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(
            f"request body is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start}); send JSON encoded as UTF-8"
        ) from None
    if not text.strip():
        raise BadRequest("request body is empty; send a JSON object")
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"request body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _number(body: dict, name: str, default: Any, integer: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok:
        kind = "an integer" if integer else "a number"
        raise BadRequest(f"`{name}` must be {kind}, got {value!r}")
    return value


def _text(value: Any, where: str, unicode: bool = True) -> str:
    """A string field; `unicode=False` lets unpaired surrogates through (the engine reads a
    prompt's `\\udc80`..`\\udcff` as raw bytes, Python's surrogateescape)."""
    if not isinstance(value, str):
        raise BadRequest(f"`{where}` must be a string, got {type(value).__name__}")
    if not unicode:
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(
            f"`{where}` is not valid Unicode: unpaired surrogate {value[exc.start]!r} at "
            f"character {exc.start}"
        ) from None
    return value


def _token_ids(value: list, where: str) -> list[int]:
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        raise BadRequest(f"`{where}` must be a string or a list of non-negative token ids")
    return value


def sampling_params(body: dict, chat: bool) -> SamplingParams:
    for name, default in UNSUPPORTED.items():
        if body.get(name) not in (None, default):
            raise BadRequest(f"`{name}` is not supported by flywheel serve; leave it unset")
    if chat:
        logprobs = body.get("logprobs") is True
        max_tokens = _number(body, "max_completion_tokens", None, integer=True)
        max_tokens = _number(body, "max_tokens", max_tokens, integer=True)
    else:  # legacy completions: `logprobs` is a count of alternatives; any count turns them on
        logprobs = _number(body, "logprobs", None, integer=True) is not None
        max_tokens = _number(body, "max_tokens", 16, integer=True)  # OpenAI's default
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list):
        raise BadRequest("`stop` must be a string or a list of strings")
    stop_token_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_token_ids, list):
        raise BadRequest("`stop_token_ids` must be a list of token ids")
    return SamplingParams(
        max_tokens=max_tokens if max_tokens is not None else SamplingParams.max_tokens,
        temperature=float(_number(body, "temperature", 1.0)),
        top_p=float(_number(body, "top_p", 1.0)),
        top_k=_number(body, "top_k", 0, integer=True),
        seed=_number(body, "seed", None, integer=True),
        stop=[_text(s, "stop") for s in stop],
        stop_token_ids=_token_ids(stop_token_ids, "stop_token_ids"),
        n=_number(body, "n", 1, integer=True),
        logprobs=logprobs,
    )


def _speculation(body: dict) -> str | None:
    value = body.get("speculation")
    return None if value is None else _text(value, "speculation")


def completion_request(body: dict, cancel: threading.Event) -> Request:
    """A /v1/completions body as an engine Request."""
    prompt = body.get("prompt")
    if prompt is None:
        raise BadRequest("`prompt` is required: a string or a list of token ids")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, str | list) for p in prompt):
            raise BadRequest(
                f"got a batch of {len(prompt)} prompts; send one prompt per request "
                "(use `n` for several samples of one prompt)"
            )
        prompt = _token_ids(prompt, "prompt")
    else:
        prompt = _text(prompt, "prompt", unicode=False)
    suffix = body.get("suffix")
    if suffix is not None:
        from agent.chat_format import render_fim

        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("`suffix` needs a non-empty text `prompt`")
        prompt = render_fim(prompt, _text(suffix, "suffix"))
    return Request(
        prompt=prompt,
        params=sampling_params(body, chat=False),
        speculation=_speculation(body),
        cancel=cancel,
        request_id=f"cmpl-{uuid.uuid4().hex[:24]}",
    )


def _message(i: int, m: Any) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise BadRequest(f"messages[{i}] must be an object with `role` and `content`")
    role = "system" if m.get("role") == "developer" else m.get("role")
    if role not in ROLES:
        raise BadRequest(
            f"messages[{i}].role must be one of system, user, assistant, tool; got {role!r}"
        )
    content = m.get("content")
    if isinstance(content, list):  # content parts: only text is understood
        if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
            raise BadRequest(f"messages[{i}].content: only text parts are supported")
        content = "".join(_text(p.get("text", ""), f"messages[{i}].content") for p in content)
    elif content is None:
        content = ""
    out: dict[str, Any] = {"role": role, "content": _text(content, f"messages[{i}].content")}
    if m.get("tool_calls"):
        if role != "assistant" or not isinstance(m["tool_calls"], list):
            raise BadRequest(f"messages[{i}].tool_calls must be a list on an assistant message")
        for call in m["tool_calls"]:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise BadRequest(f"messages[{i}].tool_calls: each needs function.name")
        out["tool_calls"] = m["tool_calls"]
    for key in ("tool_call_id", "name"):
        if key in m:
            out[key] = m[key]
    return out


def chat_request(body: dict, cancel: threading.Event) -> Request:
    """A /v1/chat/completions body as an engine Request."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("`messages` must be a non-empty list of {role, content} objects")
    tools = body.get("tools") or None
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        raise BadRequest("`tools` must be a list of tool objects")
    tool_choice = body.get("tool_choice", "auto")
    if tool_choice == "none":
        tools = None
    elif tool_choice != "auto":
        raise BadRequest("`tool_choice` may be 'auto' or 'none'; forcing a tool is not supported")
    return Request(
        messages=[_message(i, m) for i, m in enumerate(messages)],
        tools=tools,
        params=sampling_params(body, chat=True),
        speculation=_speculation(body),
        cancel=cancel,
        request_id=f"chatcmpl-{uuid.uuid4().hex[:24]}",
    )


# ---------------------------------------------------------------- Result -> response bodies


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

    Text that may be the start of `<|tool_call|>` or `<|im_end|>` is held back until the next piece
    shows what it is, so that markup never reaches the client; `<|tool_call|>...` and everything
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

    def response(self, result: Result) -> dict[str, Any]:
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


# ---------------------------------------------------------------- /metrics


class ServerMetrics:
    """Prometheus counters for one server (its own registry, so tests can run several)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "flywheel_requests",
            "HTTP requests by route and status code",
            ["route", "status"],
            registry=r,
        )
        self.cancelled = Counter(
            "flywheel_requests_cancelled", "requests cancelled by a client disconnect", registry=r
        )
        self.running = Gauge("flywheel_requests_running", "requests being generated", registry=r)
        self.prompt_tokens = Counter("flywheel_prompt_tokens", "prompt tokens", registry=r)
        self.cached_tokens = Counter(
            "flywheel_prefix_cache_hit_tokens",
            "prompt tokens read from the prefix cache instead of prefilled",
            registry=r,
        )
        self.output_tokens = Counter("flywheel_generation_tokens", "generated tokens", registry=r)
        self.drafts_proposed = Counter(
            "flywheel_spec_decode_draft_tokens", "draft tokens proposed to the verifier", registry=r
        )
        self.drafts_accepted = Counter(
            "flywheel_spec_decode_accepted_tokens", "draft tokens the verifier kept", registry=r
        )
        self.verify_steps = Counter(
            "flywheel_spec_decode_verify_steps", "target-model passes over drafts", registry=r
        )
        self.mean_acceptance = Gauge(
            "flywheel_spec_decode_mean_acceptance_length",
            "tokens emitted per verify step over the server's life (accepted + 1)",
            registry=r,
        )
        self.ttft = Histogram(
            "flywheel_time_to_first_token_seconds",
            "time to first token",
            registry=r,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.model_info = Gauge(
            "flywheel_model_info", "the model version new requests use", ["version"], registry=r
        )
        self._lock = threading.Lock()
        self._accepted = self._steps = 0

    def record(self, m: RequestMetrics) -> None:
        self.prompt_tokens.inc(m.prompt_tokens)
        self.cached_tokens.inc(m.cached_tokens)
        self.output_tokens.inc(m.output_tokens)
        self.drafts_proposed.inc(m.drafts_proposed)
        self.drafts_accepted.inc(m.drafts_accepted)
        self.verify_steps.inc(m.verify_steps)
        if m.output_tokens:
            self.ttft.observe(m.ttft_s)
        with self._lock:
            self._accepted += m.drafts_accepted
            self._steps += m.verify_steps
            if self._steps:
                self.mean_acceptance.set((self._accepted + self._steps) / self._steps)

    def render(self, version: str) -> bytes:
        from prometheus_client import generate_latest

        self.model_info.clear()
        self.model_info.labels(version=version).set(1)
        return generate_latest(self.registry)


# ---------------------------------------------------------------- the app


def _next(stream: Stream) -> Delta | None:
    try:
        return next(stream)
    except StopIteration:
        return None


class StreamJob:
    """One streaming request's engine stream, closed exactly once whichever way it ends.

    `close(ended=False)` means the client went away first: the request is cancelled (the engine
    stops within one step) and counted as cancelled. It is called from the event stream's own
    cleanup and again, as a safety net, after the response (a no-op the second time).
    """

    def __init__(self, stream: Stream, request: Request, metrics: "ServerMetrics") -> None:
        self.stream, self.request, self.metrics = stream, request, metrics
        self._lock = threading.Lock()
        self._closed = False
        metrics.running.inc()

    def close(self, ended: bool) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.metrics.running.dec()
            if not ended:
                self.request.cancel.set()
                self.metrics.cancelled.inc()
            try:
                self.stream.close()
            except ValueError:  # still running in a worker thread: the cancel event ends it
                log.warning("stream %s closed while running", self.request.request_id)


def build_app(engine: Engine, config: ServerConfig | None = None, watcher: Any = None):
    """The FastAPI app serving `engine`. Run it with uvicorn (see `main`).

    `watcher` (agent.registry.RegistryWatcher): before each request, switch to the registry's
    newly promoted version if there is one (one stat when nothing changed)."""
    import anyio
    from fastapi import FastAPI
    from fastapi import Request as HTTPRequest
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.background import BackgroundTask
    from starlette.exceptions import HTTPException

    config = config or ServerConfig()
    metrics = ServerMetrics()
    app = FastAPI(title="flywheel serve", docs_url=None, redoc_url=None)
    app.state.engine, app.state.metrics = engine, metrics

    async def follow_registry() -> None:
        if watcher is not None:
            await anyio.to_thread.run_sync(watcher.check)

    def fail(status: int, message: str, kind: str, route: str, code: str | None = None):
        metrics.requests.labels(route, str(status)).inc()
        return JSONResponse(error_body(message, kind, code), status_code=status)

    def authorized(http: HTTPRequest) -> bool:
        if config.api_key is None:
            return True
        header = http.headers.get("authorization", "")
        return secrets.compare_digest(header.encode(), f"Bearer {config.api_key}".encode())

    def unauthorized(route: str):
        return fail(
            401,
            "missing or wrong API key: send `Authorization: Bearer <key>` with the key given "
            "to `flywheel serve --api-key`",
            "authentication_error",
            route,
            "invalid_api_key",
        )

    @app.exception_handler(HTTPException)
    async def http_error(http: HTTPRequest, exc: HTTPException):
        return JSONResponse(
            error_body(f"{http.method} {http.url.path}: {exc.detail}", "invalid_request_error"),
            status_code=exc.status_code,
        )

    @app.get("/health")
    async def health():
        return {"status": "ok", "model_version": engine.model_version}

    @app.get("/metrics")
    async def prometheus(http: HTTPRequest):
        if not authorized(http):
            return unauthorized("/metrics")
        from prometheus_client import CONTENT_TYPE_LATEST

        body = metrics.render(engine.model_version)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(http: HTTPRequest):
        if not authorized(http):
            return unauthorized("/v1/models")
        await follow_registry()
        metrics.requests.labels("/v1/models", "200").inc()
        card = {
            "id": config.served_model_name,
            "object": "model",
            "created": 0,
            "owned_by": "flywheel",
            "max_model_len": engine.context_length,
            "version": engine.model_version,
        }
        return {"object": "list", "data": [card]}

    async def run_to_end(http: HTTPRequest, request: Request) -> Result:
        """engine.generate in a worker thread; a client disconnect sets the cancel event."""

        async def watch_disconnect() -> None:
            while (await http.receive())["type"] != "http.disconnect":
                pass
            request.cancel.set()

        error: Exception | None = None
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(watch_disconnect)
            try:
                result = await anyio.to_thread.run_sync(engine.generate, request)
            except Exception as exc:  # raised below, outside the task group (no ExceptionGroup)
                error = exc
            tasks.cancel_scope.cancel()
        if error is not None:
            raise error
        return result

    async def handle(http: HTTPRequest, route: str, make: Callable[..., Request]):
        if not authorized(http):
            return unauthorized(route)
        cancel = threading.Event()
        await follow_registry()
        try:
            body = parse_body(await http.body())
            if body.get("model") not in (None, config.served_model_name):
                return fail(
                    404,
                    f"model {body['model']!r} is not served here; this server serves "
                    f"{config.served_model_name!r} (see /v1/models)",
                    "invalid_request_error",
                    route,
                    "model_not_found",
                )
            request = make(body, cancel)
            shape = ResponseShape(request, body, config.served_model_name, engine.model_version)
            if body.get("stream"):
                # Start here so that a bad request is still a plain 400, not an error event.
                stream = await anyio.to_thread.run_sync(engine.stream, request)
                job = StreamJob(stream, request, metrics)
                try:
                    first = await anyio.to_thread.run_sync(_next, stream)
                except BaseException:
                    await anyio.to_thread.run_sync(job.close, True)
                    raise
                metrics.requests.labels(route, "200").inc()
                return StreamingResponse(
                    sse(job, first, shape),
                    media_type="text/event-stream",
                    background=BackgroundTask(job.close, False),
                )
            metrics.running.inc()
            try:
                result = await run_to_end(http, request)
            finally:
                metrics.running.dec()
            metrics.record(result.metrics)
            if cancel.is_set():
                metrics.cancelled.inc()
            metrics.requests.labels(route, "200").inc()
            return shape.response(result)
        except BadRequest as exc:
            return fail(400, str(exc), "invalid_request_error", route)
        except Cancelled:
            metrics.cancelled.inc()
            return fail(499, "the request was cancelled", "cancelled", route)
        except EngineError as exc:
            log.error("engine error on %s: %s", route, exc)
            return fail(500, f"engine error: {exc}", "server_error", route)
        except Exception as exc:  # never let one request take the server down
            log.exception("unexpected error on %s", route)
            return fail(500, f"internal error: {type(exc).__name__}: {exc}", "server_error", route)

    async def sse(job: StreamJob, first: Delta | None, shape: ResponseShape):
        """Server-sent events for a started stream; runs the engine in worker threads."""

        def event(obj: dict) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        ended = False
        try:
            for chunk in shape.start(job.request.params.n):
                yield event(chunk)
            delta = first
            while delta is not None:
                for chunk in shape.delta(delta):
                    yield event(chunk)
                delta = await anyio.to_thread.run_sync(_next, job.stream)
            result = job.stream.result
            metrics.record(result.metrics)
            for chunk in shape.end(result):
                yield event(chunk)
            ended = True
            yield "data: [DONE]\n\n"
        except Cancelled:
            pass  # the client went away; `job.close` counts it
        except Exception as exc:  # the status line is gone: report in the stream, then stop
            ended = True
            log.exception("error while streaming %s", job.request.request_id)
            kind = "invalid_request_error" if isinstance(exc, BadRequest) else "server_error"
            yield event(error_body(f"{type(exc).__name__}: {exc}", kind))
            yield "data: [DONE]\n\n"
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(job.close, ended)

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        return await handle(http, "/v1/completions", completion_request)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HTTPRequest):
        return await handle(http, "/v1/chat/completions", chat_request)

    return app


# ---------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flywheel serve",
        description="OpenAI-compatible HTTP server over the engine (/v1/models, /v1/completions, "
        "/v1/chat/completions with SSE streaming and tool calls, /metrics, /health).",
    )
    m = p.add_argument_group("model")
    m.add_argument(
        "--model",
        default="default",
        help="checkpoint folder, 'default' (the starter model) or an http(s) URL of "
        "another OpenAI-compatible server (default: %(default)s)",
    )
    m.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "local", "vllm", "openai"],
        help="engine backend; auto: URL -> openai, else local (default: %(default)s)",
    )
    m.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    m.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    m.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=512,
        help="memory for cached prompt prefixes, local backend; 0 turns it off (default: %(default)s)",
    )
    m.add_argument(
        "--served-model-name",
        default="flywheel",
        help="model id reported in /v1/models and expected in requests (default: %(default)s)",
    )
    s = p.add_argument_group("speculative decoding")
    s.add_argument(
        "--speculative",
        default="none",
        choices=["none", "ngram", "mtp", "draft"],
        help="where draft tokens come from (default: %(default)s)",
    )
    s.add_argument(
        "--num-draft",
        type=int,
        default=4,
        help="draft tokens per verify step, the start value (default: %(default)s)",
    )
    s.add_argument("--draft-model", default=None, help="checkpoint folder of the draft model")
    r = p.add_argument_group("model registry (with --model registry)")
    r.add_argument(
        "--registry",
        default=None,
        help="registry folder whose promoted version to serve and follow "
        "(default: $FLYWHEEL_REGISTRY or $XDG_DATA_HOME/flywheel/models)",
    )
    r.add_argument(
        "--reload-interval",
        type=float,
        default=2.0,
        help="seconds between checks for a newly promoted version (also checked before "
        "each request) (default: %(default)s)",
    )
    h = p.add_argument_group("HTTP")
    h.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    h.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    h.add_argument(
        "--api-key",
        default=None,
        help="require `Authorization: Bearer KEY` on every route but /health",
    )
    return p


def _listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (raises OSError: busy port, unknown host, ...)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not a busy port: TIME_WAIT
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def _why(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "the port is in use (another server?); stop it or choose another with --port"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need root); choose another with --port"
    return exc.strerror or str(exc)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        server = ServerConfig(args.host, args.port, args.api_key, args.served_model_name)
        config = EngineConfig(
            model=args.model,
            backend=args.backend,
            device=args.device,
            dtype=args.dtype,
            prefix_cache_mb=args.prefix_cache_mb,
            speculative=SpeculativeConfig(
                method=args.speculative,
                num_draft_tokens=args.num_draft,
                max_draft_tokens=max(8, args.num_draft),
                draft_model=args.draft_model,
            ),
        )
        from agent.engine import open_engine

        registry = None
        if args.reload_interval <= 0:
            raise EngineError(f"--reload-interval must be > 0 seconds, got {args.reload_interval}")
        if args.model == "registry":
            registry = Registry(path_from_cli(args.registry))
            promoted = registry.promoted()
            if promoted is None:
                raise EngineError(
                    f"no version of the registry {registry.root} is promoted yet: "
                    "flywheel models add PATH --promote --force, or flywheel cycle"
                )
            config.model = str(registry.verify(promoted))
        try:  # before the model loads: a busy port is one line and exit 2 at once, and the
            # "serving on" line below is true when it is printed
            sock = _listen(server.host, server.port)
        except OSError as exc:
            print(f"flywheel serve: cannot listen on {args.host}:{args.port}: {_why(exc)}",
                  file=sys.stderr)  # fmt: skip
            return 2
        try:
            engine = open_engine(config)
        except BaseException:
            sock.close()
            raise
    except (EngineError, RegistryError) as exc:
        print(f"flywheel serve: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    watcher = None
    if registry is not None:
        watcher = RegistryWatcher(
            registry, engine.swap, engine.model_version, interval_s=args.reload_interval
        )
        watcher.start()
    try:
        app = build_app(engine, server, watcher)
        port = sock.getsockname()[1]  # the one the system chose for --port 0
        print(
            f"flywheel serve: {engine.model_version} on http://{server.host}:{port}/v1", flush=True
        )
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    finally:
        sock.close()
        if watcher is not None:
            watcher.stop()
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
