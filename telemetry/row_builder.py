"""How an event becomes the row that is stored: cleaned, redacted and stripped per the policy.

`RowBuilder(policy).row(event, spec)` turns the caller's fields into column values: metadata is
cleaned and cut (privacy.clean_text), counts become numbers or NULL, code fields are kept only at
consent "code" and pass privacy.clean_code (cleaning and redaction), paths become opaque hashes
at consent "metrics", and a file that matches the exclusion globs keeps no code at all: not in a
suggestion, an edit, a task's workspace or diff, nor in a tool call that reads it and its result.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from telemetry import privacy
from telemetry.events import EVENTS, Event, EventKind
from telemetry.privacy import PrivacyPolicy
from telemetry.redaction import named_secret

# Columns holding counts or measures: anything else passed there is stored as NULL.
_NUMERIC = frozenset(
    [
        "document_version",
        "latency_ms",
        "ttft_ms",
        "prompt_tokens",
        "output_tokens",
        "drafts_proposed",
        "drafts_accepted",
        "mean_acceptance_length",
        "accepted_chars",
        "idx",
        "duration_ms",
        "is_error",
        "invalid",
        "tests_before_passed",
        "tests_before_failed",
        "tests_after_passed",
        "tests_after_failed",
        "diagnostics_before",
        "diagnostics_after",
        "lint_before",
        "lint_after",
        "reverted",
        "dissatisfied_followup",
        "after_s",
        "surviving_chars",
        "rating",
        "step",
        "value",
        "promoted_at",
        "ended_at",
    ]
)


# How RowBuilder.row treats each field of each kind (worked out once, not per event).
_AS_META, _AS_NUMBER, _AS_JSON, _AS_URI, _AS_CODE = range(5)


def _plan(spec: EventKind) -> dict[str, int]:
    plan = {}
    for name in spec.fields | {"session_id"}:
        if name in spec.code:
            plan[name] = _AS_CODE  # kept only at consent "code", after the metadata
        elif name in _NUMERIC:
            plan[name] = _AS_NUMBER
        elif name in spec.json:
            plan[name] = _AS_JSON  # metrics, config: metadata, still cleaned and redacted
        elif name == "document_uri":
            plan[name] = _AS_URI
        else:
            plan[name] = _AS_META
    return plan


_PLANS = {kind: _plan(spec) for kind, spec in EVENTS.items()}

_CUT_MARKER = re.compile(r"\n\[truncated: \d+ (?:chars|bytes), kept \d+\]\Z")


class RowBuilder:
    """Rows for one privacy policy; used by the writer thread only (it keeps per-task state)."""

    def __init__(self, policy: PrivacyPolicy) -> None:
        self.policy = policy
        # task id -> ids of its latest tool calls that named an excluded file
        self._excluded_calls: dict[str, set[str]] = {}

    def excluded(self, uri: Any) -> bool:
        return isinstance(uri, str) and privacy.is_excluded(uri, self.policy.exclude)

    def code(self, value: Any) -> str | None:
        if value is None:
            return None
        return privacy.clean_code(
            value, self.policy.max_code_chars, redact_secrets=self.policy.redact_secrets
        )

    def json_code(self, value: Any) -> Any:
        """Clean and redact every string inside a JSON-like value; a string under a key that
        names a secret ({"password": "..."}) is redacted whole."""
        if isinstance(value, str | bytes | bytearray):
            return self.code(value)
        if isinstance(value, dict):  # keys are names: cleaned, not redacted
            out = {}
            redact_names = self.policy.redact_secrets
            for k, v in value.items():
                key = privacy.clean_text(k, privacy.MAX_META_CHARS)
                if redact_names and type(v) is str and named_secret(key, v):
                    out[key] = "[REDACTED:password_assignment]"
                else:
                    out[key] = self.json_code(v)
            return out
        if isinstance(value, list | tuple):
            return [self.json_code(v) for v in value]
        if value is None or isinstance(value, bool | int | float):
            return value
        return self.code(str(value))

    def _step_touches_excluded_file(self, fields: dict[str, Any]) -> bool:
        """An assistant step calling a tool on an excluded path, or the tool step answering it
        (matched by tool_call_id, or else the tool step right after such a call)."""
        task = str(fields.get("task_id"))
        if fields.get("role") == "assistant":
            ids = _excluded_call_ids(fields.get("tool_calls"), self.policy.exclude)
            if ids:
                if len(self._excluded_calls) > 10_000:  # bounded: old tasks are long done
                    self._excluded_calls.clear()
                self._excluded_calls[task] = ids
            else:
                self._excluded_calls.pop(task, None)
            return bool(ids)
        if fields.get("role") == "tool":
            ids = self._excluded_calls.get(task)
            if not ids:
                return False
            call_id = fields.get("tool_call_id")
            return call_id is None or str(call_id) in ids or "" in ids
        return False

    def row(self, event: Event, spec: EventKind) -> dict[str, Any]:
        fields = event.fields
        consent_code = self.policy.consent == "code"
        keep_code = consent_code
        uri = fields.get("document_uri")
        if keep_code and uri is not None and self.excluded(uri):
            keep_code = False
        plan = _PLANS[event.kind]
        row: dict[str, Any] = {}
        for name, value in fields.items():
            how = plan[name]
            if how == _AS_META or (how == _AS_URI and consent_code):
                if value is None or isinstance(value, bool | int | float):
                    row[name] = value
                else:
                    row[name] = privacy.clean_text(value, privacy.MAX_META_CHARS)
            elif how == _AS_NUMBER:
                row[name] = _number(value)
            elif how == _AS_JSON:
                row[name] = _dumps(self.json_code(value))
            elif how == _AS_URI:
                row[name] = _opaque_uri(value)
        if event.kind == "step":
            calls = fields.get("tool_calls")
            if calls is not None:
                row["tool_calls_hash"] = _hash(_dumps(calls, sort_keys=True))
            if keep_code and self._step_touches_excluded_file(fields):
                keep_code = False  # a read of .env: its arguments and result are not stored
        if event.kind == "task_end":
            message, diff = fields.get("final_message"), fields.get("diff")
            row["final_message_chars"] = len(message) if isinstance(message, str) else None
            row["diff_chars"] = len(diff) if isinstance(diff, str | bytes) else None
        if event.kind == "suggestion":
            output = fields.get("output")
            row["output_chars"] = len(output) if isinstance(output, str) else None
        if not keep_code:
            return row
        # hunks: one row each, written by the recorder
        for name in spec.code & fields.keys() - {"hunks"}:
            value = fields[name]
            if name == "workspace_files":
                files = value if isinstance(value, dict) else {}
                kept = {
                    str(p): t
                    for p, t in files.items()
                    if not privacy.is_excluded(str(p), self.policy.exclude)
                }
                # keys are paths here, not field names: redact each file's text only
                kept = {
                    privacy.clean_text(p, privacy.MAX_META_CHARS): self.code(t)
                    for p, t in kept.items()
                }
                row[name] = _dumps(kept, sort_keys=True)
            elif name in spec.json:
                row[name] = _dumps(self.json_code(value))
            elif name == "diff":
                row[name] = self._diff(value)
            else:
                row[name] = self.code(value)
        return row

    def _diff(self, value: Any) -> str | None:
        """A diff as a code field (cleaned, redacted, cut with a marker), without the sections
        of excluded files; the cut's marker stays even when the last section is dropped."""
        text = self.code(value)
        if text is None:
            return None
        cut = _CUT_MARKER.search(text)
        body, marker = (text[: cut.start()], cut.group(0)) if cut else (text, "")
        return privacy.drop_excluded_files(body, self.policy.exclude) + marker


def _excluded_call_ids(calls: Any, globs: tuple[str, ...]) -> set[str]:
    """The ids ("" when missing) of tool calls whose arguments name an excluded path."""
    found: set[str] = set()
    if not isinstance(calls, list):
        return found
    for call in calls:
        args = call.get("arguments") if isinstance(call, dict) else None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = {"raw": args}
        if isinstance(args, dict) and any(
            isinstance(v, str) and privacy.is_excluded(v, globs) for v in args.values()
        ):
            found.add(str(call.get("id") or "") if isinstance(call, dict) else "")
    return found


def _number(value: Any) -> float | int | None:
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        return float(value)  # SQLite integers are 64-bit
    if value is None or isinstance(value, int | float):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _dumps(value: Any, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=sort_keys, default=str)


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _opaque_uri(uri: Any) -> str | None:
    """At `metrics` consent a path is replaced by a hash that keeps only its extension."""
    if not isinstance(uri, str):
        return None
    name = privacy.uri_path(uri).rsplit("/", 1)[-1]
    ext = name.rsplit(".", 1)[-1] if "." in name else ""
    digest = _hash(uri)[:16]
    return f"sha256:{digest}" + (f".{ext[:10]}" if ext.isalnum() else "")
