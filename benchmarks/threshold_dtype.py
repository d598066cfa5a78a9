"""Benchmark: does the confidence threshold decide the same where the language server computes it?

A completion model's threshold (agent/confidence.py) is fitted on float32 log-probabilities
(training/tab_rl.py `fit_show_threshold`); on a CPU the language server decodes with low-bit
weights (agent/engine/config.py `default_dtype`, agent/engine/local/lowbit.py). For the
completion model of a finished `benchmarks/repo_learning.py` run (its --work folder; the RL
model, else the CPT model) with a threshold:

1. `--requests` held-out cursors of the simulated user (training/repo_eval.py's), the
   float32 model's greedy suggestion at each (training/line_completion.py `complete`);
2. the same tokens scored by the low-bit model, teacher-forced, its low-bit product on every row
   (as decoding computes each token);
3. per suggestion the confidence under both, and at the model's threshold whether it is shown
   under each; and how often the low-bit model's argmax differs along the suggestion (where its
   own greedy text would part from float32's).

    .venv/bin/python benchmarks/threshold_dtype.py --work runs/repo_learning_ctx --repo flywheel \
        --json benchmarks/results/threshold-dtype-flywheel.json

What it does not do: run the engine's scheduler or prefix cache (the numbers are the model's),
or replay the session with the low-bit model's own greedy text.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.record import machine, write_json  # noqa: E402


def final_model(folder: Path) -> tuple[str, dict]:
    """The repo_learning run's completion model (as repo_learning.py picks it) and its held-out
    evaluation's settings."""
    cpt = json.loads((folder / "cpt.json").read_text())
    tab = json.loads((folder / "tab.json").read_text())
    return tab.get("model") or cpt["model"], cpt["after"]["config"]


def measure(folder: Path, requests: int, dtype: str, threads: int) -> dict:
    import torch

    from agent.confidence import confidence, threshold, worth_showing
    from agent.engine.local.model_runner import LoadedModel
    from benchmarks.int8 import lowbit_for_every_row
    from training.line_completion import complete
    from training.repo_eval import RepoEvalConfig, simulated_user
    from training.repo_pretrain import read_repo_data
    from training.simulated_user import prompt_for
    from training.simulated_user import requests as cursors_of

    torch.set_num_threads(threads)
    model, settings = final_model(folder)
    show_min = threshold(model)
    if show_min is None:
        raise SystemExit(f"{model} has no confidence threshold: nothing to compare")
    fields = RepoEvalConfig.__dataclass_fields__
    config = RepoEvalConfig(**{k: v for k, v in settings.items() if k in fields})
    user = simulated_user(config)
    repo, train, heldout = read_repo_data(folder / "repo" / "data")
    full = LoadedModel.load(model, dtype="float32")
    low = LoadedModel.load(model, dtype=dtype)
    tokenizer, trunk = full.tokenizer, full.trunk.eval()
    rows = []
    t0 = time.monotonic()
    for cursor in cursors_of(heldout, dataclasses.replace(user, max_requests=requests)):
        ids = prompt_for(tokenizer, repo, train, cursor, user)
        done = complete(trunk, tokenizer, ids, user.max_new_tokens, healed=cursor.healed)
        if not done.ids:
            continue
        x = torch.tensor([ids + done.ids])
        with torch.inference_mode(), lowbit_for_every_row():
            logits, _ = low.forward(x[:, :-1], low.new_cache())  # [1, L-1, vocab]
        tail = logits[0, len(ids) - 1 :].float()  # [len(done.ids), vocab]
        picked = tail.log_softmax(-1).gather(-1, torch.tensor(done.ids)[:, None])[:, 0]
        low_logprobs = picked.tolist()
        rows.append(
            {
                "request": f"{cursor.path}:{len(cursor.prefix)}",
                "tokens": len(done.ids),
                "float32": confidence(done.logprobs),
                dtype: confidence(low_logprobs),
                "shown_float32": worth_showing(done.logprobs, show_min),
                f"shown_{dtype}": worth_showing(low_logprobs, show_min),
                "argmax_differs": int((tail.argmax(-1) != torch.tensor(done.ids)).sum()),
            }
        )
    diffs = [r[dtype] - r["float32"] for r in rows]
    flipped = [r for r in rows if r["shown_float32"] != r[f"shown_{dtype}"]]
    return {
        "model": model,
        "threshold": show_min,
        "dtype": dtype,
        "requests": len(rows),
        "confidence_difference": {
            "median": statistics.median(diffs),
            "mean_abs": statistics.fmean(abs(d) for d in diffs),
            "max_abs": max(abs(d) for d in diffs),
        },
        "shown": {
            "float32": sum(r["shown_float32"] for r in rows),
            dtype: sum(r[f"shown_{dtype}"] for r in rows),
        },
        "decisions_flipped": len(flipped),
        "suggestions_where_argmax_differs": sum(r["argmax_differs"] > 0 for r in rows),
        "seconds": round(time.monotonic() - t0, 1),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    from agent.engine.config import LOWBIT_DTYPES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="runs/repo_learning", help="repo_learning.py's --work")
    p.add_argument("--repo", required=True, help="the repository's folder name under --work")
    p.add_argument("--requests", type=int, default=60, help="held-out cursors, spread over files")
    p.add_argument("--dtype", default="int8", choices=LOWBIT_DTYPES, help="the server's weights")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--json", default="", help="write the result here")
    args = p.parse_args(argv)
    folder = Path(args.work) / args.repo
    if not (folder / "cpt.json").is_file():
        p.error(f"{folder} holds no finished repo_learning run (no cpt.json)")
    result = measure(folder, args.requests, args.dtype, args.threads)
    d = result["confidence_difference"]
    print(f"| {args.repo} | threshold {result['threshold']:.3f} | {result['requests']} requests |")
    print(
        f"confidence {args.dtype} - float32: median {d['median']:+.4f}, mean |d| "
        f"{d['mean_abs']:.4f}, max |d| {d['max_abs']:.4f}"
    )
    print(
        f"shown: float32 {result['shown']['float32']}, {args.dtype} {result['shown'][args.dtype]};"
        f" decisions flipped {result['decisions_flipped']}; suggestions where the {args.dtype} "
        f"argmax differs {result['suggestions_where_argmax_differs']}"
    )
    if args.json:
        command = "benchmarks/threshold_dtype.py " + " ".join(argv or sys.argv[1:])
        write_json(
            args.json,
            {"benchmark": "threshold_dtype", "command": command, "machine": machine(), **result},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
