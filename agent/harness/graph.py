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
  back as error results. The same failing call (same tool and arguments, no edit in between)
  made `repeat_limit` times stops the task with `repeated_failure`.
- *finish*: records the end of the task (stop reason, final answer, diff) in telemetry.

The nodes are module-level functions in nodes.py; `build_graph` only wires them. What they need
besides the state (engine, workspace, telemetry, settings, the cancel event) comes as langgraph's
runtime context, a `GraphContext` that `Harness` passes to each `invoke`. The state (state.py) is
checkpointed after every node with langgraph's `SqliteSaver` when a `checkpoint_db` is given, so
`Harness.resume(thread_id, ...)` continues a task in a new process. langgraph is imported lazily,
when the graph is built, so importing the harness stays cheap.

What it does not do: render prompts (the engine applies the chat template), or talk to the editor
(lsp/ drives `Harness` and shows the proposals).
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.engine import Engine
from agent.harness.config import ApprovalPolicy, HarnessConfig
from agent.harness.context import EditorContext, render_context
from agent.harness.nodes import GraphContext, approve_node, finish_node, model_node, tools_node
from agent.harness.project import detect_test_command, project_rules
from agent.harness.prompts import first_messages
from agent.harness.recording import TaskLog
from agent.harness.sandbox import Sandbox
from agent.harness.state import AgentState
from agent.harness.tools import ToolContext
from agent.harness.workspace import Workspace

__all__ = ["ApprovalPolicy", "Harness", "HarnessConfig", "Outcome", "build_graph"]


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


def after_model(state: AgentState) -> str:
    if state.get("stop_reason"):
        return "finish"
    return "approve" if state.get("pending") else "model"


def after_approve(state: AgentState) -> str:
    return "finish" if state.get("stop_reason") else "tools"


def after_tools(state: AgentState) -> str:
    return "finish" if state.get("stop_reason") else "model"


def build_graph(checkpointer: Any = None):
    """Compile the graph (a fresh graph per task is cheap). Its nodes (nodes.py) get the engine,
    workspace and settings from the `GraphContext` given to each `invoke(..., context=...)`."""
    from langgraph.graph import END, START, StateGraph

    graph = StateGraph(AgentState, context_schema=GraphContext)
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
        self.graph = build_graph(self.checkpointer)
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
            **(
                self._replay_fields(verify_command)
                if sid and self.log.keeps_code
                else {"verify_command": verify_command}
            ),
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

    def _replay_fields(self, verify_command: str | None) -> dict[str, Any]:
        """What makes a logged task replayable for RL (training/rl/mining.py): the workspace
        at the start, and the command that tells whether it is solved (the caller's, else the
        configured or detected test command). Asked only when the log keeps code."""
        fields: dict[str, Any] = {
            "verify_command": verify_command or self.config.tools.test_command
        }
        if not fields["verify_command"]:
            found = detect_test_command(self.workspace)
            fields["verify_command"] = found.command if found else None
        snapshot = self.workspace.snapshot()
        if snapshot is not None:
            fields["workspace_files"] = snapshot
        return fields

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
        context = GraphContext(self.engine, self.ctx, self.config, self.log, cancel=self._cancel)
        if self._on_event is not None:
            context.emit = self._on_event
        self.graph.invoke(payload, self._thread(thread_id), context=context)
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
