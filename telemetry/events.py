"""The recorder's vocabulary: each event kind, the table it lands in, and the fields it takes.

`EVENTS` maps a kind ("session_start", "step", ...) to an `EventKind`: its table, the fields a
caller may pass, which are required, which are code (kept only at consent "code"), which are
stored as JSON, and which take enumerated values. Recorder.record() refuses anything else.
`Event` is one accepted event as it travels from record() to the writer thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUGGESTION_KINDS = frozenset({"inline", "next_edit", "apply", "agent_edit"})
SUGGESTION_EVENTS = frozenset(
    {
        "shown",
        "accepted",
        "partially_accepted",
        "rejected",
        "ignored",
        "superseded",
        "cancelled",
        "withheld",  # written, but under the model's confidence threshold: never on screen
    }
)
TASK_STATUSES = frozenset({"running", "done", "failed", "cancelled", "limit"})
ROLES = frozenset({"system", "user", "assistant", "tool"})
HUNK_OUTCOMES = frozenset({"pending", "accepted", "rejected", "failed", "reverted"})


@dataclass(frozen=True)
class EventKind:
    """How one kind of event maps onto the schema (store.py)."""

    table: str
    fields: frozenset[str]  # fields a caller may pass (besides session_id)
    required: frozenset[str] = frozenset()
    code: frozenset[str] = frozenset()  # code/prompt/output: kept only at consent "code"
    json: frozenset[str] = frozenset()  # stored as JSON text
    choices: tuple[tuple[str, frozenset[str]], ...] = ()  # enumerated fields
    session: bool = True  # belongs to a session, which must exist
    upsert: bool = False  # may update an existing row with the same id


def _spec(
    table: str,
    *,
    fields: str = "",
    required: str = "",
    code: str = "",
    json: str = "",
    choices: dict[str, frozenset[str]] | None = None,
    session: bool = True,
    upsert: bool = False,
) -> EventKind:
    req = frozenset(required.split())
    return EventKind(
        table=table,
        fields=frozenset(fields.split()) | req | frozenset(code.split()) | frozenset(json.split()),
        required=req,
        code=frozenset(code.split()),
        json=frozenset(json.split()),
        choices=tuple((choices or {}).items()),
        session=session,
        upsert=upsert,
    )


# The vocabulary: event kind -> table. Every field not listed is refused by record().
EVENTS: dict[str, EventKind] = {
    "session_start": _spec(
        "sessions", fields="id editor plugin_version model_version workspace_id git_head"
    ),
    "session_end": _spec("sessions"),
    # the model a session runs, once known (an editor session starts before its engine loads);
    # fills an empty sessions.model_version, never overwrites one
    "session_model": _spec("sessions", required="model_version"),
    "suggestion": _spec(
        "suggestions",
        fields="id trigger document_uri document_version language latency_ms ttft_ms "
        "prompt_tokens output_tokens drafts_proposed drafts_accepted mean_acceptance_length "
        "model_version",
        required="kind",
        code="context output",
        json="context",
        choices={"kind": SUGGESTION_KINDS},
    ),
    "suggestion_event": _spec(
        "suggestion_events",
        fields="accepted_chars",
        required="suggestion_id event",
        choices={"event": SUGGESTION_EVENTS},
    ),
    "task_start": _spec(
        "tasks",
        fields="id model_version",
        code="instruction verify_command workspace_files",
        json="workspace_files",
    ),
    "task_end": _spec(
        "tasks",
        fields="stop_reason",  # the harness's reason: answered, max_steps, engine_error, ...
        required="task_id status",
        code="final_message stop_detail diff",  # diff: the final unified diff of the workspace
        choices={"status": TASK_STATUSES},
    ),
    "step": _spec(
        "steps",
        fields="tool_call_id tool_name is_error invalid policy_version duration_ms "
        "prompt_tokens output_tokens",
        required="task_id idx role",
        code="content tool_calls result error token_ids logprobs",
        json="tool_calls token_ids logprobs",
        choices={"role": ROLES},
    ),
    "edit": _spec(
        "edits",
        fields="id task_id suggestion_id document_uri document_version",
        code="hunks",
    ),
    "hunk_outcome": _spec(
        "hunks", required="edit_id idx outcome", choices={"outcome": HUNK_OUTCOMES}
    ),
    "outcome": _spec(
        "outcomes",
        fields="task_id suggestion_id tests_before_passed tests_before_failed "
        "tests_after_passed tests_after_failed diagnostics_before diagnostics_after "
        "lint_before lint_after reverted dissatisfied_followup",
    ),
    "survival": _spec(
        "survival",
        fields="accepted_chars surviving_chars",
        required="suggestion_id after_s",
    ),
    "feedback": _spec("feedback", fields="task_id suggestion_id rating", code="comment"),
    "file": _spec("files", fields="language", required="document_uri", code="text"),
    "model_version": _spec(
        "model_versions",
        fields="parent stage path promoted_at",
        required="id",
        json="metrics",
        session=False,
        upsert=True,
    ),
    "training_run": _spec(
        "training_runs",
        fields="stage model_in model_out status ended_at",
        required="id",
        json="config",
        session=False,
        upsert=True,
    ),
    "training_metric": _spec("training_metrics", required="run_id step name value", session=False),
}


@dataclass
class Event:
    """One accepted event: its kind, id, time (Unix seconds) and the caller's fields."""

    kind: str
    id: str
    at: float
    fields: dict[str, Any]
