"""The promotion gate: a candidate must not be worse than the promoted version beyond noise.

Both versions are scored on the same tasks (a benchmark result's `task_set`). For each gated
metric the gate takes the per-task differences d_i = candidate_i - current_i (signed so that
positive is better) and a paired bootstrap of their mean (2,000 resamples of the tasks, fixed
seed): the candidate is *worse beyond noise* on that metric when the whole 95% interval lies
below `-tolerance`. It is accepted when it is worse on no gated metric. A worked example: six
tasks with d = [0, 0, 0, 0, 0, -1] (one task lost) give a mean of -0.17 and an interval of about
[-0.5, 0]: not beyond noise, accepted; d = [-1.2, -0.9, -1.1, -1.0, -1.3, -0.8] gives [-1.18,
-0.92]: rejected.

A candidate scored on several task sets (the agent benchmark, and a repository's held-out files
from training/repo_eval.py, where the tasks are held-out files scored by `nll` and `exact`) is
judged on each set both versions share, and accepted only when no set shows it worse.

A lane (agent/registry.py) is judged against the version that serves it now: a completion
candidate against the completion lane's version (else the promoted one). `GateConfig.gain` names
metrics of which the candidate must also be *better beyond noise* on at least one (the whole
interval above 0; by default `LANE_GAIN`'s for the lane): a completion version, trained on the
user's repository and its suggestions, replaces its parent only for a gain beyond noise on the
repository's held-out files (in perplexity, or in the simulated user's tab reward), not for
being no worse.

When a result has no per-task scores for a metric but reports a mean with an interval
(`summary[metric] = {"mean", "ci95": [lo, hi]}`), the gate falls back to comparing intervals:
worse when the candidate's upper end lies below the current version's lower end.

Benchmark results it reads (JSON objects; what `flywheel bench agent` writes, also for
`flywheel cycle`):

    {"benchmark": "...", "task_set": "<hash of the task ids>", "provisional": false,
     "metrics": {"pass": {"direction": "higher", "tolerance": 0.0}, ...},   # what to gate on
     "tasks": [{"id": "...", "scores": {"pass": 1.0, ...}}, ...],            # per-task scores
     "summary": {"pass": {"mean": 0.4, "ci95": [0.2, 0.6]}, ...}}

Rows may instead sit in `results` (or per source under `sources.<name>.results`) as flat objects
with `task_id`/`id` and numeric or boolean fields; without a `metrics` declaration the gate uses
the correctness fields it knows (passed, pass, correct, resolved, score, reward), never timings.

The bootstrap is agent/stats.py's, the one the benchmark's intervals use.

Before any score, a candidate made for another base is rejected, with both names
(`agent.model.base_of`: the trunk's shape and vocabulary, or an adapter's missing base): its
scores could not make it a replacement, and clients loading it would fail or answer nonsense.

What it does not do: run benchmarks (training/cycle.py, training/benchmark/) or promote
(agent/registry.py records the decision; the caller promotes when it is accepted).

    flywheel models promote v3          # runs this gate; --force skips it
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from agent.stats import bootstrap_interval

DEFAULT_METRICS = ("passed", "pass", "correct", "resolved", "score", "reward")
# lane -> metrics a candidate must gain on (one of them) unless GateConfig.gain says otherwise: a
# completion version learns the user's repository (nll) or which suggestions they take (reward,
# training/repo_eval.py), and replaces its parent only when it learnt one of them
LANE_GAIN = {"completion": ("nll", "reward")}
LOWER_IS_BETTER = ("tokens", "steps", "wall_s", "seconds", "invalid_calls", "lint_delta")


@dataclass
class GateConfig:
    confidence: float = 0.95  # two-sided interval of the paired bootstrap
    resamples: int = 2000  # bootstrap resamples of the tasks
    seed: int = 0  # the bootstrap's random seed: the same inputs give the same decision
    metrics: tuple[str, ...] = ()  # metrics to gate on; () = what the benchmark declares
    tolerance: dict[str, float] = field(default_factory=dict)  # metric -> allowed loss (>= 0)
    min_tasks: int = 1  # fewer common tasks than this: no decision (refused)
    gain: tuple[str, ...] = ()  # the candidate must be better beyond noise on one of these

    def __post_init__(self) -> None:
        if not 0.5 < self.confidence < 1:
            raise ValueError("confidence must be in (0.5, 1)")
        if self.resamples < 100 or self.min_tasks < 1:
            raise ValueError("resamples must be >= 100 and min_tasks >= 1")


@dataclass
class Comparison:
    metric: str
    tasks: int  # tasks both results scored
    candidate: float  # mean over those tasks
    current: float
    difference: float  # candidate - current, signed so that > 0 is better
    interval: tuple[float, float]  # bootstrap interval of the signed difference
    tolerance: float
    worse: bool  # the whole interval lies below -tolerance
    method: str  # "paired bootstrap" | "interval overlap"

    @property
    def better(self) -> bool:
        """The whole interval lies above 0: better beyond noise."""
        return self.interval[0] > 0


@dataclass
class Decision:
    accepted: bool
    reasons: list[str]
    candidate: str
    current: str | None
    comparisons: list[Comparison] = field(default_factory=list)
    at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class GateError(ValueError):
    """The gate cannot decide (no benchmark, different task sets); the message says what to run."""


# --- reading benchmark results ---------------------------------------------------------------


def _rows(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    rows: list[tuple[str, dict[str, Any]]] = []
    for key in ("tasks", "results"):
        for row in result.get(key) or []:
            if isinstance(row, dict):
                rows.append(("", row))
    for source, part in (result.get("sources") or {}).items():
        if isinstance(part, dict):
            for row in part.get("results") or part.get("tasks") or []:
                if isinstance(row, dict):
                    rows.append((f"{source}:", row))
    return rows


def directions(result: dict[str, Any]) -> dict[str, tuple[int, float]]:
    """metric -> (+1 higher is better | -1 lower is better, tolerance) that the result declares."""
    out = {}
    declared = result.get("metrics")
    if isinstance(declared, dict):
        for name, spec in declared.items():
            spec = spec if isinstance(spec, dict) else {"direction": spec}
            sign = -1 if spec.get("direction") == "lower" else 1
            out[name] = (sign, float(spec.get("tolerance", 0.0) or 0.0))
    return out


def task_scores(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """task id -> metric -> value, from either row shape (see the module docstring)."""
    out: dict[str, dict[str, float]] = {}
    for prefix, row in _rows(result):
        tid = row.get("id", row.get("task_id"))
        if tid is None:
            continue
        values = row.get("scores") if isinstance(row.get("scores"), dict) else row
        scores = {}
        for name, value in values.items():
            if (
                isinstance(value, bool)
                or isinstance(value, int | float)
                and name not in ("id", "task_id", "index")
            ):
                scores[name] = float(value)
        out[f"{prefix}{tid}"] = scores
    return out


def gated_metrics(
    candidate: dict[str, Any], current: dict[str, Any], config: GateConfig
) -> dict[str, tuple[int, float]]:
    declared = {**directions(current), **directions(candidate)}
    if config.metrics:
        names = config.metrics
    elif declared:
        names = tuple(declared)
    else:
        seen = {m for scores in task_scores(candidate).values() for m in scores}
        seen |= set((candidate.get("summary") or {}).keys())
        names = tuple(m for m in DEFAULT_METRICS if m in seen)
    out = {}
    for name in names:
        sign, tolerance = declared.get(name, (-1 if name in LOWER_IS_BETTER else 1, 0.0))
        out[name] = (sign, config.tolerance.get(name, tolerance))
    return out


# --- comparing -------------------------------------------------------------------------------


def compare(
    candidate: dict[str, Any],
    current: dict[str, Any],
    config: GateConfig | None = None,
    names: tuple[str, str | None] = ("candidate", "current"),
) -> Decision:
    """The gate's decision for two results on the same task set (see the module docstring)."""
    config = config or GateConfig()
    cand_scores, cur_scores = task_scores(candidate), task_scores(current)
    common = sorted(set(cand_scores) & set(cur_scores))
    metrics = gated_metrics(candidate, current, config)
    if not metrics:
        raise GateError(
            "the benchmark results name no metric to gate on (no `metrics` declaration and none "
            f"of {', '.join(DEFAULT_METRICS)}): pass GateConfig.metrics"
        )
    tail = (1 - config.confidence) / 2 * 100  # percent left out on each side
    comparisons, reasons = [], []
    for metric, (sign, tolerance) in metrics.items():
        tasks = [t for t in common if metric in cand_scores[t] and metric in cur_scores[t]]
        if len(tasks) >= config.min_tasks:
            a = np.array([cand_scores[t][metric] for t in tasks])  # [tasks]
            b = np.array([cur_scores[t][metric] for t in tasks])  # [tasks]
            diff = sign * (a - b)
            low, high = bootstrap_interval(diff, config.resamples, config.seed, tail)
            c = Comparison(
                metric,
                len(tasks),
                float(a.mean()),
                float(b.mean()),
                float(diff.mean()),
                (low, high),
                tolerance,
                high < -tolerance,
                "paired bootstrap",
            )
        else:
            c = _by_interval(metric, sign, tolerance, candidate, current)
            if c is None:
                raise GateError(
                    f"cannot compare {metric!r}: the results share {len(tasks)} scored task(s) "
                    f"(at least {config.min_tasks} needed) and report no interval; benchmark "
                    "both versions on the same task set"
                )
        comparisons.append(c)
        verdict = "worse beyond noise" if c.worse else "not worse beyond noise"
        reasons.append(
            f"{metric}: {names[0]} {c.candidate:.4g} vs {names[1] or 'current'} {c.current:.4g} "
            f"on {c.tasks} task(s); difference {c.difference:+.4g} "
            f"({'higher' if sign > 0 else 'lower'} is better), "
            f"{config.confidence:.0%} interval [{c.interval[0]:+.4g}, {c.interval[1]:+.4g}], "
            f"tolerance {c.tolerance:g}: {verdict} ({c.method})"
        )
    accepted = not any(c.worse for c in comparisons)
    worse = [c.metric for c in comparisons if c.worse]
    reasons.insert(
        0,
        "accepted: not worse than the current version on any gated metric"
        if accepted
        else f"rejected: worse than the current version beyond noise on {', '.join(worse)}",
    )
    return Decision(accepted, reasons, names[0], names[1], comparisons)


def _by_interval(
    metric: str, sign: int, tolerance: float, candidate: dict, current: dict
) -> Comparison | None:
    def interval(result: dict) -> tuple[float, float, float] | None:
        entry = (result.get("summary") or {}).get(metric)
        if not isinstance(entry, dict):
            return None
        ci = entry.get("ci95") or entry.get("ci")
        if not (isinstance(ci, list | tuple) and len(ci) == 2 and "mean" in entry):
            return None
        return float(entry["mean"]), float(ci[0]), float(ci[1])

    a, b = interval(candidate), interval(current)
    if a is None or b is None:
        return None
    if sign > 0:
        worse = a[2] < b[1] - tolerance
        low, high = a[1] - b[2], a[2] - b[1]
    else:
        worse = a[1] > b[2] + tolerance
        low, high = b[1] - a[2], b[2] - a[1]
    return Comparison(
        metric,
        0,
        a[0],
        b[0],
        sign * (a[0] - b[0]),
        (low, high),
        tolerance,
        worse,
        "interval overlap",
    )


# --- the gate over a registry ----------------------------------------------------------------


def gate_promotion(
    registry, candidate: str, config: GateConfig | None = None, lane: str = "agent"
) -> Decision:
    """Decide whether `candidate` may replace the version of `registry` that serves `lane`.

    Uses, for every task set that version was also scored on, the candidate's newest result on
    it (the agent benchmark and a repository's held-out files, say): accepted when no set shows
    it worse and one of the `config.gain` metrics shows a gain. Raises GateError when that cannot be
    decided (no result, no shared set).
    """
    config = config or GateConfig()
    cid = registry.resolve(candidate)
    current = registry.serving(lane)
    if current == cid:
        raise GateError(f"{cid} already serves the {lane} lane")
    other = _other_base(registry, cid, current) if current is not None else None
    if other:
        return Decision(False, [other], cid, current)
    mine = registry.benchmarks(cid)
    if not mine:
        raise GateError(
            f"{cid} has no benchmark result, so the gate cannot judge it: benchmark it "
            f"(flywheel bench agent ... --json R.json; flywheel models attach {cid} R.json) "
            "or promote with --force"
        )
    if current is None:
        return Decision(
            True, ["accepted: no version is promoted yet, nothing to compare"], cid, None
        )
    theirs = {r.get("task_set"): r for r in registry.benchmarks(current)}
    newest: dict[Any, dict[str, Any]] = {}  # task set -> the candidate's newest result on it
    for result in mine:
        if result.get("task_set") in theirs:
            newest[result.get("task_set")] = result
    if not newest:
        sets = ", ".join(sorted(str(s) for s in theirs)) or "none"
        raise GateError(
            f"the promoted version {current} was not benchmarked on the task set of {cid}'s "
            f"results ({', '.join(str(r.get('task_set')) for r in mine)}; {current} has: "
            f"{sets}): benchmark both on the same tasks (flywheel cycle does), or promote with "
            "--force"
        )
    decisions = [
        compare(result, theirs[task_set], config, (cid, current))
        for task_set, result in newest.items()
    ]
    gain = config.gain or LANE_GAIN.get(lane, ())
    if len(decisions) == 1:
        return _require_gain(decisions[0], gain)
    merged = _merge(decisions, [str(r.get("benchmark") or t) for t, r in newest.items()])
    return _require_gain(merged, gain)


def _require_gain(decision: Decision, gain: tuple[str, ...]) -> Decision:
    """Reject an accepted decision that shows a gain on none of the `gain` metrics."""
    gained = [m for m in gain if any(c.metric == m and c.better for c in decision.comparisons)]
    if decision.accepted and gain and not gained:
        decision.accepted = False
        decision.reasons[0] = (
            f"rejected: not worse, but no gain beyond noise on {' or '.join(gain)} "
            "(this lane needs one)"
        )
    elif decision.accepted and gain:
        decision.reasons[0] += f", and better beyond noise on {', '.join(gained)}"
    return decision


def _merge(decisions: list[Decision], names: list[str]) -> Decision:
    """One decision over several task sets: accepted when every one accepts; each set's reasons
    kept under its benchmark's name."""
    accepted = all(d.accepted for d in decisions)
    worse = [
        f"{n}: {c.metric}"
        for n, d in zip(names, decisions, strict=True)
        for c in d.comparisons
        if c.worse
    ]
    head = (
        "accepted: not worse than the current version on any gated metric of any benchmark"
        if accepted
        else f"rejected: worse than the current version beyond noise on {', '.join(worse)}"
    )
    reasons = [head] + [
        f"{n}: {r}" for n, d in zip(names, decisions, strict=True) for r in d.reasons[1:]
    ]
    comparisons = [c for d in decisions for c in d.comparisons]
    return Decision(accepted, reasons, decisions[0].candidate, decisions[0].current, comparisons)


def _other_base(registry, cid: str, current: str) -> str | None:
    """Why `cid` cannot replace `current` whatever its scores: it runs on another base (another
    trunk shape or vocabulary, or an adapter for a base this install lacks); None when they match."""
    from agent.engine.request import EngineError
    from agent.model import base_of

    try:
        theirs = base_of(registry.folder(current))
    except EngineError as exc:
        raise GateError(f"the promoted version {current} cannot be read: {exc}") from None
    try:
        mine = base_of(registry.folder(cid))
    except EngineError as exc:
        return f"rejected: {cid} was made for another base: {exc}"
    if mine == theirs:
        return None
    return (
        f"rejected: {cid} was made for another base ({mine}) than the promoted {current} "
        f"({theirs}): train the candidate from {current}"
    )
