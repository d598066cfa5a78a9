"""Benchmark: does the completion model's confidence threshold make it show less and be accepted
more, without giving up accepted characters?

    .venv/bin/python benchmarks/show_threshold.py --work runs/repo_learning_ctx --repos fastmcp

For each repository of a finished `benchmarks/repo_learning.py` run (its --work folder), takes the
completion-RL model (the CPT model where RL made no update) and does what the tab stage's last step does (training/tab_rl.py
`fit_show_threshold`, agent/confidence.py): greedy suggestions at `--fit-requests` train-file
cursors, scored shown and not shown by the tab recipe's reward, fit the threshold. Then the
simulated user replays the held-out files with it, at the same requests as repo_learning's
evaluation, and the result is compared, request by request, with the model after continued
pretraining and with the completion-RL model shown without a threshold (95% paired bootstrap).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.record import machine, write_json  # noqa: E402
from benchmarks.repo_learning import paired_bootstrap  # noqa: E402


def measure(folder: Path, fit_requests: int) -> dict:
    from agent.model import load_checkpoint
    from telemetry.acceptance import score
    from training.repo_eval import RepoEvalConfig, request_row, simulated_user
    from training.repo_pretrain import read_repo_data
    from training.rl import load_rl_recipe
    from training.rl.reward import RewardSpec
    from training.simulated_user import UserConfig, session
    from training.tab_rl import fit_show_threshold

    recipe = load_rl_recipe(
        ROOT / "training" / "recipes" / "tab.toml",
        {"init": "default", "out": str(folder), "show_fit": fit_requests},
    )
    spec = RewardSpec(recipe.rewards, recipe.effort_penalty, recipe.reward_version)
    repo, train, heldout = read_repo_data(folder / "repo" / "data")
    cpt = json.loads((folder / "cpt.json").read_text())
    tab = json.loads((folder / "tab.json").read_text())
    # as repo_learning.py: the RL model, or the CPT model where RL made no update
    final = tab.get("model") or cpt["model"]
    evaluated = (
        json.loads((folder / "eval-tab.json").read_text()) if tab.get("model") else cpt["after"]
    )
    cpt = cpt["after"]
    ckpt = load_checkpoint(final)
    trunk = ckpt.trunk.eval()
    t0 = time.monotonic()
    # the train-file requests as the tab stage samples them (training/tab_rl.py, repo_learning.py)
    user = UserConfig(
        seq_len=min(evaluated["config"]["seq_len"], 512), max_new_tokens=recipe.max_tokens
    )
    threshold = fit_show_threshold(trunk, ckpt.tokenizer, spec, repo, train, user, recipe)
    fit_s = time.monotonic() - t0
    replay = simulated_user(RepoEvalConfig(**evaluated["config"]))
    outcomes = session(trunk, ckpt.tokenizer, repo, train, heldout, replay, threshold)
    rows = [request_row(o) for o in outcomes]
    return {
        "repo": folder.name,
        "model": final,
        "threshold": threshold,
        "fit_requests": fit_requests,
        "scores": {"with_threshold": score(outcomes)},
        "withheld": sum("withheld" in r for r in rows),
        "paired": {
            "threshold_vs_cpt": paired_bootstrap(cpt["requests"], rows),
            "threshold_vs_tab": paired_bootstrap(evaluated["requests"], rows),
        },
        "timings_s": {"fit": round(fit_s, 1), "all": round(time.monotonic() - t0, 1)},
        "requests": rows,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="runs/repo_learning", help="repo_learning.py's --work")
    p.add_argument("--repos", default="fastmcp", help="comma-separated, finished there")
    p.add_argument("--fit-requests", type=int, default=150, help="train-file requests to fit on")
    p.add_argument("--json", default=str(ROOT / "benchmarks/results/show_threshold.json"))
    args = p.parse_args(argv)
    work = Path(args.work)
    missing = [r for r in args.repos.split(",") if not (work / r / "tab.json").exists()]
    if missing:
        print(
            f"show_threshold: no finished repo_learning run for {missing} in {work}: "
            "run benchmarks/repo_learning.py first",
            file=sys.stderr,
        )
        return 2
    t0 = time.monotonic()
    results = [measure(work / r, args.fit_requests) for r in args.repos.split(",")]
    print(f"{'repo':<11} {'score':<27} {'cpt':>7} {'+thr':>7} {'diff':>7} {'95% interval':>17}")
    for r in results:
        for name, d in r["paired"]["threshold_vs_cpt"].items():
            if isinstance(d, dict):
                low, high = d["ci95"]
                print(
                    f"{r['repo']:<11} {name:<27} {d['before']:>7.3f} {d['after']:>7.3f} "
                    f"{d['difference']:>+7.3f} [{low:+.3f}, {high:+.3f}]"
                )
        print(f"{'':<11} threshold {r['threshold']}, withheld {r['withheld']} of the requests")
    write_json(
        args.json,
        {
            "benchmark": "show_threshold",
            "command": "benchmarks/show_threshold.py "
            + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": machine(),
            "seconds": round(time.monotonic() - t0, 1),
            "repos": results,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
