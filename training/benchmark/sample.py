"""One sample: a harness run on a scratch copy of a task's workspace, then its verifier.

    sample     one run of the harness on a task (`samples` per task, each with its own seed);
               the verifier says passed or failed, with a reason (exit code, timeout)

Each sample runs `agent.harness.Harness` (the same tools, sandbox and limits as the editor and
RL rollouts); the verifier runs in the harness's `Sandbox` (bubblewrap where present) with its
own time limit. Scores per sample:

    correctness   verifier passed
    quality       lint delta: ruff findings in the changed Python files after minus before
    efficiency    tokens (prompt + output, summed over turns), model turns, wall time
    interaction   invalid tool calls (unparsable, unknown tool, arguments that do not fit),
                  final-message length in characters

With a seed, the same model gives the same sample scores locally and through any
OpenAI-compatible server that honours `seed` (`flywheel serve` does); wall time is the one
measure that varies.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from training.benchmark.sources import BenchmarkError, BenchTask, changed_lines


@dataclass
class BenchConfig:
    samples: int = 1  # harness runs per task (n of pass@k)
    ks: tuple[int, ...] = (1,)  # pass@k reported for each k <= samples
    seed: int = 0  # every sample's sampling seed derives from it, the task and the sample index
    temperature: float | None = None  # None: 0 (greedy) for one sample, 0.8 for several
    max_steps: int = 12  # model turns per sample
    max_wall_s: float = 180.0  # harness running time per sample
    turn_max_tokens: int = 1024  # output tokens per model turn
    verify_timeout_s: float = 60.0  # the verifier is killed after this; recorded as a fail
    lint: bool = True  # ruff before/after on the changed files
    resamples: int = 1000  # bootstrap resamples for the confidence intervals
    oracle_logprob: bool = False  # also score tasks that carry an oracle trajectory by its
    # mean log-probability per assistant token (local checkpoints only; see `oracle_logprob`)
    oracle_max_seq: int = 2048  # tokens of the oracle scored: its end (at most the context)
    constrain_tool_calls: bool = True  # the harness's default; False measures the model alone

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise BenchmarkError("samples must be >= 1")
        self.ks = tuple(sorted({int(k) for k in self.ks}))
        if not self.ks or self.ks[0] < 1 or self.ks[-1] > self.samples:
            raise BenchmarkError(f"each k of pass@k must be in 1..samples={self.samples}")
        if self.temperature is None:
            self.temperature = 0.0 if self.samples == 1 else 0.8
        if self.temperature < 0:
            raise BenchmarkError("temperature must be >= 0")
        if self.max_steps < 1 or self.max_wall_s <= 0 or self.verify_timeout_s <= 0:
            raise BenchmarkError("max_steps >= 1, max_wall_s > 0 and verify_timeout_s > 0")
        if self.turn_max_tokens < 1 or self.resamples < 10:
            raise BenchmarkError("turn_max_tokens must be >= 1 and resamples >= 10")


@dataclass
class SampleResult:
    task_id: str
    source: str
    sample: int  # index among the task's samples
    seed: int  # the sampling seed it ran with
    passed: bool
    verdict: str  # "passed", "failed: exit code N ...", "failed: verifier timed out after N s"
    stop_reason: str  # the harness's (answered, max_steps, wall_time, ...)
    detail: str  # the harness's one line on why it stopped (an engine error, a limit)
    steps: int  # model turns
    tokens: int  # prompt + output tokens, summed over turns
    wall_s: float  # harness + verifier time (the one measure that varies between runs)
    tool_calls: int  # tool calls written
    invalid_calls: int  # of which unparsable, unknown, or with arguments that do not fit
    final_chars: int  # length of the final message
    changed_lines: int  # lines the model changed
    lint_before: int | None  # ruff findings in the changed .py files before (None: no ruff)
    lint_after: int | None  # ... and after
    parsed_calls: int = 0  # tool calls that parsed (JSON with a name and object arguments)

    @property
    def lint_delta(self) -> int | None:
        if self.lint_before is None or self.lint_after is None:
            return None
        return self.lint_after - self.lint_before

    def scores(self) -> dict[str, Any]:
        """Everything but wall time: what must match between two runs with the same seed."""
        return {k: v for k, v in asdict(self).items() if k != "wall_s"}


def sample_seed(seed: int, task_id: str, sample: int) -> int:
    digest = hashlib.sha256(f"{seed}:{task_id}:{sample}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _ruff() -> str | None:
    try:
        from ruff.__main__ import find_ruff_bin

        return str(find_ruff_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("ruff")


def lint_count(files: dict[str, str]) -> dict[str, int] | None:
    """ruff findings (its default rules, no user config) per Python file; None without ruff."""
    from agent.harness.scratch import write_files

    ruff = _ruff()
    files = {p: t for p, t in files.items() if p.endswith(".py")}
    if ruff is None:
        return None
    if not files:
        return {}
    with tempfile.TemporaryDirectory(prefix="flywheel-lint-") as tmp:
        write_files(Path(tmp), files)
        proc = subprocess.run(
            [
                ruff,
                "check",
                "--isolated",
                "--no-cache",
                "--exit-zero",
                "--output-format",
                "json",
                ".",
            ],
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=60,
        )
        counts = dict.fromkeys(files, 0)
        for finding in json.loads(proc.stdout or "[]"):
            rel = Path(finding["filename"]).resolve().relative_to(Path(tmp).resolve()).as_posix()
            counts[rel] = counts.get(rel, 0) + 1
        return counts


def run_verifier(root: Path, task: BenchTask, timeout_s: float) -> tuple[bool, str]:
    """Write the verify files over the workspace and run the verify command in the sandbox."""
    from agent.harness import Sandbox, SandboxConfig
    from agent.harness.scratch import write_files

    write_files(root, task.verify_files)
    command = task.verify.strip()
    for name in ("python3 ", "python "):  # this interpreter, as training/tasks/task.py does
        if command.startswith(name):
            command = f"{sys.executable} {command[len(name) :]}"
    result = Sandbox(root, SandboxConfig(timeout_s=timeout_s)).run(command)
    if result.timed_out:
        return False, f"failed: verifier timed out after {timeout_s:g} s"
    if result.exit_code == 0:
        return True, "passed"
    tail = result.output.strip().splitlines()[-1:] or [""]
    return False, f"failed: exit code {result.exit_code}: {tail[0][:200]}"


def run_sample(
    engine,
    task: BenchTask,
    config: BenchConfig,
    sample: int,
    on_event: Callable[[dict], None] | None = None,
) -> SampleResult:
    """One harness run on a scratch copy of the task's workspace, then the verifier.
    `on_event` sees every harness event (turns, tool results, the stop) as it happens."""
    from agent.harness import HarnessConfig, ToolsConfig
    from agent.harness.scratch import read_files, run_unattended, scratch_copy
    from agent.harness.tools import TOOLS, check_arguments

    seed = sample_seed(config.seed, task.id, sample)
    counts = {"calls": 0, "parsed": 0, "valid": 0}

    def count(event: dict) -> None:
        if on_event is not None:
            on_event(event)
        if event.get("kind") == "assistant":
            calls, errors = event.get("calls") or [], event.get("errors") or []
            counts["calls"] += len(calls) + len(errors)
            counts["parsed"] += len(calls)
            counts["valid"] += sum(
                c["name"] in TOOLS and check_arguments(TOOLS[c["name"]], c["arguments"]) is None
                for c in calls
            )

    t0 = time.monotonic()
    with scratch_copy(task.files, prefix="flywheel-bench-") as root:
        tools = ToolsConfig(test_command=task.test_command, test_timeout_s=config.verify_timeout_s)
        harness_config = HarnessConfig(
            max_steps=config.max_steps,
            max_wall_s=config.max_wall_s,
            turn_max_tokens=config.turn_max_tokens,
            temperature=float(config.temperature or 0.0),
            seed=seed,
            editor="rollout",
            priority="background",  # an editor sharing the engine goes first
            constrain_tool_calls=config.constrain_tool_calls,
            tools=tools,
        )
        outcome = run_unattended(engine, root, task.instruction, harness_config, task.verify, count)
        after = read_files(root)
        changed = {p for p in set(after) | set(task.files) if after.get(p) != task.files.get(p)}
        lint_before = lint_after = None
        if config.lint:
            before_counts = lint_count({p: task.files[p] for p in changed if p in task.files})
            after_counts = lint_count({p: after[p] for p in changed if p in after})
            if before_counts is not None and after_counts is not None:
                lint_before, lint_after = sum(before_counts.values()), sum(after_counts.values())
        passed, verdict = run_verifier(root, task, config.verify_timeout_s)
        return SampleResult(
            task_id=task.id,
            source=task.source,
            sample=sample,
            seed=seed,
            passed=passed,
            verdict=verdict,
            stop_reason=outcome.stop_reason or "waiting",
            detail=(outcome.detail or "")[:300],
            steps=outcome.steps,
            tokens=outcome.tokens,
            wall_s=round(time.monotonic() - t0, 3),
            tool_calls=counts["calls"],
            invalid_calls=counts["calls"] - counts["valid"],
            final_chars=len(outcome.final or ""),
            changed_lines=changed_lines(task.files, after),
            lint_before=lint_before,
            lint_after=lint_after,
            parsed_calls=counts["parsed"],
        )
