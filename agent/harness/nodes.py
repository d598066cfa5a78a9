"""The graph's nodes: `model_node`, `approve_node`, `tools_node`, `finish_node`.

Each node is a module-level function `(state, runtime) -> updates`: it reads the checkpointed
state (state.py) and gets the live objects it needs (engine, workspace, telemetry, settings, the
caller's cancel event) from `runtime.context`, a `GraphContext`. That context is passed to every
`graph.invoke(..., context=...)` and never checkpointed. A node can therefore run on its own:

    model_node(state, Runtime(context=GraphContext(engine, tools, HarnessConfig(), TaskLog(None))))

Vocabulary: a *stop* is the update that ends the task (`stop_reason`, `stop_detail`); a *failure*
is a tool call that came back as an error, counted by its `call_fingerprint` together with the
state of the files the agent has changed (`Workspace.changes_digest`).

What the nodes do is described in graph.py, which wires them together.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.chat_format import CALL_SHAPE, TOOL_CALL, parse_assistant
from agent.engine import (
    Cancelled,
    Completion,
    Engine,
    EngineError,
    Request,
    Result,
    SamplingParams,
)
from agent.harness.config import HarnessConfig
from agent.harness.prompts import COMPACT_PROMPT, COMPACTED_PREFIX, tool_schemas
from agent.harness.recording import TaskLog
from agent.harness.state import AgentState
from agent.harness.tools import MAX_ARGUMENT_CHARS, TOOLS, ToolContext, check_arguments, run_tool
from agent.harness.workspace import Workspace, WorkspaceError

if TYPE_CHECKING:  # langgraph is imported lazily; nodes only read `runtime.context`
    from langgraph.runtime import Runtime

CANCEL_POLL_S = 0.05  # how often a running model turn looks at the caller's cancel event


def _ignore(event: dict[str, Any]) -> None:
    """The default `GraphContext.emit`: progress events go nowhere."""


@dataclass
class GraphContext:
    """The nodes' dependencies: live objects that are not state and are never checkpointed."""

    engine: Engine  # the model
    tools: ToolContext  # the workspace, its sandbox and the tools' settings
    config: HarnessConfig  # limits and approval policy
    log: TaskLog  # telemetry of the task (does nothing without a recorder)
    emit: Callable[[dict[str, Any]], None] = _ignore  # live progress events ({"kind": ...})
    cancel: threading.Event | None = None  # the caller sets it to stop the task (`cancelled`)
    schemas: list[dict[str, Any]] = field(default_factory=tool_schemas)  # `Request.tools`

    @property
    def workspace(self) -> Workspace:
        return self.tools.workspace

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()


def call_fingerprint(name: str, arguments: Any) -> str:
    """A short stable hash of one tool call (tool name and arguments, key order ignored).

    The same failing call made `HarnessConfig.repeat_limit` times with no edit in between stops
    the task; RL rollouts (training/rl/environments.py) use it to count repeated calls.
    """
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


def _stop(reason: str, detail: str = "") -> dict[str, Any]:
    return {"stop_reason": reason, "stop_detail": detail, "pending": []}


def _prompt_tokens(deps: GraphContext, state: AgentState, messages: list[dict[str, Any]]) -> int:
    """Estimated prompt tokens of `messages`, scaled by the last turn's tokens per character."""
    chars = _chars(messages) + _chars(deps.schemas)
    if state.get("last_prompt_tokens") and state.get("last_prompt_chars"):
        return int(chars * state["last_prompt_tokens"] / state["last_prompt_chars"]) + 1
    return chars // 3 + 1


def _call_engine(
    deps: GraphContext,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    max_tokens: int,
    deadline_s: float,
) -> tuple[Result, bool]:
    """One engine call and whether it was cut short; its request is cancelled at the deadline
    or by the caller."""
    cancel, done = threading.Event(), threading.Event()
    outer = deps.cancel
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
                max_tokens=max_tokens, temperature=deps.config.temperature, seed=deps.config.seed
            ),
            cancel=cancel,
            request_id=uuid.uuid4().hex,
            priority=deps.config.priority,
            constrain_tool_calls=deps.config.constrain_tool_calls,
        )
        return deps.engine.generate(req), cancel.is_set()
    finally:
        done.set()


def _compact(
    deps: GraphContext, state: AgentState, room: int
) -> tuple[list[dict[str, Any]] | None, dict, str]:
    """Ask the model to summarise; returns (new messages or None, updates, error)."""
    config = deps.config
    messages = state["messages"]
    ask = [*messages, {"role": "user", "content": COMPACT_PROMPT}]
    upd: dict[str, Any] = {}
    try:
        result, _ = _call_engine(
            deps,
            ask,
            None,
            config.summary_max_tokens,
            config.max_wall_s - state.get("elapsed_s", 0),
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
    upd.update(deps.log.step(state, "assistant", content=f"[compaction summary]\n{summary}"))
    deps.emit({"kind": "compact", "summary": summary, "before": len(messages), "after": len(new)})
    if _prompt_tokens(deps, state, new) > room:
        return None, upd, "the task and its context alone do not fit the model's context"
    return new, upd, ""


def _limit_stop(deps: GraphContext, state: AgentState) -> dict[str, Any] | None:
    """The stop for a limit reached before the next turn (workspace gone, steps, tokens, time,
    cancel), or None."""
    config = deps.config
    elapsed = state.get("elapsed_s", 0.0)
    steps = state.get("steps", 0)
    tokens = state.get("tokens", 0)
    try:
        deps.workspace.check_alive()
    except WorkspaceError as exc:
        return _stop("workspace_error", str(exc))
    if steps >= config.max_steps:
        return _stop("max_steps", f"used all {config.max_steps} model turns")
    if tokens >= config.max_tokens:
        return _stop("max_tokens", f"used {tokens} of {config.max_tokens} tokens")
    if elapsed >= config.max_wall_s:
        return _stop("wall_time", f"ran {elapsed:.0f} s of {config.max_wall_s:.0f} s")
    if deps.cancelled():
        return _stop("cancelled", "the user cancelled the task")
    return None


def model_node(state: AgentState, runtime: Runtime[GraphContext]) -> dict[str, Any]:
    """Check the limits, compact the history if needed, then ask the engine for one turn."""
    deps = runtime.context
    config, engine = deps.config, deps.engine
    t0 = time.monotonic()
    elapsed = state.get("elapsed_s", 0.0)
    steps = state.get("steps", 0)
    limit = _limit_stop(deps, state)
    if limit is not None:
        return limit
    upd: dict[str, Any] = {}
    messages = state["messages"]
    turn_max = min(config.turn_max_tokens, max(engine.context_length // 4, 1))
    room = engine.context_length - turn_max
    if _prompt_tokens(deps, state, messages) > config.compact_at * room:
        new, upd, error = _compact(deps, state, room)
        state = {**state, **upd}
        if new is None:
            return {**upd, **_stop("context_overflow", error)}
        messages = new
        upd["messages"] = new
        upd["last_prompt_tokens"] = 0
    remaining = config.max_wall_s - elapsed - (time.monotonic() - t0)
    try:
        result, timed_out = _call_engine(deps, messages, deps.schemas, turn_max, remaining)
    except Exception as exc:  # a backend bug too must end the task with a reason
        return {**upd, **_engine_failure(deps, exc)}
    duration = time.monotonic() - t0
    if not result.completions:
        return {**upd, **_stop("engine_error", "the engine returned no completion")}
    comp = result.completions[0]
    m = result.metrics
    upd.update(
        steps=steps + 1,
        tokens=state.get("tokens", 0) + m.prompt_tokens + m.output_tokens,
        elapsed_s=elapsed + duration,
        last_prompt_tokens=m.prompt_tokens,
        last_prompt_chars=_chars(messages) + _chars(deps.schemas),
    )
    content, pending, errors = _read_turn(comp, deps.schemas)
    messages = [*messages, _assistant_message(content, pending)]
    turn = {"content": content, "calls": pending, "errors": errors, "duration_s": duration}
    upd.update(_record_turn(deps, {**state, **upd}, result, turn))
    if comp.finish_reason == "cancelled" or timed_out:
        return {**upd, "messages": messages, **_cut_short(deps)}
    if comp.finish_reason == "error":
        return {
            **upd,
            "messages": messages,
            **_stop("engine_error", "the engine reported an error for this turn"),
        }
    stop = _answer_invalid_calls(deps, state, upd, messages, errors)
    if stop is not None:
        return {**upd, **stop}
    upd["pending"] = pending
    if not pending and not errors:
        upd.update(final=content, **_stop("answered"))
    return upd


def _record_turn(
    deps: GraphContext, state: AgentState, result: Result, turn: dict[str, Any]
) -> dict[str, Any]:
    """Log the model's turn in telemetry (with its sampled tokens, for RL) and as a progress
    event; returns the log's state updates. `turn`: content, calls, errors, duration_s."""
    comp, m = result.completions[0], result.metrics
    calls = turn["calls"]
    upd = deps.log.step(
        state,
        "assistant",
        content=turn["content"],
        tool_calls=[{**c, "arguments": _shown_arguments(c["arguments"])} for c in calls] or None,
        token_ids=list(comp.token_ids),
        logprobs=list(comp.logprobs) if comp.logprobs is not None else None,
        policy_version=comp.model_version or deps.engine.model_version,
        duration_ms=turn["duration_s"] * 1000,
        prompt_tokens=m.prompt_tokens,
        output_tokens=m.output_tokens,
    )
    deps.emit({"kind": "assistant", "step": state.get("steps", 0), **turn})
    return upd


def _cut_short(deps: GraphContext) -> dict[str, Any]:
    """The stop for a model turn cut short: by the user, or at the running-time limit."""
    if deps.cancelled():
        return _stop("cancelled", "the user cancelled the task")
    return _stop("wall_time", "the model turn passed the running-time limit")


def _engine_failure(deps: GraphContext, exc: Exception) -> dict[str, Any]:
    """The stop for an engine call that raised."""
    if isinstance(exc, Cancelled):
        return _cut_short(deps)
    if isinstance(exc, EngineError):
        return _stop("engine_error", f"the engine failed: {exc}")
    return _stop("engine_error", f"the engine failed: {type(exc).__name__}: {exc}")


def _read_turn(
    comp: Completion, schemas: list[dict[str, Any]]
) -> tuple[str, list[dict[str, Any]], list[str]]:
    """A completion as (content shown to the user, pending tool calls with unique ids, errors of
    calls that could not be used). Calls the engine did not parse are parsed from the text."""
    text = comp.text or ""
    calls, errors = list(comp.tool_calls), list(comp.tool_call_errors)
    content = text
    if TOOL_CALL in text:
        content, parsed, parse_errors = parse_assistant(text, schemas)
        if not calls and not errors:
            calls, errors = parsed, parse_errors
    seen: set[str] = set()
    pending = []
    for call in calls:
        cid = call.id if call.id and call.id not in seen else f"call_{uuid.uuid4().hex[:12]}"
        seen.add(cid)
        pending.append({"id": cid, "name": call.name, "arguments": call.arguments})
    return Workspace.display(content), pending, errors


def _assistant_message(content: str, pending: list[dict[str, Any]]) -> dict[str, Any]:
    """The turn as the history keeps it (OpenAI's shape; huge arguments replaced by a note)."""
    assistant: dict[str, Any] = {"role": "assistant", "content": content}
    if pending:
        assistant["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {
                    "name": c["name"],
                    "arguments": json.dumps(_shown_arguments(c["arguments"]), ensure_ascii=False),
                },
            }
            for c in pending
        ]
    return assistant


def _answer_invalid_calls(
    deps: GraphContext,
    state: AgentState,
    upd: dict[str, Any],
    messages: list[dict[str, Any]],
    errors: list[str],
) -> dict[str, Any] | None:
    """A note to the model for each call that could not be used, counted as a failure; adds
    the messages and counts to `upd`. Returns the stop when one malformed call repeats
    `repeat_limit` times, else None."""
    failures = dict(state.get("failures", {}))
    tool_errors = state.get("tool_errors", 0)
    for error in errors:
        note = f"Your tool call could not be used: {Workspace.display(error)}\n{CALL_SHAPE}"
        messages.append({"role": "user", "content": note})
        upd.update(deps.log.step({**state, **upd}, "tool", error=error, is_error=1, invalid=1))
        deps.emit({"kind": "tool", "name": "(invalid call)", "is_error": True, "result": error})
        tool_errors += 1
        fp = call_fingerprint("(invalid)", error[:200])
        failures[fp] = failures.get(fp, 0) + 1
        if failures[fp] >= deps.config.repeat_limit:
            upd.update(messages=messages, failures=failures, tool_errors=tool_errors)
            return _stop(
                "repeated_failure",
                f"the same malformed tool call {failures[fp]} times: {error[:200]}",
            )
    upd.update(messages=messages, failures=failures, tool_errors=tool_errors)
    return None


def approve_node(state: AgentState, runtime: Runtime[GraphContext]) -> dict[str, Any]:
    """Pause with langgraph's `interrupt` when a pending call needs the user's approval."""
    from langgraph.types import interrupt

    deps = runtime.context
    risky = []
    for call in state.get("pending", []):
        reason = deps.config.approval.reason(
            call["name"],
            call["arguments"] if isinstance(call["arguments"], dict) else {},
            deps.tools.sandbox.confined,
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
        return _stop("denied", "the user denied an action and stopped the task")
    if isinstance(decision, dict):
        approvals = {c["id"]: bool(decision.get(c["id"], False)) for c in risky}
    elif isinstance(decision, list | tuple):
        approvals = {c["id"]: bool(d) for c, d in zip(risky, decision, strict=False)}
    else:
        approvals = {c["id"]: bool(decision) for c in risky}
    deps.emit({"kind": "approval", "approvals": approvals})
    return {"approvals": approvals}


def tools_node(state: AgentState, runtime: Runtime[GraphContext]) -> dict[str, Any]:
    """Run each pending call (denied ones become error results) and append the results."""
    deps = runtime.context
    ws = deps.workspace
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
        if deps.cancelled():
            reason = ("cancelled", "the user cancelled the task")
            break
        invalid = name not in TOOLS or check_arguments(TOOLS[name], args) is not None
        result, is_error, reason = _execute(deps, call, approvals.get(cid) is not False)
        if is_error:
            tool_errors += 1
            result, repeated = _count_failure(deps, failures, call, result)
            reason = reason or repeated
        messages.append({"role": "tool", "tool_call_id": cid, "name": name, "content": result})
        upd.update(
            deps.log.step(
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
        deps.emit(
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
        upd.update(_stop(*reason))
    return upd


def _execute(
    deps: GraphContext, call: dict[str, Any], approved: bool
) -> tuple[str, bool, tuple[str, str] | None]:
    """One call's (result, is_error) and the stop it causes (a vanished workspace), if any."""
    if not approved:
        return "the user did not approve this action; do something else or answer", True, None
    try:
        deps.workspace.check_alive()
        result, is_error = run_tool(deps.tools, call["name"], call["arguments"])
    except WorkspaceError as exc:
        return str(exc), True, ("workspace_error", str(exc))
    return result, is_error, None


def _count_failure(
    deps: GraphContext, failures: dict[str, int], call: dict[str, Any], result: str
) -> tuple[str, tuple[str, str] | None]:
    """Count a failed call in `failures`: the same call failing on the same edits is a loop,
    after an edit it is a new try. Returns the result (with a warning the time before the
    limit) and the stop once the call has failed `repeat_limit` times."""
    name, repeat_limit = call["name"], deps.config.repeat_limit
    fp = f"{call_fingerprint(name, call['arguments'])}@{deps.workspace.changes_digest()}"
    failures[fp] = failures.get(fp, 0) + 1
    if failures[fp] == repeat_limit - 1:
        result += "\n[this exact call has failed before; change the arguments or the approach]"
    if failures[fp] < repeat_limit:
        return result, None
    return result, (
        "repeated_failure",
        f"{name} failed {failures[fp]} times with the same arguments and no edit in between",
    )


def finish_node(state: AgentState, runtime: Runtime[GraphContext]) -> dict[str, Any]:
    """Record the end of the task (stop reason, final answer, diff) in telemetry."""
    deps = runtime.context
    ws = deps.workspace
    reason = state.get("stop_reason") or "engine_error"
    detail = state.get("stop_detail", "")
    final = state.get("final", "")
    changes = ws.changes() if ws.root.is_dir() else {}
    diff = ws.diff() if ws.root.is_dir() else ""
    deps.log.end_task(
        state, stop_reason=reason, detail=detail, final=final, changes=changes, diff=diff
    )
    deps.emit({"kind": "stop", "reason": reason, "detail": detail})
    return {"stop_reason": reason}
