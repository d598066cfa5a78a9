"""The cycle's repository stage: learn the user's workspace when its code has changed enough.

due       the workspace (`CycleConfig.workspace`) is read as `flywheel train repo` reads it
          (training/repo_files.py: consent, exclusions, .gitignore, size limits, redaction); the
          characters of files that are new or changed since the last cycle that trained on it
          (a sha256 per file in WORK/state.json) must reach `min_repo_chars`
train     the `repo` stage (training/repo_pretrain.py) with recipes/cycle/repo.toml, from the
          promoted version, on the files' train split; the split is recorded in the cycle folder
benchmark candidate and parent on the split's held-out files (training/repo_eval.py: held-out
          perplexity per file and exact single-line completion); the parent is scored only when
          it has no result on the same task set. The gate (agent/gate.py) then judges this set
          beside the agent benchmark's, and rejects a candidate worse on either.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any


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


def train_repo_stage(config, files, current: str, folder: Path) -> tuple[Path, dict, Path]:
    """The repo stage from `current`; returns (model folder, recipe, data folder)."""
    from training.cycle import _train
    from training.repo_pretrain import write_repo_data

    data = folder / "repo_data"
    write_repo_data(files, data)
    model, recipe = _train("repo", current, folder / "repo", config, data=str(data))
    return model, recipe, data


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
