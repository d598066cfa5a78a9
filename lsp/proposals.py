"""Proposed edits and their review, hunk by hunk.

Vocabulary:
  proposal   the edits an agent task (or a client's `flywheel.reviewEdit`) wants in one document,
             made against one document version and text (the *base*); nothing is applied until
             the user accepts
  hunk       one contiguous change of a proposal (difflib line opcodes between base and proposed
             text); each is accepted or rejected on its own
  stale      the document changed since the proposal, other than by the proposal's own accepted
             hunks: accepting is refused with a clear message, never applied at a guessed place

How a hunk lands: the proposal keeps `expected_text` (the base with its accepted hunks applied).
Accepting hunk i checks that the document's text equals `expected_text`, moves the hunk's base
offsets by the length change of the accepted hunks before it, and returns the edit with the
document's current version (None for a file the editor does not have open: the file on disk),
for `workspace/applyEdit`.

`Hunk`, `Proposal` and `ProposalBook` are pure; `ReviewService` is their LSP side: it records
each proposal with its hunks, sends `flywheel/proposal`, applies accepted hunks with versioned
`workspace/applyEdit` and records every hunk's outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls import uris
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from lsp.documents import range_of
from lsp.protocol import PROPOSAL, REQUEST_FAILED

if TYPE_CHECKING:
    from lsp.server import FlywheelServer

HUNK_STATES = ("pending", "accepted", "rejected", "failed")
APPLIED_CHANGE_WAIT_S = 5.0  # how long an accept waits for the previous hunk's didChange


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


def file_path(uri: str) -> Path | None:
    """The resolved file a `file:` URI names; None for any other scheme."""
    if not uri.startswith("file:"):
        return None
    return Path(uris.to_fs_path(uri) or "").resolve()


class ReviewService:
    """The server's proposals: made, sent, then accepted or rejected hunk by hunk."""

    def __init__(self, ls: FlywheelServer) -> None:
        self.ls = ls
        self.book = ProposalBook()
        self.changed: dict[str, asyncio.Event] = {}  # uri -> set on its next didOpen/didChange

    def document_changed(self, uri: str) -> None:
        """didOpen or didChange of `uri`: an accept waiting for its previous hunk may go on."""
        event = self.changed.pop(uri, None)
        if event is not None:
            event.set()

    def propose(
        self,
        uri: str,
        version: int | None,
        base: str,
        new: str,
        task_id: str | None,
        kind: str,
    ) -> Proposal | None:
        """Record and send the proposal from `base` to `new`; None when they do not differ.

        `kind`: "apply" for a client's reviewEdit (recorded as a suggestion too), else the
        agent's edit, recorded under its task."""
        ls = self.ls
        proposal = self.book.create(uri, version, base, new, task_id)
        if proposal is None:
            return None
        sid = None
        if kind == "apply":
            sid = ls.record(
                "suggestion",
                id=proposal.id,
                kind="apply",
                document_uri=uri,
                document_version=version,
                output=new,
            )
        ls.record(
            "edit",
            id=proposal.id,
            task_id=task_id,
            suggestion_id=sid,
            document_uri=uri,
            document_version=version,
            hunks=[{"original": h.original, "replacement": h.replacement} for h in proposal.hunks],
        )
        ls.notify(PROPOSAL, proposal.as_json())
        return proposal

    def review_edit(self, doc: Any, data: dict[str, Any]) -> dict[str, Any]:
        """`flywheel.reviewEdit` {uri, version, text}: propose the open `doc`'s new text, refusing
        a text that is not a string or a version the document has moved past."""
        new_text = data.get("text")
        if not isinstance(new_text, str):
            raise JsonRpcInvalidParams(
                "reviewEdit needs {uri, version, text}: text is the new document"
            )
        if data.get("version") not in (None, doc.version):
            raise JsonRpcException(
                f"the document is at version {doc.version}, not {data.get('version')}; "
                "nothing was proposed",
                code=REQUEST_FAILED,
            )
        proposal = self.propose(doc.uri, doc.version or 0, doc.source, new_text, None, "apply")
        return {"proposal": proposal.as_json() if proposal else None}

    def get(self, proposal_id: Any) -> Proposal:
        try:
            return self.book.get(proposal_id)
        except ValueError as exc:
            raise JsonRpcInvalidParams(str(exc)) from None

    def current_text(self, proposal: Proposal) -> tuple[str, int | None, bool]:
        """The proposal's document now: (text, version or None for the disk, whether it exists)."""
        workspace = self.ls.workspace
        if proposal.uri in workspace.text_documents:
            doc = workspace.get_text_document(proposal.uri)
            return doc.source, doc.version or 0, True
        path = file_path(proposal.uri) if proposal.version is None else None
        if path is not None and path.is_file():
            return path.read_text(errors="surrogateescape"), None, True
        if path is not None and proposal.base_text == "":
            return "", None, False  # a new file: the first accepted hunk creates it
        raise JsonRpcException(
            f"{proposal.uri} is closed; reopen it and ask again", code=REQUEST_FAILED
        )

    async def accept(self, proposal: Proposal, idx: int) -> dict[str, Any]:
        """Apply hunk `idx` with a versioned workspace/applyEdit; refuse a stale document."""
        ls = self.ls
        text, version, exists = self.current_text(proposal)
        if text != proposal.expected_text and proposal.awaiting_change:
            event = self.changed.setdefault(proposal.uri, asyncio.Event())
            with contextlib.suppress(TimeoutError):  # our previous hunk's didChange is on its way
                await asyncio.wait_for(event.wait(), timeout=APPLIED_CHANGE_WAIT_S)
            text, version, exists = self.current_text(proposal)
        proposal.awaiting_change = False
        try:
            edit, after = proposal.edit_for(idx, text, version)
        except StaleProposal as exc:
            for h in proposal.hunks:
                if h.state == "pending":
                    h.state = "failed"
                    ls.record("hunk_outcome", edit_id=proposal.id, idx=h.idx, outcome="failed")
            raise JsonRpcException(str(exc), code=REQUEST_FAILED) from None
        except ValueError as exc:
            raise JsonRpcInvalidParams(str(exc)) from None
        changes: list[Any] = [edit]
        if not exists:
            create = types.CreateFile(
                uri=proposal.uri, options=types.CreateFileOptions(ignore_if_exists=True)
            )
            changes.insert(0, create)
        result = await ls.workspace_apply_edit_async(
            types.ApplyWorkspaceEditParams(
                edit=types.WorkspaceEdit(document_changes=changes), label="Flywheel: accept hunk"
            )
        )
        hunk = proposal.hunks[idx]
        if not result.applied:
            hunk.state = "failed"
            ls.record("hunk_outcome", edit_id=proposal.id, idx=idx, outcome="failed")
            raise JsonRpcException(
                f"the editor did not apply the edit: {result.failure_reason or 'no reason given'}",
                code=REQUEST_FAILED,
            )
        hunk.state = "accepted"
        proposal.expected_text = after
        proposal.awaiting_change = self.current_text(proposal)[0] != after
        ls.record("hunk_outcome", edit_id=proposal.id, idx=idx, outcome="accepted")
        return {"proposalId": proposal.id, "index": idx, "state": "accepted"}

    def reject(self, proposal: Proposal, idx: Any) -> dict[str, Any]:
        try:
            hunk = proposal.hunk(idx)
        except ValueError as exc:
            raise JsonRpcInvalidParams(str(exc)) from None
        if hunk.state == "pending":
            hunk.state = "rejected"
            self.ls.record("hunk_outcome", edit_id=proposal.id, idx=idx, outcome="rejected")
        return {"proposalId": proposal.id, "index": idx, "state": hunk.state}

    async def accept_all(self, proposal: Proposal) -> dict[str, Any]:
        """Apply every pending hunk, in order."""
        pending = [h.idx for h in proposal.hunks if h.state == "pending"]
        done = [await self.accept(proposal, idx) for idx in pending]
        return {"proposalId": proposal.id, "accepted": len(done)}

    def reject_all(self, proposal: Proposal) -> dict[str, Any]:
        pending = [h.idx for h in proposal.hunks if h.state == "pending"]
        done = [self.reject(proposal, idx) for idx in pending]
        return {"proposalId": proposal.id, "rejected": len(done)}
