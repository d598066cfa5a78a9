"""Agent tasks in the editor (ask, fix a diagnostic, explain) and the review of their edits.

Vocabulary:
  task       one instruction run to an answer; its steps stream to the client as they happen
  proposal   the edits a task (or a client's `flywheel.reviewEdit`) wants in one document, made
             against one document version and text (the *base*); nothing is applied until the
             user accepts
  hunk       one contiguous change of a proposal (difflib line opcodes between base and proposed
             text); each is accepted or rejected on its own
  stale      the document changed since the proposal, other than by the proposal's own accepted
             hunks: accepting is refused with a clear message, never applied at a guessed place

How a hunk lands: the proposal keeps `expected_text` (the base with its accepted hunks applied).
Accepting hunk i checks that the document's text equals `expected_text`, moves the hunk's base
offsets by the length change of the accepted hunks before it, and returns the edit with the
document's current version, for `workspace/applyEdit`.

Tasks run through the agent harness (`agent.harness`) when it provides `run_task`; until then a
single model turn answers, and SEARCH/REPLACE blocks in the answer become the proposal:

    <<<<<<< SEARCH
    old lines
    =======
    new lines
    >>>>>>> REPLACE

What it does not do: talk LSP (server.py sends the notifications and the workspace edits).
"""

from __future__ import annotations

import difflib
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from lsprotocol import types

from lsp.documents import range_of

HUNK_STATES = ("pending", "accepted", "rejected", "failed")
EDIT_BLOCK = re.compile(
    r"<<<<<<< SEARCH\n(?P<search>.*?)\n?=======\n(?P<replace>.*?)\n?>>>>>>> REPLACE", re.DOTALL
)
SYSTEM_PROMPT = (
    "You are Flywheel, a coding assistant inside the user's editor. Answer briefly. To change "
    "the current file, write SEARCH/REPLACE blocks:\n<<<<<<< SEARCH\nexact old lines\n=======\n"
    "new lines\n>>>>>>> REPLACE"
)


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
    version: int  # the document version the hunks were made against
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

    def edit_for(self, idx: int, text: str, version: int) -> tuple[types.TextDocumentEdit, str]:
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


def apply_search_replace(text: str, answer: str) -> tuple[str, list[str]]:
    """Apply every SEARCH/REPLACE block of `answer` to `text`; return (new text, errors)."""
    errors: list[str] = []
    for match in EDIT_BLOCK.finditer(answer):
        search, replace = match.group("search"), match.group("replace")
        count = text.count(search) if search else 0
        if count != 1:
            what = "not found" if count == 0 else f"found {count} times"
            errors.append(f"SEARCH block {what}: {search[:80]!r}")
            continue
        text = text.replace(search, replace, 1)
    return text, errors


@dataclass
class ProposalBook:
    """Open proposals by id (the most recent 64 are kept)."""

    proposals: dict[str, Proposal] = field(default_factory=dict)

    def create(
        self, uri: str, version: int, base_text: str, new_text: str, task_id: str | None
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


def task_messages(kind: str, instruction: str, uri: str, text: str, selection: str) -> list[dict]:
    """The chat for a single-turn task over one document."""
    name = uri.rsplit("/", 1)[-1]
    body = f"File {name}:\n```\n{text[:6000]}\n```\n"
    if selection:
        body += f"Selected:\n```\n{selection[:2000]}\n```\n"
    body += instruction
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": body}]


def instruction_for(kind: str, args: dict[str, Any], selection: str) -> str:
    if kind == "fix":
        diag = args.get("diagnostic") or {}
        message = diag.get("message", "") if isinstance(diag, dict) else ""
        return f"Fix this problem: {message}" if message else "Fix the problem at the selection."
    if kind == "explain":
        return "Explain what the selected code does." if selection else "Explain this file."
    question = args.get("question")
    return question if isinstance(question, str) and question.strip() else "Explain this code."
