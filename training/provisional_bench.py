"""The cycle's provisional benchmark: held-out synthetic tasks, scored per task for the gate.

A stand-in until `flywheel bench agent` (training/benchmark.py) is the cycle's benchmark; its
results say `"provisional": true`. The task set is deterministic: the tasks of `projects`
synthetic projects (training/tasks.py) made with a seed the starter's training never uses, all
held out. Two scores per task:

    oracle_logprob   mean log-probability per assistant token of the task's oracle trajectory
                     (the harness's own prompt, tools and results; one teacher-forced forward
                     pass over its last `max_seq` tokens): a continuous measure of how well the model predicts a correct
                     solution, sensitive to small changes of the weights
    pass             1 when the model, run through the real harness (greedy, `max_steps` turns
                     of at most `turn_max_tokens`), leaves the task's tests passing; only the
                     first `harness_tasks` tasks (0 = none: it takes seconds per task)

The result is the JSON shape training/gate.py reads (per-task `scores`, declared `metrics`, a
`summary` with bootstrap intervals, the `task_set` hash).

What it does not do: logged-session tasks, HumanEval, code quality or efficiency scores (the
real benchmark does those).
"""

from __future__ import annotations

import functools
import hashlib
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class BenchConfig:
    projects: int = 2  # synthetic projects whose tasks make the task set
    seed: int = 7919  # their seed: not one the starter model trained on (it uses 0)
    max_tasks: int = 8  # at most this many tasks, spread over task families
    harness_tasks: int = 0  # of those, how many also run through the harness for `pass`
    max_steps: int = 6  # harness turns per task
    turn_max_tokens: int = 256  # output tokens per harness turn
    max_seq: int = 2048  # tokens scored per trajectory: its end (at most the model's context)
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.projects < 1 or self.max_tasks < 1 or self.harness_tasks < 0:
            raise ValueError("projects and max_tasks must be >= 1, harness_tasks >= 0")


@functools.lru_cache(maxsize=4)
def _tasks(projects: int, seed: int, max_tasks: int) -> tuple:
    from training.tasks import generate_tasks

    tasks = generate_tasks(projects, seed=seed, heldout_fraction=1.0)
    by_family: dict[str, list] = {}
    for task in sorted(tasks, key=lambda t: t.id):
        by_family.setdefault(task.family, []).append(task)
    picked: list = []
    while len(picked) < min(max_tasks, len(tasks)):
        for family in sorted(by_family):
            if by_family[family] and len(picked) < max_tasks:
                picked.append(by_family[family].pop(0))
    return tuple(picked)


def benchmark_tasks(config: BenchConfig) -> list:
    """The task set: deterministic for a config, round-robin over families (made once per
    process: the tasks are verified by running their tests)."""
    return list(_tasks(config.projects, config.seed, config.max_tasks))


_ORACLES: dict[str, dict] = {}  # task id -> its oracle trajectory (made once per process)


def _oracle(task) -> dict:
    from training.tasks import oracle_trajectory

    if task.id not in _ORACLES:
        _ORACLES[task.id] = oracle_trajectory(task, random.Random(f"bench:{task.id}"))
    return _ORACLES[task.id]


def task_set_id(tasks: list, config: BenchConfig) -> str:
    key = [sorted(t.id for t in tasks), config.harness_tasks, config.max_steps,
           config.turn_max_tokens, config.max_seq]  # fmt: skip
    return "provisional-" + hashlib.sha256(repr(key).encode()).hexdigest()[:12]


def oracle_logprob(checkpoint, task, max_seq: int) -> float:
    """Mean log-probability per assistant token of the task's oracle trajectory."""
    import torch

    from training.stages import encode_conversation

    row = _oracle(task)
    ids, mask = encode_conversation(checkpoint.tokenizer, row, 1 << 30)
    # The end of the conversation (the edits, the tests, the answer), within the model's context.
    window = min(max_seq, int(checkpoint.trunk.config.max_position_embeddings))
    ids, mask = ids[-window:], mask[-window:]
    ids_t = torch.tensor([ids], device=checkpoint.trunk.device)  # [1, seq]
    with torch.no_grad():
        logits = checkpoint.trunk(input_ids=ids_t[:, :-1]).logits.float()  # [1, seq-1, vocab]
    logp = torch.log_softmax(logits, -1).gather(-1, ids_t[:, 1:, None])[0, :, 0]  # [seq-1]
    keep = torch.tensor(mask[1:], dtype=torch.bool, device=logp.device)  # [seq-1]
    return float(logp[keep].mean()) if keep.any() else float(logp.mean())


def harness_pass(engine, task, config: BenchConfig) -> float:
    """1.0 when the model, through the harness, leaves the task's tests passing."""
    from agent.harness import Harness, HarnessConfig, Workspace
    from training.tasks import TEST_TIMEOUT_S, _run, task_tools_config

    root = Path(tempfile.mkdtemp(prefix="flywheel-bench-"))
    try:
        for path, text in task.files.items():
            Path(root, path).parent.mkdir(parents=True, exist_ok=True)
            Path(root, path).write_text(text)
        harness = Harness(
            engine,
            Workspace(root),
            HarnessConfig(
                max_steps=config.max_steps,
                turn_max_tokens=config.turn_max_tokens,
                temperature=0.0,
                editor="rollout",
                map_tokens=256,
                tools=task_tools_config(task),
            ),  # fmt: skip
        )
        outcome = harness.start(task.instruction, verify_command=task.test_command)
        while outcome.approval:  # risky actions are refused, as a cautious user would
            outcome = harness.resume(outcome.thread_id, False)
        for path, text in task.files.items():  # the tests decide, not the model's edits to them
            if Path(path).name.startswith("test_"):
                Path(root, path).write_text(text)
        code, _ = _run(task.test_command, str(root), TEST_TIMEOUT_S)
        return 1.0 if code == 0 else 0.0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _summary(values: list[float], seed: int = 0) -> dict[str, Any]:
    data = np.array(values)  # [tasks]
    picks = np.random.default_rng(seed).integers(0, len(data), size=(2000, len(data)))
    low, high = np.percentile(data[picks].mean(axis=1), [2.5, 97.5])
    return {"mean": float(data.mean()), "ci95": [float(low), float(high)], "n": len(values)}


def run_benchmark(
    model: str | Path, config: BenchConfig | None = None, tasks: list | None = None
) -> dict[str, Any]:
    """Score the checkpoint folder `model` on the task set; returns the gate's JSON shape."""
    from agent.model import load_checkpoint

    config = config or BenchConfig()
    tasks = tasks if tasks is not None else benchmark_tasks(config)
    if not tasks:
        raise ValueError("the provisional benchmark has no tasks: raise BenchConfig.projects")
    t0 = time.monotonic()
    checkpoint = load_checkpoint(model, device=config.device)
    rows = [
        {"id": t.id, "family": t.family, "source": "synthetic",
         "scores": {"oracle_logprob": oracle_logprob(checkpoint, t, config.max_seq)}}
        for t in tasks
    ]  # fmt: skip
    metrics: dict[str, Any] = {"oracle_logprob": {"direction": "higher", "tolerance": 0.02}}
    if config.harness_tasks:
        from agent.engine import EngineConfig, open_engine

        engine = open_engine(EngineConfig(model=str(model), device=config.device))
        try:
            for row, task in zip(rows, tasks[: config.harness_tasks], strict=False):
                row["scores"]["pass"] = harness_pass(engine, task, config)
        finally:
            engine.close()
        metrics["pass"] = {"direction": "higher", "tolerance": 0.0}
    summary = {
        name: _summary([r["scores"][name] for r in rows if name in r["scores"]]) for name in metrics
    }
    return {
        "benchmark": "provisional",
        "provisional": True,
        "model": checkpoint.version,
        "task_set": task_set_id(tasks, config),
        "config": asdict(config),
        "metrics": metrics,
        "tasks": rows,
        "summary": summary,
        "seconds": round(time.monotonic() - t0, 2),
    }
