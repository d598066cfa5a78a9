"""How well a model knows a repository: held-out perplexity and single-line completion.

    python -m training.repo_eval --model registry:v3 --data runs/repo/data [--lines 200]
        [--requests 100] [--json out.json]

Both are measured on the held-out files of a repository split (training/repo_files.py), with
the train files as context, in the prompt format inline completion uses (render_repo_fim):

    perplexity  each held-out file, cut into windows of `seq_len` tokens after the repository
                header; the second half of each window is scored (the first half is context), at
                most `max_file_tokens` of each file; per file the mean negative log-likelihood per
                token (`nll`), over all files exp(mean nll per token) (`ppl`)
    accepted    the simulated user (training/simulated_user.py) replays the held-out files and
                judges greedy suggestions at `requests` cursors: accept rate, shown per request,
                accepted characters per request (telemetry/acceptance.py `score`, the code that
                scores real telemetry); one row per request in `requests`
    exact       single-line completion: lines picked deterministically from the held-out files
                (`pick_lines`: non-blank lines that are not only a comment, at least
                `min_line_chars` long, chosen by a seeded hash of the path, spread evenly over the
                files, at most `max_lines`); the cursor stands after the line's indentation, the
                prompt holds the text before it and the file after the line, the model decodes
                greedily to the end of the line; exact = what it wrote equals the author's line
                (trailing blanks ignored)

The result is a benchmark result the gate reads (agent/gate.py): one task per held-out file with
scores `nll` (lower is better), `exact` (share of its lines) and, with requests, `reward` (the
mean of the newest `tab` reward, telemetry/rewards.py, over its requests: what completion RL
optimises), `task_set` a hash of the split's fingerprint and the picked lines, so two versions
scored on the same split compare task by task.

What it does not do: run the language server (the prompt is the same, the engine is not).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from agent.chat_format import render_repo_fim
from agent.model import add_model_argument
from agent.stats import bootstrap_interval
from training.line_completion import (
    Cursor,
    complete,
    cursor_prompt,
    prompt_ids,
    spread_cursors,
)
from training.repo_files import RepoFile

BENCHMARK = "repo_heldout"


@dataclass
class RepoEvalConfig:
    seq_len: int = 1024  # tokens per perplexity window and per completion prompt
    max_file_tokens: int = 1024  # scored tokens per held-out file, at most
    max_tokens: int = 16_384  # scored tokens in all, spread evenly over the held-out files
    max_lines: int = 200  # completion lines in all
    min_line_chars: int = 4  # shorter lines (`)`, `else:`) are not asked for
    max_new_tokens: int = 48  # tokens a completion may write
    requests: int = 100  # simulated-user requests (0: no acceptance measurement)
    min_prefix_chars: int = 8  # the simulated user accepts a correct start this long
    context_share: float = 0.25  # share of the prompt given to other files of the repository
    seed: int = 0  # which lines are picked
    device: str = "cpu"  # torch device; "auto": cuda when there is one (a recipe's default)

    def __post_init__(self) -> None:
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.seq_len < 32 or self.max_file_tokens < 1 or self.max_lines < 0:
            raise ValueError("seq_len must be >= 32, max_file_tokens >= 1, max_lines >= 0")


def pick_lines(files: list[RepoFile], max_lines: int, min_chars: int, seed: int) -> list[Cursor]:
    """Deterministic completion cursors: per file a seeded sample of its eligible lines, the
    total spread evenly over files (a file with few lines gives its share to the others)."""
    eligible: list[list[int]] = []
    for f in files:
        offsets, at = [], 0
        for line in f.text.splitlines(keepends=True):
            body = line.strip()
            if len(body) >= min_chars and not body.startswith("#") and at > 0:
                offsets.append(at + len(line) - len(line.lstrip()))
            at += len(line)
        rng = random.Random(f"{seed}:{f.path}")
        rng.shuffle(offsets)
        eligible.append(offsets)
    return spread_cursors(files, eligible, max_lines)


@torch.no_grad()
def file_nll(
    trunk, tokenizer, header: list[int], text: str, seq_len: int, max_tokens: int, device
) -> tuple[float, int]:
    """(sum of negative log-likelihoods, scored tokens) of a file's first `max_tokens` tokens,
    each window `header` + up to seq_len - len(header) file tokens, its second half scored."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
    room = max(seq_len + 1 - len(header), 8)
    step = max(room // 2, 1)
    total, count, start = 0.0, 0, 0  # `start`: the first token scored in this window
    while start < len(ids):
        end = min(start + step, len(ids))
        left = max(0, end - room)
        row = header + ids[left:end]
        window = torch.tensor([row], device=device)
        logits = trunk(input_ids=window[:, :-1]).logits[0].float()  # [len-1, vocab]
        first = len(header) + (start - left)  # row index of the first scored token
        nll = F.cross_entropy(logits[first - 1 :], window[0, first:], reduction="sum")
        total += float(nll)
        count += end - start
        start = end
    return total, count


def heldout_perplexity(
    trunk,
    tokenizer,
    repo: str,
    train: list[RepoFile],
    heldout: list[RepoFile],
    seq_len: int,
    *,
    max_windows: int = 0,
    max_file_tokens: int = 1024,
    max_tokens: int = 0,
    context_share: float = 0.25,
    device="cpu",
) -> dict:
    """Per-file and overall held-out negative log-likelihood per token (see the module
    docstring); `max_windows` > 0 scores only that many windows' worth of tokens (the training
    loop's quick check), `max_tokens` > 0 at most that many in all, an even share per file."""
    from training.repo_pretrain import CHARS_PER_TOKEN, context_files

    budget = int(seq_len * CHARS_PER_TOKEN * context_share)
    per_file, total, count = {}, 0.0, 0
    limit = max_windows * seq_len // 2 if max_windows else 0
    if max_tokens:  # an even share of the total per file
        max_file_tokens = min(max_file_tokens, max(64, max_tokens // max(len(heldout), 1)))
    for f in heldout:
        ctx = context_files(train, f.path, budget)
        header = prompt_ids(tokenizer, render_repo_fim(repo, ctx, f.path, "", None), seq_len // 2)
        cap = min(max_file_tokens, limit - count) if limit else max_file_tokens
        if cap <= 0:
            break
        nll, n = file_nll(trunk, tokenizer, header, f.text, seq_len, cap, device)
        if n:
            per_file[f.path] = nll / n
            total, count = total + nll, count + n
    mean = total / max(count, 1)
    return {"nll": mean, "ppl": math.exp(min(mean, 50.0)), "tokens": count, "files": per_file}


def line_exact_match(
    trunk,
    tokenizer,
    repo: str,
    train: list[RepoFile],
    cursors: list[Cursor],
    config: RepoEvalConfig,
) -> list[dict]:
    """Greedy completion at each cursor; one row per cursor with `exact` and what was written."""
    from training.repo_pretrain import CHARS_PER_TOKEN

    rows = []
    budget = int((config.seq_len - config.max_new_tokens) * CHARS_PER_TOKEN)
    for c in cursors:
        prompt = cursor_prompt(repo, train, c, budget, config.context_share)
        ids = prompt_ids(tokenizer, prompt, config.seq_len - config.max_new_tokens)
        out = complete(trunk, tokenizer, ids, config.max_new_tokens, healed=c.healed)
        rows.append(
            {
                "path": c.path,
                "offset": len(c.prefix),
                "expected": c.expected,
                "written": out.text,
                "exact": out.text.rstrip() == c.expected.rstrip(),
            }
        )
    return rows


def evaluate_repo(model: str, data: str | Path, config: RepoEvalConfig) -> dict:
    """Both measurements for a model (`--model` name or folder) on a data folder from
    `flywheel train repo` (RUN/data); returns a benchmark result (see the module docstring)."""
    from agent.confidence import threshold
    from agent.model import load_checkpoint
    from training.repo_pretrain import read_repo_data

    repo, train, heldout = read_repo_data(data)
    ckpt = load_checkpoint(model, device=config.device)
    trunk = ckpt.trunk.eval()
    torch.manual_seed(config.seed)
    ppl = heldout_perplexity(
        trunk,
        ckpt.tokenizer,
        repo,
        train,
        heldout,
        config.seq_len,
        max_file_tokens=config.max_file_tokens,
        max_tokens=config.max_tokens,
        context_share=config.context_share,
        device=config.device,
    )
    cursors = pick_lines(heldout, config.max_lines, config.min_line_chars, config.seed)
    lines = line_exact_match(trunk, ckpt.tokenizer, repo, train, cursors, config)
    outcomes = []
    if config.requests:
        from training.simulated_user import session

        user = simulated_user(config)
        outcomes = session(trunk, ckpt.tokenizer, repo, train, heldout, user, threshold(ckpt.path))
    split = json.loads(Path(data, "split.json").read_text())
    return repo_result(ckpt.version, split, ppl, lines, config, outcomes)


def simulated_user(config: RepoEvalConfig):
    """The simulated user (training/simulated_user.py `UserConfig`) of an evaluation."""
    from training.simulated_user import UserConfig

    return UserConfig(
        min_prefix_chars=config.min_prefix_chars,
        max_requests=config.requests,
        seed=config.seed,
        seq_len=config.seq_len,
        max_new_tokens=config.max_new_tokens,
        context_share=config.context_share,
    )


def request_row(o) -> dict:
    """One simulated-user request (a telemetry.acceptance `Outcome`) as a result row."""
    return {
        "id": o.request_id,
        "shown": o.shown,
        "accepted_chars": o.accepted_chars,
        "output": o.output,
        "expected": o.extra.get("expected", ""),
        **{k: o.extra[k] for k in ("confidence", "withheld") if k in o.extra},
    }


def repo_result(
    version: str, split: dict, ppl: dict, lines: list[dict], config, outcomes: list | None = None
) -> dict:
    """The gate-readable result: per held-out file `nll` and `exact`, and a summary."""
    from telemetry.acceptance import score, signals
    from telemetry.rewards import get as reward_function

    tab = reward_function("tab")
    rewards: dict[str, list[float]] = {}  # held-out path -> the tab reward of each request there
    for o in outcomes or []:
        rewards.setdefault(o.request_id.rpartition(":")[0], []).append(tab.fn(signals(o)) or 0.0)
    # the reward's version is part of the task set: a result scored under another one (or before
    # rewards were scored) is not paired with this one
    task_key = json.dumps(
        [
            split.get("fingerprint"),
            [(r["path"], r["offset"]) for r in lines],
            asdict(config),
            f"{tab.name}@{tab.version}" if rewards else None,
        ],
        sort_keys=True,
    )
    tasks = []
    for path in split["heldout"]:
        mine = [r["exact"] for r in lines if r["path"] == path]
        scores = {}
        if path in ppl["files"]:
            scores["nll"] = round(ppl["files"][path], 6)
        if mine:
            scores["exact"] = sum(mine) / len(mine)
        if rewards.get(path):
            scores["reward"] = float(np.mean(rewards[path]))
        if scores:
            tasks.append({"id": path, "scores": scores})

    exact = np.array([float(r["exact"]) for r in lines])
    accepted = score(outcomes or [])
    low, high = bootstrap_interval(exact, 2000, 0, 2.5) if len(exact) else (0.0, 0.0)
    return {
        "benchmark": BENCHMARK,
        "task_set": hashlib.sha256(task_key.encode()).hexdigest()[:16],
        "model_version": version,
        "repo": split.get("repo"),
        "metrics": {
            "nll": {"direction": "lower", "tolerance": 0.0},
            "exact": {"direction": "higher", "tolerance": 0.0},
            **({"reward": {"direction": "higher", "tolerance": 0.0}} if rewards else {}),
        },
        "reward": f"{tab.name}@{tab.version}" if rewards else None,
        "config": asdict(config),
        "summary": {
            "exact": {"mean": float(exact.mean()) if len(exact) else 0.0, "ci95": [low, high]},
            "nll": {"mean": ppl["nll"]},
            "ppl": {"mean": ppl["ppl"]},
            "lines": {"mean": len(lines)},
            **{
                k: {"mean": accepted[k]}
                for k in ("accept_rate", "shown_per_request", "accepted_chars_per_request")
                if outcomes
            },
            **(
                {"reward": {"mean": float(np.mean([r for v in rewards.values() for r in v]))}}
                if rewards
                else {}
            ),
        },
        "tasks": tasks,
        "lines": lines,
        "requests": [request_row(o) for o in outcomes or []],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m training.repo_eval", description=__doc__.split("\n")[0]
    )
    add_model_argument(p, required=True, servers=False)
    p.add_argument("--data", required=True, help="RUN/data folder of `flywheel train repo`")
    p.add_argument("--lines", type=int, default=200, help="completion lines in all")
    p.add_argument("--requests", type=int, default=100, help="simulated-user requests")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--json", default="", help="write the result here")
    args = p.parse_args(argv)
    from agent.engine.request import EngineError
    from training.repo_files import RepoError

    try:
        result = evaluate_repo(
            args.model,
            args.data,
            RepoEvalConfig(seq_len=args.seq_len, max_lines=args.lines, requests=args.requests),
        )
    except (RepoError, EngineError, ValueError) as exc:
        print(f"repo eval: {exc}", file=sys.stderr)
        return 1
    s = result["summary"]
    print(
        f"{result['model_version']}: held-out ppl {s['ppl']['mean']:.3f}, exact line "
        f"{s['exact']['mean']:.3f} over {s['lines']['mean']} lines, accept rate "
        f"{s.get('accept_rate', {}).get('mean', 0.0):.3f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
