"""The cycle's repository stage: learn the user's workspace for inline completions.

A model trained on one repository's code completes that code better and calls the agent's tools
worse (benchmarks/README.md, "Learning a repository"). So this stage makes a candidate for the
registry's *completion* lane (agent/registry.py): the language server serves its ghost text and
next edits from it, and the agent keeps the promoted version.

due       the workspace (`CycleConfig.workspace`) is read as `flywheel train repo` reads it
          (training/repo_files.py: consent, exclusions, .gitignore, size limits, redaction).
          When the characters of files new or changed since the last cycle that trained on it
          (a sha256 per file in WORK/state.json) reach `min_repo_chars`, both stages run; else,
          when the telemetry database logged `min_tab_suggestions` suggestions to learn from
          (shown, with an outcome and their code, in the workspace's files) since the lane last
          ran, the tab stage alone
train     the `repo` stage (training/repo_pretrain.py) with recipes/cycle/repo.toml, from the
          version that serves completions now (the completion lane's, else the promoted one),
          on the files' train split; the split is recorded in the cycle folder
tab       completion RL (training/tab_rl.py) with recipes/cycle/tab.toml, from the repo stage's
          model (alone: from the version serving completions): the simulated user on the same
          train files, and every suggestion the telemetry database logged with its code and
          outcome in the workspace's files; it fits the model's confidence threshold too. No
          update made (no group with a learning signal): the repo stage's model is the
          candidate, and without a repo stage
          there is none
benchmark candidate and parent on the split's held-out files (training/repo_eval.py: held-out
          perplexity per file, exact single-line completion, and the simulated user's tab
          reward, under each version's own threshold); the parent is scored only when it has no
          result on the same task set
gate      agent/gate.py for the completion lane: not worse on any metric, and a gain beyond
          noise in held-out perplexity (`nll`) or in the reward; then promoted into the
          completion lane
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LANE = "completion"


@dataclass
class CompletionWork:
    """What the completion lane has to learn from now (see `completion_due`)."""

    files: Any  # the workspace's RepoFiles (training/repo_files.py)
    snapshot: dict[str, str]  # path -> sha256 of its files now
    changed: int  # characters new or changed since the last repo stage
    suggestions: int  # logged suggestions to learn from since the lane last ran
    newest: float  # the newest logged suggestion's time: the lane's next watermark
    stages: list[str] = field(default_factory=list)  # ["repo", "tab"], ["tab"], or [] (not due)

    def state_after(self) -> dict[str, Any]:
        """WORK/state.json's keys once the lane ran: its code only if the repo stage trained."""
        done = {"tab_watermark": self.newest}
        return done | ({"repo_files": self.snapshot} if "repo" in self.stages else {})


def new_suggestions(db_path: str, since: float, workspace: str = "") -> tuple[int, float]:
    """(logged inline suggestions to learn from after `since`, made under `workspace` if given;
    the newest logged suggestion's time, in any workspace)."""
    from telemetry import open_db
    from training.tab_rl import logged_outcomes

    if not Path(db_path).exists():
        return 0, since
    db = open_db(db_path, create=False)
    try:
        (newest,) = db.conn.execute(
            "SELECT max(created_at) FROM suggestions WHERE kind = 'inline'"
        ).fetchone()
    finally:
        db.conn.close()
    return len(logged_outcomes(db_path, since, workspace)), max(since, newest or 0.0)


def completion_due(config, state: dict[str, Any]) -> tuple[CompletionWork, str]:
    """What the lane would train on now, and why (the module docstring's `due`)."""
    changed, snapshot, files = repo_change(config, state)
    count, newest = new_suggestions(config.telemetry_db, state["tab_watermark"], config.workspace)
    work = CompletionWork(files, snapshot, changed, count, newest)
    if changed >= config.min_repo_chars:
        work.stages = ["repo", "tab"]
    elif count >= config.min_tab_suggestions:
        work.stages = ["tab"]
    why = (
        f"workspace {config.workspace}: {changed} characters new or changed since the last "
        f"repository stage ({'enough' if 'repo' in work.stages else 'fewer than'} "
        f"--min-repo-chars {config.min_repo_chars}); {count} logged suggestion(s) to learn from "
        f"since the completion lane last ran (--min-tab-suggestions {config.min_tab_suggestions})"
    )
    return work, why


def repo_change(config, state: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    """(changed characters, {path: sha256} now, the RepoFiles) for the configured workspace."""
    from telemetry.privacy import DEFAULT_EXCLUDE
    from training.repo_files import RepoConfig, read_repo

    files = read_repo(
        RepoConfig(
            root=config.workspace,
            exclude=DEFAULT_EXCLUDE + tuple(config.repo_exclude),
            consent=config.repo_consent,
        )
    )
    before = state.get("repo_files") or {}
    now, changed = {}, 0
    for f in files.train + files.heldout:
        now[f.path] = hashlib.sha256(f.text.encode("utf-8", "surrogatepass")).hexdigest()
        if before.get(f.path) != now[f.path]:
            changed += len(f.text)
    return changed, now, files


def train_repo_stage(config, data: Path, current: str, folder: Path) -> tuple[Path, dict]:
    """The repo stage from `current` on the split in `data`; returns (model folder, recipe)."""
    from training.cycle import _train

    return _train("repo", current, folder / "repo", config, data=str(data))


def train_tab_stage(config, init: Path, data: Path, folder: Path, log) -> tuple[Path | None, dict]:
    """Completion RL from `init` (the repo stage's model, or the serving one; see the module
    docstring); returns the trained model (None when no update was made) and the stage's
    summary with its recipe."""
    from training.cycle import CycleError
    from training.simulated_user import UserConfig
    from training.tab_rl import TabError, train_tab

    recipe = config.recipe(
        "tab",
        name=f"{folder.name}-tab",
        init=str(init),
        out=str(folder / "tab"),
        device=config.device,
    )
    # RL samples on shorter prompts than the evaluation's, as `flywheel train tab` does
    seq_len = min(config.recipe("repo").seq_len, 512)
    user = UserConfig(seq_len=seq_len, max_new_tokens=recipe.max_tokens, seed=recipe.seed)
    log(f"training tab (completion RL, {recipe.steps} step(s)) from the repo stage's model ...")
    try:
        summary = train_tab(
            recipe,
            data=str(data),
            telemetry_db=config.telemetry_db,
            workspace=config.workspace,
            user=user,
            log=log,
        )
    except TabError as exc:
        raise CycleError(f"the tab stage: {exc}") from None
    model = Path(summary["model"]) if summary.get("model") else None
    return model, {**summary, "recipe": recipe.to_dict()}


def benchmark_repo(
    config, registry, candidate: str, parent: str, data: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """Score candidate and parent on the held-out files (see the module docstring)."""
    from training.repo_eval import RepoEvalConfig, evaluate_repo

    ev = RepoEvalConfig(
        seq_len=config.recipe("repo").seq_len,
        max_lines=config.repo_lines,
        requests=config.repo_requests,
        device=config.device,
    )
    out = {}
    task_set = None
    for vid in (candidate, parent):
        known = [r for r in registry.benchmarks(vid) if r.get("task_set") == task_set]
        if vid == parent and known:
            result = known[-1]
        else:
            result = evaluate_repo(str(registry.verify(vid)), data, ev)
            registry.attach_benchmark(vid, result)
        task_set = result["task_set"]
        out[vid] = result["summary"]
        s = result["summary"]
        log(f"  {vid}: held-out ppl {s['ppl']['mean']:.4g}, exact line {s['exact']['mean']:.3f}")
    return out


def completion_lane(
    config, registry, folder: Path, work: CompletionWork, log: Callable[[str], None]
) -> dict[str, Any]:
    """Train (repo, then tab; or tab alone), register, score and gate a completion candidate (the
    module docstring); returns its part of the cycle's summary."""
    from agent.gate import GateError, gate_promotion
    from training.repo_pretrain import write_repo_data

    parent = registry.serving(LANE)
    model = registry.verify(parent)
    recipes: dict[str, Any] = {}
    data = folder / "repo_data"  # the split every stage and the benchmark read
    write_repo_data(work.files, data)
    if "repo" in work.stages:
        log(f"training repo from {parent} (serves completions) ...")
        model, recipes["repo"] = train_repo_stage(config, data, str(model), folder)
    tab_model, tab = train_tab_stage(config, model, data, folder, log)
    tab_data = {k: tab.get(k) for k in ("source", "outcomes", "updates", "show_threshold")}
    reward = None
    if tab_model is not None:
        model, recipes["tab"] = tab_model, tab.pop("recipe")
        reward = ", ".join(f"{k} x {w:g}" for k, w in recipes["tab"]["rewards"].items())
    if not recipes:
        reason = "completion RL made no update (no group had a learning signal): no candidate"
        log(f"cycle {folder.name}: {reason}")
        return {
            "parent": parent,
            "stages": [],
            "tab": tab_data,
            "status": "skipped",
            "reason": reason,
        }
    split = {"changed_chars": work.changed, "split": str(data / "split.json")}
    candidate = registry.add(
        model,
        parent=parent,
        data={
            "repo": split,
            **({"tab": tab_data, "logged_suggestions": work.suggestions} if tab_model else {}),
        },
        recipe=recipes,
        reward=reward,
        note=f"trained by {folder.name} for inline completions",
    )
    out: dict[str, Any] = {"candidate": candidate, "parent": parent, "stages": list(recipes)}
    out["tab"] = tab_data
    log(f"completion candidate {candidate}; scoring on the repository's held-out files ...")
    out["repo_benchmark"] = benchmark_repo(config, registry, candidate, parent, data, log)
    try:  # the lane's gate asks for a gain in perplexity or reward (agent/gate.py LANE_GAIN)
        decision = gate_promotion(registry, candidate, config.gate, lane=LANE)
    except GateError as exc:
        return {**out, "status": "rejected", "reasons": [f"the gate could not decide: {exc}"]}
    registry.record_gate(candidate, decision.to_dict())
    if decision.accepted:
        registry.promote(candidate, reason=f"gate accepted ({folder.name})", lane=LANE)
    status = "promoted" if decision.accepted else "rejected"
    for line in decision.reasons:
        log(f"  {line}")
    log(f"cycle {folder.name}: {candidate} {status} for completions (parent {parent})")
    return {**out, "status": status, "reasons": decision.reasons}
