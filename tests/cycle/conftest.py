"""Shared pieces of the loop tests: a registry with two tiny versions, and logged sessions.

`record_sessions` writes real telemetry through the Recorder, as the language server would: one
session per task, the task's workspace and verifying command, its steps (an oracle trajectory of
training/tasks/: the harness's own prompt, tool calls and results), its end, a passing test
outcome and a thumbs-up, so that the SFT export holds it as a good trajectory.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agent.registry import Registry


def unified_diff(before: dict[str, str], after: dict[str, str]) -> str:
    """A diff of the files that differ, as the harness writes a task's (a/ and b/ prefixes)."""
    import difflib

    return "".join(
        "".join(
            difflib.unified_diff(
                before[p].splitlines(keepends=True),
                after[p].splitlines(keepends=True),
                f"a/{p}",
                f"b/{p}",
            )
        )
        for p in sorted(after)
        if before.get(p) != after[p]
    )


def record_sessions(db: Path, count: int, seed: int = 3, diff: bool = False) -> list[str]:
    """`count` sessions, each with one good agent task; returns the session ids. With `diff`,
    each task's end records the change that solves it (so the task replays for RL)."""
    from telemetry import PrivacyPolicy, Recorder
    from training.tasks.generation import generate_tasks
    from training.tasks.oracle import oracle_trajectory

    tasks = [t for t in generate_tasks(1, seed=seed, heldout_fraction=0.0)][:count]
    assert len(tasks) == count
    rec = Recorder(str(db), PrivacyPolicy(consent="code"))
    sessions = []
    for task in tasks:
        sid = rec.record("session_start", editor="pytest", plugin_version="0", model_version="v1")
        sessions.append(sid)
        tid = rec.record(
            "task_start",
            session_id=sid,
            instruction=task.instruction,
            workspace_files=task.files,
            verify_command=task.test_command,
            model_version="v1",
        )
        messages = oracle_trajectory(task, random.Random(0))["messages"]
        for idx, m in enumerate(messages):
            fields = {"content": m.get("content") or ""}
            if m.get("tool_calls"):
                fields["tool_calls"] = [
                    {
                        "id": c["id"],
                        "name": c["function"]["name"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    }
                    for c in m["tool_calls"]
                ]
            if m["role"] == "tool":
                fields = {
                    "tool_call_id": m["tool_call_id"],
                    "tool_name": m.get("name"),
                    "result": m["content"],
                }
            rec.record("step", session_id=sid, task_id=tid, idx=idx, role=m["role"], **fields)
        rec.record(
            "task_end",
            session_id=sid,
            task_id=tid,
            status="done",
            stop_reason="answered",
            final_message=messages[-1]["content"],
            **({"diff": unified_diff(task.files, task.solution)} if diff else {}),
        )
        rec.record(
            "outcome",
            session_id=sid,
            task_id=tid,
            tests_before_passed=3,
            tests_before_failed=1,
            tests_after_passed=4,
            tests_after_failed=0,
        )
        rec.record("feedback", session_id=sid, task_id=tid, rating=1)
        rec.record("session_end", session_id=sid)
    assert rec.close(timeout=30)
    return sessions


@pytest.fixture
def registry(tmp_path) -> Registry:
    return Registry(tmp_path / "models")


def perturbed(folder: Path, out: Path, scale: float = 0.5) -> Path:
    """A copy of a checkpoint with Gaussian noise added to every trunk weight (fixed seed)."""
    import torch

    from agent.model import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(folder)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ckpt.trunk.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return save_checkpoint(out, ckpt.trunk, ckpt.tokenizer, ckpt.heads, {"version": "perturbed"})


@pytest.fixture(scope="session")
def perturbed_checkpoint(tmp_path_factory, tiny_checkpoint) -> Path:
    """tiny_checkpoint made deliberately worse: its weights perturbed (its samples differ too)."""
    return perturbed(tiny_checkpoint, tmp_path_factory.mktemp("perturbed"))
