"""The agent harness: one langgraph loop for the editor, the command line and RL rollouts.

    from agent.engine import EngineConfig, open_engine
    from agent.harness import Harness, HarnessConfig, Workspace

    harness = Harness(open_engine(EngineConfig(model="default")), Workspace("path/to/project"),
                      HarnessConfig(max_steps=20), recorder=None, checkpoint_db="agent.db")
    outcome = harness.start("Fix the failing test in tests/test_math.py")
    while outcome.approval:                       # a risky action is waiting for the user
        outcome = harness.resume(outcome.thread_id, True)
    print(outcome.stop_reason, outcome.final, outcome.diff)

Files, one concept each:
- `graph.py`     the wiring (model -> approve -> tools -> model ... -> finish) and `Harness`:
                 start, resume, checkpoints; `Outcome`
- `nodes.py`     the nodes, each a function of (state, runtime) with its dependencies in
                 `GraphContext`; failures counted by `call_fingerprint`
- `config.py`    `HarnessConfig` (a task's limits) and `ApprovalPolicy`
- `state.py`     the checkpointed graph state and the stop reasons
- `prompts.py`   system prompt, tool schemas for `Request.tools`, the compaction request
- `tools.py`     list/read/search/outline/find_symbol/edit/write/delete/run_command/run_tests
- `workspace.py` confined paths; filesystem or editor-buffer overlay (edits become proposals)
- `sandbox.py`   commands under bubblewrap with time, process and output limits
- `symbols.py`   tree-sitter definitions (Python, JS, TS, Go, Rust)
- `repo_map.py`  the files and symbols most relevant to a task, within a token budget
- `context.py`   what the editor adds: current file and cursor, diagnostics, recent edits
- `project.py`   a real project's test command and its rules files (AGENTS.md and the like)
- `recording.py` every task and step to telemetry (optional)
- `scratch.py`   a task on a throwaway copy of its files, approvals refused (benchmark, RL)

`flywheel run` (agent/run.py) is the headless front end.
"""

from agent.harness.graph import ApprovalPolicy, Harness, HarnessConfig, Outcome, build_graph
from agent.harness.sandbox import CommandResult, Sandbox, SandboxConfig
from agent.harness.tools import TOOLS, ToolContext, ToolsConfig, edit_text, run_tool
from agent.harness.workspace import Workspace, WorkspaceError

__all__ = [
    "TOOLS",
    "ApprovalPolicy",
    "CommandResult",
    "Harness",
    "HarnessConfig",
    "Outcome",
    "Sandbox",
    "SandboxConfig",
    "ToolContext",
    "ToolsConfig",
    "Workspace",
    "WorkspaceError",
    "build_graph",
    "edit_text",
    "run_tool",
]
