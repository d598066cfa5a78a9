"""The Flywheel language server: one decorated function per LSP message.

Each handler gets the document, computes, converts to lsprotocol types and returns. The work is
done by the services the server holds: completions (completion.py), next edits (next_edit.py),
agent tasks (agent_tasks.py), the review of proposed edits (proposals.py) and kept-code tracking
(feedback.py). `FlywheelServer` holds them with the settings, the engine host and the telemetry
recorder and session. The custom `flywheel/` messages and their types are in protocol.py; the
commands of `workspace/executeCommand` are in COMMANDS below.

Agent tasks run the agent harness (agent.harness.Harness) in a worker thread over a workspace
whose overlay is the open buffers; its writes come back as proposals, sent as
`flywheel/proposal` and applied hunk by hunk with versioned `workspace/applyEdit`.

When the client disappears (stdin closes, or `exit` arrives without `shutdown`), `close()` runs
after the transport ends: it cancels running tasks and completions, lets their last telemetry
rows (task_end, cancelled suggestions) reach the recorder, ends the session and flushes it to
disk, then returns so the process exits.

What it does not do: block the event loop on the model (engine calls run in worker threads) or
fail a request because telemetry failed (the recorder never raises).

Run it: `flywheel lsp` (stdio) or `flywheel lsp --tcp --port 2087` (debugging).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import asdict, replace
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer

from agent.engine import EngineError
from lsp.agent_tasks import TaskRunner, prompt_place, task_actions
from lsp.completion import Ask, CompletionService, Neighbour, head_offset
from lsp.configuration import apply_settings, pull_configuration
from lsp.documents import MAX_DOCUMENT_CHARS, looks_binary, offset_at, suggestible
from lsp.feedback import SurvivalTracker
from lsp.load_progress import LoadProgress
from lsp.model_host import ModelHost
from lsp.next_edit import NextEditService, VersionMoved
from lsp.proposals import ReviewService
from lsp.protocol import (
    ADVANCE_CLOCK,
    COMPLETION_PARTIALLY_ACCEPTED,
    COMPLETION_REJECTED,
    COMPLETION_SHOWN,
    CONTENT_MODIFIED,
    CURSOR_IDLE,
    FLUSH,
    NEXT_EDIT,
    STATUS,
    AdvanceClockParams,
    CompletionEventParams,
    CursorIdleParams,
    FlywheelProtocol,
    NextEditParams,
    NextEditResult,
)
from lsp.settings import ModelSettings, Settings, parse_settings

log = logging.getLogger("flywheel.lsp")

SURVIVAL_POLL_S = 5.0  # how often the real clock checks survival (the manual clock: on advance)
CLOSE_TIMEOUT_S = 10.0  # on exit: how long running tasks get to stop and telemetry to flush

COMMANDS = {
    "flywheel.acceptCompletion": "[suggestionId] the client accepted an inline suggestion",
    "flywheel.ask": "[{uri?, range?, question}] run an agent task",
    "flywheel.fixDiagnostic": "[{uri, diagnostic}] run an agent task that fixes a diagnostic",
    "flywheel.explain": "[{uri, range?}] explain the selection or the file",
    "flywheel.cancelTask": "[taskId] stop a running task",
    "flywheel.reviewEdit": "[{uri, version, text}] propose a new document text for review",
    "flywheel.acceptHunk": "[proposalId, index] apply one hunk of a proposal",
    "flywheel.rejectHunk": "[proposalId, index] drop one hunk of a proposal",
    "flywheel.acceptAll": "[proposalId] apply every pending hunk",
    "flywheel.rejectAll": "[proposalId] drop every pending hunk",
    "flywheel.rate": "[{suggestionId? | taskId?, rating: -1|0|1, comment?}] explicit feedback",
    "flywheel.status": "[] the model state and version",
}


def _plugin_version() -> str:
    try:
        return version("flywheel")
    except PackageNotFoundError:
        return "0"


class FlywheelServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(
            "flywheel", _plugin_version(), max_workers=4, protocol_cls=FlywheelProtocol
        )
        self.defaults = Settings()  # what `flywheel lsp` flags set; client settings overlay it
        self.settings = Settings()
        self.db_path = ""  # the CLI's default telemetry file
        self.clock = time.monotonic
        self.manual_now: float | None = None  # set by --manual-clock (tests advance it)
        self.recorder: Any = None
        self.session_id: str | None = None
        self.editor = ""
        self.host = ModelHost(
            on_status=self._send_status, on_error=self._show_error, on_progress=LoadProgress(self)
        )
        self.completion_model: ModelSettings | None = None  # the completion lane's (reload.py)
        self.completions = CompletionService(self.host, self.record, self.now)
        self.survival = SurvivalTracker(self.now)
        self.next_edits = NextEditService(
            self.host, self.completions, self.record, self.now, self.document
        )
        self.review = ReviewService(self)
        self.tasks = TaskRunner(self, self.review, MAX_DOCUMENT_CHARS)
        self._said: set[str] = set()
        self._closed = False
        self.client_gone = False  # `exit` arrived: nothing more is written to the client
        self._model_version = ""

    # --- time, telemetry, messages ----------------------------------------------------------

    def now(self) -> float:
        return self.manual_now if self.manual_now is not None else self.clock()

    def record(self, kind: str, /, **fields: Any) -> str | None:
        if self.recorder is None or self.session_id is None:
            return None
        return self.recorder.record(kind, session_id=self.session_id, **fields)

    def open_recorder(self) -> None:
        """(Re)open telemetry for the current settings; consent `off` writes nothing at all."""
        from telemetry.privacy import PrivacyPolicy, workspace_id
        from telemetry.recorder import Recorder

        if self.recorder is not None:
            self.record("session_end")
            self.recorder.close()
            self.recorder, self.session_id = None, None
        t = self.settings.telemetry
        if t.consent == "off":
            return
        path = t.db_path or self.db_path
        if not path:
            self.say_once("telemetry is on but no database path is set; nothing is recorded")
            return
        policy = PrivacyPolicy(consent=t.consent, exclude=tuple(t.exclude))
        self.recorder = Recorder(path, policy)
        if not self.recorder.enabled:
            self.say_once(self.recorder.error or "telemetry could not start")
            return
        root = self.workspace.root_path
        self.session_id = self.recorder.record(
            "session_start",
            editor=self.editor or "unknown",
            plugin_version=self.version,
            model_version=self.host.version,
            workspace_id=workspace_id(root) if root else None,
        )

    def say_once(
        self,
        message: str,
        kind: types.MessageType = types.MessageType.Warning,
        logged: bool = False,
    ) -> None:
        if message in self._said:
            return
        self._said.add(message)
        if not logged:
            log.warning("%s", message)
        self.window_show_message(types.ShowMessageParams(type=kind, message=f"Flywheel: {message}"))

    def _show_error(self, message: str) -> None:
        self.say_once(message, types.MessageType.Error, logged=True)  # the host logged it

    def notify(self, method: str, params: Any) -> None:
        """A notification to the client, unless it has gone (after `exit`)."""
        if not self.client_gone:
            self.protocol.notify(method, params)

    def status(self, status: dict[str, Any] | None = None) -> dict[str, Any]:
        """`status` (the host's), with `completionModelVersion` when the lane serves completions,
        and `continuedRequests`: completion requests answered with the open suggestion, which
        telemetry logs under that suggestion's row, not one of their own."""
        status = self.host.status() if status is None else status
        status = {**status, "continuedRequests": self.completions.continued}
        if self.completions.host is not self.host:
            status = {**status, "completionModelVersion": self.completions.host.version}
        return status

    def _send_status(self, status: dict[str, Any]) -> None:
        if self.client_gone:
            return
        self.notify(STATUS, self.status(status))
        version_now = status.get("modelVersion") or ""
        if version_now and version_now != self._model_version:
            if not self._model_version:  # the engine is ready: the session learns its model
                self.record("session_model", model_version=version_now)
            if self._model_version:
                self.window_show_message(
                    types.ShowMessageParams(
                        type=types.MessageType.Info,
                        message=f"Flywheel now uses model {version_now} "
                        f"(was {self._model_version})",
                    )
                )
            self._model_version = version_now

    def report_server_error(self, error: Exception, source: Any) -> None:
        """pygls reports an error: answered and logged by the protocol (lsp/protocol.py)."""
        self.protocol.report_error(error, source)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop everything and make telemetry durable; safe to call twice (shutdown, then exit).

        Runs after `shutdown`, and after the transport ended without one (the client went away).
        """
        if self._closed:
            return
        self._closed = True
        self.completions.abandon()
        self.next_edits.abandon()
        self.tasks.close(timeout)
        if self.recorder is not None:
            self.record("session_end")
            if not self.recorder.close(timeout=timeout):
                log.warning("telemetry could not be flushed within %.0f s", timeout)
            self.recorder, self.session_id = None, None
        if self.completions.host is not self.host:
            self.completions.host.close()
        self.host.close()

    def document(self, uri: str) -> Any:
        """The open document, or None."""
        if uri not in self.workspace.text_documents:
            return None
        return self.workspace.get_text_document(uri)

    def open_document(self, uri: str) -> Any:
        """The open document, or a clear InvalidParams error (never a read from disk)."""
        if not isinstance(uri, str) or uri not in self.workspace.text_documents:
            raise JsonRpcInvalidParams(f"document {uri!r} is not open; open it first (didOpen)")
        return self.workspace.get_text_document(uri)


SERVER = FlywheelServer()


def _command_object(args: tuple[Any, ...]) -> dict[str, Any]:
    if not args or not isinstance(args[0], dict):
        raise JsonRpcInvalidParams('this command takes one object argument, e.g. {"uri": ...}')
    return args[0]


# --- lifecycle --------------------------------------------------------------------------------


@SERVER.feature(types.INITIALIZE)
def initialize(ls: FlywheelServer, params: types.InitializeParams) -> None:
    ls.editor = params.client_info.name if params.client_info else "unknown"
    ls.settings, warnings = parse_settings(params.initialization_options, ls.defaults)
    for w in warnings:
        ls.say_once(w)
    ls.open_recorder()


@SERVER.feature(types.INITIALIZED)
async def initialized(ls: FlywheelServer, params: types.InitializedParams) -> None:
    await pull_configuration(ls)
    if ls.manual_now is None:
        asyncio.ensure_future(_survival_loop(ls))
    if getattr(ls, "registry_follower", None) is not None:  # --model registry: lsp/reload.py
        asyncio.ensure_future(ls.registry_follower.run(ls))
    with contextlib.suppress(EngineError):  # the host told the user once; features answer nothing
        await ls.host.get(ls.settings.model)
    ls._send_status(ls.host.status())  # the client shows the model version from the start


@SERVER.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
async def did_change_configuration(
    ls: FlywheelServer, params: types.DidChangeConfigurationParams
) -> None:
    data = params.settings
    if isinstance(data, dict) and isinstance(data.get("flywheel"), dict):
        apply_settings(ls, data["flywheel"])
    else:
        await pull_configuration(ls)
    if ls.host.settings != ls.settings.model:
        with contextlib.suppress(EngineError):
            await ls.host.get(ls.settings.model)


@SERVER.feature(types.EXIT)
def exit_(ls: FlywheelServer, params: Any) -> None:
    """pygls closes the output after this; the CLI then calls `close()` (see the docstring)."""
    ls.client_gone = True
    ls.protocol.drop_answers_after_exit()


@SERVER.feature(types.SHUTDOWN)
def shutdown(ls: FlywheelServer, params: Any) -> None:
    ls.close()


# --- documents ---------------------------------------------------------------------------------


@SERVER.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: FlywheelServer, params: types.DidOpenTextDocumentParams) -> None:
    """Tracks the document for next edits and, in the background, prefills the prompt of a
    completion at its head (`CompletionService.warm_opened`), so that the first completion
    typed in it finds the text before its cursor cached."""
    uri, text = params.text_document.uri, params.text_document.text
    binary = looks_binary(text)  # one scan: `suggestible` without scanning the text again
    fits = not binary and len(text) <= MAX_DOCUMENT_CHARS
    if binary:
        log.info("%s looks binary: no suggestions for it", uri)
    elif fits:
        ls.next_edits.history.open(uri, text)
    ls.review.document_changed(uri)  # an accepted hunk opened the file
    doc = ls.document(uri)
    if ls.settings.completion.enabled and doc is not None and fits:
        ask = _ask(ls, uri, doc, types.Position(line=0, character=0))
        at = head_offset(ask.text, ask.settings.max_prefix_chars)
        asyncio.ensure_future(ls.completions.warm_opened(replace(ask, offset=at)))


@SERVER.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: FlywheelServer, params: types.DidChangeTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.next_edits.history.change(uri, params.text_document.version, list(params.content_changes))
    ls.next_edits.cancel(uri)  # a next edit still running was made for the old text
    if ls.survival.tracking(uri):
        for sid in ls.survival.on_change(uri, list(params.content_changes)):
            ls.record("outcome", suggestion_id=sid, reverted=1, dissatisfied_followup=1)
    ls.review.document_changed(uri)


@SERVER.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: FlywheelServer, params: types.DidCloseTextDocumentParams) -> None:
    """Closing keeps tracked spans: their last text stands for the file as saved."""
    ls.next_edits.history.close(params.text_document.uri)


# --- completions -------------------------------------------------------------------------------


def _ask(ls: FlywheelServer, uri: str, doc: Any, position: types.Position) -> Ask:
    """A completion (or a warm-up) at `position` of the open `doc`: its text and version, the
    other open documents of its language, the settings, and the names the prompt gives it."""
    text, language = doc.source, doc.language_id or ""
    neighbours = [
        Neighbour(other, d.source[:4000], prompt_place(ls.workspace, other)[1])
        for other, d in ls.workspace.text_documents.items()
        if other != uri and d.language_id == language and not looks_binary(d.source)
    ][:3]
    return Ask(
        uri=uri,
        version=doc.version or 0,
        text=text,
        offset=offset_at(text, position),
        language=language,
        neighbours=neighbours,
        settings=ls.settings.completion,
        model=ls.completion_model or ls.settings.model,
        place=prompt_place(ls.workspace, uri),
    )


async def _suggest(ls: FlywheelServer, uri: str, position: types.Position, trigger: str):
    if not ls.settings.completion.enabled:
        return None, None
    doc = ls.document(uri)
    if doc is None:
        log.info("completion for %s, which is not open: nothing to suggest", uri)
        return None, None
    text, version = doc.source, doc.version or 0
    if not suggestible(text):
        return None, None
    suggestion = await ls.completions.complete(_ask(ls, uri, doc, position), trigger)
    now = ls.document(uri)  # pygls changes the document object in place
    if suggestion is not None and (now is None or (now.version or 0) != version):
        # The user typed on while the model ran. Some clients (Neovim's) draw an answer to an
        # outdated request anyway, where it no longer fits; the request for the new text is
        # already on its way (and a typed-through suggestion comes from this one at once).
        return None, None
    return suggestion, position


def _accept_command(sid: str) -> types.Command:
    return types.Command(
        title="Flywheel: accept", command="flywheel.acceptCompletion", arguments=[sid]
    )


@SERVER.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
async def inline_completion(
    ls: FlywheelServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList | None:
    automatic = params.context.trigger_kind == types.InlineCompletionTriggerKind.Automatic
    suggestion, position = await _suggest(
        ls, params.text_document.uri, params.position, "automatic" if automatic else "invoked"
    )
    if suggestion is None:
        return None
    return types.InlineCompletionList(
        items=[
            types.InlineCompletionItem(
                insert_text=suggestion.text,
                range=types.Range(start=position, end=position),
                command=_accept_command(suggestion.id),
            )
        ]
    )


@SERVER.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=[]))
async def completion(
    ls: FlywheelServer, params: types.CompletionParams
) -> types.CompletionList | None:
    suggestion, position = await _suggest(ls, params.text_document.uri, params.position, "invoked")
    if suggestion is None:
        return None
    first_line = suggestion.text.strip().splitlines()[0] if suggestion.text.strip() else ""
    return types.CompletionList(
        is_incomplete=True,
        items=[
            types.CompletionItem(
                label=first_line[:60] or "Flywheel suggestion",
                kind=types.CompletionItemKind.Snippet,
                detail="Flywheel",
                text_edit=types.TextEdit(
                    range=types.Range(start=position, end=position), new_text=suggestion.text
                ),
                insert_text_format=types.InsertTextFormat.PlainText,
                command=_accept_command(suggestion.id),
            )
        ],
    )


@SERVER.command("flywheel.acceptCompletion")
def accept_completion(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    sid = args[0] if args else None
    suggestion = ls.completions.resolve(sid, "accepted") if isinstance(sid, str) else None
    if suggestion is None:
        raise JsonRpcInvalidParams(f"unknown suggestion {sid!r}")
    tracked = False
    doc = ls.document(suggestion.uri)
    if doc is not None:
        tracked = ls.survival.track(
            suggestion.id, suggestion.uri, doc.source, suggestion.offset, suggestion.text
        )
    return {"suggestionId": suggestion.id, "tracked": tracked}


def _lifecycle(ls: FlywheelServer, params: CompletionEventParams, event: str) -> None:
    sid = params.suggestion_id
    if ls.completions.resolve(sid, event, params.accepted_chars) is None:
        log.info("%s for unknown suggestion %r ignored", event, sid)


@SERVER.feature(COMPLETION_SHOWN)
def completion_shown(ls: FlywheelServer, params: CompletionEventParams) -> None:
    _lifecycle(ls, params, "shown")


@SERVER.feature(COMPLETION_PARTIALLY_ACCEPTED)
def completion_partially_accepted(ls: FlywheelServer, params: CompletionEventParams) -> None:
    _lifecycle(ls, params, "partially_accepted")


@SERVER.feature(COMPLETION_REJECTED)
def completion_rejected(ls: FlywheelServer, params: CompletionEventParams) -> None:
    _lifecycle(ls, params, "rejected")


@SERVER.feature(CURSOR_IDLE)
async def cursor_idle(ls: FlywheelServer, params: CursorIdleParams) -> None:
    """The cursor rests: prefill what a completion there would need (`CompletionService.warm`)."""
    uri, version = params.text_document.uri, params.text_document.version
    doc = ls.document(uri)
    if not ls.settings.completion.enabled or doc is None or (doc.version or 0) != version:
        return  # the document moved on: the next rest will say where the cursor is now
    if suggestible(doc.source):
        await ls.completions.warm(_ask(ls, uri, doc, params.position))


# --- next edit ---------------------------------------------------------------------------------


@SERVER.feature(NEXT_EDIT)
async def next_edit_request(ls: FlywheelServer, params: NextEditParams) -> NextEditResult | None:
    uri, asked = params.text_document.uri, params.text_document.version
    doc = ls.open_document(uri)
    try:
        if asked is not None and asked != doc.version:
            raise VersionMoved(asked, doc.version)
        if not suggestible(doc.source):
            return None
        edit = await ls.next_edits.suggest(
            doc, params.position, ls.settings.next_edit, ls.completion_model or ls.settings.model
        )
    except VersionMoved as moved:
        raise JsonRpcException(
            f"{uri.rsplit('/', 1)[-1]} is at version {moved.now}, not {moved.asked}: "
            "the next edit was not made; ask again",
            code=CONTENT_MODIFIED,
        ) from None
    if edit is None:
        return None
    return NextEditResult(
        uri=uri,
        version=edit.version,
        range=edit.range,
        new_text=edit.new_text,
        suggestion_id=edit.suggestion_id,
        command=_accept_command(edit.suggestion_id),
    )


# --- survival ----------------------------------------------------------------------------------


def _record_survival(ls: FlywheelServer) -> list[dict[str, Any]]:
    checks = ls.survival.due()
    for c in checks:
        ls.record(
            "survival",
            suggestion_id=c.suggestion_id,
            after_s=c.after_s,
            accepted_chars=c.accepted_chars,
            surviving_chars=c.surviving_chars,
        )
    return [asdict(c) for c in checks]


async def _survival_loop(ls: FlywheelServer) -> None:
    while True:
        await asyncio.sleep(SURVIVAL_POLL_S)
        try:
            _record_survival(ls)
        except Exception:
            log.exception("survival check failed")


@SERVER.feature(ADVANCE_CLOCK)
def advance_clock(ls: FlywheelServer, params: AdvanceClockParams) -> dict[str, Any]:
    """Only with `--manual-clock` (tests): move time forward, run due survival checks, flush."""
    if ls.manual_now is None:
        raise JsonRpcInvalidParams("the clock is real; start the server with --manual-clock")
    ls.manual_now += params.seconds
    checks = _record_survival(ls)
    flushed = ls.recorder.flush(timeout=10) if ls.recorder is not None else False
    return {"checks": checks, "flushed": flushed}


@SERVER.feature(FLUSH)
def flush(ls: FlywheelServer, params: Any) -> dict[str, Any]:
    """Make every recorded event durable (tests read the database after it); no params."""
    return {"flushed": ls.recorder.flush(timeout=10) if ls.recorder is not None else False}


# --- feedback ----------------------------------------------------------------------------------


@SERVER.command("flywheel.rate")
def rate(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    data = args[0] if args and isinstance(args[0], dict) else {}
    rating = data.get("rating")
    if rating not in (-1, 0, 1):
        raise JsonRpcInvalidParams("rating must be -1, 0 or 1")
    comment = data.get("comment")
    fid = ls.record(
        "feedback",
        suggestion_id=data.get("suggestionId"),
        task_id=data.get("taskId"),
        rating=rating,
        comment=comment if isinstance(comment, str) else None,
    )
    return {"recorded": fid is not None}


@SERVER.command("flywheel.status")
def status(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    return ls.status()


# --- code actions ------------------------------------------------------------------------------


@SERVER.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix]),
)
def code_action(
    ls: FlywheelServer, params: types.CodeActionParams
) -> list[types.CodeAction] | list[types.Command]:
    uri = params.text_document.uri
    if ls.document(uri) is None:
        return []
    unstructure = ls.protocol._converter.unstructure
    actions = task_actions(uri, params.context.diagnostics, params.range, unstructure)
    td = ls.client_capabilities.text_document
    if td and td.code_action and td.code_action.code_action_literal_support:
        return actions
    return [a.command for a in actions]  # an old client: bare commands, as LSP says


# --- agent tasks -------------------------------------------------------------------------------


async def _run_task(ls: FlywheelServer, kind: str, data: dict[str, Any]) -> dict[str, Any]:
    uri = data.get("uri")
    doc = ls.open_document(uri) if uri is not None else None
    return await ls.tasks.run(kind, data, doc)


@SERVER.command("flywheel.ask")
async def ask(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    return await _run_task(ls, "ask", _command_object(args) if args else {})


@SERVER.command("flywheel.fixDiagnostic")
async def fix_diagnostic(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    return await _run_task(ls, "fix", _command_object(args))


@SERVER.command("flywheel.explain")
async def explain(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    return await _run_task(ls, "explain", _command_object(args))


@SERVER.command("flywheel.cancelTask")
def cancel_task(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    return {"cancelled": ls.tasks.cancel(args[0] if args else None)}


@SERVER.feature(types.WINDOW_WORK_DONE_PROGRESS_CANCEL)
def progress_cancel(ls: FlywheelServer, params: types.WorkDoneProgressCancelParams) -> None:
    ls.tasks.cancel_progress(str(params.token))


# --- review of proposed edits ------------------------------------------------------------------


@SERVER.command("flywheel.reviewEdit")
def review_edit(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    data = _command_object(args)
    return ls.review.review_edit(ls.open_document(data.get("uri")), data)


@SERVER.command("flywheel.acceptHunk")
async def accept_hunk(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    proposal = ls.review.get(args[0] if args else None)
    idx = args[1] if len(args) > 1 else None
    if not isinstance(idx, int):
        raise JsonRpcInvalidParams("acceptHunk takes [proposalId, index]")
    return await ls.review.accept(proposal, idx)


@SERVER.command("flywheel.rejectHunk")
def reject_hunk(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    proposal = ls.review.get(args[0] if args else None)
    return ls.review.reject(proposal, args[1] if len(args) > 1 else None)


@SERVER.command("flywheel.acceptAll")
async def accept_all(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    return await ls.review.accept_all(ls.review.get(args[0] if args else None))


@SERVER.command("flywheel.rejectAll")
def reject_all(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    return ls.review.reject_all(ls.review.get(args[0] if args else None))


def configure(
    *, model: str | None, consent: str | None, db_path: str, manual_clock: bool
) -> FlywheelServer:
    """Apply `flywheel lsp` flags to SERVER before it starts."""
    data: dict[str, Any] = {}
    if model:
        data["model"] = {"name": model}
    if consent:
        data["telemetry"] = {"consent": consent}
    SERVER.defaults, warnings = parse_settings(data)
    if warnings:
        raise ValueError("; ".join(warnings))
    SERVER.settings = SERVER.defaults
    SERVER.db_path = db_path
    if manual_clock:
        SERVER.manual_now = 0.0
    return SERVER
