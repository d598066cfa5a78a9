"""What each dashboard panel shows, read from the telemetry database and the model registry.

Every panel is a `Panel`: its series (plain lists, ready to plot) and rows (a small table), or
`empty` — one sentence saying what is missing and how to get it. A panel never fails the page:
a database without a table (an old schema) or an unreadable registry becomes that sentence.

Time buckets are days, or hours when everything recorded spans less than two days (a fresh
install still shows a trend).

The database is opened read-only (`mode=ro`); a missing file is the empty state, never created.
Every read is a function of telemetry/queries.py; this module only shapes the answers.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from telemetry import queries


@dataclass
class Panel:
    id: str  # HTML id, also the test's handle
    title: str
    series: dict[str, Any] = field(default_factory=dict)  # chart input (see charts.py)
    rows: list[dict[str, Any]] = field(default_factory=list)  # table rows
    stats: dict[str, str] = field(default_factory=dict)  # headline numbers: label -> text
    empty: str | None = None  # why there is nothing to show, and what to do
    note: str = ""  # where the data came from


def _unit(db: Database) -> str:
    """The time bucket: "hour" when the sessions span under two days, else "day"."""
    first, last = queries.session_span(db)
    if first is not None and last - first < 2 * 86400:
        return "hour"
    return "day"


def _pct(num: float, den: float) -> str:
    return f"{100 * num / den:.0f}%" if den else "-"


def sessions_panel(db: Database) -> Panel:
    p = Panel("sessions", "Sessions over time")
    unit = _unit(db)
    rows = queries.sessions_per_bucket(db, unit)
    if not rows:
        p.empty = "No sessions recorded yet: run `flywheel demo`, or use the editor plug-in."
        return p
    buckets = sorted({r["t"] for r in rows})
    editors = sorted({r["editor"] for r in rows})
    counts = {(r["t"], r["editor"]): r["n"] for r in rows}
    p.series = {
        "kind": "stacked_bars",
        "x": buckets,
        "stacks": {e: [counts.get((b, e), 0) for b in buckets] for e in editors},
        "ylabel": f"sessions per {unit}",
    }
    total = sum(r["n"] for r in rows)
    p.stats = {"sessions": str(total), "editors": ", ".join(editors)}
    return p


def suggestions_panel(db: Database) -> Panel:
    p = Panel("suggestions", "Suggestion acceptance and kept code")
    unit = _unit(db)
    rows = queries.suggestions_per_bucket(db, unit)
    if not rows:
        p.empty = "No inline suggestions recorded yet: they come from the language server."
        return p
    x = [r["t"] for r in rows]
    acceptance = [r["accepted"] / (r["shown"] or r["made"]) for r in rows]
    kept = [r["kept"] for r in rows]
    p.series = {
        "kind": "lines",
        "x": x,
        "lines": {"accepted / shown": acceptance, "kept (share surviving, last check)": kept},
        "ylabel": f"rate per {unit}",
        "ylim": (0, 1.05),
    }
    made, shown = sum(r["made"] for r in rows), sum(r["shown"] for r in rows)
    accepted = sum(r["accepted"] for r in rows)
    checked = [k for k in kept if k is not None]
    p.stats = {
        "suggestions": str(made),
        "acceptance": _pct(accepted, shown or made),
        "kept": f"{100 * sum(checked) / len(checked):.0f}%" if checked else "not checked yet",
    }
    return p


def rewards_panel(db: Database) -> Panel:
    p = Panel("rewards", "Reward trends")
    unit = _unit(db)
    rows = queries.rewards_per_bucket(db, unit)
    if not rows:
        p.empty = "No rewards computed yet: run `flywheel telemetry rewards` after some sessions."
        return p
    x = sorted({r["t"] for r in rows})
    functions = sorted({r["f"] for r in rows})
    means = {(r["t"], r["f"]): r["mean"] for r in rows}
    p.series = {
        "kind": "lines",
        "x": x,
        "lines": {f: [means.get((t, f)) for t in x] for f in functions},
        "ylabel": f"mean reward per {unit}",
    }
    p.stats = {"rewards": str(sum(r["n"] for r in rows)), "functions": str(len(functions))}
    return p


def agent_panel(db: Database) -> Panel:
    p = Panel("agent", "Agent success and tool errors")
    unit = _unit(db)
    rows = queries.tasks_per_bucket(db, unit)
    if not rows:
        p.empty = "No finished agent tasks yet: run `flywheel run` or an agent task in the editor."
        return p
    p.series = {
        "kind": "lines",
        "x": [r["t"] for r in rows],
        "lines": {
            "success rate": [r["ok"] / r["tasks"] for r in rows],
            "tool errors per task": [r["errors"] / r["tasks"] for r in rows],
        },
        "ylabel": f"per {unit}",
    }
    p.rows = [{"stop reason": r["reason"], "tasks": r["n"]} for r in queries.stop_reasons(db)]
    tasks, ok = sum(r["tasks"] for r in rows), sum(r["ok"] for r in rows)
    p.stats = {
        "tasks": str(tasks),
        "success": _pct(ok, tasks),
        "tool errors": str(sum(r["errors"] for r in rows)),
    }
    return p


def speculative_panel(db: Database) -> Panel:
    p = Panel("speculative", "Speculative decoding acceptance")
    unit = _unit(db)
    rows = queries.drafts_per_bucket(db, unit)
    if not rows:
        p.empty = (
            "No speculative-decoding statistics yet: suggestions record them when the engine "
            "drafts (flywheel lsp with speculative decoding on)."
        )
        return p
    p.series = {
        "kind": "lines",
        "x": [r["t"] for r in rows],
        "lines": {"accepted / proposed drafts": [r["accepted"] / r["proposed"] for r in rows]},
        "ylabel": f"acceptance per {unit}",
        "ylim": (0, 1.05),
        "right": {"mean acceptance length": [r["length"] for r in rows]},
    }
    proposed, accepted = sum(r["proposed"] for r in rows), sum(r["accepted"] for r in rows)
    p.stats = {"drafts proposed": str(proposed), "accepted": _pct(accepted, proposed)}
    return p


def training_panel(db: Database) -> Panel:
    p = Panel("training", "Training curves")
    runs = queries.training_runs(db)
    metrics = queries.training_metrics(db)
    if not metrics:
        p.empty = (
            "No training metrics recorded yet: `flywheel train` and `flywheel cycle` record "
            "their runs here."
        )
        p.rows = [{"run": r["id"], "stage": r["stage"], "status": r["status"]} for r in runs]
        return p
    stage = {r["id"]: r["stage"] or "?" for r in runs}
    curves: dict[str, dict[str, tuple[list, list]]] = {}
    for m in metrics:
        label = f"{stage.get(m['run_id'], '?')} {m['run_id'][:8]}"
        xs, ys = curves.setdefault(m["name"], {}).setdefault(label, ([], []))
        xs.append(m["step"])
        ys.append(m["value"])
    names = sorted(curves, key=lambda n: (0 if "loss" in n else 1, n))[:4]
    p.series = {"kind": "curves", "panels": {n: curves[n] for n in names}}
    p.rows = [{"run": r["id"], "stage": r["stage"], "status": r["status"]} for r in runs]
    p.stats = {"runs": str(len(runs)), "metrics": ", ".join(names)}
    return p


def _first_mean(benchmarks: list[dict[str, Any]]) -> float | None:
    """The newest result's first summary mean (the metric the chart shows)."""
    for value in (benchmarks[-1].get("summary") or {}).values() if benchmarks else []:
        if isinstance(value, dict) and isinstance(value.get("mean"), int | float):
            return float(value["mean"])
    return None


def _benchmark_text(benchmarks: list[dict[str, Any]]) -> str:
    if not benchmarks:
        return "not benchmarked"
    last = benchmarks[-1]
    summary = last.get("summary") or {}
    parts = []
    for name, value in list(summary.items())[:3]:
        if isinstance(value, dict) and isinstance(value.get("mean"), int | float):
            ci = value.get("ci95")
            text = f"{name} {value['mean']:.3f}"
            if isinstance(ci, list) and len(ci) == 2:
                text += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
            parts.append(text)
    label = last.get("benchmark") or last.get("name") or "benchmark"
    if last.get("provisional"):
        label += " (provisional)"
    return f"{label}: " + ("; ".join(parts) or "no summary")


def _gate_text(gate: list[dict[str, Any]]) -> str:
    if not gate:
        return "no gate decision"
    last = gate[-1]
    verdict = "accepted" if last.get("accepted") else "rejected"
    reasons = last.get("reasons") or last.get("reason") or []
    if isinstance(reasons, str):
        reasons = [reasons]
    return verdict + (": " + "; ".join(str(r) for r in reasons[:2]) if reasons else "")


def registry_versions(registry: Path) -> tuple[list[dict[str, Any]], str | None]:
    """Rows from the model registry (agent/registry.py), or ([], why not)."""
    from agent.registry import Registry, RegistryError

    reg = Registry(registry)
    if not reg.exists():
        return [], f"no model registry at {registry} yet (`flywheel models add` creates it)"
    try:
        versions = reg.versions()
    except RegistryError as exc:
        return [], f"the model registry cannot be read: {exc}"
    rows = [
        {
            "version": v.get("id", "?"),
            "status": v.get("status", "?"),
            "parent": v.get("parent") or "-",
            "benchmark": _benchmark_text(v.get("benchmarks") or []),
            "gate": _gate_text(v.get("gate") or []),
            "_score": _first_mean(v.get("benchmarks") or []),
        }
        for v in versions
    ]
    return rows, None


def table_versions(db: Database) -> list[dict[str, Any]]:
    """Rows from the telemetry `model_versions` table (metrics JSON may hold benchmark/gate)."""
    out = []
    for r in queries.model_versions(db):
        try:
            metrics = json.loads(r["metrics"] or "{}")
        except json.JSONDecodeError:
            metrics = {}
        metrics = metrics if isinstance(metrics, dict) else {}
        bench = [metrics["benchmark"]] if isinstance(metrics.get("benchmark"), dict) else []
        gate = metrics.get("gate")
        out.append(
            {
                "version": r["id"],
                "status": "promoted" if r["promoted_at"] else (r["stage"] or "recorded"),
                "parent": r["parent"] or "-",
                "benchmark": _benchmark_text(bench),
                "gate": _gate_text([gate] if isinstance(gate, dict) else []),
                "_score": _first_mean(bench),
            }
        )
    return out


def models_panel(db: Database | None, registry: Path | None) -> Panel:
    p = Panel("models", "Model versions, benchmark scores and gate decisions")
    why = "no registry folder was given (--registry)"
    if registry is not None:
        rows, why = registry_versions(registry)
        if rows:
            p.rows, p.note = rows, f"from the model registry at {registry}"
    if not p.rows and db is not None:
        try:
            p.rows = table_versions(db)
        except sqlite3.Error as exc:  # an old schema without model_versions
            why += f"; the telemetry database cannot list versions ({exc})"
        if p.rows:
            p.note = f"from the telemetry model_versions table ({why})"
    if not p.rows:
        p.empty = f"No model versions recorded: {why}, and the telemetry database lists none."
    else:
        scores = [row.pop("_score") for row in p.rows]
        if any(s is not None for s in scores):
            p.series = {
                "kind": "bars",
                "x": [r["version"].split("-")[0] for r in p.rows],
                "y": scores,
                "colors": [r["status"] for r in p.rows],
                "ylabel": "benchmark (first metric)",
            }
        p.stats = {
            "versions": str(len(p.rows)),
            "promoted": next((r["version"] for r in p.rows if r["status"] == "promoted"), "none"),
        }
        lane = next((r["version"] for r in p.rows if r["status"] == "completions"), None)
        if lane:  # a version of the completion lane serves inline completions
            p.stats["serving completions"] = lane
    return p


def repo_panel(registry: Path | None) -> Panel:
    """Per repository, held-out perplexity and simulated accept rate over model versions: the
    `repo_heldout` results (training/repo_eval.py) attached to registry versions, in version
    order."""
    p = Panel("repos", "Repositories: held-out perplexity and accept rate by model version")
    hint = (
        "run `flywheel train repo --workspace DIR` (it scores the result on the repository's "
        "held-out files and registers it)"
    )
    if registry is None:
        p.empty = f"No registry folder was given (--registry): {hint}."
        return p
    from agent.registry import Registry, RegistryError

    reg = Registry(registry)
    points: dict[str, list[tuple[int, str, dict]]] = {}
    try:
        for v in reg.versions() if reg.exists() else []:
            for result in reg.benchmarks(v["id"]):
                if result.get("benchmark") == "repo_heldout" and result.get("repo"):
                    summary = {k: x.get("mean") for k, x in (result.get("summary") or {}).items()}
                    points.setdefault(result["repo"], []).append((v["number"], v["id"], summary))
    except RegistryError as exc:
        p.empty = f"The model registry cannot be read: {exc}"
        return p
    if not points:
        p.empty = f"No version was scored on a repository's held-out files yet: {hint}."
        return p
    panels: dict[str, dict[str, tuple[list, list]]] = {}
    for repo, rows in sorted(points.items()):
        rows.sort()
        xs = [f"v{n}" for n, _, _ in rows]
        panels[f"{repo}: held-out ppl"] = {"ppl": (xs, [s.get("ppl") for _, _, s in rows])}
        panels[f"{repo}: accept rate"] = {
            "accept rate": (xs, [s.get("accept_rate") for _, _, s in rows])
        }
        for _, vid, s in rows:
            p.rows.append(
                {
                    "repository": repo,
                    "version": vid,
                    "held-out ppl": _fmt(s.get("ppl")),
                    "exact line": _fmt(s.get("exact")),
                    "accept rate": _fmt(s.get("accept_rate")),
                    "accepted chars / request": _fmt(s.get("accepted_chars_per_request")),
                }
            )
    p.series = {"kind": "curves", "panels": panels, "xlabel": "model version"}
    p.stats = {"repositories": str(len(points)), "scored versions": str(len(p.rows))}
    p.note = f"from `repo_heldout` results in the model registry at {registry}"
    return p


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


PANELS: list[Callable[[Database], Panel]] = [
    sessions_panel,
    suggestions_panel,
    rewards_panel,
    agent_panel,
    speculative_panel,
    training_panel,
]


def collect(db: Path, registry: Path | None) -> tuple[list[Panel], str | None]:
    """Every panel, and the page's empty-state message (None when there is data)."""
    tables = queries.open_read_only(db)
    panels: list[Panel] = []
    try:
        for build in PANELS:
            title = build.__name__.removesuffix("_panel")
            if tables is None:
                panels.append(Panel(title, title.capitalize(), empty="No telemetry database."))
                continue
            try:
                panels.append(build(tables))
            except sqlite3.Error as exc:
                panels.append(
                    Panel(
                        title,
                        title.capitalize(),
                        empty=f"This database cannot answer this panel ({exc}); run "
                        "`flywheel telemetry stats` once to upgrade its schema.",
                    )
                )
        panels.append(models_panel(tables, registry))
        panels.append(repo_panel(registry))
    finally:
        if tables is not None:
            tables.close()
    if tables is None:
        return panels, (
            f"There is no telemetry database at {db} yet. It is created by the first recorded "
            "session: run `flywheel demo`, or start the language server from your editor."
        )
    if all(p.empty for p in panels):
        return panels, (
            f"The telemetry database at {db} holds no data yet. Run `flywheel demo` for a first "
            "logged agent task, or use the editor plug-in; then reload this page."
        )
    return panels, None
