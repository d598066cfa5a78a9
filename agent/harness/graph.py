"""The agent loop as a langgraph graph: model -> (approve) -> tools -> model ... -> finish.

    model ──answer / limit / error──────────────────────────► finish ──► END
      │  └─only malformed calls (errors shown to the model)─► model
      ▼ tool calls
    approve ── risky calls: interrupt(...) until Command(resume=decision)
      ▼
    tools ──► model            (or finish on a repeated failure / a vanished workspace)

- *model*: checks the limits (steps, tokens, running time; each is a stop reason), compacts the
  history by a self-summary turn when the next prompt would pass `compact_at` of the context,
  then asks the engine for one turn. Malformed tool calls (`Completion.tool_call_errors`) become a
  message to the model and a recorded tool error, never an exception; engine failures and
  timeouts stop the task with `engine_error` / `wall_time`. A caller's `cancel` event (given to
  `Harness.start` / `resume`) stops the running turn within one decoding step and the task with
  `cancelled`; it is also checked before each turn and each tool call.
- *approve*: calls that the `ApprovalPolicy` marks risky (commands without a sandbox, deletes,
  writes to protected paths) pause the graph with langgraph's `interrupt`; the caller resumes it
  with `Command(resume=True | False | {call_id: bool} | {"stop": True})`.
- *tools*: runs each call (tools.py), appends the results; unknown tools and bad arguments come
  back as error results. The same failing call (same tool and arguments) made `repeat_limit`
  times stops the task with `repeated_failure`.
- *finish*: records the end of the task (stop reason, final answer, diff) in telemetry.

The state (state.py) is checkpointed after every node with langgraph's `SqliteSaver` when a
`checkpoint_db` is given, so `Harness.resume(thread_id, ...)` continues a task in a new process.
langgraph is imported lazily (about 1.2 s).

What it does not do: render prompts (the engine applies the chat template), or talk to the editor
(lsp/ drives `Harness` and shows the proposals).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.chat_format import CALL_SHAPE, TOOL_CALL, parse_assistant
from agent.engine import Cancelled, Engine, EngineError, Request, SamplingParams
from agent.harness.context import EditorContext, render_context
from agent.harness.project import project_rules
from agent.harness.prompts import COMPACT_PROMPT, COMPACTED_PREFIX, first_messages, tool_schemas
from agent.harness.recording import TaskLog
from agent.harness.sandbox import Sandbox, SandboxConfig
from agent.harness.state import AgentState
from agent.harness.tools import (
    MAX_ARGUMENT_CHARS,
    TOOLS,
    ToolContext,
    ToolsConfig,
    check_arguments,
    run_tool,
)
from agent.harness.workspace import Workspace, WorkspaceError

CANCEL_POLL_S = 0.05  # how often a running model turn looks at the caller's cancel event


@dataclass
class ApprovalPolicy:
    commands: Literal["never", "unsandboxed", "always"] = "unsandboxed"  # when commands ask
    delete: bool = True  # delete_file asks
    protected: tuple[str, ...] = (".git/", ".github/", ".env*", "*.pem", "*.key")  # gitignore-style
    # globs; writing, editing or deleting a matching path asks

    def __post_init__(self) -> None:
        if self.commands not in ("never", "unsandboxed", "always"):
            raise ValueError(
                f"commands must be never, unsandboxed or always, got {self.commands!r}"
            )

    def reason(self, name: str, arguments: dict[str, Any], confined: bool) -> str | None:
        """Why this call needs the user's approval, or None."""
        if name in ("run_command", "run_tests"):
            if self.commands == "always":
                return "commands need approval (policy)"
            if self.commands == "unsandboxed" and not confined:
                return "bubblewrap is not installed: the command would run unconfined"
        if name == "delete_file" and self.delete:
            return "deleting a file"
        if name in ("write_file", "edit_file", "delete_file") and self.protected:
            import pathspec

            path = arguments.get("path")
            spec = pathspec.GitIgnoreSpec.from_lines(self.protected)
            if isinstance(path, str) and spec.match_file(path.removeprefix("./")):
                return f"{path} is a protected path"
        return None


@dataclass
class HarnessConfig:
    max_steps: int = 30  # model turns per task
    max_tokens: int = 500_000  # prompt + output tokens per task, summed over turns
    max_wall_s: float = 900.0  # running time per task (time waiting for approval excluded)
    turn_max_tokens: int = 2048  # output tokens per model turn
    temperature: float = 0.0  # sampling temperature of every turn (0: greedy)
    seed: int | None = None  # sampling seed (RL rollouts set one per sample)
    repeat_limit: int = 3  # the same failing call this many times stops the task
    compact_at: float = 0.8  # compact when the prompt would pass this share of the room left
    summary_max_tokens: int = 512  # output tokens of the self-summary turn
    map_tokens: int = 1024  # repository map added to the task (0: none)
    editor: str = "headless"  # telemetry: "headless", "vscode", "nvim", "rollout"
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    approval: ApprovalPolicy = field(default_factory=ApprovalPolicy)

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.max_tokens < 1 or self.turn_max_tokens < 1:
            raise ValueError("max_steps, max_tokens and turn_max_tokens must be >= 1")
        if not self.max_wall_s > 0:
            raise ValueError("max_wall_s must be > 0")
        if self.repeat_limit < 1:
            raise ValueError("repeat_limit must be >= 1")
        if not 0 < self.compact_at <= 1:
            raise ValueError("compact_at must be in (0, 1]")


@dataclass
class Outcome:
    """Where a task stands after `start` or `resume`: finished, or waiting for approval."""

    thread_id: str
    stop_reason: str | None  # None while waiting for approval
    detail: str  # why it stopped, in one line
    final: str  # the model's last answer
    diff: str  # unified diff of the task's changes
    approval: dict[str, Any] | None  # {"calls": [{"id","name","arguments","reason"}]} when waiting
    steps: int
    tokens: int
    tool_errors: int
    messages: list[dict[str, Any]]
    proposals: dict[str, str | None]  # editor overlay: path -> proposed text (None: delete)

    @property
    def ok(self) -> bool:
        return self.stop_reason == "answered"


def _fingerprint(name: str, arguments: Any) -> str:
    blob = json.dumps([name, arguments], sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _chars(messages: list[dict[str, Any]]) -> int:
    return len(json.dumps(messages, ensure_ascii=False, default=str))


def _shown_arguments(arguments: Any) -> Any:
    """Arguments as kept in the history: a huge argument object is replaced by a note."""
    text = json.dumps(arguments, ensure_ascii=False, default=str)
    if len(text) <= MAX_ARGUMENT_CHARS:
        return arguments
    return {"_omitted": f"{len(text)} characters of arguments, over the limit"}


def build_graph(
    engine: Engine,
    ctx: ToolContext,
    config: HarnessConfig,
    log: TaskLog,
    checkpointer: Any,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    cancel_event: Callable[[], threading.Event | None] | None = None,
):
    """Compile the graph for one engine and workspace (a fresh graph per task is cheap).

    `cancel_event()` returns the running task's cancel event (or None): the caller sets it to
    stop the task with the stop reason `cancelled`.
    """
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    ws = ctx.workspace
    schemas = tool_schemas()
    emit = on_event or (lambda event: None)

    def cancelled() -> bool:
        event = cancel_event() if cancel_event is not None else None
        return event is not None and event.is_set()

    def stop(reason: str, detail: str = "") -> dict[str, Any]:
        return {"stop_reason": reason, "stop_detail": detail, "pending": []}

    def est_prompt_tokens(state: AgentState, messages: list[dict[str, Any]]) -> int:
        chars = _chars(messages) + _chars(schemas)
        if state.get("last_prompt_tokens") and state.get("last_prompt_chars"):
            return int(chars * state["last_prompt_tokens"] / state["last_prompt_chars"]) + 1
        return chars // 3 + 1

    def call_engine(messages, tools, max_tokens, deadline_s):
        """One engine call; its request is cancelled at the deadline or by the caller."""
        cancel, done = threading.Event(), threading.Event()
        outer = cancel_event() if cancel_event is not None else None
        end = time.monotonic() + max(deadline_s, 0.01)

        def watch() -> None:  # the engine sees one event: set it on either cause
            while not done.is_set():
                left = end - time.monotonic()
                if left <= 0 or (outer is not None and outer.is_set()):
                    cancel.set()
                    return
                done.wait(min(left, CANCEL_POLL_S) if outer is not None else left)

        watcher = threading.Thread(target=watch, daemon=True, name="flywheel-turn-deadline")
        watcher.start()
        try:
            req = Request(
                messages=messages,
                tools=tools,
                params=SamplingParams(
                    max_tokens=max_tokens, temperature=config.temperature, seed=config.seed
                ),
                cancel=cancel,
                request_id=uuid.uuid4().hex,
            )
            return engine.generate(req), cancel.is_set()
        finally:
            done.set()

    def compact(state: AgentState, room: int) -> tuple[list[dict[str, Any]] | None, dict, str]:
        """Ask the model to summarise; returns (new messages or None, updates, error)."""
        messages = state["messages"]
        ask = [*messages, {"role": "user", "content": COMPACT_PROMPT}]
        upd: dict[str, Any] = {}
        try:
            result, _ = call_engine(
                ask, None, config.summary_max_tokens, config.max_wall_s - state.get("elapsed_s", 0)
            )
            summary = Workspace.display(parse_assistant(result.completions[0].text)[0])
            upd["tokens"] = (
                state.get("tokens", 0) + result.metrics.prompt_tokens + result.metrics.output_tokens
            )
        except (EngineError, ValueError):
            # The history is already too long to summarise: keep only the task, say so.
            summary = "(the earlier turns could not be summarised; re-read what you need)"
        head = messages[:2]
        new = [*head, {"role": "user", "content": COMPACTED_PREFIX + summary}]
        upd.update(log.step(state, "assistant", content=f"[compaction summary]\n{summary}"))
        emit({"kind": "compact", "summary": summary, "before": len(messages), "after": len(new)})
        if est_prompt_tokens(state, new) > room:
            return None, upd, "the task and its context alone do not fit the model's context"
        return new, upd, ""

    def model_node(state: AgentState) -> dict[str, Any]:
        t0 = time.monotonic()
        elapsed = state.get("elapsed_s", 0.0)
        steps = state.get("steps", 0)
        tokens = state.get("tokens", 0)
        try:
            ws.check_alive()
        except WorkspaceError as exc:
            return stop("workspace_error", str(exc))
        if steps >= config.max_steps:
            return stop("max_steps", f"used all {config.max_steps} model turns")
        if tokens >= config.max_tokens:
            return stop("max_tokens", f"used {tokens} of {config.max_tokens} tokens")
        if elapsed >= config.max_wall_s:
            return stop("wall_time", f"ran {elapsed:.0f} s of {config.max_wall_s:.0f} s")
        if cancelled():
            return stop("cancelled", "the user cancelled the task")
        upd: dict[str, Any] = {}
        messages = state["messages"]
        turn_max = min(config.turn_max_tokens, max(engine.context_length // 4, 1))
        room = engine.context_length - turn_max
        if est_prompt_tokens(state, messages) > config.compact_at * room:
            new, upd, error = compact(state, room)
            state = {**state, **upd}
            if new is None:
                return {**upd, **stop("context_overflow", error)}
            messages = new
            upd["messages"] = new
            upd["last_prompt_tokens"] = 0
        remaining = config.max_wall_s - elapsed - (time.monotonic() - t0)
        try:
            result, timed_out = call_engine(messages, schemas, turn_max, remaining)
        except Cancelled:
            if cancelled():
                return {**upd, **stop("cancelled", "the user cancelled the task")}
            return {**upd, **stop("wall_time", "the model turn passed the running-time limit")}
        except EngineError as exc:
            return {**upd, **stop("engine_error", f"the engine failed: {exc}")}
        except Exception as exc:  # a backend bug must still end the task with a reason
            return {
                **upd,
                **stop("engine_error", f"the engine failed: {type(exc).__name__}: {exc}"),
            }
        duration = time.monotonic() - t0
        if not result.completions:
            return {**upd, **stop("engine_error", "the engine returned no completion")}
        comp = result.completions[0]
        m = result.metrics
        upd.update(
            steps=steps + 1,
            tokens=state.get("tokens", 0) + m.prompt_tokens + m.output_tokens,
            elapsed_s=elapsed + duration,
            last_prompt_tokens=m.prompt_tokens,
            last_prompt_chars=_chars(messages) + _chars(schemas),
        )
        text = comp.text or ""
        calls, errors = list(comp.tool_calls), list(comp.tool_call_errors)
        content = text
        if TOOL_CALL in text:
            content, parsed, parse_errors = parse_assistant(text, schemas)
            if not calls and not errors:
                calls, errors = parsed, parse_errors
        content = Workspace.display(content)
        seen: set[str] = set()
        pending = []
        for call in calls:
            cid = call.id if call.id and call.id not in seen else f"call_{uuid.uuid4().hex[:12]}"
            seen.add(cid)
            pending.append({"id": cid, "name": call.name, "arguments": call.arguments})
        assistant: dict[str, Any] = {"role": "assistant", "content": content}
        if pending:
            assistant["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {
                        "name": c["name"],
                        "arguments": json.dumps(
                            _shown_arguments(c["arguments"]), ensure_ascii=False
                        ),
                    },
                }
                for c in pending
            ]
        messages = [*messages, assistant]
        upd.update(
            log.step(
                {**state, **upd},
                "assistant",
                content=content,
                tool_calls=[{**c, "arguments": _shown_arguments(c["arguments"])} for c in pending]
                or None,
                token_ids=list(comp.token_ids),
                logprobs=list(comp.logprobs) if comp.logprobs is not None else None,
                policy_version=comp.model_version or engine.model_version,
                duration_ms=duration * 1000,
                prompt_tokens=m.prompt_tokens,
                output_tokens=m.output_tokens,
            )
        )
        emit({"kind": "assistant", "step": steps + 1, "content": content, "calls": pending,
              "errors": errors, "duration_s": duration})  # fmt: skip
        if comp.finish_reason == "cancelled" or timed_out:
            if cancelled():
                return {
                    **upd,
                    "messages": messages,
                    **stop("cancelled", "the user cancelled the task"),
                }
            return {
                **upd,
                "messages": messages,
                **stop("wall_time", "the model turn passed the running-time limit"),
            }
        if comp.finish_reason == "error":
            return {
                **upd,
                "messages": messages,
                **stop("engine_error", "the engine reported an error for this turn"),
            }
        failures = dict(state.get("failures", {}))
        tool_errors = state.get("tool_errors", 0)
        for error in errors:
            note = f"Your tool call could not be used: {Workspace.display(error)}\n{CALL_SHAPE}"
            messages.append({"role": "user", "content": note})
            upd.update(log.step({**state, **upd}, "tool", error=error, is_error=1, invalid=1))
            emit({"kind": "tool", "name": "(invalid call)", "is_error": True, "result": error})
            tool_errors += 1
            fp = _fingerprint("(invalid)", error[:200])
            failures[fp] = failures.get(fp, 0) + 1
            if failures[fp] >= config.repeat_limit:
                upd.update(messages=messages, failures=failures, tool_errors=tool_errors)
                return {
                    **upd,
                    **stop(
                        "repeated_failure",
                        f"the same malformed tool call {failures[fp]} times: {error[:200]}",
                    ),
                }
        upd.update(messages=messages, failures=failures, tool_errors=tool_errors, pending=pending)
        if not pending and not errors:
            upd.update(final=content, **stop("answered"))
        return upd

    def approve_node(state: AgentState) -> dict[str, Any]:
        risky = []
        for call in state.get("pending", []):
            reason = config.approval.reason(
                call["name"],
                call["arguments"] if isinstance(call["arguments"], dict) else {},
                ctx.sandbox.confined,
            )
            if reason:
                shown = _shown_arguments(call["arguments"])
                risky.append(
                    {"id": call["id"], "name": call["name"], "arguments": shown, "reason": reason}
                )
        if not risky:
            return {"approvals": {}}
        decision = interrupt({"calls": risky})
        if isinstance(decision, dict) and decision.get("stop"):
            return stop("denied", "the user denied an action and stopped the task")
        if isinstance(decision, dict):
            approvals = {c["id"]: bool(decision.get(c["id"], False)) for c in risky}
        elif isinstance(decision, list | tuple):
            approvals = {c["id"]: bool(d) for c, d in zip(risky, decision, strict=False)}
        else:
            approvals = {c["id"]: bool(decision) for c in risky}
        emit({"kind": "approval", "approvals": approvals})
        return {"approvals": approvals}

    def tools_node(state: AgentState) -> dict[str, Any]:
        t0 = time.monotonic()
        messages = list(state["messages"])
        failures = dict(state.get("failures", {}))
        tool_errors = state.get("tool_errors", 0)
        approvals = state.get("approvals", {})
        upd: dict[str, Any] = {}
        reason = None
        for call in state.get("pending", []):
            name, args, cid = call["name"], call["arguments"], call["id"]
            c0 = time.monotonic()
            if cancelled():
                reason = ("cancelled", "the user cancelled the task")
                break
            invalid = name not in TOOLS or check_arguments(TOOLS[name], args) is not None
            if approvals.get(cid) is False:
                result, is_error = (
                    "the user did not approve this action; do something else or answer",
                    True,
                )
            else:
                try:
                    ws.check_alive()
                    result, is_error = run_tool(ctx, name, args)
                except WorkspaceError as exc:
                    result, is_error = str(exc), True
                    reason = ("workspace_error", str(exc))
            if is_error:
                tool_errors += 1
                fp = _fingerprint(name, args)
                failures[fp] = failures.get(fp, 0) + 1
                if failures[fp] == config.repeat_limit - 1:
                    result += "\n[this exact call has failed before; change the arguments or the approach]"
                if failures[fp] >= config.repeat_limit and reason is None:
                    reason = (
                        "repeated_failure",
                        f"{name} failed {failures[fp]} times with the same arguments",
                    )
            messages.append({"role": "tool", "tool_call_id": cid, "name": name, "content": result})
            upd.update(
                log.step(
                    {**state, **upd},
                    "tool",
                    tool_call_id=cid,
                    tool_name=name,
                    result=None if is_error else result,
                    error=result if is_error else None,
                    is_error=int(is_error),
                    invalid=int(invalid),
                    duration_ms=(time.monotonic() - c0) * 1000,
                )
            )
            emit(
                {
                    "kind": "tool",
                    "name": name,
                    "arguments": args,
                    "is_error": is_error,
                    "result": result,
                }
            )
            if reason is not None:
                break
        if reason is None:
            try:
                ws.check_alive()
            except WorkspaceError as exc:
                reason = ("workspace_error", str(exc))
        upd.update(
            messages=messages,
            failures=failures,
            tool_errors=tool_errors,
            pending=[],
            approvals={},
            originals=dict(ws._original),
            elapsed_s=state.get("elapsed_s", 0.0) + time.monotonic() - t0,
        )
        if reason is not None:
            upd.update(stop(*reason))
        return upd

    def finish_node(state: AgentState) -> dict[str, Any]:
        reason = state.get("stop_reason") or "engine_error"
        detail = state.get("stop_detail", "")
        final = state.get("final", "")
        changes = ws.changes() if ws.root.is_dir() else {}
        diff = ws.diff() if ws.root.is_dir() else ""
        log.end_task(
            state, stop_reason=reason, detail=detail, final=final, changes=changes, diff=diff
        )
        emit({"kind": "stop", "reason": reason, "detail": detail})
        return {"stop_reason": reason}

    def after_model(state: AgentState) -> str:
        if state.get("stop_reason"):
            return "finish"
        return "approve" if state.get("pending") else "model"

    def after_tools(state: AgentState) -> str:
        return "finish" if state.get("stop_reason") else "model"

    def after_approve(state: AgentState) -> str:
        return "finish" if state.get("stop_reason") else "tools"

    graph = StateGraph(AgentState)
    graph.add_node("model", model_node)
    graph.add_node("approve", approve_node)
    graph.add_node("tools", tools_node)
    graph.add_node("finish", finish_node)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", after_model, ["finish", "approve", "model"])
    graph.add_conditional_edges("approve", after_approve, ["finish", "tools"])
    graph.add_conditional_edges("tools", after_tools, ["finish", "model"])
    graph.add_edge("finish", END)
    return graph.compile(checkpointer=checkpointer)


def open_checkpointer(path: str | None):
    """langgraph's SqliteSaver on `path` (created if needed), or an in-memory saver."""
    if path is None:
        from langgraph.checkpoint.memory import InMemorySaver

        return InMemorySaver()
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    return SqliteSaver(conn)


class Harness:
    """One agent over one engine and workspace: `start` a task, `resume` it after an approval.

    The same object runs in the editor (overlay workspace), headless (`flywheel run`) and in RL
    rollouts; `recorder` (a telemetry Recorder or None) receives every task and step.
    """

    def __init__(
        self,
        engine: Engine,
        workspace: Workspace,
        config: HarnessConfig | None = None,
        *,
        recorder: Any | None = None,
        checkpoint_db: str | None = None,  # SQLite file for checkpoints; None keeps them in memory
        on_event: Callable[[dict[str, Any]], None] | None = None,  # live progress
        session_id: str | None = None,  # join this telemetry session (the editor's) instead of
        # starting one; `close` then leaves it open
    ) -> None:
        self.engine = engine
        self.workspace = workspace
        self.config = config or HarnessConfig()
        self.sandbox = Sandbox(workspace.root, self.config.sandbox)
        self.ctx = ToolContext(workspace, self.sandbox, self.config.tools)
        self.log = TaskLog(recorder)
        self._on_event = on_event
        self.checkpointer = open_checkpointer(checkpoint_db)
        self._cancel: threading.Event | None = None
        self.graph = build_graph(
            engine, self.ctx, self.config, self.log, self.checkpointer, on_event,
            cancel_event=lambda: self._cancel,
        )  # fmt: skip
        self._session_id: str | None = session_id
        self._own_session = session_id is None

    def _thread(self, thread_id: str) -> dict[str, Any]:
        return {
            "configurable": {"thread_id": thread_id},
            "recursion_limit": self.config.max_steps * 4 + 20,
        }

    def session_id(self) -> str:
        if self._session_id is None:
            self._session_id = self.log.start_session(
                editor=self.config.editor,
                model_version=self.engine.model_version,
                workspace_root=str(self.workspace.root),
            )
        return self._session_id

    def start(
        self,
        instruction: str,
        *,
        editor: EditorContext | None = None,
        thread_id: str | None = None,
        verify_command: str | None = None,
        cancel: threading.Event | None = None,
    ) -> Outcome:
        """Run a new task until it stops or waits for approval.

        `cancel`: set it from any thread to stop the task (stop reason `cancelled`); it stays in
        force for `resume` unless another is given there.
        """
        self._cancel = cancel
        thread_id = thread_id or uuid.uuid4().hex
        rules = project_rules(self.workspace)
        if rules is not None and self._on_event is not None:
            self._on_event(
                {"kind": "rules", "files": list(rules.files), "truncated": rules.truncated}
            )
        context = render_context(self.workspace, instruction, editor, self.config.map_tokens, rules)
        messages = first_messages(instruction, context)
        sid = self.session_id()
        task_id = self.log.start_task(
            sid,
            instruction=instruction,
            model_version=self.engine.model_version,
            verify_command=verify_command,
        )
        state: dict[str, Any] = {
            "messages": messages,
            "task_id": task_id,
            "session_id": sid,
            "record_idx": 0,
            "steps": 0,
            "tokens": 0,
            "elapsed_s": 0.0,
            "pending": [],
            "approvals": {},
            "failures": {},
            "tool_errors": 0,
            "stop_reason": None,
            "stop_detail": "",
            "final": "",
            "originals": {},
        }
        for m in messages:
            state.update(self.log.step(state, m["role"], content=m["content"]))
        return self._invoke(state, thread_id)

    def resume(
        self, thread_id: str, decision: Any = True, cancel: threading.Event | None = None
    ) -> Outcome:
        """Continue a task waiting for approval (in this process or a new one).

        `decision`: True/False for every waiting call, {call_id: bool}, or {"stop": True}.
        `cancel`: as for `start` (None keeps the one given to `start`).
        """
        from langgraph.types import Command

        if cancel is not None:
            self._cancel = cancel
        snap = self.graph.get_state(self._thread(thread_id))
        if not snap.values:
            raise ValueError(f"no task with thread id {thread_id!r} in the checkpoint database")
        if not snap.next:
            return self._outcome(thread_id)
        self.workspace._original.update(
            {
                k: v
                for k, v in (snap.values.get("originals") or {}).items()
                if k not in self.workspace._original
            }
        )
        return self._invoke(Command(resume=decision), thread_id)

    def _invoke(self, payload: Any, thread_id: str) -> Outcome:
        self.graph.invoke(payload, self._thread(thread_id))
        self.log.flush()
        return self._outcome(thread_id)

    def status(self, thread_id: str) -> Outcome:
        """Where a checkpointed task stands, without running anything."""
        return self._outcome(thread_id)

    def _outcome(self, thread_id: str) -> Outcome:
        snap = self.graph.get_state(self._thread(thread_id))
        values = snap.values
        approval = None
        if snap.next:
            interrupts = [i.value for task in snap.tasks for i in task.interrupts]
            approval = interrupts[0] if interrupts else None
        alive = self.workspace.root.is_dir()
        return Outcome(
            thread_id=thread_id,
            stop_reason=None if snap.next else values.get("stop_reason"),
            detail=values.get("stop_detail", ""),
            final=values.get("final", ""),
            diff=self.workspace.diff() if alive else "",
            approval=approval,
            steps=values.get("steps", 0),
            tokens=values.get("tokens", 0),
            tool_errors=values.get("tool_errors", 0),
            messages=values.get("messages", []),
            proposals=self.workspace.proposals() if alive else {},
        )

    def close(self) -> None:
        if self._own_session:
            self.log.end_session(self._session_id or "")
        self.log.flush()
        conn = getattr(self.checkpointer, "conn", None)
        if conn is not None:
            conn.close()
