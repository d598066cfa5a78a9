"""Each node of the agent graph run on its own, without compiling the graph: a node is
a module-level function that gets its dependencies from langgraph's runtime context."""

from __future__ import annotations

import threading

from langgraph.runtime import Runtime

from agent.harness import HarnessConfig, Sandbox, ToolContext, Workspace
from agent.harness.nodes import (
    GraphContext,
    approve_node,
    call_fingerprint,
    finish_node,
    model_node,
    tools_node,
)
from agent.harness.prompts import first_messages
from agent.harness.recording import TaskLog
from tests.harness.replay import ReplayEngine, call


def runtime(root, turns=(), events=None, **config) -> Runtime[GraphContext]:
    ws = Workspace(root)
    harness_config = HarnessConfig(**config)
    tools = ToolContext(ws, Sandbox(ws.root, harness_config.sandbox), harness_config.tools)
    context = GraphContext(ReplayEngine(list(turns)), tools, harness_config, TaskLog(None))
    if events is not None:
        context.emit = events.append
    return Runtime(context=context)


def state(**values):
    return {"messages": first_messages("make test_add pass"), **values}


def test_model_node_turns_a_tool_call_into_a_pending_call(workspace):
    rt = runtime(workspace, [call("read_file", path="calc.py")])
    upd = model_node(state(), rt)
    [pending] = upd["pending"]
    assert pending["name"] == "read_file" and pending["arguments"] == {"path": "calc.py"}
    assert upd["steps"] == 1 and "stop_reason" not in upd
    assert upd["messages"][-1]["tool_calls"][0]["id"] == pending["id"]
    [request] = rt.context.engine.requests
    assert request.tools == rt.context.schemas


def test_model_node_stops_at_the_step_limit_without_asking_the_engine(workspace):
    rt = runtime(workspace, max_steps=2)
    upd = model_node(state(steps=2), rt)
    assert upd["stop_reason"] == "max_steps" and rt.context.engine.requests == []


def test_model_node_stops_when_cancelled(workspace):
    rt = runtime(workspace)
    rt.context.cancel = threading.Event()
    rt.context.cancel.set()
    assert model_node(state(), rt)["stop_reason"] == "cancelled"


def test_approve_node_passes_safe_calls_without_interrupting(workspace):
    pending = [{"id": "c1", "name": "read_file", "arguments": {"path": "calc.py"}}]
    assert approve_node(state(pending=pending), runtime(workspace)) == {"approvals": {}}


def test_tools_node_runs_calls_and_counts_failures(workspace):
    events: list[dict] = []
    pending = [
        {"id": "c1", "name": "read_file", "arguments": {"path": "calc.py"}},
        {"id": "c2", "name": "read_file", "arguments": {"path": "missing.py"}},
    ]
    upd = tools_node(state(pending=pending), runtime(workspace, events=events))
    ok, failed = upd["messages"][-2:]
    assert ok["tool_call_id"] == "c1" and "return a - b" in ok["content"]
    assert failed["tool_call_id"] == "c2" and upd["tool_errors"] == 1
    digest = Workspace(workspace).changes_digest()  # nothing edited yet
    assert upd["failures"] == {
        f"{call_fingerprint('read_file', {'path': 'missing.py'})}@{digest}": 1
    }
    assert upd["pending"] == [] and "stop_reason" not in upd
    assert [e["is_error"] for e in events] == [False, True]


def test_finish_node_reports_the_stop(workspace):
    events: list[dict] = []
    upd = finish_node(state(stop_reason="answered"), runtime(workspace, events=events))
    assert upd == {"stop_reason": "answered"}
    assert events == [{"kind": "stop", "reason": "answered", "detail": ""}]


def test_call_fingerprint_ignores_argument_order():
    assert call_fingerprint("edit_file", {"a": 1, "b": 2}) == call_fingerprint(
        "edit_file", {"b": 2, "a": 1}
    )
    assert call_fingerprint("edit_file", {"a": 1}) != call_fingerprint("write_file", {"a": 1})
