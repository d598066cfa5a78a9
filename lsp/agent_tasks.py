"""Agent tasks in the editor: ask, fix a diagnostic, explain; and the code actions that start them.

Vocabulary:
  task       one instruction run by the agent harness (`agent.harness.Harness`) to an answer; its
             steps stream to the client as they happen (`flywheel/taskStep`)
  buffer     an open document under the task's workspace folder; its unsaved text wins over the
             disk
  proposal   the task's edits in one document, reviewed hunk by hunk (proposals.py)

How a task runs: `TaskRunner.run` builds a harness `Workspace` whose overlay is the open buffers,
so the agent's writes become proposals instead of files. The harness runs in one of the runner's
worker threads (never on the event loop); it joins the editor's telemetry session
(`Harness(session_id=...)`) and stops with `cancelled` when the task's cancel event is set
(`Harness.start(cancel=...)`): `flywheel.cancelTask`, the progress's cancel button, the answer
"Stop the task" to an approval, or the server closing. One small adapter remains,
`TaskRecorder`: the task is recorded under the id the server already gave the client, and the
harness's whole-file `edit` rows are left to the review, which records each proposal with its
hunks and their outcomes.

What it does not do: apply edits (proposals.py), or find the document a command names (server.py
opens it and hands over the command's object).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from agent.engine import EngineError
from agent.harness import (
    ApprovalPolicy,
    Harness,
    HarnessConfig,
    Outcome,
    SandboxConfig,
    Workspace,
)
from agent.harness.context import Diagnostic, EditorContext
from agent.harness.recording import STATUS_OF_STOP
from lsp.documents import looks_binary, offset_at
from lsp.proposals import Proposal, ReviewService, file_path
from lsp.protocol import REQUEST_FAILED, TASK_STEP

if TYPE_CHECKING:
    from lsp.server import FlywheelServer

log = logging.getLogger("flywheel.lsp")

TASK_WORKERS = 2  # harness runs at once; further tasks wait for a worker
PROGRESS_PREFIX = "flywheel-task-"  # a task's work-done progress token is this + its id
APPROVE, DENY, STOP = "Allow", "Deny", "Stop the task"


@dataclass
class RunningTask:
    """An agent task in progress: what stopping it needs."""

    cancel: threading.Event
    work: concurrent.futures.Future | None = None  # the harness call running in the pool
    harness: Any = None  # the task's Harness once started
    waiting: str | None = None  # the harness thread id while it waits for an approval


@dataclass
class Buffer:
    uri: str
    version: int | None
    text: str


def selection_of(text: str, rng: Any) -> str:
    """The text a command's `range` ({start: {line, character}, end}) covers; "" without one."""
    if not isinstance(rng, dict):
        return ""
    try:
        start = offset_at(text, types.Position(**rng["start"]))
        end = offset_at(text, types.Position(**rng["end"]))
    except (KeyError, TypeError):
        raise JsonRpcInvalidParams("range must be {start: {line, character}, end: {...}}") from None
    return text[min(start, end) : max(start, end)]


def task_root(workspace: Any, uri: str | None) -> Path:
    """The task's workspace: the editor's workspace folder that holds the document (the deepest,
    in a multi-root workspace), else the client's root folder, else the document's folder. The
    harness reads that folder's rules (AGENTS.md) and runs its tests."""
    doc_path = file_path(uri) if uri else None
    folders = [file_path(f.uri) for f in (workspace.folders or {}).values()]
    roots = [p for p in folders if p is not None and p.is_dir()]
    if workspace.root_path and Path(workspace.root_path).is_dir():
        roots.append(Path(workspace.root_path).resolve())
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


def prompt_place(workspace: Any, uri: str) -> tuple[str, str]:
    """(repository, path) by which the completion prompt names a document: the workspace folder
    that holds it (`task_root`) and the path inside it, as `flywheel train repo` names a
    workspace's files, so what a model learned of the repository applies in the editor; ("", "")
    when no folder holds it (the prompt then names its own folder and file)."""
    path = file_path(uri)
    try:
        root = task_root(workspace, uri)
    except JsonRpcException:
        return "", ""
    if path is None or root not in path.parents:
        return "", ""
    return root.name, path.relative_to(root).as_posix()


def open_buffers(workspace: Any, root: Path, max_chars: int) -> dict[str, Buffer]:
    """Open documents under `root` by relative path; too large or binary ones are left out."""
    out: dict[str, Buffer] = {}
    for uri, doc in list(workspace.text_documents.items()):
        path = file_path(uri)
        if path is None or root not in path.parents:
            continue
        text = doc.source
        if len(text) > max_chars or looks_binary(text):
            continue
        out[path.relative_to(root).as_posix()] = Buffer(uri, doc.version, text)
    return out


def editor_context(
    data: dict[str, Any], rel: str | None, text: str, selection: str, open_files: list[str]
) -> EditorContext:
    """What the harness is told about the editor: the file, cursor line, selection, diagnostic."""
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


def task_actions(
    uri: str, diagnostics: list[types.Diagnostic], selected: types.Range, unstructure: Any
) -> list[types.CodeAction]:
    """The code actions that start a task: fix each diagnostic, and ask about a non-empty
    selection. `unstructure`: the protocol's converter, for the commands' JSON arguments."""
    actions = []
    for diag in diagnostics:
        actions.append(
            types.CodeAction(
                title=f"Fix with Flywheel: {diag.message[:60]}",
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[diag],
                command=types.Command(
                    title="Fix with Flywheel",
                    command="flywheel.fixDiagnostic",
                    arguments=[{"uri": uri, "diagnostic": unstructure(diag)}],
                ),
            )
        )
    if selected.start != selected.end:
        actions.append(
            types.CodeAction(
                title="Ask Flywheel about selection",
                kind=types.CodeActionKind.Empty,
                command=types.Command(
                    title="Ask Flywheel about selection",
                    command="flywheel.ask",
                    arguments=[{"uri": uri, "range": unstructure(selected)}],
                ),
            )
        )
    return actions


class TaskRunner:
    """The server's agent tasks: run, cancelled, asked for approval, stopped when it closes.

    Owns the worker threads the harness runs in. `ls` is the server (settings, the engine host,
    telemetry, the client); `review` turns the task's edits into proposals."""

    def __init__(self, ls: FlywheelServer, review: ReviewService, max_document_chars: int) -> None:
        self.ls = ls
        self.review = review
        self.max_document_chars = max_document_chars  # larger buffers are left out of the task
        self.pool = ThreadPoolExecutor(max_workers=TASK_WORKERS, thread_name_prefix="flywheel-task")
        self.running: dict[str, RunningTask] = {}  # running task id -> how to stop it
        self.abandoned: list[RunningTask] = []  # tasks whose request ended with the transport
        self.approvals: dict[str, asyncio.Future] = {}  # task id -> the approval being asked
        self.last_task: dict[str, tuple[str, float]] = {}  # uri -> (task id, finished at)

    async def run(self, kind: str, data: dict[str, Any], doc: Any) -> dict[str, Any]:
        """Run one task to its end. `kind`: ask | fix | explain; `data`: the command's object;
        `doc`: the open document it names, or None."""
        ls = self.ls
        uri = data.get("uri")
        text = doc.source if doc is not None else ""
        selection = selection_of(text, data.get("range"))
        instruction = instruction_for(kind, data, selection)
        root = task_root(ls.workspace, uri)
        buffers = open_buffers(ls.workspace, root, self.max_document_chars)
        rel = next((r for r, b in buffers.items() if b.uri == uri), None)
        context = editor_context(data, rel, text, selection, sorted(buffers))
        task_id = uuid.uuid4().hex
        previous = self.last_task.get(uri or "")
        if previous and ls.now() - previous[1] <= ls.settings.agent.followup_window_s:
            ls.record("outcome", task_id=previous[0], dissatisfied_followup=1)
        task = _TaskSteps(self, task_id, RunningTask(threading.Event()))
        self.running[task_id] = task.running
        await self._progress(task.token, "begin", instruction[:80])
        task.step("user", instruction, kind="instruction")
        status, answer, stop_reason = "failed", "", None
        proposals: list[Proposal] = []
        skipped: list[str] = []
        try:
            outcome = await self._harness_task(task, instruction, context, root, buffers)
            stop_reason = outcome.stop_reason
            answer = outcome.final or outcome.detail
            if task.running.cancel.is_set() or stop_reason == "denied":
                status = "cancelled"
            else:
                status = STATUS_OF_STOP.get(stop_reason or "", "failed")
            if stop_reason == "engine_error":
                ls.host.error_once(outcome.detail)
            if status != "cancelled":
                proposals, skipped = self._propose(outcome.proposals, buffers, root, task_id)
        except asyncio.CancelledError:  # the request was cancelled, or the transport ended
            task.running.cancel.set()
            self.abandoned.append(task.running)
            raise
        except EngineError as exc:
            ls.host.error_once(str(exc))
            answer = f"the model failed: {exc}"
            ls.record(
                "task_start", id=task_id, instruction=instruction, model_version=ls.host.version
            )
            ls.record("task_end", task_id=task_id, status="failed", final_message=answer)
        finally:
            self.running.pop(task_id, None)
            if uri:
                self.last_task[uri] = (task_id, ls.now())
            await self._progress(task.token, "end", status)
        return {
            "taskId": task_id,
            "status": status,
            "stopReason": stop_reason,
            "answer": answer,
            "proposals": [p.as_json() for p in proposals],
            "skipped": skipped,
        }

    async def _harness_task(
        self,
        task: _TaskSteps,
        instruction: str,
        context: EditorContext,
        root: Path,
        buffers: dict[str, Buffer],
    ) -> Outcome:
        """The harness run of `instruction` over the open buffers, in a worker thread, with the
        user asked about each approval it waits for; returns its outcome."""
        ls = self.ls
        engine = await ls.host.get(ls.settings.model)
        config = self._config()
        recorder = TaskRecorder(ls.recorder, task.task_id) if ls.session_id else None
        overlay = {r: b.text for r, b in buffers.items()}
        running = task.running

        def start() -> tuple[Harness, Outcome]:
            harness = Harness(
                engine,
                Workspace(root, buffers=overlay),
                config,
                recorder=recorder,
                on_event=task.on_event,
                session_id=ls.session_id,
            )
            outcome = harness.start(
                instruction, editor=context, thread_id=task.task_id, cancel=running.cancel
            )
            return harness, outcome

        harness, outcome = await task.submit(start)
        running.harness = harness
        while outcome.approval is not None:
            task.step(
                "system",
                "waiting for approval",
                kind="approval_request",
                calls=outcome.approval.get("calls", []),
            )
            running.waiting = outcome.thread_id
            decision = await self._ask_approval(task.task_id, outcome.approval)
            running.waiting = None
            outcome = await task.submit(harness.resume, outcome.thread_id, decision)
        return outcome

    def cancel(self, task_id: Any) -> bool:
        """Stop a running task: its model turn, its next turn, and an approval it waits for."""
        task = self.running.get(task_id) if isinstance(task_id, str) else None
        if task is None:
            return False
        task.cancel.set()  # the harness stops the running model turn and the task
        waiting = self.approvals.get(task_id)
        if waiting is not None:
            waiting.cancel()
        return True

    def cancel_progress(self, token: str) -> None:
        """The client cancelled a work-done progress: stop the task it belongs to, if any."""
        if token.startswith(PROGRESS_PREFIX):
            self.cancel(token.removeprefix(PROGRESS_PREFIX))

    def close(self, timeout: float) -> None:
        """Stop every task, give their harness calls `timeout` seconds to end, and end a task
        paused for approval as the user stopping it would."""
        running = [*self.running.values(), *self.abandoned]
        for task in running:
            task.cancel.set()
        for waiting in self.approvals.values():
            waiting.cancel()
        work = [t.work for t in running if t.work is not None]
        if work:
            concurrent.futures.wait(work, timeout=timeout)
        for task in running:
            if (
                task.waiting
                and task.harness is not None
                and (task.work is None or task.work.done())
            ):
                try:
                    task.harness.resume(task.waiting, {"stop": True})
                except Exception:
                    log.exception("could not end a task waiting for approval")
        self.running.clear()
        self.abandoned.clear()

    def _config(self) -> HarnessConfig:
        agent = self.ls.settings.agent
        return HarnessConfig(
            max_steps=agent.max_steps,
            turn_max_tokens=agent.max_tokens,
            editor=self.ls.editor or "editor",
            approval=approval_policy(agent.approval),
            sandbox=SandboxConfig(
                read_only_paths=tuple(agent.read_only_paths),
                allow_unconfined=agent.allow_unconfined,
            ),
        )

    def _propose(
        self, written: dict[str, str | None], buffers: dict[str, Buffer], root: Path, task_id: str
    ) -> tuple[list[Proposal], list[str]]:
        """The harness's writes (relative path -> new text, None: deleted) as proposals against
        the open buffers or the disk; deletions are reported, never proposed."""
        proposals, skipped = [], []
        for path, new in written.items():
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
            proposal = self.review.propose(doc_uri, version, base, new, task_id, "agent_edit")
            if proposal is not None:
                proposals.append(proposal)
        return proposals, skipped

    def _step(self, task_id: str, index: int, role: str, text: str, **extra: Any) -> None:
        self.ls.notify(
            TASK_STEP, {"taskId": task_id, "index": index, "role": role, "text": text, **extra}
        )

    async def _progress(self, token: str, kind: str, message: str) -> None:
        """Work-done progress for the task (begin, report, end), when the client supports it."""
        ls = self.ls
        caps = ls.client_capabilities.window
        if not (caps and caps.work_done_progress) or ls.client_gone:
            return
        if kind == "begin":
            try:
                await asyncio.wait_for(ls.work_done_progress.create_async(token), timeout=5)
            except Exception:
                return
            ls.work_done_progress.begin(
                token,
                types.WorkDoneProgressBegin(title="Flywheel", message=message, cancellable=True),
            )
        elif token in ls.work_done_progress.tokens:
            if kind == "end":
                ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
            else:
                ls.work_done_progress.report(token, types.WorkDoneProgressReport(message=message))

    async def _ask_approval(self, task_id: str, approval: dict[str, Any]) -> Any:
        """Ask the user (window/showMessageRequest) about the calls waiting; return the decision."""
        ls = self.ls
        lines = []
        for c in approval.get("calls") or []:
            args = json.dumps(c.get("arguments"), ensure_ascii=False)
            lines.append(f"- {c.get('name')} {args[:200]} ({c.get('reason')})")
        params = types.ShowMessageRequestParams(
            type=types.MessageType.Warning,
            message="Flywheel wants to:\n" + "\n".join(lines),
            actions=[types.MessageActionItem(t) for t in (APPROVE, DENY, STOP)],
        )
        waiting = asyncio.ensure_future(ls.window_show_message_request_async(params))
        self.approvals[task_id] = waiting
        try:
            item = await asyncio.wait_for(waiting, timeout=ls.settings.agent.approval_timeout_s)
        except asyncio.CancelledError:
            task = self.running.get(task_id)
            if task is not None and task.cancel.is_set():
                return {"stop": True}  # cancelTask while waiting
            raise
        except (TimeoutError, JsonRpcException) as exc:
            log.info("no approval for task %s (%s): denied", task_id, exc or "timed out")
            return False
        finally:
            self.approvals.pop(task_id, None)
        title = getattr(item, "title", None)
        if title == STOP:
            return {"stop": True}
        return title == APPROVE


class _TaskSteps:
    """One running task's link to the client: its numbered steps (`flywheel/taskStep`) and
    progress reports, and its harness calls in the runner's worker threads."""

    def __init__(self, runner: TaskRunner, task_id: str, running: RunningTask) -> None:
        self.runner, self.task_id, self.running = runner, task_id, running
        self.token = PROGRESS_PREFIX + task_id  # its work-done progress
        self.loop = asyncio.get_running_loop()
        self.index = 0  # the next step's number

    def step(self, role: str, text: str, **extra: Any) -> None:
        self.runner._step(self.task_id, self.index, role, text, **extra)
        self.index += 1

    def submit(self, fn: Any, *fn_args: Any) -> asyncio.Future:
        """Run `fn` in a worker thread; the running task keeps its future (to wait on it)."""
        self.running.work = self.runner.pool.submit(fn, *fn_args)
        return asyncio.wrap_future(self.running.work)

    def on_event(self, event: dict[str, Any]) -> None:  # in the task's worker thread
        with contextlib.suppress(RuntimeError):  # the loop is gone: the client went away
            self.loop.call_soon_threadsafe(self._send, event)

    def _send(self, event: dict[str, Any]) -> None:  # on the event loop
        role, note, extra = step_note(event)
        self.step(role, note, **extra)
        report = f"step {self.index - 1}: {note[:60]}"
        asyncio.ensure_future(self.runner._progress(self.token, "report", report))
