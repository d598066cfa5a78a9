"""Benchmark: asynchronous vs synchronous RL, trajectories per minute, in one run.

What it measures, where it runs: the toy RL recipe ("say the magic token", training/rl) run
twice with the same settings, first synchronous (staleness 0: generate a batch, update, push the
weights, repeat), then asynchronous (rollouts keep running while the trainer updates; samples
more than `--staleness` versions old are refused). Rollouts run in `--workers` spawned worker
processes (runtime "processes"), each with its own local engine and one torch thread; the
trainer runs in this process. Each rollout samples `--tokens` tokens so generation costs about
as much as an update (the reward still judges the first token).

Trajectories per minute are counted over the steady part of each run: from the first update to
the last (worker start-up and the initial evaluation excluded). Also reported: the groups refused
for staleness and the admitted samples over the bound (which must be 0).
The target: async >= 1.3x sync.

    .venv/bin/python benchmarks/rl_throughput.py [--steps 12] [--tokens 24] [--workers 1]
        [--staleness 2] [--init CHECKPOINT] [--json benchmarks/results/rl_throughput.json]

Without --init it builds a ~0.6M-parameter checkpoint (1,024-token tokenizer trained on the
standard library's json package), as the tests do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.record import machine, write_json  # noqa: E402


def tiny_checkpoint(folder: Path) -> Path:
    from agent.model import build_trunk, save_checkpoint
    from agent.tokenizer import iter_source_texts, train_tokenizer

    stdlib = Path(sys.base_prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    tokenizer = train_tokenizer(iter_source_texts(stdlib / "json", 2_000_000), vocab_size=1024)
    trunk = build_trunk("test", vocab_size=len(tokenizer), seed=0)
    return save_checkpoint(folder, trunk, tokenizer, meta={"version": "bench-tiny"})


def run(mode: str, args, init: Path, work: Path) -> dict:
    from training.rl import train_rl
    from training.rl.recipe import rl_recipe_from_dict

    out = work / mode
    recipe = rl_recipe_from_dict(
        dict(
            name=f"bench-{mode}",
            out=str(out),
            init=str(init),
            env="magic",
            max_tokens=args.tokens,
            group_size=8,
            tasks_per_step=4,
            steps=args.steps,
            lr=1e-3,  # slow learning: every group keeps its signal, no early stop
            loss_tokens=1,
            rewards={"task_success@1": 1.0},
            mode=mode,
            max_staleness=args.staleness if mode == "async" else 0,
            runtime="processes",
            workers=args.workers,
            worker_threads=1,
            eval_tasks=1,
            eval_samples=2,
            save_every=10_000,
            max_idle_groups=10_000,
        )
    )
    t0 = time.monotonic()
    train_rl(recipe, resume=False, progress=False, log=lambda line: None)
    wall = time.monotonic() - t0
    train = [
        r
        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    ]
    first, last = train[0], train[-1]
    span = last["t"] - first["t"]
    done = last["trajectories"] - first["trajectories"]
    return {
        "mode": mode,
        "updates": len(train),
        "trajectories": last["trajectories"],
        "steady_trajectories": done,
        "steady_s": round(span, 2),
        "trajectories_per_min": round(done / span * 60, 1) if span > 0 else 0.0,
        "wall_s": round(wall, 1),
        "refused_stale": last["refused_stale"],
        "admitted_over_bound": last["admitted_over_bound"],
        "staleness_max": max(r["staleness_max"] for r in train),
        "mean_update_s": round(sum(r["update_s"] for r in train) / len(train), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="updates per mode")
    parser.add_argument("--tokens", type=int, default=24, help="tokens sampled per rollout")
    parser.add_argument("--workers", type=int, default=1, help="rollout worker processes")
    parser.add_argument("--staleness", type=int, default=2, help="async max_staleness")
    parser.add_argument("--init", default="", help="checkpoint to start from (default: tiny)")
    parser.add_argument("--json", default="benchmarks/results/rl_throughput.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flywheel-rl-bench-") as tmp:
        work = Path(tmp)
        init = Path(args.init) if args.init else tiny_checkpoint(work / "init")
        rows = [run(mode, args, init, work) for mode in ("sync", "async")]
    speedup = rows[1]["trajectories_per_min"] / max(rows[0]["trajectories_per_min"], 1e-9)
    header = f"{'mode':<6} {'updates':>7} {'traj/min':>9} {'steady s':>8} {'refused':>7} {'over bound':>10} {'max stale':>9}"  # fmt: skip
    print(header)
    for r in rows:
        print(f"{r['mode']:<6} {r['updates']:>7} {r['trajectories_per_min']:>9.0f} "
              f"{r['steady_s']:>8.1f} {r['refused_stale']:>7} {r['admitted_over_bound']:>10} "
              f"{r['staleness_max']:>9}")  # fmt: skip
    print(f"async / sync trajectories per minute: {speedup:.2f}x (target >= 1.3x)")
    report = {
        "benchmark": "rl_throughput",
        "machine": machine(cpus=os.cpu_count()),
        "settings": vars(args),
        "results": rows,
        "speedup": round(speedup, 3),
        "target": 1.3,
    }
    if args.json:
        write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
