"""Flywheel's chat format: special tokens, the chat template, and the tool-call parser.

A conversation renders as (one line per message, shown here with the newline after `<|end|>`):

    <|system|>You are Flywheel...
    # Tools
    {"name": "read_file", "description": ..., "parameters": {...}}<|end|>
    <|user|>Fix the failing test.<|end|>
    <|assistant|>Let me look.<|tool_call|>{"name": "read_file", "arguments": {"path": "a.py"}}<|/tool_call|><|end|>
    <|tool|>def add(a, b): ...<|end|>
    <|assistant|>

The model's turn ends with `<|end|>` (a stop token for chat requests). Fill-in-the-middle prompts
are `<|fim_prefix|>PREFIX<|fim_suffix|>SUFFIX<|fim_middle|>` and the model writes the middle,
ending with `<|endoftext|>`. A fast-apply request (`apply_messages`) is a system turn
(`APPLY_SYSTEM`) and a user turn holding the file and an edit sketch; the answer is the whole file.

The same template is stored in the tokenizer's config (Hugging Face `chat_template`), so vLLM and
`transformers` render exactly what this module renders.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any

from agent.engine.request import ToolCall

EOS = "<|endoftext|>"
SYSTEM, USER, ASSISTANT, TOOL = "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"
END = "<|end|>"
TOOL_CALL, TOOL_CALL_END = "<|tool_call|>", "<|/tool_call|>"
FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
PAD = "<|pad|>"

SPECIAL_TOKENS = [
    EOS,
    PAD,
    SYSTEM,
    USER,
    ASSISTANT,
    TOOL,
    END,
    TOOL_CALL,
    TOOL_CALL_END,
    FIM_PREFIX,
    FIM_SUFFIX,
    FIM_MIDDLE,
]

# Jinja, as Hugging Face and vLLM render it. Tool-call arguments may be a JSON string (OpenAI
# wire shape) or a mapping.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(system_done=false) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "<|system|>{{ message['content'] }}"
    "{%- if tools -%}{{ '\\n' }}# Tools{%- for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{%- endfor -%}{%- endif -%}"
    "<|end|>{{ '\\n' }}{%- set ns.system_done = true -%}"
    "{%- else -%}"
    "{%- if not ns.system_done and tools -%}"
    "<|system|># Tools{%- for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{%- endfor -%}<|end|>{{ '\\n' }}"
    "{%- set ns.system_done = true -%}"
    "{%- endif -%}"
    "{%- if message['role'] == 'user' -%}<|user|>{{ message['content'] }}<|end|>{{ '\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}<|assistant|>{{ message['content'] or '' }}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{%- set fn = call['function'] if 'function' in call else call -%}"
    '<|tool_call|>{"name": {{ fn[\'name\'] | tojson }}, "arguments": '
    "{%- if fn['arguments'] is string %} {{ fn['arguments'] }}"
    "{%- else %} {{ fn['arguments'] | tojson }}{%- endif -%}"
    "}<|/tool_call|>"
    "{%- endfor -%}<|end|>{{ '\\n' }}"
    "{%- elif message['role'] == 'tool' -%}<|tool|>{{ message['content'] }}<|end|>{{ '\\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


def render_fim(prefix: str, suffix: str) -> str:
    return f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}"


# Fast apply: an original file plus an edit sketch -> the whole updated file. The engine serves it
# with the original file as its n-gram speculation; training (training/tasks.py) writes examples
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


def parse_assistant(text: str) -> tuple[str, list[ToolCall], list[str]]:
    """Split an assistant turn into (content, tool calls, errors).

    Content is the text outside tool-call markers. A call that is not valid JSON, lacks a string
    `name`, has non-object `arguments`, or is never closed becomes an error message (the harness
    shows it to the model and records it as a tool-call error) instead of an exception.

    >>> parse_assistant('ok<|tool_call|>{"name": "ls", "arguments": {}}<|/tool_call|>')[1][0].name
    'ls'
    """
    text = text.replace(END, "")
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
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(
                f"tool call is not valid JSON ({exc.msg} at char {exc.pos}): {body[:200]!r}"
            )
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append(f'tool call needs {{"name": str, "arguments": object}}: {body[:200]!r}')
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            with contextlib.suppress(json.JSONDecodeError):
                args = json.loads(args)
        if not isinstance(args, dict):
            errors.append(f"arguments of tool call {obj['name']!r} must be a JSON object")
            continue
        calls.append(ToolCall(name=obj["name"], arguments=args, id=f"call_{uuid.uuid4().hex[:12]}"))
    return "".join(content).strip(), calls, errors


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
