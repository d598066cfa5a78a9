"""The median of each engine figure over several `flywheel bench engine` result files.

One run of `flywheel bench engine` reports its targets' ratios (each the best of its repeats);
on a busy machine those move from run to run, so benchmarks/README.md quotes the median
over the runs of one command on one model version, next to the latest run. This prints a table:
one column per file, then the median.

    python benchmarks/medians.py benchmarks/results/engine-peers-default-int8-2026-12-04-int8-prefill.json \\
        benchmarks/results/engine-peers-default-int8-2026-12-04-prefetch-tree.json \\
        benchmarks/results/engine-peers-default-int8-2026-12-05-exact.json

It refuses files whose command settings or model version differ: their median would mix two
experiments.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

TARGETS = {  # figure -> (target in the result's "targets", field)
    "plain / HF generate float32": ("plain_vs_hf_greedy", "ratio"),
    "verify over 4 drafts / decode step": ("verify4_vs_decode_step", "ratio"),
    "MTP head step / decode step": ("mtp_head_cost", "ratio"),
    "free text, MTP / plain": ("mtp_free_text", "ratio"),
    "free text, MTP acceptance length": ("mtp_free_text", "mean_acceptance_length"),
    "agent's next turn, TTFT warm / cold": ("agent_turn", "ratio"),
    "RL group of 8 / one by one": ("rl_group", "ratio"),
    "4 concurrent / one alone, p50": ("concurrent_completions", "ratio"),
    "cold completion / llama.cpp's, time": ("cold_completion", "ratio"),
}
ROWS = {  # figure -> ((workload, method), (workload, method)): the first's tokens/s over the second's
    "apply, ngram / our plain": (("apply", "ngram"), ("apply", "plain")),
    "apply, vLLM ngram / vLLM plain": (("apply", "vllm-ngram"), ("apply", "vllm")),
    "apply, ngram / llama.cpp plain": (("apply", "ngram"), ("apply", "llamacpp")),
    "free text, plain / llama.cpp plain": (("free", "plain"), ("free", "llamacpp")),
    "free text, ngram / llama.cpp plain": (("free", "ngram"), ("free", "llamacpp")),
    "free text, MTP / llama.cpp plain": (("free", "mtp"), ("free", "llamacpp")),
}


def figures(result: dict) -> dict[str, float | None]:
    """Each figure of one result file (None where the run did not measure it)."""
    out: dict[str, float | None] = {}
    for name, (target, field) in TARGETS.items():
        out[name] = (result.get("targets", {}).get(target) or {}).get(field)
    speed = {(r["workload"], r["method"]): r.get("tokens_per_s") for r in result.get("rows", [])}
    for name, (top, bottom) in ROWS.items():
        a, b = speed.get(top), speed.get(bottom)
        out[name] = a / b if a and b else None
    return out


def _same_experiment(results: list[dict]) -> str | None:
    def key(r: dict) -> tuple:
        settings = {k: v for k, v in r.get("settings", {}).items() if k != "peers"}
        command = r.get("command", "").split(" --json")[0]
        return command, r.get("model", {}).get("version"), json.dumps(settings, sort_keys=True)

    if len({key(r) for r in results}) == 1:
        return None
    return "the files differ in command, model version or settings: a median would mix experiments"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    results = [json.loads(Path(p).read_text()) for p in argv]
    if problem := _same_experiment(results):
        print(f"medians: {problem}", file=sys.stderr)
        return 1
    per_file = [figures(r) for r in results]
    print(f"{results[0]['command'].split(' --json')[0]}")
    print(f"model {results[0]['model']['version']}, {len(results)} runs\n")
    names = [Path(p).stem for p in argv]
    print(f"{'figure':<38}" + "".join(f"{n[-14:]:>16}" for n in names) + f"{'median':>10}")
    for figure in [*TARGETS, *ROWS]:
        values = [f[figure] for f in per_file]
        cells = "".join(f"{v:>16.2f}" if v is not None else f"{'-':>16}" for v in values)
        known = [v for v in values if v is not None]
        median = f"{statistics.median(known):>10.2f}" if known else f"{'-':>10}"
        print(f"{figure:<38}{cells}{median}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
