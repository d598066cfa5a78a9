"""The Flywheel language server: one decorated function per LSP message.

Each handler gets the document, computes (completion.py, agent_tasks.py, feedback.py), converts
to lsprotocol types and returns. Server state lives on `FlywheelServer` (settings, the engine
host, the telemetry recorder and session, open suggestions, proposals, tracked spans).

Custom protocol (all names under `flywheel/`; the clients in lsp/clients use them):
  server -> client notifications
    flywheel/status       {state: loading|idle|busy|error|stopped, modelVersion, message}
    flywheel/taskStep     {taskId, index, role, text}                 each step as it happens
    flywheel/proposal     {proposalId, taskId, uri, version, hunks: [{index, range, original,
                           newText, state}]}                         edits awaiting review
  client -> server notifications
    flywheel/completionShown              {suggestionId}
    flywheel/completionPartiallyAccepted  {suggestionId, acceptedChars}
    flywheel/completionRejected           {suggestionId}
  workspace/executeCommand commands: see COMMANDS below.

What it does not do: block the event loop on the model (engine calls run in worker threads) or
fail a request because telemetry failed (the recorder never raises).

Run it: `flywheel lsp` (stdio) or `flywheel lsp --tcp --port 2087` (debugging).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import uuid
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer

from agent.engine import Cancelled, EngineError, Request, SamplingParams
from lsp.agent_tasks import (
    ProposalBook,
    StaleProposal,
    apply_search_replace,
    instruction_for,
    task_messages,
)
from lsp.completion import CompletionService, Neighbour
from lsp.documents import looks_binary, offset_at
from lsp.feedback import SurvivalTracker
from lsp.model_host import ModelHost
from lsp.settings import Settings, parse_settings

log = logging.getLogger("flywheel.lsp")

REQUEST_FAILED = -32803  # LSP's RequestFailed: the request was valid but could not be done
MAX_DOCUMENT_CHARS = 20_000_000  # larger documents are kept but get no suggestions
SURVIVAL_POLL_S = 5.0  # how often the real clock checks survival (the manual clock: on advance)

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
        super().__init__("flywheel", _plugin_version(), max_workers=4)
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
        self.proposals = ProposalBook()
        self.tasks: dict[str, threading.Event] = {}  # running task id -> cancel
        self.last_task: dict[str, tuple[str, float]] = {}  # uri -> (task id, finished at)
        self.changed: dict[str, asyncio.Event] = {}  # uri -> set on its next didChange
        self._said: set[str] = set()
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

    def _send_status(self, status: dict[str, Any]) -> None:
        self.protocol.notify("flywheel/status", status)
        version_now = status.get("modelVersion") or ""
        if version_now and version_now != self._model_version:
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
        """Malformed messages: answer JSON-RPC's parse error (id null) and log once."""
        if isinstance(error, json.JSONDecodeError) or "Expecting" in str(error):
            self.protocol._send_data(
                {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": -32700, "message": f"Parse error: {error}"},
                }
            )
            if "parse" not in self._said:
                self._said.add("parse")
                log.error("a message from the client is not valid JSON: %s", error)
            return
        log.error("%s", error)

    def open_document(self, uri: str) -> Any:
        """The open document, or a clear InvalidParams error (never a read from disk)."""
        if not isinstance(uri, str) or uri not in self.workspace.text_documents:
            raise JsonRpcInvalidParams(f"document {uri!r} is not open; open it first (didOpen)")
        return self.workspace.get_text_document(uri)


SERVER = FlywheelServer()


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
    with contextlib.suppress(EngineError):  # the host told the user once; features answer nothing
        await ls.host.get(ls.settings.model)


async def _pull_configuration(ls: FlywheelServer) -> None:
    caps = ls.client_capabilities.workspace
    if not (caps and caps.configuration):
        return
    try:
        items = await asyncio.wait_for(
            ls.workspace_configuration_async(
                types.ConfigurationParams(items=[types.ConfigurationItem(section="flywheel")])
            ),
            timeout=10,
        )
    except (TimeoutError, JsonRpcException) as exc:
        log.warning("workspace/configuration failed: %s", exc)
        return
    if items and items[0] is not None:
        _apply_settings(ls, items[0])


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


@SERVER.feature(types.SHUTDOWN)
def shutdown(ls: FlywheelServer, params: Any) -> None:
    if ls.recorder is not None:
        ls.record("session_end")
        ls.recorder.close(timeout=10)
    ls.host.close()


# --- documents ---------------------------------------------------------------------------------


@SERVER.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: FlywheelServer, params: types.DidOpenTextDocumentParams) -> None:
    text = params.text_document.text
    if looks_binary(text):
        log.info("%s looks binary: no suggestions for it", params.text_document.uri)


@SERVER.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: FlywheelServer, params: types.DidChangeTextDocumentParams) -> None:
    uri = params.text_document.uri
    if ls.survival.tracking(uri):
        for sid in ls.survival.on_change(uri, list(params.content_changes)):
            ls.record("outcome", suggestion_id=sid, reverted=1, dissatisfied_followup=1)
    event = ls.changed.pop(uri, None)
    if event is not None:
        event.set()


@SERVER.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: FlywheelServer, params: types.DidCloseTextDocumentParams) -> None:
    """Closing keeps tracked spans: their last text stands for the file as saved."""


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
    if ls.completions.resolve(sid, event, data.get("acceptedChars")) is None:
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
    if not (caps and caps.work_done_progress):
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


async def _run_task(ls: FlywheelServer, kind: str, args: tuple[Any, ...]) -> dict[str, Any]:
    data = _args(args) if kind != "ask" or args else {}
    uri = data.get("uri")
    doc = ls.open_document(uri) if uri is not None else None
    text = doc.source if doc is not None else ""
    selection = _selection(text, data.get("range"))
    instruction = instruction_for(kind, data, selection)
    task_id = uuid.uuid4().hex
    previous = ls.last_task.get(uri or "")
    if previous and ls.now() - previous[1] <= ls.settings.agent.followup_window_s:
        ls.record("outcome", task_id=previous[0], dissatisfied_followup=1)
    cancel = threading.Event()
    ls.tasks[task_id] = cancel
    token = f"flywheel-task-{task_id}"
    ls.record("task_start", id=task_id, instruction=instruction, model_version=ls.host.version)
    await _progress(ls, token, "begin", instruction[:80])
    steps = 0

    def step(role: str, content: str, **fields: Any) -> None:
        nonlocal steps
        ls.record("step", task_id=task_id, idx=steps, role=role, content=content, **fields)
        ls.protocol.notify(
            "flywheel/taskStep", {"taskId": task_id, "index": steps, "role": role, "text": content}
        )
        steps += 1

    status, answer, proposal = "failed", "", None
    try:
        messages = task_messages(kind, instruction, uri or "", text, selection)
        step("user", messages[-1]["content"])
        engine = await ls.host.get(ls.settings.model)
        request = Request(
            messages=messages,
            params=SamplingParams(max_tokens=ls.settings.agent.max_tokens, temperature=0.0),
        )
        request.cancel = cancel
        await _progress(ls, token, "report", "thinking")
        started = time.perf_counter()
        result = await ls.host.call(engine.generate, request)
        sample = result.completions[0]
        if sample.finish_reason == "cancelled" or cancel.is_set():
            raise Cancelled("cancelled by the user")
        answer = sample.text
        step(
            "assistant",
            answer,
            token_ids=sample.token_ids,
            logprobs=sample.logprobs,
            policy_version=sample.model_version,
            duration_ms=(time.perf_counter() - started) * 1000,
            prompt_tokens=result.metrics.prompt_tokens,
            output_tokens=result.metrics.output_tokens,
        )
        if doc is not None:
            new_text, errors = apply_search_replace(text, answer)
            if errors:
                step("tool", "", tool_name="edit", is_error=1, error="; ".join(errors))
            proposal = _propose(ls, uri, doc.version or 0, text, new_text, task_id, "agent_edit")
        status = "done"
    except (Cancelled, asyncio.CancelledError) as exc:
        status = "cancelled"
        if isinstance(exc, asyncio.CancelledError):
            cancel.set()
            ls.record("task_end", task_id=task_id, status=status, final_message=answer)
            raise
    except EngineError as exc:
        ls.host.error_once(str(exc))
        answer = f"the model failed: {exc}"
    finally:
        ls.tasks.pop(task_id, None)
        if uri:
            ls.last_task[uri] = (task_id, ls.now())
        await _progress(ls, token, "end", status)
    ls.record("task_end", task_id=task_id, status=status, final_message=answer)
    return {
        "taskId": task_id,
        "status": status,
        "answer": answer,
        "proposal": proposal.as_json() if proposal else None,
    }


def _propose(
    ls: FlywheelServer, uri: str, version: int, base: str, new: str, task_id: str | None, kind: str
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
    ls.protocol.notify("flywheel/proposal", proposal.as_json())
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


@SERVER.command("flywheel.cancelTask")
def cancel_task(ls: FlywheelServer, *args: Any) -> dict[str, Any]:
    event = ls.tasks.get(args[0]) if args and isinstance(args[0], str) else None
    if event is not None:
        event.set()
    return {"cancelled": event is not None}


@SERVER.feature(types.WINDOW_WORK_DONE_PROGRESS_CANCEL)
def progress_cancel(ls: FlywheelServer, params: types.WorkDoneProgressCancelParams) -> None:
    token = str(params.token)
    if token.startswith("flywheel-task-"):
        event = ls.tasks.get(token.removeprefix("flywheel-task-"))
        if event is not None:
            event.set()


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


async def _accept(ls: FlywheelServer, proposal: Any, idx: int) -> dict[str, Any]:
    if proposal.uri not in ls.workspace.text_documents:
        raise JsonRpcException(
            f"{proposal.uri} is closed; reopen it and ask again", code=REQUEST_FAILED
        )
    doc = ls.workspace.get_text_document(proposal.uri)
    if doc.source != proposal.expected_text and proposal.awaiting_change:
        event = ls.changed.setdefault(proposal.uri, asyncio.Event())
        with contextlib.suppress(TimeoutError):  # our previous hunk's didChange is on its way
            await asyncio.wait_for(event.wait(), timeout=5)
    proposal.awaiting_change = False
    try:
        edit, after = proposal.edit_for(idx, doc.source, doc.version or 0)
    except StaleProposal as exc:
        for h in proposal.hunks:
            if h.state == "pending":
                h.state = "failed"
                ls.record("hunk_outcome", edit_id=proposal.id, idx=h.idx, outcome="failed")
        raise JsonRpcException(str(exc), code=REQUEST_FAILED) from None
    except ValueError as exc:
        raise JsonRpcInvalidParams(str(exc)) from None
    result = await ls.workspace_apply_edit_async(
        types.ApplyWorkspaceEditParams(
            edit=types.WorkspaceEdit(document_changes=[edit]), label="Flywheel: accept hunk"
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
    proposal.awaiting_change = ls.workspace.get_text_document(proposal.uri).source != after
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
