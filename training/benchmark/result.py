"""Scoring a benchmark run: per-task scores, per-source means with intervals, the result JSON.

    pass@k     per task from its n samples (agent/stats.py `pass_at_k`), averaged over tasks
    CI         95% percentile bootstrap over tasks (agent/stats.py `bootstrap`)
    shape      the task set as CursorBench reports it: median changed lines of the reference
               solutions, median prompt (instruction) length, median workspace files

The result's JSON declares what the promotion gate (agent/gate.py) compares: pass@1, and
`oracle_logprob` when it was scored. `compare` is a paired comparison of two results for a
reader; the gate makes its own decision from the JSON.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.stats import Interval, bootstrap, pass_at_k
from training.benchmark.sample import BenchConfig, SampleResult
from training.benchmark.sources import SOURCES, BenchmarkError, BenchTask

FORMAT = "flywheel-benchmark/1"
ORACLE_TOLERANCE = 0.02  # nats per token of oracle_logprob the gate lets a candidate lose

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
    reused: int = 0  # samples taken from an earlier run (--resume); `seconds` excludes them
    engine: dict[str, Any] = field(default_factory=dict)  # backend, dtype, drafts (when known)

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
        """The JSON the registry stores and agent/gate.py reads: `metrics` declares what to
        gate on (pass@1 and oracle_logprob, higher is better), `tasks[].scores` are the per-task
        scores, `summary` the overall means with `ci95`; `groups` holds the same per source."""

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
            "reused_samples": self.reused,
            "engine": self.engine,
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
            reused=data.get("reused_samples", 0),
            engine=data.get("engine", {}),
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


def compare(
    candidate: BenchmarkResult | dict[str, float],
    baseline: BenchmarkResult | dict[str, float],
    metric: str = "pass@1",
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Paired comparison on the tasks both were scored on: mean of candidate - baseline per
    task, with a 95% bootstrap interval. For reading two runs side by side; the promotion gate
    (agent/gate.py) decides from the results' JSON with its own signs and tolerances."""
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


def iter_groups(result: BenchmarkResult) -> Iterable[str]:
    """The report's groups in order: overall, then each source present."""
    return [g for g in ("overall", *SOURCES) if g in result.summary]
