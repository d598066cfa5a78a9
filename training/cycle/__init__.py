"""`flywheel cycle`: new sessions -> training -> benchmark -> gate -> promotion, as one recorded run.

One cycle, in order:

    lock       one cycle per registry at a time (fcntl lock on REGISTRY/cycle.lock; a second
               cycle is refused with the first one's pid)
    sessions   count sessions logged since the last cycle (the watermark in WORK/state.json);
               fewer than `min_sessions` -> skipped, nothing trained, unless the completion
               lane is due (`--workspace` changed enough, or enough suggestions were logged)
    base       an empty registry first gets `base` (the starter model) as its promoted version
    export     telemetry.export of the whole store; the rows no earlier cycle used are new
    repo, tab  when the workspace changed enough: a candidate for the completion lane, trained
               on the workspace's own code, then by completion RL on the simulated user and the
               logged suggestions; when only enough suggestions were logged, by completion RL
               alone; scored on its held-out files and gated on its own (repo.py)
    train      from the promoted version, the stages the new data calls for:
                 pretrain  on new code (file snapshots, task workspaces) when there are at least
                           `min_code_chars` characters of it
                 sft       on new good trajectories (tasks whose reward >= `min_reward`) when
                           there are at least `min_trajectories`
                 rl        async RL on verifiable tasks mined from the logged ones (rl.py: a
                           task whose tests fail at its start and pass at the session's end,
                           replayed), plus `rl_synthetic` synthetic tasks, when there are at
                           least `min_rl_tasks`; the summary says how many tasks the logs
                           yielded and why the others were dropped
               nothing to train on -> skipped
    mtp        re-distill the MTP heads on the new model (its trunk changed; SFT drops them)
    register   the candidate goes into the registry with its lineage: parent, export manifest,
               stage recipes, reward function@version
    benchmark  candidate and, when it has no result on the same task set and settings, the
               promoted version: `flywheel bench agent` (training/benchmark `run_benchmark`) on
               held-out synthetic tasks, the same tasks and sampling seed for both (a paired
               comparison); pass@1 through the harness, and oracle_logprob (the mean
               log-probability of each task's oracle trajectory: a tiny model rarely passes a
               task, so pass@1 alone cannot tell two candidates apart)
    gate       agent/gate.py, on every task set both were scored on; the decision is kept in the
               registry
    promote    when accepted; running `flywheel serve` / `flywheel lsp --model registry`
               processes switch to it by themselves

Each cycle is a telemetry `training_run` (stage "cycle", running -> promoted | rejected | skipped
| failed, its summary as config), each stage a run of its own with its metrics, and the candidate
a `model_version`. WORK/CYCLE_ID/ keeps the export, the stage runs and summary.json.

Files: this one (the cycle), rl.py (the RL stage's task pool), repo.py (the repository stage),
cli.py (`flywheel cycle`).

`--watch` repeats: a cycle starts when `min_sessions` new sessions are logged, or when `period_s`
has passed since the last one and at least one session is new.

    flywheel cycle --quick                              # tiny stages and benchmark: a smoke test
    flywheel cycle --watch --min-sessions 20 --period 86400
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.gate import GateConfig, GateError, gate_promotion
from agent.registry import Registry
from training.benchmark import BenchConfig, BenchTask

# Each stage's recipe: training/recipes/cycle/STAGE.toml (`quick`: cycle/quick/STAGE.toml).
RECIPES = Path(__file__).resolve().parents[1] / "recipes" / "cycle"
STAGES = ("repo", "tab", "pretrain", "sft", "rl", "mtp")  # repo, tab: the completion lane's


@dataclass
class CycleBench:
    """The cycle's benchmark: held-out synthetic tasks through `flywheel bench agent`."""

    projects: int = 2  # synthetic projects whose tasks (all held out) make the task set
    task_seed: int = 7919  # their seed: not one the starter model trained on (it uses 0)
    max_tasks: int = 8  # at most this many tasks, spread over task families
    seed: int = 0  # sampling seed, the same for the candidate and the current version
    max_steps: int = 6  # harness turns per task
    turn_max_tokens: int = 256  # output tokens per harness turn
    max_wall_s: float = 120.0  # harness running time per task
    oracle_logprob: bool = True  # also score each task's oracle trajectory's log-probability

    def __post_init__(self) -> None:
        if self.projects < 1 or self.max_tasks < 1:
            raise CycleError("--bench-projects and --bench-tasks must be >= 1")
        if self.max_steps < 1 or self.turn_max_tokens < 1 or self.max_wall_s <= 0:
            raise CycleError("benchmark max_steps and turn_max_tokens must be >= 1")

    def config(self) -> BenchConfig:
        return BenchConfig(
            seed=self.seed,
            max_steps=self.max_steps,
            turn_max_tokens=self.turn_max_tokens,
            max_wall_s=self.max_wall_s,
            oracle_logprob=self.oracle_logprob,
        )


QUICK_BENCH = dict(max_steps=2, turn_max_tokens=32)  # `--quick`: a benchmark of seconds


@functools.lru_cache(maxsize=4)
def _tasks(projects: int, task_seed: int, max_tasks: int, oracle: bool) -> tuple[BenchTask, ...]:
    from training.benchmark import from_synthetic, pick_tasks
    from training.tasks.generation import generate_tasks

    tasks = generate_tasks(projects, seed=task_seed, heldout_fraction=1.0)
    return tuple(from_synthetic(t, oracle=oracle) for t in pick_tasks(tasks, max_tasks))


def cycle_tasks(bench: CycleBench) -> list[BenchTask]:
    """The task set: deterministic for the settings (made once per process: the tasks are
    verified by running their tests)."""
    return list(_tasks(bench.projects, bench.task_seed, bench.max_tasks, bench.oracle_logprob))


class CycleError(RuntimeError):
    """A cycle cannot run (no database, bad settings); the message says what to do."""


class CycleBusy(CycleError):
    """Another cycle holds the registry's cycle lock."""


@dataclass
class CycleConfig:
    registry: str  # the model registry folder
    telemetry_db: str  # the telemetry database the sessions come from (and runs go to)
    work: str  # cycle folders (exports, stage runs, summaries) and state.json
    base: str = "default"  # promoted first when the registry is empty ("default": the starter)
    min_sessions: int = 1  # new sessions needed before a cycle trains
    min_trajectories: int = 1  # new good trajectories needed for an SFT stage
    min_code_chars: int = 20_000  # characters of new code needed for a pretraining stage
    min_rl_tasks: int = 4  # tasks (new replayable ones plus synthetic) needed for an RL stage
    rl_synthetic: int = 0  # synthetic tasks added to the RL stage's pool (0: logged ones only)
    reward: str = "total"  # reward function that picks good trajectories (telemetry/rewards.py)
    min_reward: float = 0.5  # trajectories below this reward are not trained on
    held_out_percent: float = 10.0  # sessions kept out of training for the benchmark
    quick: bool = False  # tiny stages (a few steps each): tests and smoke runs
    workspace: str = ""  # a repository to learn (the repo stage, training/cycle/repo.py); "" = none
    min_repo_chars: int = 20_000  # characters of new or changed code in it for a repo stage
    min_tab_suggestions: int = 200  # new logged suggestions to learn from for a tab stage alone
    repo_exclude: tuple[str, ...] = ()  # files of the workspace never read, beside the defaults
    repo_consent: str = "code"  # the workspace's telemetry consent; the repo stage needs "code"
    repo_lines: int = 100  # held-out completion lines the gate compares on
    repo_requests: int = 50  # simulated-user requests scored per version (0: none)
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)  # per-stage recipe overrides
    bench: CycleBench = field(default_factory=CycleBench)
    gate: GateConfig = field(default_factory=GateConfig)
    device: str = "cpu"  # torch device for training and benchmarking
    progress: bool = False  # progress lines from the stages

    def __post_init__(self) -> None:
        least = (self.min_sessions, self.min_trajectories, self.min_code_chars, self.min_rl_tasks)
        if min(*least, self.min_repo_chars, self.min_tab_suggestions) < 1:
            raise CycleError(
                "min_sessions, min_trajectories, min_code_chars, min_rl_tasks, min_repo_chars "
                "and min_tab_suggestions must be >= 1"
            )
        if self.rl_synthetic < 0:
            raise CycleError("rl_synthetic must be >= 0")
        unknown = set(self.stages) - set(STAGES)
        if unknown:
            raise CycleError(f"unknown stage(s) {sorted(unknown)}; use {sorted(STAGES)}")
        for stage in self.stages:
            self.recipe(stage)  # an unknown key or a wrong type fails here, before any work

    def recipe(self, stage: str, **fill: Any):
        """The stage's recipe file, then `fill` (paths and the like), then the --set overrides."""
        from training.recipe import RecipeError, load_recipe
        from training.rl import load_rl_recipe

        path = (RECIPES / "quick" if self.quick else RECIPES) / f"{stage}.toml"
        try:
            load = load_rl_recipe if stage in ("rl", "tab") else load_recipe
            return load(path, {**fill, **self.stages.get(stage, {})})
        except RecipeError as exc:
            raise CycleError(str(exc)) from None


# --- the lock and the state ------------------------------------------------------------------


@contextlib.contextmanager
def cycle_lock(registry_root: str | Path) -> Iterator[None]:
    """Hold REGISTRY/cycle.lock, or raise CycleBusy naming the cycle that holds it."""
    root = Path(registry_root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "cycle.lock"
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise CycleBusy(
                f"another flywheel cycle is running on {root} ({holder}); wait for it to "
                "finish, or stop it (the lock is released when its process ends)"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# A work folder's state before its first cycle; a state file from an older version gains the
# keys it lacks.
NEW_STATE = {
    "watermark": 0.0,
    "cycles": 0,
    "used_sft": [],
    "used_text": [],
    "used_rl": [],
    "last_at": 0.0,
    "repo_files": {},  # path -> sha256 of the workspace's files the last repo stage trained on
    "tab_watermark": 0.0,  # the newest logged suggestion the completion lane has seen
}


def load_state(work: Path) -> dict[str, Any]:
    path = work / "state.json"
    if not path.exists():
        return dict(NEW_STATE)
    try:
        return {**NEW_STATE, **json.loads(path.read_text())}
    except (OSError, json.JSONDecodeError) as exc:
        raise CycleError(
            f"{path} is damaged ({exc}): remove it to treat every session as new"
        ) from exc


def save_state(work: Path, state: dict[str, Any]) -> None:
    tmp = work / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, work / "state.json")


def new_sessions(db_path: str, since: float) -> tuple[int, int, float]:
    """(all sessions, sessions started after `since`, the newest start) in the telemetry store."""
    from telemetry import open_db, queries

    if not Path(db_path).exists():
        raise CycleError(
            f"no telemetry database at {db_path}: use Flywheel in an editor first (flywheel lsp "
            "logs sessions there), or pass --telemetry-db"
        )
    db = open_db(db_path, create=False)
    try:
        total, fresh, newest = queries.session_counts(db, since)
    finally:
        db.conn.close()
    return total, fresh, float(newest or since)


def due(state: dict[str, Any], fresh: int, now: float, min_sessions: int, period_s: float) -> str:
    """Why a watched cycle should start now, or "" (pure: the watch loop's decision)."""
    if fresh >= min_sessions:
        return f"{fresh} new session(s) (>= {min_sessions})"
    if fresh and period_s and now - state.get("last_at", 0.0) >= period_s:
        return f"{period_s:g} s since the last cycle and {fresh} new session(s)"
    return ""


# --- one cycle -------------------------------------------------------------------------------


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def _train(stage: str, init: str, out: Path, config: CycleConfig, **data: Any) -> tuple[Path, dict]:
    from training.trainer import train

    name = f"{out.parent.name}-{stage}"
    recipe = config.recipe(
        stage,
        name=name,
        out=str(out),
        init=init,
        device=config.device,
        telemetry_db=config.telemetry_db,
        **data,
    )
    return train(recipe, resume=False, progress=config.progress), recipe.to_dict()


def run_cycle(config: CycleConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """One cycle (see the module docstring); returns its summary (also WORK/ID/summary.json)."""
    registry = Registry(config.registry)
    work = Path(config.work)
    with cycle_lock(registry.root):
        work.mkdir(parents=True, exist_ok=True)
        state = load_state(work)
        total, fresh, newest = new_sessions(config.telemetry_db, state["watermark"])
        lane = None  # the completion lane's work (repo.py), when it is due
        if config.workspace:
            from training.cycle.repo import completion_due

            lane, why = completion_due(config, state)
            lane = lane if lane.stages else None
            log(why)
        if total == 0 and lane is None:
            return _skip(
                {},
                log,
                f"the telemetry database {config.telemetry_db} has no "
                "sessions yet: use Flywheel in an editor first",
            )
        if fresh < config.min_sessions and lane is None:
            return _skip(
                {},
                log,
                f"{fresh} new session(s) since the last cycle, fewer "
                f"than --min-sessions {config.min_sessions}",
            )
        cycle_id = f"cycle-{state['cycles'] + 1:04d}-{time.strftime('%Y%m%d-%H%M%S')}"
        folder = work / cycle_id
        folder.mkdir(parents=True)
        run = _TelemetryRun(config.telemetry_db, cycle_id)
        summary: dict[str, Any] = {"id": cycle_id, "new_sessions": fresh, "status": "failed"}
        try:
            summary.update(_cycle(config, registry, state, folder, log, lane))
            if summary.get("completion"):  # its code and suggestions are used, even if skipped
                state.update(lane.state_after())
                save_state(work, state)
            if summary["status"] != "skipped":
                state.update(
                    watermark=newest,
                    cycles=state["cycles"] + 1,
                    last_at=time.time(),
                    used_sft=summary.pop("_used_sft"),
                    used_text=summary.pop("_used_text"),
                    used_rl=summary.pop("_used_rl"),
                )
                save_state(work, state)
            return summary
        finally:
            summary.pop("_used_sft", None)
            summary.pop("_used_text", None)
            summary.pop("_used_rl", None)
            (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
            run.end(summary)


def _cycle(
    config: CycleConfig,
    registry: Registry,
    state: dict,
    folder: Path,
    log: Callable[[str], None],
    lane=None,
) -> dict[str, Any]:
    """The cycle's work under the lock: export, train what the new data calls for, re-distill
    the MTP heads, register, benchmark, gate. Returns the summary (`_used_*`: the state's next
    lists of used rows)."""
    parent = _baseline(config, registry, log)
    new = _new_data(config, state, folder, log)
    out: dict[str, Any] = {"parent": parent, **{f"_{k}": v for k, v in new.used.items()}}
    out["data"] = new.summary
    if lane is not None:
        from training.cycle.repo import completion_lane

        out["completion"] = completion_lane(config, registry, folder, lane, log)
    plan = _plan(config, new)
    if not plan:
        return _skip(
            out,
            log,
            f"nothing for the agent to learn from: {len(new.sft)} new good trajectories (< "
            f"{config.min_trajectories}), {new.code_chars} characters of new code "
            f"(< {config.min_code_chars}) and {new.rl_size} RL tasks (< {config.min_rl_tasks})",
        )
    current = str(registry.verify(parent))
    current, recipes = _train_stages(config, current, plan, new, folder, log)
    if not recipes:
        return _skip(out, log, "no stage changed the model: the RL stage found no learning signal")
    current = _redistill_mtp(config, current, folder, recipes, log)
    reward = new.manifest["reward"]
    candidate = registry.add(
        current,
        parent=parent,
        data={
            "export": new.manifest["files"],
            "sessions": new.manifest["sessions"],
            "held_out": new.manifest["held_out"],
            **new.summary,
        },
        recipe=recipes,
        reward=f"{reward['function']}@{reward['version']} (min {reward['min']})",
        note=f"trained by {folder.name}",
    )
    out["candidate"] = candidate
    out["stages"] = list(recipes)
    log(f"candidate {candidate}; benchmarking ...")
    out["benchmark"] = _benchmark(config, registry, candidate, parent, log)
    out.update(_decide(config, registry, candidate, parent, folder, log))
    return out


def _baseline(config: CycleConfig, registry: Registry, log: Callable[[str], None]) -> str:
    """The promoted version; an empty registry first gets `config.base` as its baseline."""
    from agent.model import resolve_model

    if registry.promoted() is None:
        base = registry.add(resolve_model(config.base), note="the base model of the first cycle")
        registry.promote(base, forced=True, reason="baseline: the first version of the registry")
        log(f"registry was empty: {base} (from {config.base}) is the baseline")
    return registry.promoted()


@dataclass
class _NewData:
    """What this cycle's export holds that no earlier cycle trained on."""

    manifest: dict[str, Any]  # the export's manifest
    sft: list[dict[str, Any]]  # new good trajectories
    text: list[dict[str, Any]]  # new code
    rl_pool: Path  # the RL stage's task file
    summary: dict[str, Any]  # the counts, as the cycle's summary and the candidate keep them
    used: dict[str, list[str]]  # the state's used_sft, used_text and used_rl after this cycle

    @property
    def code_chars(self) -> int:
        return self.summary["new_code_chars"]

    @property
    def rl_size(self) -> int:
        """New replayable RL tasks plus synthetic ones."""
        return self.summary["rl_tasks"]["new"] + self.summary["rl_tasks"]["synthetic"]


def _new_data(
    config: CycleConfig, state: dict, folder: Path, log: Callable[[str], None]
) -> _NewData:
    """Export the whole store into FOLDER/export and pick out the rows no earlier cycle used;
    mine the RL stage's tasks from it (training/cycle/rl.py)."""
    from telemetry import export
    from training.cycle.rl import rl_pool

    report = export(
        config.telemetry_db,
        folder / "export",
        reward=config.reward,
        min_reward=config.min_reward,
        held_out_percent=config.held_out_percent,
    )
    sft_rows = _jsonl(folder / "export" / "sft.jsonl")
    text_rows = _jsonl(folder / "export" / "pretrain.jsonl")
    used_sft, used_text = set(state["used_sft"]), set(state["used_text"])
    new_sft = [r for r in sft_rows if r["id"] not in used_sft]
    new_text = [r for r in text_rows if r["id"] not in used_text]
    summary: dict[str, Any] = {
        "new_trajectories": len(new_sft),
        "new_code_chars": sum(len(r["text"]) for r in new_text),
        "export": {k: v["count"] for k, v in report.manifest["files"].items()},
    }
    pool, summary["rl_tasks"], mined = rl_pool(
        folder, folder / "export", set(state["used_rl"]), config.rl_synthetic, log
    )
    used = {
        "used_sft": sorted(used_sft | {r["id"] for r in sft_rows}),
        "used_text": sorted(used_text | {r["id"] for r in text_rows}),
        "used_rl": sorted(set(state["used_rl"]) | set(mined)),
    }
    return _NewData(report.manifest, new_sft, new_text, pool, summary, used)


def _plan(config: CycleConfig, new: _NewData) -> list[str]:
    """The agent's stages the new data calls for, in the order they train."""
    plan = []
    if new.code_chars >= config.min_code_chars:
        plan.append("pretrain")
    if len(new.sft) >= config.min_trajectories:
        plan.append("sft")
    if new.rl_size >= config.min_rl_tasks:
        plan.append("rl")
    return plan


def _skip(out: dict[str, Any], log: Callable[[str], None], reason: str) -> dict[str, Any]:
    """No agent candidate: the cycle's status is the completion lane's when it ran."""
    out["status"] = out.get("completion", {}).get("status", "skipped")
    out["reason"] = reason
    log(f"{'agent stages' if 'completion' in out else 'cycle'} skipped: {reason}")
    return out


def _train_stages(
    config: CycleConfig,
    current: str,
    plan: list[str],
    new: _NewData,
    folder: Path,
    log: Callable[[str], None],
) -> tuple[str, dict[str, Any]]:
    """Each planned stage from the model the one before made. Returns the last model and each
    stage's recipe (an RL stage that made no update has none, and changed nothing)."""
    from training.cycle.rl import train_rl_stage

    recipes: dict[str, Any] = {}
    for stage in plan:
        log(f"training {stage} from {Path(current).name} ...")
        if stage == "pretrain":
            from training.data import CorpusConfig, build_corpus

            _write_jsonl(folder / "new_code.jsonl", new.text)
            build_corpus(
                CorpusConfig(
                    exports=[str(folder / "new_code.jsonl")],
                    tokenizer=current,
                    heldout_fraction=0.1,
                ),
                folder / "code_corpus",
            )
            model, recipes[stage] = _train(
                stage, current, folder / stage, config, data=str(folder / "code_corpus")
            )
        elif stage == "rl":
            recipe = config.recipe(
                "rl",
                name=f"{folder.name}-rl",
                out=str(folder / "rl"),
                init=current,
                tasks=str(new.rl_pool),
                device=config.device,
                telemetry_db=config.telemetry_db,
            )
            model, updates = train_rl_stage(recipe, config.progress, log)
            if not updates:
                log("the RL stage made no update (no group had a learning signal)")
                continue
            recipes[stage] = {**recipe.to_dict(), "updates": updates}
        else:
            _write_jsonl(folder / "new_sft.jsonl", new.sft)
            model, recipes[stage] = _train(
                stage, current, folder / stage, config, sft_data=[str(folder / "new_sft.jsonl")]
            )
        current = str(model)
    return current, recipes


def _redistill_mtp(
    config: CycleConfig,
    current: str,
    folder: Path,
    recipes: dict[str, Any],
    log: Callable[[str], None],
) -> str:
    """The MTP heads distilled again on the new model (its trunk changed; SFT drops them), from
    the export's text; the model unchanged when there is too little text."""
    from agent.model import adapter_base, is_adapter
    from training.data import CorpusError, distillation_corpus

    try:
        export = folder / "export"
        corpus, tokens = distillation_corpus(
            folder / "mtp_text",
            str(adapter_base(Path(current)) if is_adapter(Path(current)) else current),
            [r["text"] for r in _jsonl(export / "pretrain.jsonl")],
            _jsonl(export / "sft.jsonl"),
        )
    except CorpusError as exc:
        corpus, tokens = folder, 0
        log(f"no text to re-distill the MTP heads on: {exc}")
    seq_len = min(config.recipe("mtp").seq_len, tokens - 1)
    if seq_len < 8:
        log(f"MTP heads not re-distilled: only {tokens} tokens of text (the candidate has none)")
        return current
    log("re-distilling the MTP heads ...")
    model, recipes["mtp"] = _train(
        "mtp", current, folder / "mtp", config, data=str(corpus), seq_len=seq_len
    )
    return str(model)


def _decide(
    config: CycleConfig,
    registry: Registry,
    candidate: str,
    parent: str,
    folder: Path,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The gate's decision on the candidate (kept in the registry), and its promotion when
    accepted: the summary's status and reasons."""
    try:
        decision = gate_promotion(registry, candidate, config.gate)
    except GateError as exc:
        return {"status": "rejected", "reasons": [f"the gate could not decide: {exc}"]}
    registry.record_gate(candidate, decision.to_dict())
    if decision.accepted:
        registry.promote(candidate, reason=f"gate accepted ({folder.name})")
    status = "promoted" if decision.accepted else "rejected"
    for line in decision.reasons:
        log(f"  {line}")
    log(f"cycle {folder.name}: {candidate} {status} (parent {parent})")
    return {"reasons": decision.reasons, "status": status}


def _benchmark(
    config: CycleConfig, registry: Registry, candidate: str, parent: str, log: Callable
) -> dict[str, Any]:
    """Score the candidate, and the parent when it has no result on the same task set with the
    same settings (the gate compares the two per task)."""
    from agent.engine import EngineConfig, SpeculativeConfig
    from training.benchmark import run_benchmark, task_set_id

    tasks = cycle_tasks(config.bench)
    bench = config.bench.config()
    task_set = task_set_id(t.id for t in tasks)
    settings = json.loads(json.dumps(dataclasses.asdict(bench)))  # as the registry keeps it
    out = {}
    for vid in (candidate, parent):
        known = [
            r
            for r in registry.benchmarks(vid)
            if r.get("task_set") == task_set and r.get("config") == settings
        ]
        if known:
            result = known[-1]
        else:
            engine = EngineConfig(
                model=str(registry.verify(vid)),
                device=config.device,
                speculative=SpeculativeConfig("none"),
            )
            result = run_benchmark(engine, tasks, bench).to_dict()
            registry.attach_benchmark(vid, result)
        out[vid] = result["summary"]
        gated = [m for m in result.get("metrics", {}) if result["summary"].get(m)]
        log(f"  {vid}: " + ", ".join(f"{m} {result['summary'][m]['mean']:.4g}" for m in gated))
    return out


class _TelemetryRun:
    """The cycle as a telemetry `training_run` (stage "cycle"), and its candidate's version."""

    def __init__(self, db: str, run_id: str) -> None:
        from telemetry import Recorder

        self.run_id = run_id
        self.recorder = Recorder(db)
        self.recorder.record("training_run", id=run_id, stage="cycle", status="running")

    def end(self, summary: dict[str, Any]) -> None:
        self.recorder.record(
            "training_run",
            id=self.run_id,
            stage="cycle",
            status=summary.get("status"),
            model_in=summary.get("parent"),
            model_out=summary.get("candidate"),
            ended_at=time.time(),
            config=summary,
        )
        for lane, part, scores in (
            ("agent", summary, "benchmark"),
            ("completion", summary.get("completion") or {}, "repo_benchmark"),
        ):
            if part.get("candidate"):
                bench = (part.get(scores) or {}).get(part["candidate"], {})
                self.recorder.record(
                    "model_version",
                    id=part["candidate"],
                    parent=part.get("parent"),
                    stage="cycle" if lane == "agent" else "cycle-completion",
                    metrics={"benchmark": bench, "gate": part.get("reasons")},
                    promoted_at=time.time() if part.get("status") == "promoted" else None,
                )
        self.recorder.close()


from training.cycle.cli import main as main  # noqa: E402  (the entry point, after the names it uses)
