"""The Flywheel language server: one decorated function per LSP message.

Each handler gets the document, computes (completion.py, agent_tasks.py, feedback.py), converts
to lsprotocol types and returns. Server state lives on `FlywheelServer` (settings, the engine
host, the telemetry recorder and session, open suggestions, proposals, tracked spans).

Custom protocol (all names under `flywheel/`; the clients in lsp/clients use them):
  server -> client notifications
    flywheel/status       {state: loading|idle|busy|error|stopped, modelVersion, message}
    flywheel/taskStep     {taskId, index, role, text, kind, ...}      each harness step as it
                          happens; kind: instruction | assistant (+calls) | tool (+name,
                          isError) | approval_request (+calls) | approval | compact | stop
    flywheel/proposal     {proposalId, taskId, uri, version, hunks: [{index, range, original,
                           newText, state}]}                         edits awaiting review
  client -> server requests
    flywheel/nextEdit     {textDocument: {uri, version}, position?} -> null | {uri, version,
                          range, newText, suggestionId, command}: the edit the user will likely
                          make next, near their last edit (next_edit.py). Refused with
                          ContentModified (-32801) when `version` is not the document's version,
                          before or after the model ran; the client applies it only at `version`
                          and runs `command` (flywheel.acceptCompletion) when it does.
  client -> server notifications
    flywheel/completionShown              {suggestionId}
    flywheel/completionPartiallyAccepted  {suggestionId, acceptedChars}
    flywheel/completionRejected           {suggestionId}
  workspace/executeCommand commands: see COMMANDS below.
  server -> client requests
    window/showMessageRequest  an agent action needs approval: "Allow" | "Deny" | "Stop the task"
                               (no answer within agent.approvalTimeoutS: denied)

Agent tasks run the agent harness (agent.harness.Harness) in a worker thread over a workspace
whose overlay is the open buffers; its writes come back as proposals (agent_tasks.py), sent as
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
import concurrent.futures
import contextlib
import json
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls import uris
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer

from agent.engine import Cancelled, EngineError, Request, SamplingParams
from agent.harness import Harness, HarnessConfig, Outcome, SandboxConfig, Workspace
from agent.harness.context import Diagnostic, EditorContext
from agent.harness.recording import STATUS_OF_STOP
from lsp.agent_tasks import (
    ProposalBook,
    StaleProposal,
    TaskRecorder,
    approval_policy,
    instruction_for,
    step_note,
)
from lsp.completion import CompletionService, Neighbour, Suggestion
from lsp.documents import looks_binary, offset_at, range_of
from lsp.feedback import SurvivalTracker
from lsp.model_host import ModelHost
from lsp.next_edit import (
    REGION_CLOSE,
    EditHistory,
    build_prompt,
    next_edit,
    parse_rewrite,
    region_around,
)
from lsp.protocol import PARSE_ERROR, FlywheelProtocol
from lsp.settings import Settings, parse_settings

log = logging.getLogger("flywheel.lsp")

REQUEST_FAILED = -32803  # LSP's RequestFailed: the request was valid but could not be done
CONTENT_MODIFIED = -32801  # LSP's ContentModified: the document changed; the answer is void
MAX_DOCUMENT_CHARS = 20_000_000  # larger documents are kept but get no suggestions
CONFIGURATION_TIMEOUT_S = 10.0  # a client that never answers workspace/configuration
SURVIVAL_POLL_S = 5.0  # how often the real clock checks survival (the manual clock: on advance)
TASK_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="flywheel-task")  # harness runs
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


@dataclass
class RunningTask:
    """An agent task in progress: what stopping it needs."""

    cancel: threading.Event
    work: concurrent.futures.Future | None = None  # the harness call running in TASK_POOL
    harness: Any = None  # the task's Harness once started
    waiting: str | None = None  # the harness thread id while it waits for an approval


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
        self.host = ModelHost(on_status=self._send_status, on_error=self._show_error)
        self.completions = CompletionService(self.host, self.record, self.now)
        self.survival = SurvivalTracker(self.now)
        self.history = EditHistory()  # recent edits per document, for next-edit
        self.next_edit_running: dict[str, threading.Event] = {}  # uri -> cancel of its request
        self.proposals = ProposalBook()
        self.tasks: dict[str, RunningTask] = {}  # running task id -> how to stop it
        self.abandoned: list[RunningTask] = []  # tasks whose request ended with the transport
        self.approvals: dict[str, asyncio.Future] = {}  # task id -> the approval being asked
        self.last_task: dict[str, tuple[str, float]] = {}  # uri -> (task id, finished at)
        self.changed: dict[str, asyncio.Event] = {}  # uri -> set on its next didChange
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

    def _send_status(self, status: dict[str, Any]) -> None:
        if self.client_gone:
            return
        self.notify("flywheel/status", status)
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
        """A message that is not JSON (or not UTF-8, or nested too deep to parse): answer
        JSON-RPC's parse error (id null) and log once. Anything else pygls reports: log it once
        per kind, without a traceback (lsp/protocol.py answers the requests themselves)."""
        parsing = source is JsonRpcException  # pygls' read loop: json.loads failed
        if parsing and isinstance(error, ValueError | RecursionError):  # also UnicodeDecodeError
            self.protocol.reply_error(None, PARSE_ERROR, f"Parse error: {_short(error)}")
            if "parse" not in self._said:
                self._said.add("parse")
                log.error("a message from the client is not valid JSON: %s", _short(error))
            return
        self.protocol.log_once(type(error).__name__, f"{type(error).__name__}: {_short(error)}")

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stop everything and make telemetry durable; safe to call twice (shutdown, then exit).

        Runs after `shutdown`, and after the transport ended without one (the client went away).
        """
        if self._closed:
            return
        self._closed = True
        running = [*self.tasks.values(), *self.abandoned]
        for task in running:
            task.cancel.set()
        for waiting in self.approvals.values():
            waiting.cancel()
        self.completions.abandon()
        for event in self.next_edit_running.values():
            event.set()
        work = [t.work for t in running if t.work is not None]
        if work:
            concurrent.futures.wait(work, timeout=timeout)
        for task in running:  # paused for approval: end it as the user stopping it would
            if (
                task.waiting
                and task.harness is not None
                and (task.work is None or task.work.done())
            ):
                try:
                    task.harness.resume(task.waiting, {"stop": True})
                except Exception:
                    log.exception("could not end a task waiting for approval")
        self.tasks.clear()
        self.abandoned.clear()
        if self.recorder is not None:
            self.record("session_end")
            if not self.recorder.close(timeout=timeout):
                log.warning("telemetry could not be flushed within %.0f s", timeout)
            self.recorder, self.session_id = None, None
        self.host.close()

    def open_document(self, uri: str) -> Any:
        """The open document, or a clear InvalidParams error (never a read from disk)."""
        if not isinstance(uri, str) or uri not in self.workspace.text_documents:
            raise JsonRpcInvalidParams(f"document {uri!r} is not open; open it first (didOpen)")
        return self.workspace.get_text_document(uri)


SERVER = FlywheelServer()


def _short(value: Any, limit: int = 200) -> str:
    """One line of at most `limit` characters, for logs and error messages."""
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[:limit] + "…"


def plain(value: Any) -> Any:
    """Custom messages' params arrive as pygls namedtuples: turn them back into dicts."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


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
    await _pull_configuration(ls)
    if ls.manual_now is None:
        asyncio.ensure_future(_survival_loop(ls))
    if getattr(ls, "registry_follower", None) is not None:  # --model registry: lsp/reload.py
        asyncio.ensure_future(ls.registry_follower.run(ls))
    with contextlib.suppress(EngineError):  # the host told the user once; features answer nothing
        await ls.host.get(ls.settings.model)
    ls._send_status(ls.host.status())  # the client shows the model version from the start


async def _pull_configuration(ls: FlywheelServer) -> None:
    """Ask the client for the "flywheel" section. A reply that does not fit (`null`, not a
    list) fails at once (lsp/protocol.py): the settings stay as they are, logged once."""
    caps = ls.client_capabilities.workspace
    if not (caps and caps.configuration):
        return
    try:
        items = await asyncio.wait_for(
            ls.workspace_configuration_async(
                types.ConfigurationParams(items=[types.ConfigurationItem(section="flywheel")])
            ),
            timeout=CONFIGURATION_TIMEOUT_S,
        )
    except TimeoutError:
        reason = f"no answer within {CONFIGURATION_TIMEOUT_S:g} s"
    except JsonRpcException as exc:
        reason = _short(exc) or f"error {exc.code}"
    else:
        items = list(items) if isinstance(items, list | tuple) else items
        if isinstance(items, list) and items and isinstance(items[0], dict | type(None)):
            if items[0] is not None:
                _apply_settings(ls, items[0])
            return
        reason = f"expected a list with one object, got {_short(items, 80)}"
    ls.protocol.log_once(
        "configuration", f"workspace/configuration gave no settings ({reason}); using the defaults"
    )


def _apply_settings(ls: FlywheelServer, data: Any) -> None:
    old = ls.settings
    ls.settings, warnings = parse_settings(data, old)
    for w in warnings:
        ls.say_once(w)
    if ls.settings.telemetry != old.telemetry:
        ls.open_recorder()


@SERVER.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
async def did_change_configuration(
    ls: FlywheelServer, params: types.DidChangeConfigurationParams
) -> None:
    data = params.settings
    if isinstance(data, dict) and isinstance(data.get("flywheel"), dict):
        _apply_settings(ls, data["flywheel"])
    else:
        await _pull_configuration(ls)
    if ls.host.settings != ls.settings.model:
        with contextlib.suppress(EngineError):
            await ls.host.get(ls.settings.model)


class _WriterAfterExit:
    """The output once `exit` arrived: pygls closes it, and the answers of requests that were
    still running (cancelled now) are dropped instead of failing on the closed stream."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.closed = False

    def close(self) -> Any:
        self.closed = True
        return self.writer.close()

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.writer.write(data)


@SERVER.feature(types.EXIT)
def exit_(ls: FlywheelServer, params: Any) -> None:
    """pygls closes the output after this; the CLI then calls `close()` (see the docstring)."""
    ls.client_gone = True
    writer = ls.protocol.writer
    if writer is not None and not isinstance(writer, _WriterAfterExit):
        ls.protocol.writer = _WriterAfterExit(writer)


@SERVER.feature(types.SHUTDOWN)
def shutdown(ls: FlywheelServer, params: Any) -> None:
    ls.close()


# --- documents ---------------------------------------------------------------------------------


@SERVER.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: FlywheelServer, params: types.DidOpenTextDocumentParams) -> None:
    text = params.text_document.text
    if looks_binary(text):
        log.info("%s looks binary: no suggestions for it", params.text_document.uri)
    elif len(text) <= MAX_DOCUMENT_CHARS:
        ls.history.open(params.text_document.uri, text)
    event = ls.changed.pop(params.text_document.uri, None)
    if event is not None:  # an accepted hunk opened the file in the editor
        event.set()


@SERVER.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: FlywheelServer, params: types.DidChangeTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.history.change(uri, params.text_document.version, list(params.content_changes))
    if ls.survival.tracking(uri):
        for sid in ls.survival.on_change(uri, list(params.content_changes)):
            ls.record("outcome", suggestion_id=sid, reverted=1, dissatisfied_followup=1)
    event = ls.changed.pop(uri, None)
    if event is not None:
        event.set()


@SERVER.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: FlywheelServer, params: types.DidCloseTextDocumentParams) -> None:
    """Closing keeps tracked spans: their last text stands for the file as saved."""
    ls.history.close(params.text_document.uri)


# --- completions -------------------------------------------------------------------------------


def _neighbours(ls: FlywheelServer, uri: str, language: str) -> list[Neighbour]:
    out = []
    for other_uri, doc in ls.workspace.text_documents.items():
        if other_uri != uri and doc.language_id == language and not looks_binary(doc.source):
            out.append(Neighbour(other_uri, doc.source[:4000]))
    return out[:3]


async def _suggest(ls: FlywheelServer, uri: str, position: types.Position, trigger: str):
    if not ls.settings.completion.enabled:
        return None, None
    if uri not in ls.workspace.text_documents:
        log.info("completion for %s, which is not open: nothing to suggest", uri)
        return None, None
    doc = ls.workspace.get_text_document(uri)
    text = doc.source
    if len(text) > MAX_DOCUMENT_CHARS or looks_binary(text):
        return None, None
    offset = offset_at(text, position)
    suggestion = await ls.completions.complete(
        uri=uri,
        version=doc.version or 0,
        text=text,
        offset=offset,
        language=doc.language_id or "",
        trigger=trigger,
        neighbours=_neighbours(ls, uri, doc.language_id or ""),
        settings=ls.settings.completion,
        model=ls.settings.model,
    )
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
    if suggestion.uri in ls.workspace.text_documents:
        doc = ls.workspace.get_text_document(suggestion.uri)
        tracked = ls.survival.track(
            suggestion.id, suggestion.uri, doc.source, suggestion.offset, suggestion.text
        )
    return {"suggestionId": suggestion.id, "tracked": tracked}


def _lifecycle(ls: FlywheelServer, params: Any, event: str) -> None:
    data = plain(params)
    data = data if isinstance(data, dict) else {}
    sid = data.get("suggestionId")
    if (
        not isinstance(sid, str)
        or ls.completions.resolve(sid, event, data.get("acceptedChars")) is None
    ):
        log.info("%s for unknown suggestion %r ignored", event, sid)


@SERVER.feature("flywheel/completionShown")
def completion_shown(ls: FlywheelServer, params: Any) -> None:
    _lifecycle(ls, params, "shown")


@SERVER.feature("flywheel/completionPartiallyAccepted")
def completion_partially_accepted(ls: FlywheelServer, params: Any) -> None:
    _lifecycle(ls, params, "partially_accepted")


@SERVER.feature("flywheel/completionRejected")
def completion_rejected(ls: FlywheelServer, params: Any) -> None:
    _lifecycle(ls, params, "rejected")


# --- next edit ---------------------------------------------------------------------------------


def _content_modified(uri: str, asked: Any, now: Any) -> JsonRpcException:
    name = uri.rsplit("/", 1)[-1]
    return JsonRpcException(
        f"{name} is at version {now}, not {asked}: the next edit was not made; ask again",
        code=CONTENT_MODIFIED,
    )


@SERVER.feature("flywheel/nextEdit")
async def next_edit_request(ls: FlywheelServer, params: Any) -> dict[str, Any] | None:
    data = plain(params)
    data = data if isinstance(data, dict) else {}
    td = data.get("textDocument") if isinstance(data.get("textDocument"), dict) else {}
    uri, version = td.get("uri"), td.get("version")
    doc = ls.open_document(uri)
    if version is not None and version != doc.version:
        raise _content_modified(uri, version, doc.version)
    version = doc.version or 0
    settings = ls.settings.next_edit
    text = doc.source
    edits = ls.history.recent(uri)[-settings.recent_edits :]
    if not settings.enabled or not edits or len(text) > MAX_DOCUMENT_CHARS or looks_binary(text):
        return None
    last = edits[-1]
    anchors = [min(last.start + len(last.inserted), len(text))]
    pos = data.get("position")
    if isinstance(pos, dict) and isinstance(pos.get("line"), int):
        anchors.append(offset_at(text, types.Position(pos["line"], pos.get("character", 0))))
    region = region_around(text, anchors, settings.context_lines)
    previous = ls.next_edit_running.pop(uri, None)
    if previous is not None:
        previous.set()
    cancel = ls.next_edit_running[uri] = threading.Event()
    try:
        engine = await ls.host.get(ls.settings.model)
    except EngineError:
        return None
    prompt = build_prompt(uri.rsplit("/", 1)[-1], text, edits, region)
    sid = uuid.uuid4().hex
    request = Request(
        prompt=prompt,
        params=SamplingParams(
            max_tokens=settings.max_tokens,
            temperature=settings.temperature,
            seed=settings.seed if settings.seed >= 0 else None,
            stop=[REGION_CLOSE],
            logprobs=False,
        ),
        cancel=cancel,
        request_id=sid,
    )
    row = {"id": sid, "kind": "next_edit", "trigger": "invoked", "document_uri": uri,
           "document_version": version, "language": doc.language_id or "",
           "context": {"region": region.text, "recent_edits": len(edits)}}  # fmt: skip
    started = time.perf_counter()
    try:
        result = await ls.host.call(engine.generate, request)
    except (Cancelled, asyncio.CancelledError) as exc:
        ls.record("suggestion", **row)
        ls.record("suggestion_event", suggestion_id=sid, event="cancelled")
        if isinstance(exc, asyncio.CancelledError):
            raise
        return None
    except EngineError as exc:
        ls.host.error_once(str(exc))
        return None
    finally:
        if ls.next_edit_running.get(uri) is cancel:
            del ls.next_edit_running[uri]
    sample = result.completions[0]
    if sample.finish_reason == "cancelled" or cancel.is_set():
        ls.record("suggestion", **row)
        ls.record("suggestion_event", suggestion_id=sid, event="cancelled")
        return None
    rewrite = parse_rewrite(sample.text, stopped=sample.finish_reason == "stop")
    found = next_edit(region, rewrite) if rewrite is not None else None
    m = result.metrics
    ls.record("suggestion", **row, output=found[2] if found else "",
              latency_ms=(time.perf_counter() - started) * 1000, prompt_tokens=m.prompt_tokens,
              output_tokens=m.output_tokens,
              model_version=sample.model_version or engine.model_version)  # fmt: skip
    now = ls.workspace.get_text_document(uri) if uri in ls.workspace.text_documents else None
    if now is None or (now.version or 0) != version:
        ls.record("suggestion_event", suggestion_id=sid, event="superseded")
        raise _content_modified(uri, version, now.version if now else "closed")
    if found is None:
        ls.record("suggestion_event", suggestion_id=sid, event="ignored")
        return None
    start, end, new_text = found
    ls.completions.offer(Suggestion(sid, uri, version, start, text[:start], new_text, ls.now()))
    rng = range_of(text, start, end)
    return {
        "uri": uri,
        "version": version,
        "range": ls.protocol._converter.unstructure(rng),
        "newText": new_text,
        "suggestionId": sid,
        "command": {
            "title": "Flywheel: accept",
            "command": "flywheel.acceptCompletion",
            "arguments": [sid],
        },  # fmt: skip
    }


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


@SERVER.feature("flywheel/debug/advanceClock")
def advance_clock(ls: FlywheelServer, params: Any) -> dict[str, Any]:
    """Only with `--manual-clock` (tests): move time forward, run due survival checks, flush."""
    if ls.manual_now is None:
        raise JsonRpcInvalidParams("the clock is real; start the server with --manual-clock")
    data = plain(params)
    seconds = data.get("seconds", 0) if isinstance(data, dict) else 0
    if not isinstance(seconds, int | float) or seconds < 0:
        raise JsonRpcInvalidParams("seconds must be a number >= 0")
    ls.manual_now += seconds
    checks = _record_survival(ls)
    flushed = ls.recorder.flush(timeout=10) if ls.recorder is not None else False
    return {"checks": checks, "flushed": flushed}


@SERVER.feature("flywheel/debug/flush")
def flush(ls: FlywheelServer, params: Any) -> dict[str, Any]:
    """Make every recorded event durable (tests read the database after it)."""
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
    return ls.host.status()


# --- code actions ------------------------------------------------------------------------------


@SERVER.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix]),
)
def code_action(
    ls: FlywheelServer, params: types.CodeActionParams
) -> list[types.CodeAction] | list[types.Command]:
    uri = params.text_document.uri
    if uri not in ls.workspace.text_documents:
        return []
    actions = []
    for diag in params.context.diagnostics:
        actions.append(
            types.CodeAction(
                title=f"Fix with Flywheel: {diag.message[:60]}",
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[diag],
                command=types.Command(
                    title="Fix with Flywheel",
                    command="flywheel.fixDiagnostic",
                    arguments=[
                        {"uri": uri, "diagnostic": ls.protocol._converter.unstructure(diag)}
                    ],
                ),
            )
        )
    if params.range.start != params.range.end:
        rng = ls.protocol._converter.unstructure(params.range)
        actions.append(
            types.CodeAction(
                title="Ask Flywheel about selection",
                kind=types.CodeActionKind.Empty,
                command=types.Command(
                    title="Ask Flywheel about selection",
                    command="flywheel.ask",
                    arguments=[{"uri": uri, "range": rng}],
                ),
            )
        )
    td = ls.client_capabilities.text_document
    if td and td.code_action and td.code_action.code_action_literal_support:
        return actions
    return [a.command for a in actions]  # an old client: bare commands, as LSP says


# --- agent tasks -------------------------------------------------------------------------------


def _args(args: tuple[Any, ...]) -> dict[str, Any]:
    if not args or not isinstance(args[0], dict):
        raise JsonRpcInvalidParams('this command takes one object argument, e.g. {"uri": ...}')
    return args[0]


def _selection(text: str, rng: Any) -> str:
    if not isinstance(rng, dict):
        return ""
    try:
        start = offset_at(text, types.Position(**rng["start"]))
        end = offset_at(text, types.Position(**rng["end"]))
    except (KeyError, TypeError):
        raise JsonRpcInvalidParams("range must be {start: {line, character}, end: {...}}") from None
    return text[min(start, end) : max(start, end)]


async def _progress(ls: FlywheelServer, token: str, kind: str, message: str) -> None:
    caps = ls.client_capabilities.window
    if not (caps and caps.work_done_progress) or ls.client_gone:
        return
    if kind == "begin":
        try:
            await asyncio.wait_for(ls.work_done_progress.create_async(token), timeout=5)
        except Exception:
            return
        ls.work_done_progress.begin(
            token, types.WorkDoneProgressBegin(title="Flywheel", message=message, cancellable=True)
        )
    elif token in ls.work_done_progress.tokens:
        if kind == "end":
            ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
        else:
            ls.work_done_progress.report(token, types.WorkDoneProgressReport(message=message))


def _task_root(ls: FlywheelServer, uri: str | None) -> Path:
    """The task's workspace: the editor's workspace folder that holds the document (the deepest,
    in a multi-root workspace), else the client's root folder, else the document's folder. The
    harness reads that folder's rules (AGENTS.md) and runs its tests."""
    doc_path = _path_of(uri) if uri else None
    folders = [_path_of(f.uri) for f in (ls.workspace.folders or {}).values()]
    roots = [p for p in folders if p is not None and p.is_dir()]
    if ls.workspace.root_path and Path(ls.workspace.root_path).is_dir():
        roots.append(Path(ls.workspace.root_path).resolve())
    holding = [
        r for r in roots if doc_path is not None and (r == doc_path or r in doc_path.parents)
    ]
    if holding:
        return max(holding, key=lambda r: len(r.parts))
    if roots and doc_path is None:
        return roots[-1]
    if doc_path is not None and doc_path.parent.is_dir():
        return doc_path.parent
    raise JsonRpcException(
        "Flywheel needs a workspace folder for agent tasks: open a folder (rootUri) or run the "
        "task from a saved file",
        code=REQUEST_FAILED,
    )


def _path_of(uri: str) -> Path | None:
    if not uri.startswith("file:"):
        return None
    return Path(uris.to_fs_path(uri) or "").resolve()


@dataclass
class _Buffer:
    uri: str
    version: int | None
    text: str


def _buffers(ls: FlywheelServer, root: Path) -> dict[str, _Buffer]:
    """Open documents under `root` (relative path -> uri, version, text); unsaved text wins."""
    out: dict[str, _Buffer] = {}
    for uri, doc in list(ls.workspace.text_documents.items()):
        path = _path_of(uri)
        if path is None or root not in path.parents:
            continue
        text = doc.source
        if len(text) > MAX_DOCUMENT_CHARS or looks_binary(text):
            continue
        out[path.relative_to(root).as_posix()] = _Buffer(uri, doc.version, text)
    return out


def _editor_context(
    data: dict[str, Any], rel: str | None, text: str, selection: str, open_files: list[str]
) -> EditorContext:
    line = None
    rng = data.get("range")
    if isinstance(rng, dict) and isinstance(rng.get("start"), dict):
        line = rng["start"].get("line")
    diagnostics = []
    diag = data.get("diagnostic")
    if rel and isinstance(diag, dict):
        start = (diag.get("range") or {}).get("start") or {}
        dline = start.get("line") if isinstance(start.get("line"), int) else 0
        line = dline if line is None else line
        severity = {1: "error", 2: "warning", 3: "info", 4: "hint"}.get(
            diag.get("severity"), "error"
        )
        diagnostics.append(Diagnostic(rel, dline + 1, severity, str(diag.get("message", ""))))
    return EditorContext(
        current_file=rel,
        cursor_line=line + 1 if isinstance(line, int) and rel else None,
        selection=selection or None,
        diagnostics=diagnostics,
        open_files=tuple(open_files),
    )


def _step(ls: FlywheelServer, task_id: str, index: int, role: str, text: str, **extra) -> None:
    ls.notify(
        "flywheel/taskStep",
        {"taskId": task_id, "index": index, "role": role, "text": text, **extra},
    )


APPROVE, DENY, STOP = "Allow", "Deny", "Stop the task"


async def _ask_approval(ls: FlywheelServer, task_id: str, approval: dict[str, Any]) -> Any:
    """Ask the user (window/showMessageRequest) about the calls waiting; return the decision."""
    calls = approval.get("calls") or []
    lines = []
    for c in calls:
        args = json.dumps(c.get("arguments"), ensure_ascii=False)
        lines.append(f"- {c.get('name')} {args[:200]} ({c.get('reason')})")
    params = types.ShowMessageRequestParams(
        type=types.MessageType.Warning,
        message="Flywheel wants to:\n" + "\n".join(lines),
        actions=[types.MessageActionItem(t) for t in (APPROVE, DENY, STOP)],
    )
    waiting = asyncio.ensure_future(ls.window_show_message_request_async(params))
    ls.approvals[task_id] = waiting
    try:
        item = await asyncio.wait_for(waiting, timeout=ls.settings.agent.approval_timeout_s)
    except asyncio.CancelledError:
        if ls.tasks.get(task_id) is not None and ls.tasks[task_id].cancel.is_set():
            return {"stop": True}  # cancelTask while waiting
        raise
    except (TimeoutError, JsonRpcException) as exc:
        log.info("no approval for task %s (%s): denied", task_id, exc or "timed out")
        return False
    finally:
        ls.approvals.pop(task_id, None)
    title = getattr(item, "title", None)
    if title == STOP:
        return {"stop": True}
    return title == APPROVE


async def _run_task(ls: FlywheelServer, kind: str, args: tuple[Any, ...]) -> dict[str, Any]:
    data = _args(args) if kind != "ask" or args else {}
    uri = data.get("uri")
    doc = ls.open_document(uri) if uri is not None else None
    text = doc.source if doc is not None else ""
    selection = _selection(text, data.get("range"))
    instruction = instruction_for(kind, data, selection)
    root = _task_root(ls, uri)
    buffers = _buffers(ls, root)
    rel = next((r for r, b in buffers.items() if b.uri == uri), None)
    context = _editor_context(data, rel, text, selection, sorted(buffers))
    task_id = uuid.uuid4().hex
    previous = ls.last_task.get(uri or "")
    if previous and ls.now() - previous[1] <= ls.settings.agent.followup_window_s:
        ls.record("outcome", task_id=previous[0], dissatisfied_followup=1)
    cancel = threading.Event()
    running = RunningTask(cancel)
    ls.tasks[task_id] = running
    token = f"flywheel-task-{task_id}"
    await _progress(ls, token, "begin", instruction[:80])
    loop = asyncio.get_running_loop()
    index = 1
    _step(ls, task_id, 0, "user", instruction, kind="instruction")

    def submit(fn: Any, *fn_args: Any) -> asyncio.Future:
        running.work = TASK_POOL.submit(fn, *fn_args)
        return asyncio.wrap_future(running.work)

    def send(event: dict[str, Any]) -> None:  # on the event loop
        nonlocal index
        role, note, extra = step_note(event)
        _step(ls, task_id, index, role, note, **extra)
        index += 1
        asyncio.ensure_future(_progress(ls, token, "report", f"step {index - 1}: {note[:60]}"))

    def on_event(event: dict[str, Any]) -> None:  # in the task's worker thread
        with contextlib.suppress(RuntimeError):  # the loop is gone: the client went away
            loop.call_soon_threadsafe(send, event)

    status, answer, stop_reason = "failed", "", None
    proposals: list[Any] = []
    skipped: list[str] = []
    try:
        engine = await ls.host.get(ls.settings.model)
        agent = ls.settings.agent
        config = HarnessConfig(
            max_steps=agent.max_steps,
            turn_max_tokens=agent.max_tokens,
            editor=ls.editor or "editor",
            approval=approval_policy(agent.approval),
            sandbox=SandboxConfig(
                read_only_paths=tuple(agent.read_only_paths),
                allow_unconfined=agent.allow_unconfined,
            ),
        )
        recorder = TaskRecorder(ls.recorder, task_id) if ls.session_id else None
        overlay = {r: b.text for r, b in buffers.items()}

        def start() -> tuple[Harness, Outcome]:
            harness = Harness(
                engine, Workspace(root, buffers=overlay), config, recorder=recorder,
                on_event=on_event, session_id=ls.session_id,
            )  # fmt: skip
            outcome = harness.start(instruction, editor=context, thread_id=task_id, cancel=cancel)
            return harness, outcome

        harness, outcome = await submit(start)
        running.harness = harness
        while outcome.approval is not None:
            _step(ls, task_id, index, "system", "waiting for approval", kind="approval_request",
                  calls=outcome.approval.get("calls", []))  # fmt: skip
            index += 1
            running.waiting = outcome.thread_id
            decision = await _ask_approval(ls, task_id, outcome.approval)
            running.waiting = None
            outcome = await submit(harness.resume, outcome.thread_id, decision)
        stop_reason = outcome.stop_reason
        answer = outcome.final or outcome.detail
        if cancel.is_set() or stop_reason == "denied":
            status = "cancelled"
        else:
            status = STATUS_OF_STOP.get(stop_reason or "", "failed")
        if stop_reason == "engine_error":
            ls.host.error_once(outcome.detail)
        if status != "cancelled":
            for path, new in outcome.proposals.items():
                if new is None:
                    skipped.append(f"{path}: the agent deleted it; delete it yourself if you agree")
                    continue
                buf = buffers.get(path)
                if buf is not None:
                    base, version, doc_uri = buf.text, buf.version, buf.uri
                else:
                    full = root / path
                    base = full.read_text(errors="surrogateescape") if full.is_file() else ""
                    version, doc_uri = None, full.as_uri()
                proposal = _propose(ls, doc_uri, version, base, new, task_id, "agent_edit")
                if proposal is not None:
                    proposals.append(proposal)
    except asyncio.CancelledError:  # the request was cancelled, or the transport ended
        cancel.set()
        ls.abandoned.append(running)
        raise
    except EngineError as exc:
        ls.host.error_once(str(exc))
        answer = f"the model failed: {exc}"
        ls.record("task_start", id=task_id, instruction=instruction, model_version=ls.host.version)
        ls.record("task_end", task_id=task_id, status="failed", final_message=answer)
    finally:
        ls.tasks.pop(task_id, None)
        if uri:
            ls.last_task[uri] = (task_id, ls.now())
        await _progress(ls, token, "end", status)
    return {
        "taskId": task_id,
        "status": status,
        "stopReason": stop_reason,
        "answer": answer,
        "proposals": [p.as_json() for p in proposals],
        "skipped": skipped,
    }


def _propose(
    ls: FlywheelServer,
    uri: str,
    version: int | None,
    base: str,
    new: str,
    task_id: str | None,
    kind: str,
) -> Any:
    proposal = ls.proposals.create(uri, version, base, new, task_id)
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
    ls.notify("flywheel/proposal", proposal.as_json())
    return proposal


@SERVER.command("flywheel.ask")
async def ask(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    return await _run_task(ls, "ask", args)


@SERVER.command("flywheel.fixDiagnostic")
async def fix_diagnostic(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    return await _run_task(ls, "fix", args)


@SERVER.command("flywheel.explain")
async def explain(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    return await _run_task(ls, "explain", args)


def _cancel(ls: FlywheelServer, task_id: Any) -> bool:
    """Stop a running task: its model turn, its next turn, and an approval it waits for."""
    task = ls.tasks.get(task_id) if isinstance(task_id, str) else None
    if task is None:
        return False
    task.cancel.set()  # the harness stops the running model turn and the task
    waiting = ls.approvals.get(task_id)
    if waiting is not None:
        waiting.cancel()
    return True


@SERVER.command("flywheel.cancelTask")
def cancel_task(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    return {"cancelled": _cancel(ls, args[0] if args else None)}


@SERVER.feature(types.WINDOW_WORK_DONE_PROGRESS_CANCEL)
def progress_cancel(ls: FlywheelServer, params: types.WorkDoneProgressCancelParams) -> None:
    token = str(params.token)
    if token.startswith("flywheel-task-"):
        _cancel(ls, token.removeprefix("flywheel-task-"))


@SERVER.command("flywheel.reviewEdit")
def review_edit(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    data = _args(args)
    doc = ls.open_document(data.get("uri"))
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
    proposal = _propose(ls, doc.uri, doc.version or 0, doc.source, new_text, None, "apply")
    return {"proposal": proposal.as_json() if proposal else None}


def _current_text(ls: FlywheelServer, proposal: Any) -> tuple[str, int | None, bool]:
    """The proposal's document now: (text, version or None for the disk, whether it exists)."""
    if proposal.uri in ls.workspace.text_documents:
        doc = ls.workspace.get_text_document(proposal.uri)
        return doc.source, doc.version or 0, True
    path = _path_of(proposal.uri) if proposal.version is None else None
    if path is not None and path.is_file():
        return path.read_text(errors="surrogateescape"), None, True
    if path is not None and proposal.base_text == "":
        return "", None, False  # a new file: the first accepted hunk creates it
    raise JsonRpcException(
        f"{proposal.uri} is closed; reopen it and ask again", code=REQUEST_FAILED
    )


async def _accept(ls: FlywheelServer, proposal: Any, idx: int) -> dict[str, Any]:
    text, version, exists = _current_text(ls, proposal)
    if text != proposal.expected_text and proposal.awaiting_change:
        event = ls.changed.setdefault(proposal.uri, asyncio.Event())
        with contextlib.suppress(TimeoutError):  # our previous hunk's didChange is on its way
            await asyncio.wait_for(event.wait(), timeout=5)
        text, version, exists = _current_text(ls, proposal)
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
    proposal.awaiting_change = _current_text(ls, proposal)[0] != after
    ls.record("hunk_outcome", edit_id=proposal.id, idx=idx, outcome="accepted")
    return {"proposalId": proposal.id, "index": idx, "state": "accepted"}


def _reject(ls: FlywheelServer, proposal: Any, idx: int) -> dict[str, Any]:
    try:
        hunk = proposal.hunk(idx)
    except ValueError as exc:
        raise JsonRpcInvalidParams(str(exc)) from None
    if hunk.state == "pending":
        hunk.state = "rejected"
        ls.record("hunk_outcome", edit_id=proposal.id, idx=idx, outcome="rejected")
    return {"proposalId": proposal.id, "index": idx, "state": hunk.state}


def _proposal(ls: FlywheelServer, args: tuple[Any, ...]) -> Any:
    try:
        return ls.proposals.get(args[0] if args else None)
    except ValueError as exc:
        raise JsonRpcInvalidParams(str(exc)) from None


@SERVER.command("flywheel.acceptHunk")
async def accept_hunk(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    proposal = _proposal(ls, args)
    idx = args[1] if len(args) > 1 else None
    if not isinstance(idx, int):
        raise JsonRpcInvalidParams("acceptHunk takes [proposalId, index]")
    return await _accept(ls, proposal, idx)


@SERVER.command("flywheel.rejectHunk")
def reject_hunk(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    proposal = _proposal(ls, args)
    idx = args[1] if len(args) > 1 else None
    return _reject(ls, proposal, idx)  # type: ignore[arg-type]


@SERVER.command("flywheel.acceptAll")
async def accept_all(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    proposal = _proposal(ls, args)
    done = [await _accept(ls, proposal, h.idx) for h in proposal.hunks if h.state == "pending"]
    return {"proposalId": proposal.id, "accepted": len(done)}


@SERVER.command("flywheel.rejectAll")
def reject_all(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    proposal = _proposal(ls, args)
    done = [_reject(ls, proposal, h.idx) for h in proposal.hunks if h.state == "pending"]
    return {"proposalId": proposal.id, "rejected": len(done)}


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
