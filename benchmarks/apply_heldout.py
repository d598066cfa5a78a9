"""Benchmark: fast apply on held-out real files, for one or more models in one run.

Each example (training/code_apply.py, the rows with split "heldout": files of the standard
library no training example came from) is an original file, an edit sketch and the whole updated
file. Each model answers the engine's fast-apply conversation greedily (a fast-apply request: the
model folder's apply/ adapter where it has one), with n-gram drafts from
the original file (lossless: the output is plain greedy decoding's). Reported per model: how
many answers are the expected file exactly, the mean difflib similarity to it, and output
tokens/s.

    flywheel train apply --out runs/x/apply_code.jsonl --count 5000
    .venv/bin/python benchmarks/apply_heldout.py --model default --model runs/x/model \\
        --examples runs/x/apply_code.jsonl --limit 12 --json benchmarks/results/apply-heldout.json
    .venv/bin/python benchmarks/apply_heldout.py --model default --copy-bias 0 --copy-bias 5 \\
        --examples runs/x/apply_code.jsonl --dtype int8    # the copy bias off and on
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

    add_model_argument(parser, required=True, repeat=True, servers=False)
    parser.add_argument("--examples", required=True, help="JSONL from `flywheel train apply`")
    parser.add_argument("--limit", type=int, default=12, help="held-out examples")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--copy-bias",
        type=float,
        action="append",
        help="fast apply's copy bias (agent/engine/local/copy_bias.py); repeat to compare "
        "(default: the engine's)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    import torch

    from agent.engine.config import APPLY_COPY_BIAS
    from training.evaluate import evaluate_apply

    torch.set_num_threads(args.threads)
    biases = args.copy_bias or [APPLY_COPY_BIAS]
    results = {}
    for model in args.model:
        for bias in biases:
            name = model if len(biases) == 1 else f"{model} bias {bias:g}"
            try:
                results[name] = evaluate_apply(
                    model, args.examples, args.limit, args.dtype, copy_bias=bias
                )
            except ValueError as exc:
                print(exc, file=sys.stderr)
                return 1
            results[name]["copy_bias"] = bias
    print(f"\n{'model':32} {'exact':>8} {'similarity':>11} {'tok/s':>7}")
    for model, r in results.items():
        exact = f"{r['exact']}/{r['examples']}"
        print(f"{model:32} {exact:>8} {r['mean_similarity']:>11.3f} {r['tokens_per_s']:>7.1f}")
    if args.json:
        record = {
            "benchmark": "apply_heldout",
            "command": "python " + " ".join(["benchmarks/apply_heldout.py", *sys.argv[1:]]),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "python": platform.python_version()},
            "settings": vars(args),
            "models": results,
        }
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
