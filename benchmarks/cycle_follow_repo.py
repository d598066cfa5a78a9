"""Benchmark: the cycle learns a repository and a real editor's completions follow it.

1. The workspace is a repository of benchmarks/repo_learning.py (`REPOS`: a Python package from
   PyPI first released after the base model's training data, at a pinned version, or this
   repository at a commit). A fresh registry gets the shipped default as its promoted version.
2. An editor: `flywheel lsp --model registry` over stdio (a pygls client) with the workspace as
   its folder. It goes through the workspace's held-out files (the split `flywheel cycle` makes,
   training/repo_files.py) at lines picked as training/repo_eval.py picks them: the file is open
   with that line emptied after its indentation, and an inline completion is asked there. A
   line counts when the suggestion's first line is the author's line (trailing blanks ignored).
3. `flywheel cycle --workspace SRC`: only the completion lane is due (the agent stages'
   thresholds are out of reach): the repository stage, then completion RL on the simulated
   user. Its candidate is for the registry's completion lane: the gate compares it with its
   parent on the held-out files (perplexity per file, exact lines, the simulated user's
   reward) and asks for a gain in perplexity or reward; the agent keeps the promoted version.
4. When it promotes, the editor waits for the server's `flywheel/status` naming the new version
   as `completionModelVersion`, then asks at the same lines again: every answer must come from
   the new version.

It prints each step and a table, and writes the decision, the versions that answered and the
editor's exact lines before and after (with a paired 95% bootstrap interval) to `--json`.

    .venv/bin/python benchmarks/cycle_follow_repo.py --repo fastmcp --work /tmp/follow-repo \
        --json benchmarks/results/cycle-follow-repo-fastmcp.json

`--quick` starts from a ~0.6M-parameter model built in-process and runs the cycle's `--quick`
stages on a few lines: it measures nothing, but every step runs
(tests/bench/test_cycle_follow_repo.py).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cycle_follow import Editor, cycle  # noqa: E402
from benchmarks.repo_learning import REPOS, fetch, tiny_checkpoint  # noqa: E402

# Only the repository stage is due: no session, code or RL thresholds can be met.
CYCLE_ARGS = shlex.split(
    "--base default --min-repo-chars 1 --min-trajectories 1000000 --min-code-chars 1000000000 "
    "--min-rl-tasks 1000000 --repo-requests 0 --bench-projects 2 --bench-tasks 6"
)

QUICK = shlex.split("--quick --bench-projects 1 --bench-tasks 2 --repo-lines 4")


def heldout_lines(src: Path, count: int) -> list:
    """The held-out files' completion cursors (training/repo_eval.py `pick_lines`) on the split
    the cycle's repository stage makes of `src` (training/cycle/repo.py reads it the same way)."""
    from telemetry.privacy import DEFAULT_EXCLUDE
    from training.repo_eval import RepoEvalConfig, pick_lines
    from training.repo_files import RepoConfig, read_repo

    files = read_repo(RepoConfig(root=str(src), exclude=DEFAULT_EXCLUDE))
    ev = RepoEvalConfig()
    return pick_lines(files.heldout, count, ev.min_line_chars, ev.seed)


async def go_through(editor: Editor, src: Path, cursors: list, label: str) -> list[dict]:
    """One completion at each cursor, file by file (each closed after its lines)."""
    rows, current = [], None
    for i, c in enumerate(cursors):
        path = src / c.path
        if current is not None and current != path:
            editor.close(current)
        current = path
        answer = await editor.complete_at(path, c.prefix + c.suffix, len(c.prefix))
        first = answer["text"].split("\n", 1)[0].rstrip()
        exact = bool(first) and first == c.expected.rstrip()
        rows.append(dict(path=c.path, expected=c.expected, exact=exact, **answer))
        if (i + 1) % 10 == 0 or i + 1 == len(cursors):
            hits = sum(r["exact"] for r in rows)
            print(f"{label}: {i + 1}/{len(cursors)} lines, {hits} exact", flush=True)
    if current is not None:
        editor.close(current)
    return rows


def paired_exact(before: list[dict], after: list[dict], resamples: int = 2000) -> dict:
    """Exact lines before and after, and a 95% paired bootstrap interval of the difference."""
    a = np.array([float(r["exact"]) for r in before])  # [lines]
    b = np.array([float(r["exact"]) for r in after])  # [lines]
    picks = np.random.default_rng(0).integers(0, len(a), size=(resamples, len(a)))
    low, high = np.percentile((b[picks] - a[picks]).mean(axis=1), [2.5, 97.5])
    return dict(
        lines=len(a),
        before=float(a.mean()),
        after=float(b.mean()),
        difference=float(b.mean() - a.mean()),
        ci95=[float(low), float(high)],
    )


async def run(args: argparse.Namespace) -> dict:
    from agent.model import resolve_model
    from agent.registry import Registry

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=False)
    src = fetch(REPOS[args.repo], work / "source")
    args.registry = work / "registry"
    registry = Registry(args.registry)
    start = tiny_checkpoint(work / "tiny-model") if args.quick else resolve_model("default")
    v1 = registry.add(start, note="the starting model")
    registry.promote(v1, forced=True, reason="the baseline of this benchmark")
    cursors = heldout_lines(src, args.lines)
    print(f"{args.repo}: {len(cursors)} held-out lines", flush=True)
    editor = Editor(args.registry, src, work / "editor.db", max_tokens=48)
    await editor.start()
    report: dict = dict(repo=args.repo, source=REPOS[args.repo].source, baseline=v1)
    try:
        before = await go_through(editor, src, cursors, "editor before")
        since = len(editor.statuses)
        options = [*CYCLE_ARGS, "--workspace", str(src)] + (QUICK if args.quick else [])
        options += [f"--set={pair}" for pair in args.set]
        result = await cycle(args, editor.db, options)  # the editor's telemetry: the user's
        promoted = registry.serving("completion")
        result["promoted_after"] = promoted
        result["agent_after"] = registry.promoted()
        if promoted != v1:
            result["seconds_to_status"] = round(await editor.wait_for(promoted, since), 1)
        after = await go_through(editor, src, cursors, "editor after")
    finally:
        await editor.stop()
    answered = [r["model_version"] for r in after if r["model_version"]]
    report.update(
        cycle=result,
        editor_before=before,
        editor_after=after,
        exact=paired_exact(before, after),
        versions_before=sorted({r["model_version"] for r in before if r["model_version"]}),
        versions_after=sorted(set(answered)),
        editor_follows=promoted != v1 and bool(answered) and set(answered) == {promoted},
    )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default="fastmcp", choices=sorted(REPOS))
    parser.add_argument("--work", required=True, help="a new folder for everything the run makes")
    parser.add_argument("--lines", type=int, default=60, help="held-out lines the editor asks at")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="a tiny model, a few steps")
    parser.add_argument(
        "--set", action="append", default=[], metavar="STAGE.KEY=VALUE", help="to the cycle"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.lines = min(args.lines, 4)
    started = time.perf_counter()
    report = asyncio.run(run(args))
    report = dict(
        benchmark="cycle-follow-repo",
        command="python benchmarks/cycle_follow_repo.py " + " ".join(argv or sys.argv[1:]),
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        machine=f"{platform.machine()}, {platform.processor() or platform.system()}",
        minutes=round((time.perf_counter() - started) / 60, 1),
        **report,
    )
    e, c = report["exact"], report["cycle"]
    print("\n| decision | promoted | answered after | exact before | exact after | diff [95%] |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(
        f"| {c['summary']['status']} | {c['promoted_after']} | "
        f"{', '.join(report['versions_after']) or 'nothing'} | {e['before']:.3f} | "
        f"{e['after']:.3f} | {e['difference']:+.3f} [{e['ci95'][0]:+.3f}, {e['ci95'][1]:+.3f}] |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0 if report["editor_follows"] else 1


if __name__ == "__main__":
    sys.exit(main())
