"""`flywheel bench agent`: flags, the run, then the table on stdout and the JSON and HTML files.

flywheel bench agent --model default --synthetic runs/starter/tasks --humaneval 20 --out bench/
flywheel bench agent --model default --real --out bench/real/
flywheel bench agent --model default --real --limit 50 --out bench/real/ \
    --resume bench/real/samples.jsonl      # after a kill, or to grow a run to more tasks
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agent.engine.config import SPEC_METHODS
from agent.model import add_model_argument
from training.benchmark.journal import read_previous
from training.benchmark.report import render_table, write_html
from training.benchmark.run import run_benchmark
from training.benchmark.sample import BenchConfig
from training.benchmark.sources import BenchmarkError, load_tasks


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flywheel bench agent",
        description="Score a model through the real harness on held-out sessions, synthetic "
        "tasks, HumanEval and real-code tasks: correctness, lint delta, efficiency, "
        "interaction; pass@k with bootstrap confidence intervals. Prints a table; writes JSON "
        "and an HTML report.",
    )
    m = p.add_argument_group("model")
    add_model_argument(m)
    m.add_argument("--served-model-name", default=None, help="model name to ask a server for")
    m.add_argument("--api-key-env", default="", help="environment variable holding the API key")
    m.add_argument(
        "--speculative",
        default=None,
        choices=[m for m in SPEC_METHODS if m != "draft"],
        help="local engine drafts (outputs are distributed as without); default ngram+mtp for a "
        "model with MTP heads, else ngram; none for a server (it decides)",
    )
    m.add_argument("--device", default="cpu", help="torch device of the local engine")
    t = p.add_argument_group("tasks")
    t.add_argument("--sessions", default=None, help="telemetry export folder or benchmark.jsonl")
    t.add_argument("--synthetic", default=None, help="synthetic tasks folder or tasks.jsonl")
    t.add_argument(
        "--real",
        nargs="?",
        const=True,
        default=None,
        metavar="FOLDER",
        help="real-code tasks (training/tasks/real.py): built into the cache on "
        "first use, or a folder written by `python -m training.tasks.real build --out`",
    )
    t.add_argument(
        "--split",
        default="heldout",
        choices=["heldout", "train", "all"],
        help="which synthetic and real tasks",
    )
    t.add_argument("--humaneval", type=int, default=0, help="HumanEval problems (164: all)")
    t.add_argument("--limit", type=int, default=0, help="at most N tasks per source")
    r = p.add_argument_group("run")
    r.add_argument("--samples", type=int, default=1, help="samples per task (n of pass@k)")
    r.add_argument("--k", default="1", help="comma-separated k of pass@k, each <= samples")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument(
        "--temperature", type=float, default=None, help="default: 0 for one sample, 0.8 for several"
    )
    r.add_argument("--max-steps", type=int, default=12, help="model turns per sample")
    r.add_argument("--max-wall-s", type=float, default=180.0, help="running time per sample")
    r.add_argument("--turn-max-tokens", type=int, default=1024, help="output tokens per turn")
    r.add_argument("--verify-timeout-s", type=float, default=60.0, help="verifier time limit")
    r.add_argument("--no-lint", action="store_true", help="skip the ruff lint delta")
    o = p.add_argument_group("output")
    o.add_argument(
        "--out",
        default="",
        help="folder for benchmark.json, report.html and samples.jsonl (each sample as it ends)",
    )
    o.add_argument(
        "--resume",
        default="",
        metavar="PATH",
        help="reuse the samples of an earlier run of the same model and settings: its "
        "samples.jsonl (a killed run leaves one) or its result JSON",
    )
    o.add_argument("--json", default="", help="write the result JSON here")
    o.add_argument("--html", default="", help="write the HTML report here")
    o.add_argument("--quiet", action="store_true", help="no per-sample progress lines")
    return p


def main(argv: list[str]) -> int:
    import os

    args = _parser().parse_args(argv)
    try:
        from agent.engine import EngineConfig, EngineError, SpeculativeConfig
        from agent.engine.config import default_speculative

        ks = tuple(int(k) for k in args.k.split(",") if k.strip())
        config = BenchConfig(
            samples=args.samples,
            ks=ks,
            seed=args.seed,
            temperature=args.temperature,
            max_steps=args.max_steps,
            max_wall_s=args.max_wall_s,
            turn_max_tokens=args.turn_max_tokens,
            verify_timeout_s=args.verify_timeout_s,
            lint=not args.no_lint,
        )
        tasks = load_tasks(
            sessions=args.sessions,
            synthetic=args.synthetic,
            humaneval=args.humaneval,
            real=args.real,
            split=args.split,
            limit=args.limit,
        )
        api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
        engine = EngineConfig(
            model=args.model,
            device=args.device,
            speculative=SpeculativeConfig(args.speculative or default_speculative(args.model)),
            api_key=api_key,
            served_model_name=args.served_model_name,
        )
        resume = read_previous(args.resume) if args.resume else None
        if not args.quiet:
            print(f"{len(tasks)} tasks x {config.samples} samples on {args.model}", file=sys.stderr)
        result = run_benchmark(
            engine,
            tasks,
            config,
            log=None if args.quiet else lambda s: print(s, file=sys.stderr),
            resume=resume,
            journal=Path(args.out, "samples.jsonl") if args.out else None,
        )
    except (BenchmarkError, EngineError, FileNotFoundError, ValueError) as exc:
        print(f"flywheel bench agent: {exc}", file=sys.stderr)
        return 1
    print(render_table(result))
    outputs = []
    json_path = args.json or (str(Path(args.out, "benchmark.json")) if args.out else "")
    html_path = args.html or (str(Path(args.out, "report.html")) if args.out else "")
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        outputs.append(json_path)
    if html_path:
        write_html(result, html_path)
        outputs.append(html_path)
    if outputs:
        print("written: " + ", ".join(outputs))
    return 0
