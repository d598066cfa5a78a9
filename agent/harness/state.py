"""The graph's state: everything a task needs to continue after a restart, as plain JSON values.

The state is checkpointed after every node (langgraph's SQLite saver), so it holds no objects:
the engine, workspace, sandbox and recorder reach the nodes through langgraph's runtime context
(`nodes.GraphContext`) and live outside it.
Each node returns the keys it changes; a returned key replaces the old value (no reducers).
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

# Why a task stopped. `answered` is the only success.
StopReason = Literal[
    "answered",  # the model replied without a tool call
    "max_steps",  # HarnessConfig.max_steps model turns were used
    "max_tokens",  # HarnessConfig.max_tokens (prompt + output, summed over turns) were used
    "wall_time",  # HarnessConfig.max_wall_s of running time were used
    "repeated_failure",  # the same failing tool call was made HarnessConfig.repeat_limit times
    "context_overflow",  # the history does not fit the model even after compaction
    "engine_error",  # the engine failed or timed out
    "workspace_error",  # the workspace disappeared or became unusable
    "denied",  # the user denied an action and asked to stop
    "cancelled",  # the caller set the task's cancel event (Harness.start(cancel=...))
]


class AgentState(TypedDict, total=False):
    messages: list[dict[str, Any]]  # OpenAI-shape chat messages, system first
    task_id: str  # telemetry id of the task ("" when not recording)
    session_id: str  # telemetry session the task belongs to
    record_idx: int  # next telemetry step index
    steps: int  # model turns so far
    tokens: int  # prompt + output tokens so far, summed over turns
    elapsed_s: float  # running time so far (waiting for approval does not count)
    last_prompt_tokens: int  # prompt size the engine reported for the last turn
    last_prompt_chars: int  # characters of the messages sent in that turn
    pending: list[dict[str, Any]]  # tool calls of the last turn: {"id", "name", "arguments"}
    approvals: dict[str, bool]  # call id -> the user's decision, for calls that needed one
    failures: dict[str, int]  # fingerprint@edits digest of a failing call -> times it failed
    tool_errors: int  # failed or invalid tool calls so far (a reward signal)
    stop_reason: StopReason | None
    stop_detail: str  # one line on why it stopped (the error, the limit)
    final: str  # the model's last answer
    originals: dict[str, str | None]  # text of each changed file before the task (None: new)
