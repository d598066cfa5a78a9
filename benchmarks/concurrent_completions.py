"""Benchmark: k editor completions sent at once, with the engine on its own thread or not.

Each case runs in a fresh process (`benchmarks.engine.serving.concurrent_completions_fresh`, what `flywheel
bench engine`'s *concurrent completions* workload runs too, with the engine on its own thread):

- `own-thread`: `EngineConfig(own_thread=True)` (what `flywheel lsp` and `flywheel serve` use):
  the weights load and every step runs on the engine's thread, whose loop batches the requests'
  steps; the callers only wait;
- `callers-threads`: the engine without its thread: each request runs on its caller's thread,
  one priority lock around every forward call, each step alone.

Each prints the p50 latency of one completion alone and of k sent together (16 greedy tokens
each, on k distinct prompts of the same length: the last *free* prompt of `flywheel bench
engine`, shifted by one token per editor), and their ratio (the target: <= 1.5).

    .venv/bin/python benchmarks/concurrent_completions.py --model default --dtype int8 \
        --json benchmarks/results/concurrent-completions.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python benchmarks/concurrent_completions.py` imports benchmarks

CASES = ("callers-threads", "own-thread")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from agent.model import add_model_argument

    add_model_argument(parser, servers=False)
    parser.add_argument("--dtype", default="int8", help="float32 or int8 (the product's default)")
    parser.add_argument("--concurrent", type=int, default=4, help="completions sent at once")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of alone + together")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every case, interleaved")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from agent.model import checkpoint_folder, tokenizer_folder
    from benchmarks.engine.serving import concurrent_completions_fresh
    from benchmarks.engine.workloads import workloads

    folder = checkpoint_folder(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder(folder)))
    free = [item for item in workloads(tokenizer) if item["workload"] == "free"][-1]
    runs: dict[str, list[dict]] = {case: [] for case in CASES}
    for round_ in range(args.rounds):
        for case in CASES:
            result = concurrent_completions_fresh(
                args.model,
                args.dtype,
                free["prompt_ids"],
                args.concurrent,
                args.repeats,
                args.threads,
                own_thread=case == "own-thread",
            )
            runs[case].append(result)
            print(
                f"round {round_ + 1} {case:16} alone p50 {result['alone_p50_ms']:7.0f} ms   "
                f"{args.concurrent} together p50 {result['concurrent_p50_ms']:7.0f} ms   "
                f"ratio {result['ratio']:.2f}",
                flush=True,
            )
    summary = {
        case: {
            "alone_p50_ms": [r["alone_p50_ms"] for r in results],
            "concurrent_p50_ms": [r["concurrent_p50_ms"] for r in results],
            "ratio": [r["ratio"] for r in results],
        }
        for case, results in runs.items()
    }
    print(f"\n{'case':16} {'alone p50 ms':>14} {'together p50 ms':>16} {'ratio':>12}")
    for case, row in summary.items():
        alone = "/".join(f"{v:.0f}" for v in row["alone_p50_ms"])
        together = "/".join(f"{v:.0f}" for v in row["concurrent_p50_ms"])
        ratio = "/".join(f"{v:.2f}" for v in row["ratio"])
        print(f"{case:16} {alone:>14} {together:>16} {ratio:>12}")
    if args.json:
        record = {
            "benchmark": "concurrent_completions",
            "command": "python "
            + " ".join(["benchmarks/concurrent_completions.py", *sys.argv[1:]]),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "python": platform.python_version()},
            "settings": vars(args),
            "target": "concurrent p50 <= 1.5x alone",
            "cases": summary,
        }
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
