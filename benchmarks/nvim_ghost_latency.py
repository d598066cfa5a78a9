"""Benchmark: typing to ghost text in Neovim, through the real client and server.

Neovim 0.12 (`.venv/bin/nvim`, headless) runs the Flywheel plugin (lsp/clients/nvim) with the real
`flywheel lsp --model MODEL`; benchmarks/nvim_ghost_latency.lua empties a finished function's
`return` line to `return `, types one character there (a different function each time, so the
server's cache never answers), times until Neovim draws the ghost text (a trial ends without one
when the server answered and nothing was drawn), and puts the line back. Beside it, the server's
own latency for the same suggestions (the `suggestions.latency_ms` telemetry column: the model
call, prompt to answer). The difference is what the editor adds: Neovim's own delay before it
asks, the completion settings' debounce, LSP transport and drawing. Prints a table and writes JSON.

    .venv/bin/python benchmarks/nvim_ghost_latency.py --model base --trials 12 \\
        --json benchmarks/results/nvim-ghost-latency-base.json

The completion settings are the server's defaults (debounce included, greedy) unless
--debounce-ms or --temperature is given (a random tiny checkpoint's greedy text is empty:
sample). The first trial after start-up also pays for warming caches; it is reported, not
dropped.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BODIES = {  # a finished function per name: the file around each trial reads like real code
    "area": "width * height",
    "total": "width + height",
    "scale": "width / height",
    "ratio": "height / width",
    "blend": "(width + height) / 2",
    "clamp": "max(0, min(width, height))",
    "mix": "0.25 * width + 0.75 * height",
    "span": "abs(width - height)",
    "score": "math.sqrt(width * height)",
    "delta": "width - height",
}


def source(trials: int) -> tuple[str, list[int], list[str]]:
    """A module of finished functions, one per trial; the 1-based line of each one's `return`
    and that line's text. A trial empties its line to `return ` and types there; the line is
    put back afterwards, so every other function in the prompt stays finished."""
    names = list(BODIES)
    out, lines, finished = ["import math", "", ""], [], []
    for i in range(trials):
        name = names[i % len(names)]
        out += [f"def {name}_{i}(width, height):", f'    """The {name} of a width and a height."""']
        out += [f"    return {BODIES[name]}", "", ""]
        lines.append(len(out) - 2)
        finished.append(out[-3])
    return "\n".join(out) + "\n", lines, finished


def nvim() -> str:
    found = Path(sys.executable).parent / "nvim"
    return str(found) if found.exists() else shutil.which("nvim") or "nvim"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run(args: argparse.Namespace) -> dict:
    from telemetry.folders import cache_home

    with tempfile.TemporaryDirectory(prefix="flywheel-ghost-bench-") as tmp:
        tmp = Path(tmp)
        (tmp / "ws" / ".git").mkdir(parents=True)
        text, lines, finished = source(args.trials)
        (tmp / "ws" / "shapes.py").write_text(text)
        db = tmp / "telemetry.db"
        completion = {} if args.debounce_ms is None else {"debounceMs": args.debounce_ms}
        if args.temperature is not None:  # a random tiny model's greedy text is empty
            completion.update(temperature=args.temperature, seed=0)
        cmd = [sys.executable, "-m", "agent.cli", "lsp", "--model", args.model, "--db", str(db)]
        cfg = {
            "plugin": str(ROOT / "lsp" / "clients" / "nvim"),
            "cmd": cmd,
            "root": str(tmp / "ws"),
            "file": str(tmp / "ws" / "shapes.py"),
            "settings": {"completion": completion} if completion else {},
            "lines": lines,
            "finished": finished,
            "typed": args.typed,
            "timeout_ms": args.timeout_s * 1000,
            "out": str(tmp / "out.json"),
        }
        (tmp / "config.json").write_text(json.dumps(cfg))
        env = {**os.environ, "FLYWHEEL_BENCH_CONFIG": str(tmp / "config.json")}
        env["PYTHONPATH"] = str(ROOT)
        # the user's settings and data stay out; the converted base stays in (converting it
        # again would be timed as the server's start)
        env["FLYWHEEL_CACHE"] = str(cache_home())
        for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
            env[name] = str(tmp / "xdg" / name.lower())
        lua = str(ROOT / "benchmarks" / "nvim_ghost_latency.lua")
        proc = subprocess.run(
            [nvim(), "--headless", "--clean", "-S", lua],
            cwd=tmp / "ws",
            env=env,
            capture_output=True,
            text=True,
            timeout=args.timeout_s * (args.trials + 2) + 900,
        )
        out_file = tmp / "out.json"
        if not out_file.exists():
            sys.exit(f"nvim wrote no results (exit {proc.returncode}): {proc.stderr[-2000:]}")
        result = json.loads(out_file.read_text())
        if not result.get("ok"):
            sys.exit(f"the benchmark failed in Neovim: {result.get('error')}")
        conn = sqlite3.connect(db)
        rows = conn.execute(
            "SELECT latency_ms, output, context FROM suggestions WHERE kind = 'inline' "
            "AND trigger != 'cache' AND latency_ms IS NOT NULL ORDER BY rowid"
        ).fetchall()
        conn.close()
    # what the server answered, with the end of the line it answered at: a ghost text that
    # differs from the answer shows what the client did with it
    answers = [
        {"prefix_tail": json.loads(c or "{}").get("prefix", "")[-24:], "output": o}
        for _, o, c in rows
    ]
    server = [r[0] for r in rows]
    return {"trials": result["trials"], "server_latency_ms": server, "answers": answers}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from agent.model import add_model_argument

    add_model_argument(p, role="the model `flywheel lsp --model` gets")
    p.add_argument("--trials", type=int, default=12, help="lines typed at (default 12)")
    p.add_argument("--typed", default="w", help="the character typed (default w)")
    p.add_argument("--debounce-ms", type=int, help="completion.debounceMs (default: the server's)")
    p.add_argument("--temperature", type=float, help="completion.temperature (default: greedy)")
    p.add_argument("--timeout-s", type=int, default=60, help="per trial: no ghost text after it")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()
    measured = run(args)
    typed = [t["ms"] for t in measured["trials"] if t["ms"] is not None]
    server = measured["server_latency_ms"]
    rows = [
        ("typing to ghost text (Neovim)", typed),
        ("server: model call (telemetry)", server),
    ]
    print(f"model {args.model}, {args.trials} trials, typed {args.typed!r}")
    print(f"{'what':34} {'n':>3} {'p50 ms':>8} {'p90 ms':>8} {'mean ms':>8}")
    for name, values in rows:
        p50, p90 = percentile(values, 0.5), percentile(values, 0.9)
        mean = statistics.fmean(values) if values else None
        cells = [f"{v:8.0f}" if v is not None else f"{'-':>8}" for v in (p50, p90, mean)]
        print(f"{name:34} {len(values):>3} {' '.join(cells)}")
    missed = [t for t in measured["trials"] if t["ms"] is None]
    declined = sum(bool(t.get("answered")) for t in missed)
    if declined:
        print(f"{declined} trial(s) got no ghost text: the server answered with none")
    if len(missed) > declined:
        print(f"{len(missed) - declined} trial(s) got no answer within {args.timeout_s} s")
    if args.json:
        report = {
            "benchmark": "nvim_ghost_latency",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "model": args.model,
            "debounce_ms": args.debounce_ms,
            "temperature": args.temperature,
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "load_average_1_5_15": os.getloadavg(),  # other work on the machine, at the end
            },
            "typing_to_ghost_ms": {"p50": percentile(typed, 0.5), "p90": percentile(typed, 0.9)},
            "server_latency_ms": {"p50": percentile(server, 0.5), "p90": percentile(server, 0.9)},
            "trials": measured["trials"],
            "server_latency_all_ms": server,
            "server_answers": measured["answers"],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
