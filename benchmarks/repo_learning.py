"""Benchmark: does learning a repository pay on one machine? CPT, then completion RL, before/after.

For each repository: read it and split its files by path (training/repo_files.py, 20% held
out), then

    before  the starting model (`--model`, default: the built-in default)
    cpt     `flywheel train repo` on the train files (training/recipes/repo.toml)
    tab     `flywheel train tab` from the cpt model, the simulated user on the train files
            (training/recipes/tab.toml)

and score each on the held-out files with training/repo_eval.py: held-out perplexity, exact
single-line completion, and the simulated user's session (accept rate, shown per request,
accepted characters per request; telemetry/acceptance.py, the code that scores real telemetry).
The same requests and lines are asked of every model, so `before` and each later model are
compared request by request: a paired bootstrap (2,000 resamples of the requests, seed 0) gives
95% intervals of the difference of each score; accept rate is a ratio (accepted / shown), so each
resample recomputes it from the resampled requests. HumanEval single-line infilling
(benchmarks/infill.py, `flywheel bench infill`, FIM prompts) is run on each of the three models,
to see what each stage forgot.

Repositories (`REPOS`): Flywheel itself at a named commit (its files at that commit, from `git
archive`), and two Python packages from PyPI whose first release came after 2024-10, after the
base model's training data: fastmcp (0.1.0's sdist files are dated 2024-11-30) and smolagents
(0.1.0's are dated 2024-12), each at a pinned version checked by sha256.

    nice .venv/bin/python benchmarks/repo_learning.py      # -> benchmarks/results/repo_learning.json
    .venv/bin/python benchmarks/repo_learning.py --quick --repos flywheel --work /tmp/q  # a minute

The full run is long on a 2-core CPU (about an hour and a half per repository: the times of each
stage are in benchmarks/README.md); `--repos` runs some of them, and a rerun with the
same `--work` takes every finished stage from it; `--no-tab` stops after continued pretraining.
`--quick` builds a ~0.6M-parameter model in-process and runs every stage for a few steps: it
measures nothing, but every step runs (tests/bench/test_repo_learning.py).

What it does not do: measure latency (benchmarks/completion_wait.py does), or go through the
language server.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.record import machine, write_json  # noqa: E402


@dataclass(frozen=True)
class Repo:
    name: str
    source: str  # "git:<commit>" (this repository) or "pypi:<name>==<version>"
    sha256: str = ""  # of the sdist, for PyPI sources
    first_release: str = ""  # how we know it is newer than the base model


REPOS = {
    "flywheel": Repo(
        "flywheel",
        "git:87005fa4a1842cc8128ae0eaeb1f5705dfd96dbf",
        first_release="this repository",
    ),
    "fastmcp": Repo(
        "fastmcp",
        "pypi:fastmcp==2.2.0",
        "4d9373705ebd9e3de807005ed732b8955c6eb74e4b47595752f461c1c689f231",
        "fastmcp 0.1.0 sdist, files dated 2024-11-30",
    ),
    "smolagents": Repo(
        "smolagents",
        "pypi:smolagents==1.0.0",
        "8793a0d3af1e17ba9703dcd5d266f15d45f7479b1379f5c25ccb06830529b01d",
        "smolagents 0.1.0 sdist, files dated 2024-12",
    ),
}

QUICK_REPO = {  # recipe overrides for --quick: seconds per stage
    "steps": 2,
    "seq_len": 64,
    "batch_size": 2,
    "lora_rank": 4,
    "save_every": 1,
    "log_every": 1,
    "eval_every": 2,
    "precision": "fp32",
}
QUICK_TAB = {"steps": 1, "group_size": 2, "tasks_per_step": 2, "max_tokens": 8, "show_fit": 4}


# --- sources ---------------------------------------------------------------------------------


def fetch(repo: Repo, folder: Path) -> Path:
    """The repository's files in `folder/NAME` (the name the prompts carry), once; a finished
    copy is reused."""
    src = folder / repo.name
    done = folder / "src.done"
    if done.exists():
        return src
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    kind, _, ref = repo.source.partition(":")
    if kind == "git":
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", ref],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(src, filter="data")
    else:
        sdists = folder / "sdist"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                ref,
                "-d",
                str(sdists),
            ],
            check=True,
            capture_output=True,
        )
        (sdist,) = sorted(sdists.glob("*.tar.gz"))
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        if digest != repo.sha256:
            raise SystemExit(f"{sdist.name}: sha256 {digest}, expected {repo.sha256}")
        unpacked = folder / "unpacked"
        shutil.rmtree(unpacked, ignore_errors=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(unpacked, filter="data")
        (top,) = unpacked.iterdir()  # NAME-VERSION/
        src.rmdir()
        top.rename(src)
    done.write_text(repo.source + "\n")
    return src


def tiny_checkpoint(folder: Path) -> Path:
    """A ~0.6M-parameter model with a 1,024-token tokenizer (the tests' shape), for --quick."""
    from agent.model import build_trunk, save_checkpoint
    from agent.tokenizer import iter_source_texts, train_tokenizer

    if (folder / "config.json").exists():
        return folder
    stdlib = Path(sys.base_prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    tokenizer = train_tokenizer(iter_source_texts(stdlib / "json", 2_000_000), vocab_size=1024)
    trunk = build_trunk("test", vocab_size=len(tokenizer), seed=0)
    return save_checkpoint(folder, trunk, tokenizer, meta={"version": "bench-tiny"})


# --- comparison ------------------------------------------------------------------------------


def paired_bootstrap(a: list[dict], b: list[dict], resamples: int = 2000, seed: int = 0) -> dict:
    """95% intervals of b - a for each acceptance score, over the same requests (rows of
    repo_eval's `requests`, matched by id)."""
    ids = sorted({r["id"] for r in a} & {r["id"] for r in b})
    if not ids:
        return {}
    by_a, by_b = {r["id"]: r for r in a}, {r["id"]: r for r in b}

    def arrays(rows: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        shown = np.array([float(rows[i]["shown"]) for i in ids])  # [requests]
        chars = np.array([float(rows[i]["accepted_chars"]) for i in ids])  # [requests]
        return shown, (chars > 0).astype(float) * shown, chars

    (sa, aa, ca), (sb, ab, cb) = arrays(by_a), arrays(by_b)
    picks = np.random.default_rng(seed).integers(0, len(ids), size=(resamples, len(ids)))

    def rate(accepted: np.ndarray, shown: np.ndarray) -> np.ndarray:
        s = shown.sum(-1)
        return np.where(s > 0, accepted.sum(-1) / np.maximum(s, 1), 0.0)

    out = {}
    for name, fa, fb in (
        ("accept_rate", lambda p: rate(aa[p], sa[p]), lambda p: rate(ab[p], sb[p])),
        ("shown_per_request", lambda p: sa[p].mean(-1), lambda p: sb[p].mean(-1)),
        ("accepted_chars_per_request", lambda p: ca[p].mean(-1), lambda p: cb[p].mean(-1)),
    ):
        full = np.arange(len(ids))
        diff = fb(picks) - fa(picks)  # [resamples]
        low, high = np.percentile(diff, [2.5, 97.5])
        out[name] = {
            "before": float(fa(full)),
            "after": float(fb(full)),
            "difference": float(fb(full) - fa(full)),
            "ci95": [float(low), float(high)],
        }
    out["requests"] = len(ids)
    return out


# --- one repository --------------------------------------------------------------------------


def measure(repo: Repo, model: str, work: Path, args, log) -> dict:
    from training.recipe import load_recipe
    from training.repo_eval import RepoEvalConfig, evaluate_repo
    from training.repo_files import RepoConfig
    from training.repo_pretrain import train_repo
    from training.rl import load_rl_recipe
    from training.simulated_user import UserConfig
    from training.tab_rl import train_tab

    folder = work / repo.name
    src = fetch(repo, folder)
    run = folder / "repo"
    quick_repo = QUICK_REPO if args.quick else {}
    recipe = load_recipe(
        ROOT / "training" / "recipes" / "repo.toml",
        {
            **quick_repo,
            **args.overrides["repo"],
            "name": f"bench-{repo.name}",
            "init": model,
            "out": str(run),
            "data": str(run / "data"),
        },
    )
    ev = RepoEvalConfig(
        seq_len=recipe.seq_len if args.quick else 1024,
        max_lines=args.lines,
        requests=args.requests,
        max_file_tokens=256 if args.quick else 1024,
        max_new_tokens=8 if args.quick else 48,
    )
    cpt = _cached(
        folder / "cpt.json",
        lambda: train_repo(
            recipe,
            RepoConfig(root=str(src), heldout_fraction=0.2),
            None,
            resume=True,
            progress=False,
            log=log,
            evaluation=ev,
        ),
    )
    tab_recipe = load_rl_recipe(
        ROOT / "training" / "recipes" / "tab.toml",
        {
            **(QUICK_TAB if args.quick else {}),
            **args.overrides["tab"],
            "name": f"bench-tab-{repo.name}",
            "init": cpt["model"],
            "out": str(folder / "tab"),
        },
    )
    # RL samples on shorter prompts than the evaluation's: sampling and updates are its cost
    user = UserConfig(seq_len=min(ev.seq_len, 512), max_new_tokens=tab_recipe.max_tokens)
    tab = (
        {"model": None, "seconds": None}
        if args.no_tab
        else _cached(
            folder / "tab.json",
            lambda: train_tab(tab_recipe, data=str(run / "data"), user=user, log=log),
        )
    )
    final = tab.get("model") or cpt["model"]
    before, after_cpt = cpt["before"], cpt["after"]  # train_repo scored both with `ev`
    after = (
        _cached(folder / "eval-tab.json", lambda: evaluate_repo(final, run / "data", ev))
        if tab.get("model")
        else after_cpt
    )
    result = {
        "repo": repo.name,
        "source": repo.source,
        "first_release": repo.first_release,
        "split": {k: v for k, v in cpt["split"].items() if k not in ("train", "heldout")}
        | {
            "train_files": len(cpt["split"]["train"]),
            "heldout_files": len(cpt["split"]["heldout"]),
        },
        "tab": {k: tab.get(k) for k in ("updates", "steps", "outcomes", "reward")},
        "models": {"before": model, "cpt": cpt["model"], "tab": tab.get("model")},
        "scores": {
            name: _scores(r)
            for name, r in (("before", before), ("cpt", after_cpt), ("tab", after))
            if name != "tab" or not args.no_tab
        },
        "paired": {"cpt_vs_before": paired_bootstrap(before["requests"], after_cpt["requests"])}
        | (
            {
                "tab_vs_before": paired_bootstrap(before["requests"], after["requests"]),
                "tab_vs_cpt": paired_bootstrap(after_cpt["requests"], after["requests"]),
            }
            if not args.no_tab
            else {}
        ),
        "timings_s": {  # as first computed (a resumed run keeps the earlier figure)
            "cpt_and_both_evaluations": cpt["seconds"],
            "tab": tab["seconds"],
            "tab_evaluation": after.get("seconds") if tab.get("model") else None,
        },
    }
    if args.infill_limit >= 0:
        models = {"before": model, "cpt": cpt["model"]} | (
            {"tab": tab["model"]} if tab.get("model") else {}
        )
        result["infill"] = infill(models, args, folder / "infill.json")
    return result


def infill(models: dict[str, str], args, path: Path) -> dict:
    """HumanEval single-line infilling (FIM prompts) of each model: what each stage forgot.
    Kept in `path` per model version, so a stage trained again is scored again alone."""
    from agent.model import checkpoint_version, resolve_model
    from benchmarks.infill import infill_tasks, run_model

    tasks = infill_tasks(args.infill_limit)
    out = json.loads(path.read_text()) if path.exists() else {}
    for name, model in models.items():
        version = checkpoint_version(resolve_model(model))
        if out.get(name, {}).get("version") == version:
            continue
        t0 = time.monotonic()
        (score,), _ = run_model(model, tasks, ("fim",), log=lambda line: None)
        out[name] = {
            "version": version,
            "pass_at_1": score.pass_at_1,
            "exact": score.exact,
            "tasks": score.tasks,
            "seconds": round(time.monotonic() - t0, 1),
        }
        path.write_text(json.dumps(out, indent=2) + "\n")
    return out


def stage_overrides(pairs: list[str]) -> dict | None:
    """`--set repo.steps=96` -> {"repo": {"steps": 96}, "tab": {}}; None for any other stage."""
    from training.recipe import parse_overrides

    out: dict = {"repo": {}, "tab": {}}
    for pair in pairs:
        stage, _, rest = pair.partition(".")
        if stage not in out or "=" not in rest:
            return None
        out[stage].update(parse_overrides([rest]))
    return out


def _scores(result: dict) -> dict:
    return {k: v["mean"] for k, v in result["summary"].items()} | {
        "exact_ci95": result["summary"]["exact"]["ci95"]
    }


def _cached(path: Path, compute):
    """A stage's result from `path` when an earlier run finished it, else computed and kept."""
    if path.exists():
        return json.loads(path.read_text())
    t0 = time.monotonic()
    value = {**compute(), "seconds": 0.0}
    value["seconds"] = round(time.monotonic() - t0, 1)
    path.write_text(json.dumps(value, indent=2, default=str) + "\n")
    return value


# --- the command -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repos", default=",".join(REPOS), help="comma-separated: %(default)s")
    from agent.model import add_model_argument

    add_model_argument(p, servers=False, role="the model to start from")
    p.add_argument("--work", default="runs/repo_learning", help="sources, runs and stage results")
    p.add_argument(
        "--json",
        default="",
        help="result file (default: benchmarks/results/repo_learning.json; --quick: in --work)",
    )
    p.add_argument("--lines", type=int, default=100, help="held-out completion lines per repo")
    p.add_argument("--requests", type=int, default=150, help="simulated-user requests per repo")
    p.add_argument(
        "--infill-limit", type=int, default=0, help="HumanEval problems (0: all 164; -1: skip)"
    )
    p.add_argument(
        "--no-tab", action="store_true", help="stop after continued pretraining (no completion RL)"
    )
    p.add_argument("--quick", action="store_true", help="a tiny in-process model, a few steps")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="STAGE.KEY=VALUE",
        help="override a recipe key of the repo or tab stage (repo.train_context=true)",
    )
    args = p.parse_args(argv)
    args.overrides = stage_overrides(args.set)
    if args.overrides is None:
        print(
            f"repo_learning: --set takes repo.KEY=VALUE or tab.KEY=VALUE, got {args.set}",
            file=sys.stderr,
        )
        return 2
    unknown = [r for r in args.repos.split(",") if r not in REPOS]
    if unknown:
        print(
            f"repo_learning: unknown repo(s) {unknown}; use some of {list(REPOS)}", file=sys.stderr
        )
        return 2
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if not args.json:  # a quick run measures nothing: never over the committed results
        quick = work / "repo_learning-quick.json"
        args.json = str(quick if args.quick else ROOT / "benchmarks/results/repo_learning.json")
    model = str(tiny_checkpoint(work / "tiny-model")) if args.quick else args.model
    if args.quick:
        args.lines, args.requests = min(args.lines, 4), min(args.requests, 6)
        args.infill_limit = min(args.infill_limit, 2) if args.infill_limit else 2
    t0 = time.monotonic()
    results = []
    for name in args.repos.split(","):
        print(f"== {name}", flush=True)
        results.append(
            measure(REPOS[name], model, work, args, lambda line: print(line, flush=True))
        )
    print(
        f"\n{'repo':<11} {'model':<7} {'ppl':>9} {'exact':>6} {'accept':>7} {'shown/req':>9} "
        f"{'chars/req':>9}"
    )
    for r in results:
        for name, s in r["scores"].items():
            print(
                f"{r['repo']:<11} {name:<7} {s['ppl']:>9.3f} {s['exact']:>6.3f} "
                f"{s.get('accept_rate', 0):>7.3f} {s.get('shown_per_request', 0):>9.3f} "
                f"{s.get('accepted_chars_per_request', 0):>9.2f}"
            )
        last = "tab" if "tab_vs_before" in r["paired"] else "cpt"
        d = r["paired"][f"{last}_vs_before"].get("accept_rate")
        if d:
            print(
                f"{'':<11} accept rate {last} - before {d['difference']:+.3f} "
                f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
            )
    report = {
        "benchmark": "repo_learning",
        "command": "benchmarks/repo_learning.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "quick": args.quick,
        "machine": machine(),
        "seconds": round(time.monotonic() - t0, 1),
        "repos": results,
    }
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
