"""Telemetry for agent tasks: every task and step of the harness, through telemetry's Recorder.

Maps harness events onto the recorder's vocabulary (telemetry/events.py `EVENTS`):
`session_start` / `task_start` / `step` (one per message: system, user, each assistant turn with
its token ids and sampling logprobs, each tool result or tool-call error) / `edit` (the final
change of each file) / `task_end` (status, final answer, stop reason and detail, final diff; the
telemetry schema v3 columns `tasks.stop_reason`, `stop_detail`, `diff`).

Recording is optional: with `recorder=None` every method does nothing, and a recorder that
refuses or drops events never affects the run (the recorder never raises).
"""

from __future__ import annotations

from typing import Any

STATUS_OF_STOP = {
    "answered": "done",
    "max_steps": "limit",
    "max_tokens": "limit",
    "wall_time": "limit",
    "repeated_failure": "failed",
    "context_overflow": "failed",
    "engine_error": "failed",
    "workspace_error": "failed",
    "denied": "cancelled",
    "cancelled": "cancelled",
}


class TaskLog:
    """Writes one task's events; holds no state of its own beyond the recorder."""

    @property
    def keeps_code(self) -> bool:
        """Whether this log stores code fields at all (consent "code"): a task's starting
        workspace is only read when it will be kept."""
        policy = getattr(self.recorder, "policy", None)
        return self.recorder is not None and getattr(policy, "consent", "code") == "code"

    def __init__(self, recorder: Any | None) -> None:
        self.recorder = (
            recorder if recorder is not None and getattr(recorder, "enabled", True) else None
        )

    def _record(self, kind: str, **fields: Any) -> str | None:
        if self.recorder is None:
            return None
        return self.recorder.record(kind, **fields)

    def start_session(self, *, editor: str, model_version: str, workspace_root: str) -> str:
        if self.recorder is None:
            return ""
        from telemetry.privacy import workspace_id

        sid = self._record(
            "session_start",
            editor=editor,
            model_version=model_version,
            workspace_id=workspace_id(workspace_root),
        )
        return sid or ""

    def end_session(self, session_id: str) -> None:
        if session_id:
            self._record("session_end", session_id=session_id)

    def start_task(
        self,
        session_id: str,
        *,
        instruction: str,
        model_version: str,
        workspace_files: dict[str, str] | None = None,
        verify_command: str | None = None,
    ) -> str:
        if not session_id:
            return ""
        fields: dict[str, Any] = {"instruction": instruction, "model_version": model_version}
        if workspace_files is not None:
            fields["workspace_files"] = workspace_files
        if verify_command:
            fields["verify_command"] = verify_command
        return self._record("task_start", session_id=session_id, **fields) or ""

    def step(self, state: dict[str, Any], role: str, **fields: Any) -> dict[str, Any]:
        """Record one step at the state's next index; returns the state update (the new index)."""
        idx = state.get("record_idx", 0)
        task_id = state.get("task_id", "")
        if task_id:
            fields = {k: v for k, v in fields.items() if v is not None}
            self._record(
                "step",
                session_id=state["session_id"],
                task_id=task_id,
                idx=idx,
                role=role,
                **fields,
            )
        return {"record_idx": idx + 1}

    def end_task(
        self,
        state: dict[str, Any],
        *,
        stop_reason: str,
        detail: str,
        final: str,
        changes: dict[str, tuple[str | None, str | None]],
        diff: str,
    ) -> None:
        task_id = state.get("task_id", "")
        if not task_id:
            return
        sid = state["session_id"]
        for path, (before, after) in changes.items():
            self._record(
                "edit",
                session_id=sid,
                task_id=task_id,
                document_uri=path,
                hunks=[{"original": before or "", "replacement": after or ""}],
            )
        self._record(
            "task_end",
            session_id=sid,
            task_id=task_id,
            status=STATUS_OF_STOP.get(stop_reason, "failed"),
            final_message=final,
            stop_reason=stop_reason,
            stop_detail=detail,
            diff=diff,
        )

    def flush(self) -> None:
        if self.recorder is not None:
            self.recorder.flush(timeout=30)
