"""Benchmark: one RL group of harness rollouts, its samples one after another or all at once.

What RL spends its time on is rollouts: a group of G samples of one task, each a whole agent
run through the product's harness (training/rl/environments.py `HarnessEnv`). Both ways here use
the engine as a rollout worker opens it (local, on its own thread, float32, the prefix cache on):
- `sequential`: the samples one after another (`HarnessEnv(concurrent=False)`), each turn
  decoding alone;
- `concurrent`: all G samples at once, each on a thread of its own; the engine's thread batches
  their decode steps into one pass and the first sample's prefill of the shared prompt serves
  the others (agent/engine/scheduler.py, batched.py).

Per task and mode: wall seconds for the group, output tokens sampled, model turns, samples that
passed, and output tokens per second; the modes alternate which goes first. Samples use the same
seeds both ways, but the outputs need not match token for token: a batched pass rounds
differently, and a sampled token can flip at a near-tie.

    .venv/bin/python benchmarks/rl_group_rollout.py --model default --tasks runs/base/tasks \
        --count 2 --group 4 --json benchmarks/results/rl-group-rollout.json
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.record import machine, write_json  # noqa: E402

MODES = ("sequential", "concurrent")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from agent.model import add_model_argument

    add_model_argument(p, servers=False)
    p.add_argument("--tasks", default="runs/base/tasks", help="`flywheel train tasks` output")
    p.add_argument("--split", default="train")
    p.add_argument("--count", type=int, default=2, help="tasks (groups) per mode")
    p.add_argument("--group", type=int, default=4, help="samples per group")
    p.add_argument("--max-turns", type=int, default=6)
    p.add_argument("--turn-max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--wall-s", type=float, default=600.0, help="the harness's limit per rollout")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()

    from transformers import AutoTokenizer

    from agent.engine import EngineConfig, open_engine
    from agent.model import checkpoint_folder, tokenizer_folder
    from training.rl.environments import HarnessEnv, load_rl_tasks

    try:
        tasks = load_rl_tasks(args.tasks, args.split)
    except FileNotFoundError as exc:
        print(exc)
        return 2
    env = HarnessEnv(
        args.tasks,
        max_turns=args.max_turns,
        turn_max_tokens=args.turn_max_tokens,
        temperature=args.temperature,
        wall_s=args.wall_s,
    )
    tasks = [task for task in tasks if not env.check(task)][: args.count]
    if not tasks:
        print(f"no usable {args.split} tasks in {args.tasks}")
        return 2
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder(checkpoint_folder(args.model))))
    engine = open_engine(EngineConfig(model=args.model, backend="local", own_thread=True))

    rows = []
    for i, task in enumerate(tasks):
        order = MODES if i % 2 == 0 else MODES[::-1]
        for mode in order:
            env.concurrent = mode == "concurrent"
            engine._model.prefix_cache.clear()  # each group starts cold, as a new task does
            start = time.perf_counter()
            group = env.rollout(engine, tokenizer, task, args.group, args.seed + 100 * i)
            seconds = time.perf_counter() - start
            tokens = sum(len(turn.output_ids) for traj in group for turn in traj.turns)
            row = dict(
                task=task.id,
                mode=mode,
                seconds=seconds,
                output_tokens=tokens,
                turns=sum(len(traj.turns) for traj in group),
                passed=sum(traj.passed for traj in group),
                errors=[traj.error for traj in group if traj.error],
                tokens_per_s=tokens / seconds,
            )
            rows.append(row)
            print(
                f"{task.id:28} {mode:10} {seconds:7.1f} s  {tokens:5d} tokens  "
                f"{row['turns']:3d} turns  {row['passed']}/{args.group} passed  "
                f"{row['tokens_per_s']:5.1f} tok/s",
                flush=True,
            )
    engine.close()

    totals = {
        mode: {
            "seconds": sum(r["seconds"] for r in rows if r["mode"] == mode),
            "output_tokens": sum(r["output_tokens"] for r in rows if r["mode"] == mode),
        }
        for mode in MODES
    }
    for total in totals.values():
        total["tokens_per_s"] = total["output_tokens"] / total["seconds"]
    ratio = totals["concurrent"]["tokens_per_s"] / totals["sequential"]["tokens_per_s"]
    print(f"\n{'mode':12} {'seconds':>8} {'tokens':>7} {'tok/s':>6}")
    for mode in MODES:
        t = totals[mode]
        print(f"{mode:12} {t['seconds']:8.1f} {t['output_tokens']:7d} {t['tokens_per_s']:6.1f}")
    print(f"concurrent / sequential output tokens per second: {ratio:.2f}x")
    if args.json:
        result = dict(
            benchmark="rl_group_rollout",
            command="python benchmarks/rl_group_rollout.py " + " ".join(sys.argv[1:]),
            date=datetime.datetime.now().isoformat(timespec="seconds"),
            machine=machine(),
            settings=vars(args),
            rows=rows,
            totals=totals,
            concurrent_vs_sequential_tokens_per_s=ratio,
        )
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
