"""Benchmark: what prefix caching saves an agent, turn by turn, in one run.

Replays held-out oracle conversations (the harness's own format, from `flywheel train tasks`):
every assistant turn's prompt is the conversation so far, as the harness sends it. Each prompt
goes to two local engines on the same weights, one with the prefix cache and one without,
alternating which runs first; each generates `--max-tokens` greedy tokens. Reported per turn and
in total: prompt tokens, tokens read from the cache, time to first token (the prefill) and the
request's total time, with and without the cache, and whether the outputs are identical
(`--exact` asks for the same bits: `EngineConfig.exact`).

    .venv/bin/python benchmarks/prefix_cache.py --model default \
        --trajectories runs/starter/tasks/trajectories.jsonl --conversations 4 \
        --json benchmarks/results/prefix-cache.json
    .venv/bin/python benchmarks/prefix_cache.py --model default --dtype int8 --exact \
        --speculative ngram+mtp --trajectories runs/base/tasks/trajectories.jsonl --max-tokens 48
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def conversations(path: Path, count: int) -> list[dict]:
    """The first `count` held-out trajectories, one per task family."""
    out, families = [], set()
    with path.open() as f:
        for line in f:
            t = json.loads(line)
            if t.get("split") == "train" or t["family"] in families:
                continue
            families.add(t["family"])
            out.append(t)
            if len(out) == count:
                break
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from agent.model import add_model_argument

    add_model_argument(p, servers=False)
    p.add_argument("--trajectories", default="runs/starter/tasks/trajectories.jsonl")
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--dtype", default="float32", help="float32 or int8 (the product's default)")
    p.add_argument("--speculative", default="none", help="drafting method of both engines")
    p.add_argument("--exact", action="store_true", help="EngineConfig.exact on both engines")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    path = Path(args.trajectories)
    if not path.is_file():
        p.error(f"no trajectories at {path}: run `flywheel train tasks` or pass --trajectories")

    import torch

    from agent.engine import EngineConfig, SpeculativeConfig
    from agent.engine.local.engine import LocalEngine
    from benchmarks.record import machine, write_json

    torch.set_num_threads(2)
    engines = {
        mode: LocalEngine(
            EngineConfig(
                model=args.model,
                prefix_cache_mb=mb,
                dtype=args.dtype,
                exact=args.exact,
                speculative=SpeculativeConfig(method=args.speculative),
            )
        )
        for mode, mb in (("off", 0), ("on", 1024))
    }
    rows = replay(engines, conversations(path, args.conversations), args.max_tokens)
    summary = summarize(rows)
    print_summary(summary)
    if args.json:
        report = {
            "benchmark": "prefix_cache",
            "command": "python benchmarks/prefix_cache.py " + " ".join(sys.argv[1:]),
            "date": datetime.date.today().isoformat(),
            "machine": machine(torch_threads=torch.get_num_threads()),
            "model": args.model,
            "model_version": engines["on"].model_version,
            "max_tokens": args.max_tokens,
            "dtype": args.dtype,
            "speculative": args.speculative,
            "exact": args.exact,
            "summary": summary,
            "turns": rows,
        }
        write_json(args.json, report)
    return 0


def replay(engines: dict, convs: list[dict], max_tokens: int) -> list[dict]:
    """Every assistant turn's prompt to both engines (the first alternating), greedy: one row
    per turn, printed as it comes."""
    from agent.chat_format import render_chat
    from agent.engine import Request, SamplingParams

    tokenizer = engines["on"]._model.tokenizer
    params = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=False)
    rows = []
    for c, conv in enumerate(convs):
        messages = conv["messages"]
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prompt = render_chat(tokenizer, messages[:i], conv["tools"], add_generation_prompt=True)
            order = ("off", "on") if len(rows) % 2 == 0 else ("on", "off")
            results = {m: engines[m].generate(Request(prompt=prompt, params=params)) for m in order}
            on, off = results["on"].metrics, results["off"].metrics
            rows.append(
                {
                    "conversation": c,
                    "family": conv["family"],
                    "turn": i,
                    "prompt_tokens": on.prompt_tokens,
                    "cached_tokens": on.cached_tokens,
                    "ttft_off_s": round(off.ttft_s, 4),
                    "ttft_on_s": round(on.ttft_s, 4),
                    "total_off_s": round(off.total_s, 4),
                    "total_on_s": round(on.total_s, 4),
                    "identical": results["on"].completions[0].token_ids
                    == results["off"].completions[0].token_ids,
                }
            )
            r = rows[-1]
            print(
                f"conv {c} turn {i:>2}  prompt {r['prompt_tokens']:>5}  cached {r['cached_tokens']:>5}"
                f"  ttft {r['ttft_off_s']:.2f}s -> {r['ttft_on_s']:.2f}s"
                f"  total {r['total_off_s']:.2f}s -> {r['total_on_s']:.2f}s"
                f"  {'same' if r['identical'] else 'DIFFERENT'}"
            )
    return rows


def summarize(rows: list[dict]) -> dict:
    later = [r for r in rows if r["cached_tokens"] > 0]
    return {
        "turns": len(rows),
        "turns_with_hits": len(later),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rows),
        "cached_tokens": sum(r["cached_tokens"] for r in rows),
        "ttft_off_s": round(sum(r["ttft_off_s"] for r in rows), 2),
        "ttft_on_s": round(sum(r["ttft_on_s"] for r in rows), 2),
        "total_off_s": round(sum(r["total_off_s"] for r in rows), 2),
        "total_on_s": round(sum(r["total_on_s"] for r in rows), 2),
        "median_ttft_speedup_on_hits": round(
            statistics.median(r["ttft_off_s"] / r["ttft_on_s"] for r in later), 2
        )
        if later
        else None,
        "all_identical": all(r["identical"] for r in rows),
    }


def print_summary(summary: dict) -> None:
    print(
        f"\n{'':<22}{'no cache':>10}{'cache':>10}{'ratio':>8}\n"
        f"{'prefill (ttft), s':<22}{summary['ttft_off_s']:>10.2f}{summary['ttft_on_s']:>10.2f}"
        f"{summary['ttft_off_s'] / max(summary['ttft_on_s'], 1e-9):>8.2f}\n"
        f"{'request total, s':<22}{summary['total_off_s']:>10.2f}{summary['total_on_s']:>10.2f}"
        f"{summary['total_off_s'] / max(summary['total_on_s'], 1e-9):>8.2f}\n"
        f"cached {summary['cached_tokens']} of {summary['prompt_tokens']} prompt tokens; "
        f"outputs identical: {summary['all_identical']}"
    )


if __name__ == "__main__":
    sys.exit(main())
