"""Flywheel's chat format: special tokens, the chat template, and the tool-call parser.

Conversations are ChatML, the format of the base (Qwen2.5-Coder-Instruct). Shown here with the
newlines written out:

    <|im_start|>system
    You are Flywheel...
    # Tools
    - read_file(path, start_line?, end_line?): Read a text file with line numbers...<|im_end|>
    <|im_start|>user
    Fix the failing test.<|im_end|>
    <|im_start|>assistant
    Let me look.
    <tool_call>edit_file
    <|arg|>path
    a.py
    <|arg|>search
        return a - b
    <|arg|>replace
        return a + b
    </tool_call><|im_end|>
    <|im_start|>tool
    a.py: 1 of 1 hunks applied...<|im_end|>
    <|im_start|>assistant

A tool call sits inside Qwen's own `<tool_call>` and `</tool_call>` tokens: the tool's name, then
each argument as `<|arg|>KEY`, a newline and its raw value. Values are never escaped: a small
model copies code into them as it reads it (Qwen's native Hermes format writes them as JSON
strings, where every quote and newline of the code must be escaped). `<|arg|>` is the one token
the base lacks (agent/base.py adds it); the markers are single tokens, so code cannot contain or
split them. benchmarks/chat_formats.py compares this format with Hermes JSON and others on the
base. A string value is written as it is; other values as JSON (`coerce_arguments` reads them
back by the tool's schema). `edit_file`'s `hunks` list is written as `search`/`replace` pairs,
one pair per hunk. The model's turn ends with `<|im_end|>`. OpenAI-shaped `tool_calls` stay at
the API boundary: the template renders them from messages, and `parse_assistant` turns model
text back into them.

Fill-in-the-middle prompts are Qwen's: `<|fim_prefix|>PREFIX<|fim_suffix|>SUFFIX<|fim_middle|>`,
with repository context before them in Qwen's repository-level format (`render_repo_fim`); the
model writes the middle, ending with `<|endoftext|>`. A fast-apply request (`apply_messages`) is a
system turn (`APPLY_SYSTEM`) and a user turn holding the file and an edit sketch; the answer is
the whole file.

The template is stored in the tokenizer's config (Hugging Face `chat_template`), so vLLM and
`transformers` render exactly what `render_chat` renders, in training and at inference.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from agent.engine.request import ToolCall

EOS = "<|endoftext|>"
START, END = "<|im_start|>", "<|im_end|>"
TOOL_CALL, TOOL_CALL_END, ARG = "<tool_call>", "</tool_call>", "<|arg|>"
FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
REPO_NAME, FILE_SEP = "<|repo_name|>", "<|file_sep|>"
PAD = EOS  # Qwen pads with its end-of-text token; padded positions are masked everywhere
ROLES = ("system", "user", "assistant", "tool")

# Every special token the format needs; a base tokenizer gains the ones it lacks (agent/base.py).
SPECIAL_TOKENS = [
    EOS,
    START,
    END,
    TOOL_CALL,
    TOOL_CALL_END,
    ARG,
    FIM_PREFIX,
    FIM_SUFFIX,
    FIM_MIDDLE,
    REPO_NAME,
    FILE_SEP,
]
# The tokens the format adds to a Qwen2.5 base (agent/base.py; the rest are Qwen's own).
ADDED_TOKENS = [ARG]
# The tokens whose embedding rows train with the adapter (training/adapters.py): the added one,
# and the chat markers whose rows in the 0.5B still sit where untrained rows sit (the norm of a
# spare row), so that the model cannot tell them apart: it wrote <|im_start|> for <tool_call>.
TRAINED_ROWS = [START, END, TOOL_CALL, TOOL_CALL_END, *ADDED_TOKENS]
# How a call is written, for the harness's reply to a call it could not parse.
CALL_SHAPE = (
    f"Write each call as {TOOL_CALL}NAME, then for each argument {ARG}ARGUMENT on its own line "
    f"and its raw value on the next lines, then {TOOL_CALL_END}."
)

# Jinja, as Hugging Face and vLLM render it. Tool-call arguments must be a mapping (`render_chat`
# and vLLM's server decode OpenAI's JSON strings first). Newlines are written as expressions
# (`NL`) because `{%- -%}` trims the whitespace around tags.
NL = "{{ '\\n' }}"
_ARGS = (
    "{%- for key, value in args.items() -%}"
    "{%- if key == 'hunks' and value is sequence and value is not string -%}"
    "{%- for hunk in value -%}"
    "<|arg|>search"
    + NL
    + "{{ hunk['search'] }}"
    + NL
    + "<|arg|>replace"
    + NL
    + "{{ hunk['replace'] }}"
    + NL
    + "{%- endfor -%}"
    "{%- elif value is string -%}<|arg|>{{ key }}"
    + NL
    + "{{ value }}"
    + NL
    + "{%- else -%}<|arg|>{{ key }}"
    + NL
    + "{{ value | tojson }}"
    + NL
    + "{%- endif -%}"
    "{%- endfor -%}"
)
_TOOLS = (
    "# Tools"
    "{%- for tool in tools -%}"
    "{%- set fn = tool['function'] if 'function' in tool else tool -%}"
    "{%- set params = fn.get('parameters') or {} -%}"
    "{%- set required = params.get('required') or [] -%}" + NL + "- {{ fn['name'] }}("
    "{%- for name in (params.get('properties') or {}) -%}"
    "{{ ', ' if not loop.first }}"
    "{%- if name == 'hunks' %}search, replace{% else %}{{ name }}{% endif -%}"
    "{{ '' if name in required else '?' }}"
    "{%- endfor -%}"
    "): {{ fn.get('description', '') }}"
    "{%- endfor -%}"
)
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' and tools -%}"
    "<|im_start|>system" + NL + _TOOLS + "<|im_end|>" + NL + "{%- endif -%}"
    "<|im_start|>{{ message['role'] }}" + NL + "{{ message['content'] or '' }}"
    "{%- if message['role'] == 'system' and tools -%}" + NL + _TOOLS + "{%- endif -%}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{%- set fn = call['function'] if 'function' in call else call -%}"
    "{%- set args = fn['arguments'] -%}"
    "{%- if message['content'] or not loop.first -%}" + NL + "{%- endif -%}"
    "<tool_call>{{ fn['name'] }}" + NL + _ARGS + "</tool_call>"
    "{%- endfor -%}"
    "<|im_end|>" + NL + "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant" + NL + "{%- endif -%}"
)


def decoded_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with tool-call arguments as mappings (OpenAI sends them as JSON strings)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            fixed = []
            for call in calls:
                fn = dict(call.get("function", call))
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"] or "{}")
                    except json.JSONDecodeError:
                        fn["arguments"] = {"_raw": fn["arguments"]}
                if not isinstance(fn.get("arguments"), dict):
                    fn["arguments"] = {"_raw": fn.get("arguments")}
                fixed.append({**call, "function": fn} if "function" in call else fn)
            message = {**message, "tool_calls": fixed}
        out.append(message)
    return out


def render_chat(
    tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """The text of a conversation: the one rendering used by training, inference and RL."""
    return tokenizer.apply_chat_template(
        decoded_messages(messages),
        tools=tools or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )


def assistant_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of what the model writes in a rendered conversation: each assistant
    turn's body and its closing `<|im_end|>` (the model must learn to stop)."""
    opening = f"{START}assistant\n"
    spans, at = [], 0
    while (start := text.find(opening, at)) >= 0:
        body = start + len(opening)
        end = text.find(END, body)
        stop = len(text) if end < 0 else end + len(END)
        spans.append((body, stop))
        at = stop
    return spans


def heal(prefix: str) -> tuple[str, str]:
    """(prompt prefix, healed): a cursor at the start of a line or inside its indentation ends
    the prefix in the middle of what the model sees as one token (a line break and the spaces
    after it are usually one BPE token), and a model asked to continue from there writes poorly.
    The prompt stops before the line break instead; the completion must then begin with the
    `healed` text, which the reader of the output removes (token healing). The language server's
    prompts, repository pretraining's samples and the simulated user's requests all heal, so the
    model is trained where it is asked."""
    head = prefix.rstrip(" \t")
    if head.endswith("\n"):
        cut = len(head) - 1
        return prefix[:cut], prefix[cut:]
    return prefix, ""


def render_fim(prefix: str, suffix: str) -> str:
    return f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}"


def render_repo_fim(
    repo: str, context: list[tuple[str, str]], path: str, prefix: str, suffix: str | None
) -> str:
    """Qwen2.5-Coder's repository-level prompt: the repository's name, other files as
    `<|file_sep|>PATH⏎TEXT`, then the current file's path and its fill-in-the-middle (or, with
    `suffix` None, its text so far: a left-to-right completion).

    For `repo="shop"`, one other file `a.py` and the cursor in `b.py` after `y = `:
    `<|repo_name|>shop⏎<|file_sep|>a.py⏎x = 1⏎<|file_sep|>b.py⏎<|fim_prefix|>y = <|fim_suffix|>⏎
    <|fim_middle|>` (⏎ a newline).
    """
    head = f"{REPO_NAME}{repo}\n"
    for other, text in context:
        head += f"{FILE_SEP}{other}\n{text}" + ("" if text.endswith("\n") else "\n")
    current = prefix if suffix is None else render_fim(prefix, suffix)
    return f"{head}{FILE_SEP}{path}\n{current}"


# Fast apply: an original file plus an edit sketch -> the whole updated file. The engine serves it
# with the original file as its n-gram speculation; training (training/tasks/) writes examples
# in exactly this shape.
APPLY_SYSTEM = (
    "Apply the edit to the file. The edit shows changed code with `... existing code "
    "...` comments for unchanged parts. Reply with the whole updated file and nothing "
    "else."
)


def apply_messages(path: str, original: str, sketch: str, updated: str | None = None) -> list[dict]:
    """A fast-apply conversation; with `updated`, the assistant's answer is included."""
    messages = [
        {"role": "system", "content": APPLY_SYSTEM},
        {
            "role": "user",
            "content": f'<file path="{path}">\n{original}</file>\n<edit>\n{sketch}</edit>',
        },
    ]
    if updated is not None:
        messages.append({"role": "assistant", "content": updated})
    return messages


def apply_parts(content: str) -> tuple[str, str, str] | None:
    """(path, original, sketch) of an `apply_messages` user message; None for other text."""
    match = re.fullmatch(r'<file path="([^"]*)">\n(.*)</file>\n<edit>\n(.*)</edit>', content, re.S)
    return (match[1], match[2], match[3]) if match else None


def _schema_types(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """tool name -> its parameters' JSON-schema properties."""
    out = {}
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out[fn["name"]] = (fn.get("parameters") or {}).get("properties") or {}
    return out


def coerce_arguments(arguments: dict[str, Any], properties: dict[str, Any]) -> dict[str, Any]:
    """Raw text values read back as the types the schema asks for ("12" -> 12 for an integer).

    A value that does not convert stays text, so the tool's own check names the problem."""
    out = dict(arguments)
    for key, value in arguments.items():
        want = (properties.get(key) or {}).get("type")
        if not isinstance(value, str) or want in (None, "string"):
            continue
        text = value.strip()
        try:
            if want == "integer":
                out[key] = int(text)
            elif want == "number":
                out[key] = float(text) if any(c in text for c in ".eE") else int(text)
            elif want == "boolean" and text.lower() in ("true", "false"):
                out[key] = text.lower() == "true"
            elif want in ("array", "object"):
                out[key] = json.loads(text)
        except (ValueError, json.JSONDecodeError):
            pass
    return out


def _parse_call(body: str) -> tuple[str, dict[str, Any]]:
    """`NAME\\n<|arg|>KEY\\nVALUE\\n...` -> (name, arguments); raises ValueError."""
    head, *parts = body.split(ARG)
    name = head.strip()
    if not name or any(c.isspace() for c in name):
        raise ValueError(f"a tool call starts with the tool's name on its own line: {body[:120]!r}")
    args: dict[str, Any] = {}
    hunks: list[dict[str, str]] = []
    for part in parts:
        key, newline, value = part.partition("\n")
        key = key.strip()
        if not key:
            raise ValueError(f"{ARG} needs the argument's name on its line: {part[:120]!r}")
        value = value[:-1] if newline and value.endswith("\n") else value
        if key == "search":
            hunks.append({"search": value})
        elif key == "replace":
            if not hunks or "replace" in hunks[-1]:
                raise ValueError("each `replace` follows its own `search`")
            hunks[-1]["replace"] = value
        elif key in args:
            raise ValueError(f"argument {key!r} is given twice")
        else:
            args[key] = value
    if hunks:
        if "replace" not in hunks[-1]:
            raise ValueError("the last `search` has no `replace`")
        args["hunks"] = hunks
    return name, args


def parse_assistant(
    text: str, tools: list[dict[str, Any]] | None = None
) -> tuple[str, list[ToolCall], list[str]]:
    """Split an assistant turn into (content, tool calls, errors).

    Content is the text outside tool-call markers. With `tools` (OpenAI-shaped schemas), values
    are read back as the schema's types. A call that is never closed, has no name, or repeats an
    argument becomes an error message (the harness shows it to the model and records it as a
    tool-call error) instead of an exception.

    >>> parse_assistant('ok<tool_call>read_file\\n<|arg|>path\\na.py\\n</tool_call>')[1][0].arguments
    {'path': 'a.py'}
    """
    text = text.replace(END, "")
    types = _schema_types(tools)
    content: list[str] = []
    calls: list[ToolCall] = []
    errors: list[str] = []
    rest = text
    while True:
        start = rest.find(TOOL_CALL)
        if start < 0:
            content.append(rest)
            break
        content.append(rest[:start])
        rest = rest[start + len(TOOL_CALL) :]
        end = rest.find(TOOL_CALL_END)
        body = rest if end < 0 else rest[:end]
        rest = "" if end < 0 else rest[end + len(TOOL_CALL_END) :]
        if end < 0:
            errors.append(f"tool call not closed with {TOOL_CALL_END}: {body[:200]!r}")
            break
        try:
            name, args = _parse_call(body)
        except ValueError as exc:
            errors.append(str(exc))
            continue
        args = coerce_arguments(args, types.get(name, {}))
        calls.append(ToolCall(name=name, arguments=args, id=f"call_{uuid.uuid4().hex[:12]}"))
    text = "".join(content)
    for marker in (TOOL_CALL_END, ARG):  # a call's inner markers, written outside any call
        if marker in text:
            errors.append(f"{marker} outside a tool call: a call opens with {TOOL_CALL}")
            text = text.replace(marker, "")
    return text.strip(), calls, errors


def tool_calls_to_openai(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Our parsed calls in OpenAI's wire shape (arguments as a JSON string)."""
    return [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in calls
    ]
