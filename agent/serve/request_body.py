"""Request bodies -> engine `Request`s: the JSON of `/v1/completions` and `/v1/chat/completions`,
checked field by field.

Every problem is a `BadRequest` whose message names the field and what is wrong with it (the app
turns it into a 400). Fields OpenAI defines but the engine cannot honour (penalties, `logit_bias`,
`echo`, `best_of`) are refused rather than ignored. Beyond OpenAI's fields: `speculation`,
`top_k`, `stop_token_ids`, `priority` (vLLM's: an integer, lower runs first; or one of the
engine's lanes by name), and `apply` on chat (true: a fast-apply conversation, decoded by the
model's fast-apply adapter where it has one).
"""

import json
import threading
import uuid
from typing import Any

from agent.engine import BadRequest, Request, SamplingParams
from agent.engine.request import LANES

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


def _apply(body: dict) -> bool:
    value = body.get("apply", False)
    if not isinstance(value, bool):
        raise BadRequest("`apply` must be true or false")
    return value


def _priority(body: dict) -> str:
    """The engine lane of `priority`: a lane's name, or vLLM's integer (< 0 interactive, 0
    normal, > 0 background)."""
    value = body.get("priority", "normal")
    if isinstance(value, int) and not isinstance(value, bool):
        return "interactive" if value < 0 else "normal" if value == 0 else "background"
    if value not in LANES:
        raise BadRequest(f"`priority` must be an integer or one of {', '.join(LANES)}")
    return value


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
        priority=_priority(body),
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
        priority=_priority(body),
        apply=_apply(body),
    )
