"""`flywheel cycle`'s command line: one cycle, or `--watch` to run them when due."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

from agent.gate import GateError
from agent.registry import RegistryError, path_from_cli
from telemetry.folders import data_home, db_path
from training.cycle import (
    QUICK_BENCH,
    STAGES,
    CycleBench,
    CycleBusy,
    CycleConfig,
    CycleError,
    due,
    load_state,
    new_sessions,
    run_cycle,
)

# --- the command line ------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flywheel cycle",
        description="Train on new sessions, benchmark, gate, promote: one recorded run "
        "(--watch: repeat when enough sessions are new or a period has passed).",
    )
    p.add_argument("--watch", action="store_true", help="keep running cycles when due")
    p.add_argument("--min-sessions", type=int, default=1, help="new sessions to start a cycle")
    p.add_argument(
        "--period",
        type=float,
        default=86400.0,
        help="with --watch: also start after this many seconds if any session is new",
    )
    p.add_argument("--poll", type=float, default=60.0, help="with --watch: seconds between looks")
    p.add_argument("--registry", help="model registry (default: $FLYWHEEL_REGISTRY or XDG data)")
    p.add_argument("--telemetry-db", help="telemetry file (default: $FLYWHEEL_DB or XDG data)")
    p.add_argument("--work", help="cycle folders (default: $XDG_DATA_HOME/flywheel/cycles)")
    p.add_argument("--base", default="default", help="model to start an empty registry from")
    p.add_argument("--min-trajectories", type=int, default=1, help="new good trajectories for SFT")
    p.add_argument("--min-code-chars", type=int, default=20_000, help="new code for pretraining")
    p.add_argument(
        "--min-rl-tasks", type=int, default=4, help="replayable (plus synthetic) tasks for RL"
    )
    p.add_argument(
        "--rl-synthetic",
        type=int,
        default=0,
        help="synthetic tasks added to the RL stage's pool (default 0: logged tasks only)",
    )
    p.add_argument("--min-reward", type=float, default=0.5, help="reward a trajectory needs")
    p.add_argument(
        "--held-out-percent",
        type=float,
        default=10.0,
        help="sessions kept out of training for the benchmark (default 10)",
    )
    p.add_argument("--quick", action="store_true", help="tiny stages (a few steps): smoke tests")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="STAGE.KEY=VALUE",
        help="override a stage's recipe value, e.g. sft.steps=100 (repeatable)",
    )
    p.add_argument("--bench-projects", type=int, default=2, help="synthetic projects to score on")
    p.add_argument("--bench-tasks", type=int, default=8, help="benchmark tasks (held out)")
    p.add_argument("--bench-seed", type=int, default=0, help="benchmark sampling seed")
    p.add_argument(
        "--bench-max-steps",
        type=int,
        default=None,
        help="harness turns per benchmark task (default 6; --quick: 2)",
    )
    p.add_argument(
        "--bench-turn-tokens",
        type=int,
        default=None,
        help="output tokens per benchmark turn (default 256; --quick: 32)",
    )
    p.add_argument(
        "--no-oracle-logprob",
        action="store_true",
        help="gate on pass@1 only (no oracle log-probability score)",
    )
    p.add_argument(
        "--workspace",
        default="",
        help="a repository to learn: the completion lane runs when its code changed enough, "
        "or enough suggestions were logged",
    )
    p.add_argument(
        "--min-repo-chars",
        type=int,
        default=20_000,
        help="characters of new or changed code in --workspace for a repo stage",
    )
    p.add_argument(
        "--min-tab-suggestions",
        type=int,
        default=200,
        help="new suggestions logged with their code and outcome for completion RL alone",
    )
    p.add_argument(
        "--repo-exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="workspace files never read, beside telemetry's defaults (repeatable)",
    )
    p.add_argument(
        "--repo-lines", type=int, default=100, help="held-out completion lines the gate compares"
    )
    p.add_argument(
        "--repo-requests", type=int, default=50, help="simulated-user requests scored per version"
    )
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    return p


def _stage_overrides(pairs: list[str]) -> dict[str, dict[str, Any]]:
    from training.recipe import parse_overrides

    out: dict[str, dict[str, Any]] = {}
    for key, value in parse_overrides(pairs).items():
        stage, dot, name = key.partition(".")
        if not dot or stage not in STAGES:
            raise CycleError(f"--set {key}=...: use STAGE.KEY with STAGE in {sorted(STAGES)}")
        out.setdefault(stage, {})[name] = value
    return out


def _bench(args: argparse.Namespace) -> CycleBench:
    quick = QUICK_BENCH if args.quick else {}
    default = CycleBench()
    return CycleBench(
        projects=args.bench_projects,
        max_tasks=args.bench_tasks,
        seed=args.bench_seed,
        max_steps=args.bench_max_steps or quick.get("max_steps", default.max_steps),
        turn_max_tokens=args.bench_turn_tokens
        or quick.get("turn_max_tokens", default.turn_max_tokens),
        oracle_logprob=not args.no_oracle_logprob,
    )


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    env = dict(os.environ)
    try:
        config = CycleConfig(
            registry=str(path_from_cli(args.registry)),
            telemetry_db=str(db_path(args.telemetry_db, env)),
            work=args.work or str(data_home(env) / "cycles"),
            base=args.base,
            min_sessions=args.min_sessions,
            min_trajectories=args.min_trajectories,
            min_code_chars=args.min_code_chars,
            min_rl_tasks=args.min_rl_tasks,
            rl_synthetic=args.rl_synthetic,
            min_reward=args.min_reward,
            held_out_percent=args.held_out_percent,
            quick=args.quick,
            workspace=args.workspace,
            min_repo_chars=args.min_repo_chars,
            min_tab_suggestions=args.min_tab_suggestions,
            repo_exclude=tuple(args.repo_exclude),
            repo_lines=args.repo_lines,
            repo_requests=args.repo_requests,
            stages=_stage_overrides(args.set),
            bench=_bench(args),
            device=args.device,
            progress=True,
        )
        if not args.watch:
            summary = run_cycle(config, log=lambda line: print(line, flush=True))
            return 1 if summary["status"] == "rejected" else 0
        return _watch(config, args.period, args.poll)
    except CycleBusy as exc:
        print(f"flywheel cycle: {exc}", file=sys.stderr)
        return 3
    except (CycleError, RegistryError, GateError, ValueError, FileNotFoundError) as exc:
        print(f"flywheel cycle: {exc}", file=sys.stderr)
        return 2


def _workspace_due(config: CycleConfig, state: dict) -> str:
    """Why the completion lane calls for a cycle now (enough changed code, or enough logged
    suggestions), or ""."""
    from training.cycle.repo import completion_due

    try:
        work, _ = completion_due(config, state)
    except ValueError as exc:  # the workspace cannot be read now: say so, keep watching
        print(f"flywheel cycle: {exc}", file=sys.stderr, flush=True)
        return ""
    if "repo" in work.stages:
        return f"{work.changed} characters of {config.workspace} new or changed"
    if work.stages:
        return f"{work.suggestions} new suggestions logged with their outcome"
    return ""


def _watch(config: CycleConfig, period_s: float, poll_s: float) -> int:
    if poll_s <= 0:
        raise CycleError("--poll must be > 0 seconds")
    print(
        f"flywheel cycle: watching {config.telemetry_db} (a cycle at {config.min_sessions} new "
        f"session(s) or every {period_s:g} s)",
        flush=True,
    )
    while True:
        state = load_state(Path(config.work))
        try:
            _, fresh, _ = new_sessions(config.telemetry_db, state["watermark"])
        except CycleError as exc:
            print(f"flywheel cycle: {exc}", file=sys.stderr, flush=True)
            fresh = 0
        reason = due(state, fresh, time.time(), config.min_sessions, period_s)
        if not reason and config.workspace:
            reason = _workspace_due(config, state)
        if reason:
            print(f"flywheel cycle: starting ({reason})", flush=True)
            try:
                run_cycle(
                    dataclasses.replace(config, min_sessions=1),
                    log=lambda line: print(line, flush=True),
                )
            except CycleBusy as exc:
                print(f"flywheel cycle: {exc}", file=sys.stderr, flush=True)
            except Exception as exc:  # keep watching; the failed cycle is recorded
                print(f"flywheel cycle: the cycle failed: {exc}", file=sys.stderr, flush=True)
        time.sleep(poll_s)  # the watch loop's pace, not a wait for an event
