"""The cycle's RL stage: verifiable tasks mined from logged sessions, plus synthetic ones.

pool    training/rl/mining.py replays the export's tasks: a task is kept when its verify
        command fails on the starting files and passes on the session's end state; the
        report counts the others by reason. Tasks an earlier cycle trained on are not new.
        With `rl_synthetic` N, N synthetic tasks join them (projects seeded apart from the
        benchmark's, so the gate still scores on tasks no stage saw).
train   `flywheel train rl` (training/rl) with recipes/cycle/rl.toml, from the model the
        earlier stages made, on the pool; the curriculum skips tasks that are always or never
        solved, and the run stops early when none is left to learn from.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

SYNTHETIC_SEED = 31  # the synthetic pool's projects (the benchmark's seed is CycleBench.task_seed)


def rl_pool(
    folder: Path, export: Path, used: set[str], synthetic: int, log: Callable[[str], None]
) -> tuple[Path, dict[str, Any], list[str]]:
    """FOLDER/rl_tasks.jsonl: the new mined tasks and `synthetic` generated ones. Returns its
    path, the summary (what the logs yielded, what was dropped and why) and the mined ids."""
    from training.cycle import _jsonl
    from training.rl.mining import REASONS, mine

    report = mine(export, folder / "mined")
    rows = _jsonl(folder / "mined" / "mined.jsonl")
    mined = [r for r in rows if r["id"] not in used]
    log(
        f"RL tasks: {report['kept']} of {report['logged_tasks']} logged tasks replay "
        f"({len(mined)} new)"
    )
    for reason, count in report["dropped"].items():
        log(f"  dropped {count}: {REASONS[reason]}")
    pool = list(mined)
    if synthetic:
        from training.tasks.generation import generate_tasks

        tasks = generate_tasks(max(1, synthetic // 6 + 1), seed=SYNTHETIC_SEED, heldout_fraction=0)
        pool += [
            {
                "id": t.id,
                "family": t.family,
                "instruction": t.instruction,
                "workspace": t.files,
                "verify": t.test_command,
            }
            for t in tasks[:synthetic]
        ]
    path = folder / "rl_tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in pool))
    summary = {
        "logged_tasks": report["logged_tasks"],
        "replayed": report["kept"],
        "new": len(mined),
        "synthetic": len(pool) - len(mined),
        "dropped": report["dropped"],
    }
    return path, summary, [r["id"] for r in rows]


def train_rl_stage(recipe, progress: bool, log: Callable[[str], None]) -> tuple[Path, int]:
    """Run the stage's RL recipe (its `tasks` is the pool) to its end: the final model folder
    and the number of updates made (0 when no group had a learning signal)."""
    from training.rl import train_rl

    model = train_rl(recipe, resume=False, progress=progress, log=log)
    return model, json.loads((model / "flywheel.json").read_text())["step"]
