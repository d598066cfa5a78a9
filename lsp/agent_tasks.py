"""Agent tasks in the editor (ask, fix a diagnostic, explain) and the review of their edits.

Vocabulary:
  task       one instruction run by the agent harness (`agent.harness.Harness`) to an answer; its
             steps stream to the client as they happen
  proposal   the edits a task (or a client's `flywheel.reviewEdit`) wants in one document, made
             against one document version and text (the *base*); nothing is applied until the
             user accepts
  hunk       one contiguous change of a proposal (difflib line opcodes between base and proposed
             text); each is accepted or rejected on its own
  stale      the document changed since the proposal, other than by the proposal's own accepted
             hunks: accepting is refused with a clear message, never applied at a guessed place

How a task runs: the server builds a harness `Workspace` whose overlay is the open editor buffers
(unsaved text wins over the disk), so the agent's writes become proposals instead of files. The
harness joins the editor's telemetry session (`Harness(session_id=...)`) and stops with
`cancelled` when the task's cancel event is set (`Harness.start(cancel=...)`). One small adapter
remains, `TaskRecorder`: the task is recorded under the id the server already gave the client,
and the harness's whole-file `edit` rows are left to the server, which records each proposal with
its hunks and their outcomes.

How a hunk lands: the proposal keeps `expected_text` (the base with its accepted hunks applied).
Accepting hunk i checks that the document's text equals `expected_text`, moves the hunk's base
offsets by the length change of the accepted hunks before it, and returns the edit with the
document's current version (None for a file the editor does not have open: the file on disk),
for `workspace/applyEdit`.

What it does not do: talk LSP (server.py sends the notifications and the workspace edits).
"""

from __future__ import annotations

import difflib
import uuid
from dataclasses import dataclass, field
from typing import Any

from lsprotocol import types

from agent.harness import ApprovalPolicy
from lsp.documents import range_of

HUNK_STATES = ("pending", "accepted", "rejected", "failed")


class StaleProposal(Exception):
    """The document changed since the proposal was made; the message says what to do."""


@dataclass
class Hunk:
    idx: int
    start: int  # base-text offsets (code points) of the replaced text
    end: int
    original: str
    replacement: str
    state: str = "pending"

    def as_json(self, base_text: str) -> dict[str, Any]:
        rng = range_of(base_text, self.start, self.end)
        return {
            "index": self.idx,
            "range": {
                "start": {"line": rng.start.line, "character": rng.start.character},
                "end": {"line": rng.end.line, "character": rng.end.character},
            },
            "original": self.original,
            "newText": self.replacement,
            "state": self.state,
        }


@dataclass
class Proposal:
    id: str
    uri: str
    version: int | None  # the document version the hunks were made against (None: the disk)
    base_text: str
    hunks: list[Hunk]
    task_id: str | None = None
    expected_text: str = ""  # the base with the accepted hunks applied
    awaiting_change: bool = False  # an accepted hunk's didChange has not arrived yet

    def __post_init__(self) -> None:
        self.expected_text = self.expected_text or self.base_text

    @property
    def done(self) -> bool:
        return all(h.state != "pending" for h in self.hunks)

    def as_json(self) -> dict[str, Any]:
        return {
            "proposalId": self.id,
            "taskId": self.task_id,
            "uri": self.uri,
            "version": self.version,
            "hunks": [h.as_json(self.base_text) for h in self.hunks],
        }

    def hunk(self, idx: int) -> Hunk:
        if not isinstance(idx, int) or not 0 <= idx < len(self.hunks):
            raise ValueError(f"proposal {self.id} has hunks 0..{len(self.hunks) - 1}, not {idx!r}")
        return self.hunks[idx]

    def edit_for(
        self, idx: int, text: str, version: int | None
    ) -> tuple[types.TextDocumentEdit, str]:
        """The edit that applies hunk `idx` to the document now at (`text`, `version`).

        Returns the edit and the text after it; raises StaleProposal or ValueError.
        """
        hunk = self.hunk(idx)
        if hunk.state != "pending":
            raise ValueError(f"hunk {idx} of proposal {self.id} is already {hunk.state}")
        if text != self.expected_text:
            raise StaleProposal(
                f"{self.uri.rsplit('/', 1)[-1]} changed since Flywheel proposed this edit "
                f"(version {self.version}); nothing was applied. Ask again for a fresh proposal."
            )
        shift = sum(
            len(h.replacement) - (h.end - h.start)
            for h in self.hunks
            if h.state == "accepted" and h.start < hunk.start
        )
        start, end = hunk.start + shift, hunk.end + shift
        edit = types.TextDocumentEdit(
            text_document=types.OptionalVersionedTextDocumentIdentifier(
                uri=self.uri, version=version
            ),
            edits=[types.TextEdit(range=range_of(text, start, end), new_text=hunk.replacement)],
        )
        return edit, text[:start] + hunk.replacement + text[end:]


def hunks_between(old: str, new: str) -> list[Hunk]:
    """Line-level hunks that turn `old` into `new`, in order, as base-text offsets."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    starts = [0]
    for line in a:
        starts.append(starts[-1] + len(line))
    hunks: list[Hunk] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        start, end = starts[i1], starts[i2]
        hunks.append(Hunk(len(hunks), start, end, old[start:end], "".join(b[j1:j2])))
    return hunks


@dataclass
class ProposalBook:
    """Open proposals by id (the most recent 64 are kept)."""

    proposals: dict[str, Proposal] = field(default_factory=dict)

    def create(
        self, uri: str, version: int | None, base_text: str, new_text: str, task_id: str | None
    ) -> Proposal | None:
        hunks = hunks_between(base_text, new_text)
        if not hunks:
            return None
        proposal = Proposal(uuid.uuid4().hex, uri, version, base_text, hunks, task_id)
        self.proposals[proposal.id] = proposal
        while len(self.proposals) > 64:
            self.proposals.pop(next(iter(self.proposals)))
        return proposal

    def get(self, proposal_id: Any) -> Proposal:
        proposal = self.proposals.get(proposal_id) if isinstance(proposal_id, str) else None
        if proposal is None:
            raise ValueError(f"no open proposal {proposal_id!r} (finished, or from an old session)")
        return proposal


def instruction_for(kind: str, args: dict[str, Any], selection: str) -> str:
    if kind == "fix":
        diag = args.get("diagnostic") or {}
        message = diag.get("message", "") if isinstance(diag, dict) else ""
        return f"Fix this problem: {message}" if message else "Fix the problem at the selection."
    if kind == "explain":
        return "Explain what the selected code does." if selection else "Explain this file."
    question = args.get("question")
    return question if isinstance(question, str) and question.strip() else "Explain this code."


def approval_policy(setting: str) -> ApprovalPolicy:
    """The harness's approval policy for the `agent.approval` setting.

    Edits in the editor are proposals the user reviews hunk by hunk anyway, so `edits` asks only
    before what a review cannot undo (deletes, protected paths, commands outside the sandbox).
    """
    if setting == "never":
        return ApprovalPolicy(commands="never", delete=False, protected=())
    if setting == "always":
        return ApprovalPolicy(commands="always", delete=True, protected=("*",))
    return ApprovalPolicy()


class TaskRecorder:
    """The server's recorder as the harness sees it (see the module docstring)."""

    def __init__(self, recorder: Any, task_id: str) -> None:
        self.recorder = recorder
        self.task_id = task_id

    @property
    def enabled(self) -> bool:
        return self.recorder is not None and self.recorder.enabled

    def record(self, kind: str, /, **fields: Any) -> str | None:
        if not self.enabled or kind == "edit":
            return None
        if kind == "task_start":
            fields["id"] = self.task_id
        return self.recorder.record(kind, **fields)

    def flush(self, timeout: float | None = None) -> bool:
        return self.recorder.flush(timeout=timeout) if self.enabled else False


def step_note(event: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    """A harness event (`on_event`) as (role, text, extra fields) for `flywheel/taskStep`."""
    kind = event.get("kind")
    if kind == "assistant":
        calls = [{"name": c.get("name"), "arguments": c.get("arguments")} for c in event["calls"]]
        return "assistant", event.get("content") or "", {"kind": kind, "calls": calls}
    if kind == "tool":
        text = str(event.get("result", ""))
        if len(text) > 4000:
            text = text[:4000] + f"\n[... {len(text) - 4000} more characters]"
        extra = {"kind": kind, "name": event.get("name"), "isError": bool(event.get("is_error"))}
        return "tool", text, extra
    if kind == "approval":
        decisions = event.get("approvals") or {}
        allowed = sum(1 for v in decisions.values() if v)
        return "user", f"approved {allowed} of {len(decisions)} actions", {"kind": kind}
    if kind == "compact":
        return "assistant", f"[compacted the history] {event.get('summary', '')}", {"kind": kind}
    if kind == "rules":
        cut = " (cut to its budget)" if event.get("truncated") else ""
        text = f"project rules: {', '.join(event.get('files') or [])}{cut}"
        return "system", text, {"kind": kind}
    if kind == "stop":
        detail = event.get("detail") or ""
        text = f"stopped: {event.get('reason')}" + (f": {detail}" if detail else "")
        return "system", text, {"kind": kind, "reason": event.get("reason")}
    return "system", str(event), {"kind": str(kind)}
