"""Benchmark: fast apply on held-out real files, for one or more models in one run.

Each example (training/code_apply.py, the rows with split "heldout": files of the standard
library no training example came from) is an original file, an edit sketch and the whole updated
file. Each model answers the engine's fast-apply conversation greedily, with n-gram drafts from
the original file (lossless: the output is plain greedy decoding's). Reported per model: how
many answers are the expected file exactly, the mean difflib similarity to it, and output
tokens/s.

    flywheel train apply --out runs/x/apply_code.jsonl --count 5000
    .venv/bin/python benchmarks/apply_heldout.py --model default --model runs/x/model \\
        --examples runs/x/apply_code.jsonl --limit 12 --json benchmarks/results/apply-heldout.json
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import json
import platform
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="repeat to compare")
    parser.add_argument("--examples", required=True, help="JSONL from `flywheel train apply`")
    parser.add_argument("--limit", type=int, default=12, help="held-out examples")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    import torch

    from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig
    from agent.engine.local import LocalEngine

    torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in Path(args.examples).read_text().splitlines() if line]
    rows = [row for row in rows if row.get("split") == "heldout"][: args.limit]
    if not rows:
        print(f"no held-out examples in {args.examples}", file=sys.stderr)
        return 1
    results = {}
    for model in args.model:
        spec = SpeculativeConfig("ngram", max_draft_tokens=16)
        engine = LocalEngine(EngineConfig(model=model, dtype=args.dtype, speculative=spec))
        per_example, tokens, seconds = [], 0, 0.0
        for row in rows:
            *messages, answer = row["messages"]
            original = messages[1]["content"]
            expected = answer["content"]
            # room for about twice the expected file (code runs 3-4 characters per token)
            params = SamplingParams(temperature=0, max_tokens=len(expected) // 2 + 64)
            result = engine.generate(
                Request(messages=messages, speculation=original, params=params)
            )
            text = result.completions[0].text
            similar = difflib.SequenceMatcher(None, text, expected, autojunk=False).ratio()
            exact = text.strip() == expected.strip()
            tokens += result.metrics.output_tokens
            seconds += result.metrics.total_s
            per_example.append(
                {"family": row["family"], "exact": exact, "similarity": round(similar, 4)}
            )
            print(f"{model:32} {row['family']:24} {'exact' if exact else '     '} {similar:.3f}")
        engine.close()
        results[model] = {
            "version": engine.model_version,
            "exact": sum(e["exact"] for e in per_example),
            "examples": len(per_example),
            "mean_similarity": round(sum(e["similarity"] for e in per_example) / len(rows), 4),
            "tokens_per_s": round(tokens / seconds, 1) if seconds else 0.0,
            "per_example": per_example,
        }
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
