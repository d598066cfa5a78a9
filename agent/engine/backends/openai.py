"""The `openai` backend: the Engine interface over any OpenAI-compatible HTTP server.

    engine = open_engine(EngineConfig(model="http://127.0.0.1:8000/v1"))   # e.g. flywheel serve
    result = engine.generate(Request(prompt="def add(a, b):", params=SamplingParams(temperature=0)))

Prompt requests go to `/v1/completions`, chat requests (`messages`, optional `tools`) to
`/v1/chat/completions`. Every request asks to stream (server-sent events, parsed here with httpx),
so `generate` is `stream` run to the end and cancellation works the same for both: between two
chunks the cancel event is checked, the HTTP stream is closed (the server then stops the request)
and unfinished samples end with finish reason "cancelled", as in the local backend. A server that
answers with one JSON body instead (it does not stream) is read as a stream of one chunk.

The context length is read once, when the engine opens: `max_model_len` (vLLM, flywheel serve) or
`context_length`, `context_window`, `max_context_length` in the model's `/v1/models` entry. The
caller's `context_length` (`flywheel run --context-length`) overrides it; a server that reports
none (OpenAI itself, most proxies) gets `DEFAULT_CONTEXT_LENGTH`, with one logged warning that
names the flag.

Sent beyond OpenAI's fields (servers that do not know them ignore them; flywheel serve and vLLM
honour them): `top_k`, `speculation`, `stop_token_ids`, and `return_token_ids` (token ids of each
chunk, for RL); and on chat `apply` for a fast-apply request (flywheel serve's extension). What
comes back is used when present: token ids (`token_ids`, or logprob tokens named `token_id:N`),
logprobs, tool calls (assembled from their streamed pieces into `Completion.tool_calls`), usage,
and flywheel's `metrics` (draft counters). Times (time to first token, total) are measured here,
as the caller sees them. For chat, `Completion.text` is the message content: servers send tool
calls apart from the text, while the local backend's text is the raw turn with its tool-call
markup.

Not here: speculative decoding settings (the server owns them: `flywheel serve --speculative`),
swapping weights (`swap` raises), batching several prompts into one HTTP request.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import httpx

from agent.confidence import KEY as CONFIDENCE_KEY
from agent.confidence import as_threshold
from agent.engine import Stream
from agent.engine.config import EngineConfig
from agent.engine.request import (
    BadRequest,
    Completion,
    Delta,
    EngineError,
    FinishReason,
    Request,
    RequestMetrics,
    Result,
    SamplingParams,
    ToolCall,
)
from agent.engine.sample_output import first_stop

log = logging.getLogger("flywheel.engine")

DEFAULT_CONTEXT_LENGTH = 8192  # assumed when the server does not say (tokens)
CONTEXT_KEYS = ("max_model_len", "context_length", "context_window", "max_context_length")

# OpenAI finish reasons -> ours. "abort" is vLLM's (and flywheel serve's) word for a cancelled
# request; "tool_calls" means the model stopped after calling tools.
FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "stop",
    "function_call": "stop",
    "content_filter": "stop",
    "abort": "cancelled",
    "cancelled": "cancelled",
    "error": "error",
}


def api_root(url: str) -> str:
    """`http://host:port`, `.../v1` or `.../v1/` -> `http://host:port/v1`."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


@dataclass
class _Sample:
    """One sample as its chunks arrive."""

    index: int
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)  # tool-call index -> pieces
    call_errors: list[str] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    cut: bool = False  # ended here at a stop string (`stop_after`), not by the server

    def tool_calls(self) -> tuple[list[ToolCall], list[str]]:
        calls, errors = [], list(self.call_errors)
        for _, piece in sorted(self.calls.items()):
            try:
                arguments = json.loads(piece["arguments"] or "{}")
            except json.JSONDecodeError as exc:
                errors.append(f"arguments of tool call {piece['name']!r} are not JSON: {exc.msg}")
                continue
            if not isinstance(arguments, dict):
                errors.append(f"arguments of tool call {piece['name']!r} must be a JSON object")
                continue
            calls.append(ToolCall(name=piece["name"], arguments=arguments, id=piece["id"]))
        return calls, errors


class OpenAIEngine:
    """Implements `agent.engine.Engine` over HTTP. Thread-safe (httpx.Client is)."""

    def __init__(self, config: EngineConfig, context_length: int | None = None) -> None:
        if config.speculative.method != "none":
            raise BadRequest(
                "the openai backend cannot choose speculative decoding: the server decides it "
                "(e.g. `flywheel serve --speculative ngram`); leave speculative.method 'none'"
            )
        self.config = config
        self.url = api_root(config.model)
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
        )
        if context_length is not None and context_length < 16:
            raise BadRequest(f"the context length must be at least 16 tokens, got {context_length}")
        self._card: dict[str, Any] = {}
        card = self._model_card()  # also proves the server is there, with a clear error if not
        self.model_name = config.served_model_name or card["id"]
        reported = next(
            (card[k] for k in CONTEXT_KEYS if type(card.get(k)) is int and card[k] > 0), None
        )
        self.context_length: int = context_length or reported or DEFAULT_CONTEXT_LENGTH
        if context_length is None and reported is None:
            log.warning(
                "the server at %s does not report the context length of %r (no max_model_len in "
                "/v1/models); assuming %d tokens: pass --context-length N to set it",
                self.url,
                card["id"],
                DEFAULT_CONTEXT_LENGTH,
            )

    # -- the Engine protocol -------------------------------------------------------------

    @property
    def model_version(self) -> str:
        """The server's `version` for the model (flywheel serve), else the model id."""
        card = self._model_card()
        return str(card.get("version") or card["id"])

    @property
    def show_min_confidence(self) -> float | None:
        """The threshold `flywheel serve` reports with the model (None from other servers), as of
        the last time /v1/models was read: with `model_version`, which callers read to know the
        weights a request will meet."""
        return as_threshold(self._card.get(CONFIDENCE_KEY))

    def generate(self, request: Request) -> Result:
        return self.stream(request).finish()

    def stream(self, request: Request) -> Stream:
        """Opens the HTTP stream now, so that a rejected request raises here, before any output."""
        path, body = self._body(request)
        started = time.perf_counter()
        response = self._open(path, body)
        return Stream(self._run(request, response, started))

    def swap(self, model: str) -> str:
        raise EngineError(
            f"the openai backend cannot swap weights: the server at {self.url} owns its model; "
            "swap or restart it there (or use the local backend)"
        )

    def close(self) -> None:
        self._http.close()

    # -- HTTP ----------------------------------------------------------------------------

    def _model_card(self) -> dict[str, Any]:
        try:
            response = self._http.get("/models")
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from exc
        if response.status_code != 200:
            raise self._status_error(response.status_code, response.text, "/models")
        try:
            cards = response.json().get("data") or []
            cards = [c for c in cards if isinstance(c, dict) and isinstance(c.get("id"), str)]
        except (ValueError, AttributeError, TypeError):
            raise EngineError(
                f"the server at {self.url} answered /models with something that is not an "
                f"OpenAI model list ({response.text[:100]!r}); check that the URL is an "
                "OpenAI-compatible API (it usually ends in /v1)"
            ) from None
        if not cards:
            raise EngineError(f"the server at {self.url} serves no models (/v1/models is empty)")
        wanted = self.config.served_model_name
        for card in cards:
            if wanted is None or card.get("id") == wanted:
                self._card = card
                return card
        served = ", ".join(repr(c.get("id")) for c in cards)
        raise EngineError(
            f"the server at {self.url} does not serve {wanted!r} (it serves {served}); "
            "fix EngineConfig.served_model_name"
        )

    def _open(self, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            # Our own JSON: ASCII-escaped, so text with unpaired surrogates still travels (the
            # server decides what it means), and NaN is refused here rather than sent.
            content = json.dumps(body, allow_nan=False).encode()
            headers = {"Content-Type": "application/json"}
            request = self._http.build_request("POST", path, content=content, headers=headers)
            response = self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from exc
        if response.status_code != 200:
            text = response.read().decode("utf-8", "replace")
            response.close()
            raise self._status_error(response.status_code, text, path)
        return response

    def _transport_error(self, exc: httpx.HTTPError) -> EngineError:
        if isinstance(exc, httpx.TimeoutException):
            return EngineError(
                f"the server at {self.url} did not answer within {self.config.timeout_s:g}s "
                f"({type(exc).__name__}); raise EngineConfig.timeout_s or check the server's load"
            )
        return EngineError(
            f"cannot reach the OpenAI-compatible server at {self.url} ({type(exc).__name__}: "
            f"{exc}); check that it is running and that the URL (host, port, /v1) is right, "
            "e.g. start one with `flywheel serve --port 8000`"
        )

    def _status_error(self, status: int, text: str, path: str) -> EngineError:
        try:
            message = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = text[:500] or "(no body)"
        message = " ".join(str(message).split()) or "(no message)"  # one line (an HTML page...)
        if status in (400, 422):
            return BadRequest(message)
        if status in (401, 403):
            return EngineError(
                f"the server at {self.url} refused the request (HTTP {status}: {message}); "
                "set EngineConfig.api_key to the server's key"
            )
        return EngineError(f"the server at {self.url} failed on {path} (HTTP {status}): {message}")

    # -- requests and streamed answers ---------------------------------------------------

    def _body(self, request: Request) -> tuple[str, dict[str, Any]]:
        p = request.params
        body: dict[str, Any] = {
            "model": self.model_name,
            "max_tokens": p.max_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "n": p.n,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        if p.top_k:
            body["top_k"] = p.top_k
        if p.seed is not None:
            body["seed"] = p.seed
        if p.stop and not p.stop_after:  # with stop_after, `_delta` cuts: OpenAI's API cannot
            body["stop"] = p.stop
        if p.stop_token_ids:
            body["stop_token_ids"] = p.stop_token_ids
        if request.speculation is not None:
            body["speculation"] = request.speculation
        if request.messages is not None:
            body["messages"] = request.messages
            if request.apply:
                body["apply"] = True
            if request.tools:
                body["tools"] = request.tools
            if p.logprobs:
                body["logprobs"] = True
            return "/chat/completions", body
        if isinstance(request.prompt, bytes | bytearray):
            raise BadRequest("the openai backend sends text or token ids, not raw bytes")
        body["prompt"] = request.prompt
        if p.logprobs:
            body["logprobs"] = 0  # the sampled token's logprob, no alternatives
        return "/completions", body

    def _run(
        self, request: Request, response: httpx.Response, started: float
    ) -> Generator[Delta, None, Result]:
        samples = {i: _Sample(i) for i in range(request.params.n)}
        metrics = RequestMetrics()
        usage: dict[str, Any] = {}
        version = ""
        try:
            for event in _events(response, self.url):
                if request.cancelled:
                    break
                if "error" in event:
                    error = event["error"] if isinstance(event["error"], dict) else {}
                    message = error.get("message") or str(event["error"])
                    if error.get("type") == "invalid_request_error":
                        raise BadRequest(message)
                    raise EngineError(f"the server at {self.url} failed mid-stream: {message}")
                version = event.get("system_fingerprint") or version
                if event.get("usage"):
                    usage = event["usage"]
                    server = event.get("metrics") or {}
                    metrics.drafts_proposed = int(server.get("drafts_proposed", 0))
                    metrics.drafts_accepted = int(server.get("drafts_accepted", 0))
                    metrics.verify_steps = int(server.get("verify_steps", 0))
                for choice in event.get("choices") or []:
                    delta = _delta(samples, choice, request.params)
                    if delta is not None:
                        if not metrics.ttft_s and (delta.text or delta.token_ids):
                            metrics.ttft_s = time.perf_counter() - started
                        yield delta
                if any(s.cut for s in samples.values()) and all(
                    s.finish_reason for s in samples.values()
                ):
                    break  # closing the stream stops the server (its usage is not waited for)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from exc
        finally:
            response.close()  # on cancel or early close, the server sees the disconnect
        for s in samples.values():
            if s.finish_reason is None:
                s.finish_reason = "cancelled" if request.cancelled else "error"
                yield Delta(
                    s.index, "", [], [] if request.params.logprobs else None, s.finish_reason
                )
        metrics.total_s = time.perf_counter() - started
        metrics.prompt_tokens = int(usage.get("prompt_tokens", 0))
        metrics.output_tokens = int(
            usage.get("completion_tokens", sum(len(s.token_ids) for s in samples.values()))
        )
        version = version or self.model_name
        completions = []
        for s in samples.values():
            calls, errors = s.tool_calls()
            logprobs = s.logprobs if request.params.logprobs and s.logprobs else None
            completions.append(
                Completion(
                    text="".join(s.text),
                    token_ids=s.token_ids,
                    logprobs=logprobs,
                    finish_reason=s.finish_reason,
                    index=s.index,
                    tool_calls=calls,
                    tool_call_errors=errors,
                    model_version=version,
                )
            )
        return Result(completions, metrics)


def _events(response: httpx.Response, url: str) -> Generator[dict[str, Any], None, None]:
    """The JSON payloads of a server-sent-event stream, up to `data: [DONE]`; a server that
    answers with one JSON body (it ignored `stream`) gives that body as a single chunk."""
    if response.headers.get("content-type", "").startswith("application/json"):
        try:
            yield _as_chunk(json.loads(response.read()))
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, TypeError):
            raise EngineError(
                f"the server at {url} sent a body that is not an OpenAI completion: "
                f"{response.text[:200]!r}"
            ) from None
        return
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, comments, `event:` lines
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            yield json.loads(data)
        except json.JSONDecodeError:
            raise EngineError(
                f"the server at {url} sent an event that is not JSON: {data[:200]!r}"
            ) from None


def _as_chunk(body: dict[str, Any]) -> dict[str, Any]:
    """A whole (non-streamed) completion in the shape of one streamed chunk: a chat choice's
    `message` becomes its `delta`, each tool call numbered by its position."""
    choices = []
    for choice in body.get("choices") or []:
        if "message" in choice:
            message = dict(choice["message"] or {})
            calls = message.get("tool_calls") or []
            message["tool_calls"] = [{**call, "index": i} for i, call in enumerate(calls)]
            choice = {**choice, "delta": message}
        choices.append(choice)
    return {**body, "choices": choices}


def _delta(
    samples: dict[int, _Sample], choice: dict[str, Any], params: SamplingParams
) -> Delta | None:
    """Fold one streamed choice into its sample; the Delta to yield, or None if nothing new.
    With `params.stop_after`, the stop strings (not sent to the server) are looked for here."""
    index = choice.get("index", 0)
    sample = samples.setdefault(index, _Sample(index))
    if sample.finish_reason is not None:
        return None  # cut at a stop string here: the rest of the stream is not the answer
    if "delta" in choice:  # chat
        piece = choice["delta"] or {}
        text = piece.get("content") or ""
        for call in piece.get("tool_calls") or []:
            slot = sample.calls.setdefault(
                call.get("index", 0), {"id": "", "name": "", "arguments": ""}
            )
            fn = call.get("function") or {}
            slot["id"] = call.get("id") or slot["id"]
            slot["name"] += fn.get("name") or ""
            slot["arguments"] += fn.get("arguments") or ""
        sample.call_errors += piece.get("tool_call_errors") or []
    else:
        text = choice.get("text") or ""
    token_ids, logprobs = _tokens(choice.get("logprobs"))
    token_ids = choice.get("token_ids") or token_ids
    finish = choice.get("finish_reason")
    finish = FINISH.get(finish, "stop") if finish else None
    if not (text or token_ids or finish):
        return None
    if params.stop_after and params.stop:
        text, finish = _cut(sample, text, params, finish)
    sample.text.append(text)
    sample.token_ids += token_ids
    sample.logprobs += logprobs
    sample.finish_reason = finish or sample.finish_reason
    return Delta(index, text, token_ids, logprobs if params.logprobs else None, finish)


def _cut(
    sample: _Sample, text: str, params: SamplingParams, finish: FinishReason | None
) -> tuple[str, FinishReason | None]:
    """`text` (new for `sample`) up to the first stop string that begins at character
    `params.stop_after` of the output or later, and "stop" if there was one."""
    before = sum(len(t) for t in sample.text)
    whole = "".join(sample.text) + text
    start = max(params.stop_after, before - max(len(s) for s in params.stop) + 1)
    cut = first_stop(whole, params.stop, start)
    if cut is None:
        return text, finish
    sample.cut = True
    if cut < before:  # it began in text already yielded: the answer drops that part too
        sample.text[:] = [whole[:cut]]
        return "", "stop"
    return whole[before:cut], "stop"


def _tokens(logprobs: dict[str, Any] | None) -> tuple[list[int], list[float]]:
    """(token ids if the tokens are named `token_id:N`, logprobs) of a choice's logprobs."""
    if not logprobs:
        return [], []
    if "content" in logprobs:  # chat shape
        entries = logprobs["content"] or []
        tokens = [e.get("token", "") for e in entries]
        values = [float(e["logprob"]) for e in entries]
    else:  # completions shape
        tokens = logprobs.get("tokens") or []
        values = [float(v) for v in logprobs.get("token_logprobs") or []]
    ids = []
    for token in tokens:
        if not (isinstance(token, str) and token.startswith("token_id:")):
            return [], values
        ids.append(int(token[9:]))
    return ids, values
