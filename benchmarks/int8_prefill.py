"""Benchmark: the agent under int8 decoding with its prefill in bfloat16 against float32.

On a CPU with fast bfloat16 products, `Int8Linear` multiplies long inputs (prefill) by a
bfloat16 copy of the weights instead of float32 (agent/engine/local/model_runner.py). This runs the
agent on the same held-out tasks both ways in one process (`flywheel train eval`'s
`evaluate_agent`, greedy, int8) and reports pass@1, the tasks only one way solves, and the time.

    flywheel train tasks --out runs/base/tasks --projects 160 --seed 0
    .venv/bin/python benchmarks/int8_prefill.py --model default --tasks runs/base/tasks \\
        --limit 27 --json benchmarks/results/int8-prefill-agent.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from agent.model import add_model_argument

    add_model_argument(parser, servers=False)
    parser.add_argument("--tasks", required=True, help="folder from `flywheel train tasks`")
    parser.add_argument("--limit", type=int, default=27, help="held-out tasks")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    from agent.engine.local import model_runner
    from training.evaluate import EvalConfig, evaluate_agent

    if not model_runner.bf16_matmul_is_fast():
        print("this CPU has no fast bfloat16 products: prefill stays float32", file=sys.stderr)
    runs = {}
    for prefill in ("bfloat16", "float32"):
        model_runner.bf16_matmul_is_fast = lambda fast=prefill == "bfloat16": fast
        report = evaluate_agent(
            args.model, args.tasks, EvalConfig(limit=args.limit, dtype="int8"), log=lambda _: None
        ).to_dict()
        runs[prefill] = report
        print(f"prefill {prefill:9} pass@1 {report['pass_at_1']:.1%} in {report['seconds']:.0f} s")
    solved = {k: {r["task_id"] for r in v["results"] if r["passed"]} for k, v in runs.items()}
    only = {
        k: sorted(solved[k] - solved[other])
        for k, other in (("bfloat16", "float32"), ("float32", "bfloat16"))
    }
    print(
        f"solved by both {len(solved['bfloat16'] & solved['float32'])}, "
        f"only bfloat16 {len(only['bfloat16'])}, only float32 {len(only['float32'])}"
    )
    if args.json:
        record = {
            "benchmark": "int8_prefill",
            "command": "python " + " ".join(["benchmarks/int8_prefill.py", *sys.argv[1:]]),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "python": platform.python_version()},
            "settings": vars(args),
            "prefill": {
                k: {
                    key: v[key]
                    for key in ("pass_at_1", "tasks", "parse_rate", "by_family", "seconds")
                }
                for k, v in runs.items()
            },
            "only_solved_with": only,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
