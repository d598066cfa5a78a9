"""Benchmark: how much text after the cursor an inline completion's prompt should hold.

The server's fill-in-the-middle prompt holds at most `completion.maxSuffixChars` of the text
after the cursor's line (lsp/completion.py `build_prompt`). Every keystroke re-computes that part
of the prompt (it comes after the text being typed), so it costs latency on every request; this
measures what it buys. Cursors: three per file in held-out standard-library modules of the
starter's code split (`training/starter.code_files`: the default never trained on them), each a
third of the way into a code line, the rest of that line removed as a user writing it would see
the file. A suggestion counts when it equals the rest of the line. The same cursors, greedy, the
server's own prompt, stop strings and cleaning, for each setting; prints a table and writes JSON.

    .venv/bin/python benchmarks/completion_suffix.py --model default --suffix-chars 1000 500 300 150 \\
        --json benchmarks/results/completion-suffix-default.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import sysconfig
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def cursors(files: int, per_file: int, seed: int) -> list[tuple[str, str, str]]:
    """(prefix, suffix, expected rest of the line) at code lines of held-out stdlib modules."""
    from training.repo_files import RepoFile, split_files
    from training.self_text import stdlib_files

    std = Path(sysconfig.get_paths()["stdlib"])
    kept = [
        RepoFile(p.relative_to(std).as_posix(), p.read_text(errors="replace"))
        for p in stdlib_files()
    ]
    _, held = split_files(kept, 0.1, 0)  # the starter's split (its seed 0)
    rng = random.Random(seed)
    out = []
    for f in sorted(held, key=lambda f: f.path)[:files]:
        lines = f.text.split("\n")
        code = [
            i
            for i, line in enumerate(lines)
            if 20 < i < len(lines) - 5 and len(line.strip()) > 12 and line.strip()[0] not in "#\"'"
        ]
        for i in rng.sample(code, min(per_file, len(code))):
            line = lines[i]
            indent = len(line) - len(line.lstrip())
            cut = indent + max(1, (len(line) - indent) // 3)
            start = sum(len(x) + 1 for x in lines[:i])
            text = f.text
            out.append((text[: start + cut], text[start + len(line) :], line[cut:]))
    return out


def main() -> None:
    from agent.engine import open_engine
    from agent.model import add_model_argument
    from lsp.completion import build_prompt, clean_output, completion_stops, suggestion_request
    from lsp.model_host import engine_config
    from lsp.settings import CompletionSettings, ModelSettings

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_argument(p)
    p.add_argument("--suffix-chars", type=int, nargs="+", default=[1000, 500, 300, 150])
    p.add_argument("--files", type=int, default=30, help="held-out modules (3 cursors each)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    engine = open_engine(engine_config(ModelSettings(name=args.model)))
    places = cursors(args.files, 3, args.seed)
    rows = []
    for chars in args.suffix_chars:
        settings = CompletionSettings(max_suffix_chars=chars)
        hits, ms = 0, []
        for prefix, suffix, expected in places:
            prompt = build_prompt(
                prefix, suffix, "python", [], settings, 30_000, uri="file:///w/x.py"
            )
            stop, stop_after = completion_stops(prefix, settings)  # as the server asks
            request = suggestion_request(
                prompt, settings, stop, threading.Event(), "b", "interactive", stop_after=stop_after
            )
            started = time.perf_counter()
            result = engine.generate(request)
            ms.append((time.perf_counter() - started) * 1000)
            said = clean_output(result.completions[0].text, suffix, prefix).rstrip()
            hits += bool(said) and said == expected.rstrip()
        rows.append(
            {
                "suffix_chars": chars,
                "exact": hits,
                "cursors": len(places),
                "p50_ms": statistics.median(ms),
            }
        )
        print(
            f"suffix {chars:>5} chars: {hits}/{len(places)} exact, p50 {statistics.median(ms):.0f} ms",
            flush=True,
        )
    if args.json:
        report = {
            "benchmark": "completion_suffix",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv),
            "model": args.model,
            "rows": rows,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
