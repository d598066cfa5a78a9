"""What the model is told: the system prompt, the tool schemas, and the compaction request.

Tool schemas go into `Request.tools` in OpenAI's shape
(`{"type": "function", "function": {"name", "description", "parameters"}}`); the chat template
(agent/chat_format.py) renders them as one line each under `# Tools` in the system turn, and
OpenAI-compatible servers receive them as-is.
"""

from __future__ import annotations

from typing import Any

from agent.chat_format import ARG, TOOL_CALL, TOOL_CALL_END
from agent.harness.tools import TOOLS, Tool

SYSTEM_PROMPT = f"""You are Flywheel, a coding agent in the user's workspace. Look at the code
before changing it, make the smallest change that does the task, and run the tests. Paths are
relative to the workspace root. To call a tool, write {TOOL_CALL}NAME, then each argument as
{ARG}ARGUMENT on its own line followed by its raw value (code exactly as in the file, never
escaped), then {TOOL_CALL_END}. When the task is done, answer in a sentence or two without a tool
call: what you changed and how you checked it."""

COMPACT_PROMPT = """The conversation is getting too long. Summarise the work so far for yourself:
the task, what you found (files, functions, line numbers), what you changed, what is left to do.
Be brief and concrete; do not call tools."""

COMPACTED_PREFIX = "Progress so far (earlier turns were compacted to save space):\n"


def tool_schemas(tools: dict[str, Tool] | None = None) -> list[dict[str, Any]]:
    """The tools as JSON schemas for `Request.tools`."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in (tools or TOOLS).values()
    ]


def first_messages(
    instruction: str, context: str = "", system_prompt: str = SYSTEM_PROMPT
) -> list[dict[str, Any]]:
    """The conversation a task starts with: the system prompt, then the task (and its context)."""
    user = instruction if not context else f"{instruction}\n\n{context}"
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": user}]
