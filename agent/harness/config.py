"""The harness's settings: the limits of one task and which tool calls need the user's approval.

`HarnessConfig` is given to `Harness`; the graph's nodes read it from their runtime context
(nodes.py `GraphContext`). Tools and sandbox settings live beside their code (tools.py,
sandbox.py) and are nested here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from agent.engine.request import LANES
from agent.harness.sandbox import SandboxConfig
from agent.harness.tools import ToolsConfig


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
    priority: str = "normal"  # the engine's lane for every turn (agent/engine/scheduler.py)
    constrain_tool_calls: bool = True  # decode calls under their grammar (engine/tool_grammar.py)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    approval: ApprovalPolicy = field(default_factory=ApprovalPolicy)

    def __post_init__(self) -> None:
        if self.max_steps < 1 or self.max_tokens < 1 or self.turn_max_tokens < 1:
            raise ValueError("max_steps, max_tokens and turn_max_tokens must be >= 1")
        if not self.max_wall_s > 0:
            raise ValueError("max_wall_s must be > 0")
        if self.priority not in LANES:
            raise ValueError(f"priority must be one of {', '.join(LANES)}")
        if self.repeat_limit < 1:
            raise ValueError("repeat_limit must be >= 1")
        if not 0 < self.compact_at <= 1:
            raise ValueError("compact_at must be in (0, 1]")
