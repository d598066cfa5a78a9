"""One measured RL run: does RL raise the agent's held-out pass@1, and by how much, with what certainty.

    tasks     the synthetic tasks of training/tasks (`generate_tasks`) and the real-code tasks of
              training/tasks/real.py, both splits, in one tasks.jsonl under `--work` (or the
              `--tasks` folder given); the held-out tasks alternate between the two sources, so
              the recipe's `eval_tasks` takes both kinds whatever its size
    run       `train_rl` with the recipe (recipes/rl_gpu.toml), `init` = `--model`, on `--device`:
              a held-out evaluation at the start (`eval_samples` samples per task, fixed seeds),
              updates until `steps` or the wall-clock `budget_s`, the same evaluation at the end
    report    --out/result.json: the device, the software, the recipe, each phase's seconds, the
              held-out pass@1 and pass@k before and after, each with a 95% interval, and the
              paired difference after - before with its 95% interval (a paired bootstrap over
              tasks: the same tasks and seeds before and after, so each task's difference is
              resampled whole), also per source; the curves (rewards.png, lengths.png,
              outcomes.png: reward, length, diversity, failure modes), metrics.jsonl and the
              log beside it

The paired interval answers the question; the unpaired ones say where each end lies. pass@k is
the unbiased estimator from `eval_samples` samples (agent/stats.py), so k = `eval_samples`.

`--out` receives a handful of files only; checkpoints and pushed weights (a 0.5B model's are
about a gigabyte each) stay in `--work`. What it does not do: bring the model to the machine
(`--model` is a folder, made there or carried by whoever runs it), or choose the sizes (the
recipe's header says how they were chosen).

    python -m training.rl.measured_run --model MODEL_DIR --out runs/rl-gpu --device cuda
    make rl-gpu MODEL=MODEL_DIR          # the same on a lent GPU machine, image checked first
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

RESAMPLES = 10_000  # bootstrap resamples per interval
REPORT_FILES = ("metrics.jsonl", "rewards.png", "lengths.png", "outcomes.png")
REAL_PROJECT = "real:"  # project prefix of the real-code tasks (their source, in the report)


class MeasuredRunError(RuntimeError):
    """The run cannot start or finish; the message is one actionable line."""


# --- tasks ------------------------------------------------------------------------------------


def real_code_tasks(rows: list[dict]) -> list:
    """training/tasks/real.py rows as `Task`s (what the RL environment reads)."""
    from training.tasks.task import Task

    tasks = []
    for row in rows:
        bench = row["task"]
        tasks.append(
            Task(
                bench["id"],
                bench["family"],
                REAL_PROJECT + row["module"],
                row["split"],
                bench["instruction"],
                {**bench["files"], **bench.get("verify_files", {})},
                row["solution"],
                test_command=bench["verify"],
            )
        )
    return tasks


def alternate(*sources: list) -> list:
    """One list taking from each source in turn: [a0, b0, a1, b1, ...], the rest at the end."""
    out = []
    for i in range(max((len(s) for s in sources), default=0)):
        out += [s[i] for s in sources if i < len(s)]
    return out


def build_tasks(
    folder: Path, projects: int, real: str, seed: int, log: Callable[[str], None]
) -> Path:
    """folder/tasks.jsonl: synthetic tasks from `projects` projects and the real-code set
    (`real`: a folder written by `python -m training.tasks.real build --out`, "build" to build it
    here, "none" to leave it out)."""
    from training.tasks.generation import default_workers, generate_tasks

    workers = default_workers()
    synthetic = generate_tasks(projects, seed=seed, heldout_fraction=0.5, workers=workers)
    code: list = []
    if real != "none":
        from training.tasks.real import build, read_rows, write_set

        if real == "build":
            log(f"building the real-code tasks in {workers} processes")
            real = str(write_set(folder / "real", *build(seed, workers=workers)))
        code = real_code_tasks(read_rows(real))
    parts = {
        split: alternate(
            [t for t in synthetic if t.split == split], [t for t in code if t.split == split]
        )
        for split in ("heldout", "train")
    }
    folder.mkdir(parents=True, exist_ok=True)
    rows = [asdict(t) for split in ("heldout", "train") for t in parts[split]]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log(
        f"tasks: {len(parts['train'])} train, {len(parts['heldout'])} held out "
        f"({len(synthetic)} synthetic, {len(code)} real-code) in {folder}"
    )
    return folder


# --- the report -------------------------------------------------------------------------------


def per_task_scores(record: dict, k: int) -> dict[str, tuple[float, float]]:
    """task id -> (pass@1, pass@k) from an evaluation record's per-task counts."""
    from agent.stats import pass_at_k

    return {
        row["id"]: (row["passed"] / row["n"], pass_at_k(row["n"], row["passed"], min(k, row["n"])))
        for row in record["per_task"]
        if row["n"]
    }


def paired(
    before: dict[str, float], after: dict[str, float], seed: int = 0
) -> dict[str, float | int]:
    """Means before and after, and after - before with a 95% paired-bootstrap interval, over the
    tasks scored both times (each task's difference is one resampled unit)."""
    import numpy as np

    from agent.stats import bootstrap_interval

    ids = sorted(set(before) & set(after))
    if not ids:
        return {"tasks": 0}
    b = np.array([before[i] for i in ids])  # [tasks]
    a = np.array([after[i] for i in ids])  # [tasks]
    out: dict[str, float | int] = {"tasks": len(ids)}
    for name, values in (("before", b), ("after", a), ("delta", a - b)):
        lo, hi = bootstrap_interval(values, RESAMPLES, seed)
        out[name] = round(float(values.mean()), 4)
        out[f"{name}_lo"], out[f"{name}_hi"] = round(lo, 4), round(hi, 4)
    out["tasks_better"] = int((a > b).sum())
    out["tasks_worse"] = int((a < b).sum())
    return out


def compare(first: dict, last: dict, k: int, sources: dict[str, str]) -> dict:
    """pass@1 and pass@k before -> after, overall and per task source."""
    b, a = per_task_scores(first, k), per_task_scores(last, k)
    result: dict = {}
    for source in ["all", *sorted(set(sources.values()))]:
        keep = [i for i in b if source == "all" or sources.get(i) == source]
        result[source] = {
            "pass@1": paired({i: b[i][0] for i in keep}, {i: a[i][0] for i in a if i in keep}),
            f"pass@{k}": paired({i: b[i][1] for i in keep}, {i: a[i][1] for i in a if i in keep}),
        }
    return result


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"{platform.machine()} CPU, {os.cpu_count()} cores ({platform.processor() or 'cpu'})"


def software() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "peft", "langgraph"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out


def report(run: Path, out: Path, recipe, phases: dict[str, float], tasks: Path) -> dict:
    """result.json (and the curves and metrics beside it) in `out`; returns the result."""
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    evals = [r for r in records if r["kind"] == "eval" and "per_task" in r]
    train = [r for r in records if r["kind"] == "train"]
    if not evals:
        raise MeasuredRunError(
            f"no held-out evaluation in {run / 'metrics.jsonl'}: check that {tasks} has held-out "
            "tasks whose verifier runs (the log says which were skipped)"
        )
    rows = [json.loads(x) for x in (tasks / "tasks.jsonl").read_text().splitlines() if x]
    sources = {
        r["id"]: "real-code" if r["project"].startswith(REAL_PROJECT) else "synthetic" for r in rows
    }
    k = recipe.eval_samples
    first, last = evals[0], evals[-1]
    result = {
        "device": device_name(recipe.device),
        "software": software(),
        "model": recipe.init,
        "recipe": recipe.to_dict(),
        "seconds": {key: round(value, 1) for key, value in phases.items()},
        "updates": last["step"],
        "budget_s": recipe.budget_s,
        "trajectories_trained_on": sum(r.get("trained_trajectories", 0) for r in train),
        "eval": {
            "tasks": first["tasks"],
            "samples_per_task": k,
            "before_step": first["step"],
            "after_step": last["step"],
            "outcomes_before": first.get("outcomes", {}),
            "outcomes_after": last.get("outcomes", {}),
        },
        "held_out": compare(first, last, k, sources),
        "last_update": {key: v for key, v in (train[-1] if train else {}).items() if key != "kind"},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    for name in REPORT_FILES:
        if (run / name).exists() and run.resolve() != out.resolve():
            shutil.copy(run / name, out / name)
    return result


def summary_lines(result: dict, k: int) -> list[str]:
    lines = [f"device: {result['device']}; updates: {result['updates']}"]
    for source, scores in result["held_out"].items():
        for metric in ("pass@1", f"pass@{k}"):
            s = scores[metric]
            if not s.get("tasks"):
                continue
            lines.append(
                f"{source:>9} {metric:<7} {s['before']:.3f} -> {s['after']:.3f}  "
                f"delta {s['delta']:+.3f} [{s['delta_lo']:+.3f}, {s['delta_hi']:+.3f}] "
                f"over {s['tasks']} tasks"
            )
    return lines


# --- the command ------------------------------------------------------------------------------


def measured_run(args: argparse.Namespace, log: Callable[[str], None]) -> dict:
    import torch

    from training.recipe import RecipeError, parse_overrides
    from training.rl import load_rl_recipe, train_rl
    from training.trainer import TrainingError

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise MeasuredRunError(
            f"--device {args.device} but torch {torch.__version__} sees no CUDA device: run on "
            "the GPU machine, or pass --device cpu"
        )
    from agent.engine import EngineError
    from agent.model import checkpoint_folder

    try:
        model = checkpoint_folder(args.model)  # "base", "default" or a folder
    except EngineError as exc:
        raise MeasuredRunError(f"--model {args.model}: {exc}") from None
    work, out = Path(args.work), Path(args.out)
    t0 = time.monotonic()
    tasks = Path(args.tasks) if args.tasks else None
    if tasks is None:
        try:
            tasks = build_tasks(work / "tasks", args.projects, args.real, args.seed, log)
        except FileNotFoundError as exc:  # --real names a folder without the set
            raise MeasuredRunError(str(exc)) from None
    phases = {"tasks": time.monotonic() - t0}
    overrides = parse_overrides(args.set)
    overrides.update(init=str(model), out=str(work / "run"), device=args.device)
    overrides["tasks"] = str(tasks)
    try:
        recipe = load_rl_recipe(args.recipe, overrides)
        t1 = time.monotonic()
        train_rl(recipe, resume=False, log=log)
    except (RecipeError, TrainingError, FileNotFoundError) as exc:  # FileNotFoundError: --tasks
        raise MeasuredRunError(str(exc)) from None
    phases["rl"] = time.monotonic() - t1
    phases["total"] = time.monotonic() - t0
    result = report(work / "run", out, recipe, phases, tasks)
    for line in summary_lines(result, recipe.eval_samples):
        log(line)
    log(f"result: {out / 'result.json'}")
    return result


def parser() -> argparse.ArgumentParser:
    from agent.model import add_model_argument

    p = argparse.ArgumentParser(
        prog="python -m training.rl.measured_run", description=__doc__.split("\n")[0]
    )
    add_model_argument(p, required=True, servers=False, role="the model to start from")
    p.add_argument("--out", required=True, help="folder for result.json, the curves, the log")
    p.add_argument("--work", default=None, help="checkpoints and tasks (default: OUT/work)")
    p.add_argument("--device", default="cuda", help="torch device (cuda, cuda:1, cpu)")
    p.add_argument("--recipe", default="training/recipes/rl_gpu.toml", help="RL recipe TOML")
    p.add_argument("--tasks", default=None, help="a tasks folder to use instead of building one")
    p.add_argument("--projects", type=int, default=16, help="synthetic projects to build tasks of")
    p.add_argument(
        "--real", default="build", help="real-code tasks: a folder, 'build' (here) or 'none'"
    )
    p.add_argument("--seed", type=int, default=0, help="task generation seed")
    p.add_argument("--set", action="append", default=[], help="recipe override key=value")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.work = args.work or str(Path(args.out) / "work")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "log.txt").open("w") as log_file:

        def log(line: str) -> None:
            print(line, flush=True)
            log_file.write(line + "\n")
            log_file.flush()

        try:
            measured_run(args, log)
        except MeasuredRunError as exc:
            log(f"error: {exc}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
