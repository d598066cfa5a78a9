"""`flywheel train`: build data, make tasks, run a training stage from a recipe.

    flywheel train data  --source /usr/lib/python3.11 --out runs/starter/data
    flywheel train tasks --out runs/starter/tasks --projects 200
    flywheel train pretrain --recipe training/recipes/pretrain.toml [--set steps=10] [--no-resume]
    flywheel train starter --out runs/starter [--quick] [--ship]
    flywheel train eval --model runs/starter/model --tasks runs/starter/tasks --json eval.json
    flywheel train rl --recipe training/recipes/rl.toml [--set steps=10] [--no-resume]
    flywheel train repo --workspace ~/src/project [--model default] [--out runs/repo]
    flywheel train tab --data runs/repo/data --model registry:v3 [--telemetry-db DB --workspace ~/src/project]

STAGE is one of data, tasks, pretrain, long_context, sft, mtp, starter (the whole chain, see
training/starter.py), eval (held-out tasks through the real harness, training/evaluate.py),
repo (pretraining on one workspace, training/repo_pretrain.py) or tab (completion RL from
accepted and rejected suggestions, training/tab_rl.py).
A stage's recipe must name the same stage. Under the `deepspeed` launcher the module runs as `--module training.cli`, and the
launcher's `--local_rank` argument is accepted.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from agent.engine.config import DTYPES
from agent.engine.request import EngineError
from agent.model import add_model_argument
from training.recipe import STAGES, RecipeError, load_recipe, parse_overrides

REPO_RECIPE = Path(__file__).resolve().parent / "recipes" / "repo.toml"
TAB_RECIPE = Path(__file__).resolve().parent / "recipes" / "tab.toml"


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.stage == "eval":
            return _eval(args, argv)
        return _RUNS.get(args.stage, _stage)(args)
    except (RecipeError, ValueError, RuntimeError, FileNotFoundError, EngineError) as exc:
        print(f"flywheel train {args.stage}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a full disk or an unwritable folder outside the trainer's own checks
        print(
            f"flywheel train {args.stage}: {exc.strerror or exc} ({exc.filename or 'writing'}): "
            "free disk space or fix the folder, then run the same command again",
            file=sys.stderr,
        )
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flywheel train", description=__doc__.split("\n")[0])
    parser.add_argument("--local_rank", type=int, default=0, help=argparse.SUPPRESS)  # deepspeed
    sub = parser.add_subparsers(dest="stage", required=True, metavar="STAGE")
    _data_parser(sub)
    _tasks_parser(sub)
    _apply_parser(sub)
    _starter_parser(sub)
    _eval_parser(sub)
    rl = sub.add_parser(
        "rl", help="asynchronous RL (Dr. GRPO) in the agent's harness, from an RL recipe"
    )
    _recipe_arguments(
        rl, "RL recipe TOML (training/recipes/rl.toml)", "no per-update progress lines"
    )
    _repo_parser(sub)
    _tab_parser(sub)
    for stage in STAGES:
        if stage == "repo":
            continue
        p = sub.add_parser(stage, help=f"run the {stage} stage from a recipe")
        _recipe_arguments(p, "recipe TOML file", "no progress bar")
        p.add_argument("--local_rank", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def _recipe_arguments(p: argparse.ArgumentParser, recipe_help: str, progress_help: str) -> None:
    """The flags of a stage run from a recipe: the recipe, overrides, resuming, progress."""
    p.add_argument("--recipe", required=True, help=recipe_help)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe key (TOML value), repeatable",
    )
    p.add_argument("--no-resume", action="store_true", help="start over, ignoring checkpoints")
    p.add_argument("--no-progress", action="store_true", help=progress_help)


def _recipe_file_arguments(p: argparse.ArgumentParser, default: Path, what: str) -> None:
    """The recipe flags of a stage with a default recipe: the file, its run folder, overrides."""
    p.add_argument("--recipe", default=str(default), help=f"{what} (default: %(default)s)")
    p.add_argument("--out", default="", help="run folder (default: the recipe's out)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override"
    )


def _data_parser(sub) -> None:
    data = sub.add_parser("data", help="build a tokenized, deduplicated corpus")
    data.add_argument("--source", action="append", default=[], help="source folder (repeatable)")
    data.add_argument(
        "--export",
        action="append",
        default=[],
        help="telemetry pretrain.jsonl or export folder (repeatable)",
    )
    data.add_argument("--out", required=True, help="corpus folder to write")
    data.add_argument("--tokenizer", default="", help="tokenizer folder; default: train one")
    data.add_argument("--vocab-size", type=int, default=8192, help="when training a tokenizer")
    data.add_argument("--max-mb", type=float, default=50.0, help="read at most this much text")
    data.add_argument("--heldout", type=float, default=0.02, help="held-out share of documents")


def _tasks_parser(sub) -> None:
    tasks = sub.add_parser(
        "tasks", help="generate verified synthetic tasks and oracle trajectories"
    )
    tasks.add_argument("--out", required=True, help="folder for tasks/trajectories/apply JSONL")
    tasks.add_argument("--projects", type=int, default=100, help="projects to generate")
    tasks.add_argument("--seed", type=int, default=0)
    tasks.add_argument("--heldout", type=float, default=0.1, help="held-out share of projects")
    tasks.add_argument("--samples", type=int, default=2, help="oracle trajectories per task")
    tasks.add_argument(
        "--templates", default="", help="comma-separated project templates (default: all)"
    )
    tasks.add_argument(
        "--pytest-fraction",
        type=float,
        default=0.0,
        help="share of projects whose tests are pytest functions instead of unittest",
    )
    tasks.add_argument(
        "--test-first",
        type=float,
        default=1.0,
        help="share of bug-fix trajectories that run the tests before the first edit (default 1)",
    )
    tasks.add_argument(
        "--diagnose",
        action="store_true",
        help="bug fixes say which test fails and which line is wrong before their edit",
    )
    tasks.add_argument(
        "--workers", type=int, default=0, help="processes (0: twice the cores, at most 8)"
    )


def _apply_parser(sub) -> None:
    apply = sub.add_parser(
        "apply", help="fast-apply examples from real source files (one edit each, via ast)"
    )
    apply.add_argument(
        "--source", action="append", default=[], help="folder of .py files; default: the stdlib"
    )
    apply.add_argument("--out", required=True, help="JSONL file to write")
    apply.add_argument("--count", type=int, default=1200, help="examples to write")
    apply.add_argument("--seed", type=int, default=0)


def _starter_parser(sub) -> None:
    starter = sub.add_parser(
        "starter", help="the built-in default: the base, tasks, a LoRA adapter (SFT), evaluation"
    )
    starter.add_argument("--out", required=True, help="run folder (resumes what is already there)")
    starter.add_argument("--quick", action="store_true", help="seconds per stage: a smoke test")
    starter.add_argument(
        "--status",
        action="store_true",
        help="say where the run in --out stands (each step, its time, what is left) and stop",
    )
    starter.add_argument(
        "--ship", action="store_true", help="then copy OUT/model into agent/starter/"
    )
    starter.add_argument("--projects", type=int, default=160, help="synthetic projects")
    starter.add_argument("--samples", type=int, default=1, help="oracle trajectories per task")
    starter.add_argument("--eval-tasks", type=int, default=27, help="held-out tasks to evaluate")


def _eval_parser(sub) -> None:
    ev = sub.add_parser("eval", help="run held-out tasks through the harness; pass@1, parse rate")
    add_model_argument(ev, required=True, repeat=True, servers=False)
    ev.add_argument("--tasks", required=True, help="tasks folder or tasks.jsonl")
    ev.add_argument("--json", default="", help="write the report here")
    ev.add_argument("--split", default="heldout", choices=["heldout", "train", "all"])
    ev.add_argument("--limit", type=int, default=0, help="at most N tasks, spread over families")
    ev.add_argument("--max-steps", type=int, default=12, help="model turns per task")
    ev.add_argument("--max-wall-s", type=float, default=180.0, help="running time per task")
    ev.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="engine weights; int8 and int4 are lossy (default: %(default)s)",
    )
    ev.add_argument(
        "--turn-max-tokens", type=int, default=2048, help="output tokens per model turn"
    )
    ev.add_argument(
        "--transcripts",
        default="",
        help="folder: write each task's turns, tool calls and results there "
        "(one JSONL per task; with several models, one subfolder each)",
    )
    ev.add_argument(
        "--progress",
        default="",
        help="JSONL file: each finished task is appended; a rerun with the same model and "
        "settings takes those tasks from it (resume a killed evaluation)",
    )
    ev.add_argument(
        "--free-tool-calls",
        action="store_true",
        help="decode tool calls without their grammar (measures how often the model alone "
        "writes calls that parse)",
    )


def _repo_parser(sub) -> None:
    p = sub.add_parser(
        "repo", help="pretrain a LoRA adapter on a workspace's own code; register the result"
    )
    p.add_argument("--workspace", required=True, help="the repository folder to learn")
    add_model_argument(
        p,
        default="",
        default_help="the recipe's init",
        servers=False,
        role="the model to start from",
    )
    _recipe_file_arguments(p, REPO_RECIPE, "recipe TOML")
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="files never read, beside telemetry's defaults (.env*, keys, certificates)",
    )
    p.add_argument("--consent", default="code", help="the workspace's telemetry consent")
    p.add_argument("--heldout", type=float, default=0.1, help="held-out share of files")
    p.add_argument("--eval-lines", type=int, default=50, help="completion lines evaluated")
    p.add_argument(
        "--eval-requests", type=int, default=50, help="simulated-user requests evaluated"
    )
    p.add_argument("--registry", default=None, help="model registry (default: the user's)")
    p.add_argument("--no-register", action="store_true", help="train and evaluate only")
    p.add_argument(
        "--promote",
        action="store_true",
        help="then serve inline completions from the result when the gate finds a gain over "
        "the version serving them (needs --model registry:completion)",
    )
    p.add_argument(
        "--no-resume", action="store_true", help="start over, reading the workspace again"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress lines")


def _data(args: argparse.Namespace) -> int:
    from training.data import CorpusConfig, build_corpus

    config = CorpusConfig(
        sources=args.source,
        exports=args.export,
        tokenizer=args.tokenizer,
        vocab_size=args.vocab_size,
        max_total_bytes=int(args.max_mb * 1e6),
        heldout_fraction=args.heldout,
    )
    manifest = build_corpus(config, args.out)
    print(json.dumps(manifest["stats"], indent=2))
    print(f"corpus written to {args.out}")
    return 0


def _tasks(args: argparse.Namespace) -> int:
    from training.tasks.dataset import export
    from training.tasks.generation import default_workers, generate_tasks

    workers = args.workers or default_workers()
    tasks = generate_tasks(
        args.projects,
        seed=args.seed,
        heldout_fraction=args.heldout,
        log=lambda line: print(line, file=sys.stderr),
        workers=workers,
        templates=[t for t in args.templates.split(",") if t] or None,
        pytest_fraction=args.pytest_fraction,
    )
    manifest = export(
        tasks,
        args.out,
        seed=args.seed,
        samples_per_task=args.samples,
        workers=workers,
        test_first=args.test_first,
        diagnose=args.diagnose,
    )
    print(json.dumps(manifest, indent=2))
    return 0


def _apply(args: argparse.Namespace) -> int:
    import sysconfig

    from training.code_apply import CodeApplyConfig, build

    sources = args.source or [sysconfig.get_paths()["stdlib"]]
    config = CodeApplyConfig(sources=sources, count=args.count, seed=args.seed)
    print(json.dumps(build(config, args.out), indent=2))
    return 0


def _starter(args: argparse.Namespace) -> int:
    from training.starter import StarterConfig, run, status
    from training.starter_ship import model_card, ship

    config = StarterConfig(
        out=args.out,
        quick=args.quick,
        projects=args.projects,
        samples=args.samples,
        eval_tasks=args.eval_tasks,
    )
    if args.status:
        rows = status(config)
        width = max(len(step) for step, _, _ in rows)
        for step, state, spent in rows:
            print(f"{step:<{width}}  {spent:>7}  {state}")
        return 0
    final = run(config, log=lambda line: print(line, flush=True))
    if args.ship:
        from agent.model import STARTER_DIR

        ship(final, STARTER_DIR, model_card(final))
    return 0


def _eval(args: argparse.Namespace, argv: list[str]) -> int:
    from training.evaluate import EvalConfig, evaluate_agent

    config = EvalConfig(
        split=args.split,
        limit=args.limit,
        max_steps=args.max_steps,
        max_wall_s=args.max_wall_s,
        turn_max_tokens=args.turn_max_tokens,
        dtype=args.dtype,
        constrain_tool_calls=not args.free_tool_calls,
        progress=args.progress,
    )
    reports = []
    for i, model in enumerate(args.model):
        if args.transcripts:
            sub = f"{i + 1}-{Path(model).name}" if len(args.model) > 1 else ""
            config.transcripts = str(Path(args.transcripts, sub))
        report = evaluate_agent(
            model, args.tasks, config, log=lambda line: print(line, file=sys.stderr, flush=True)
        )
        reports.append(report.to_dict())
        print(json.dumps({k: v for k, v in reports[-1].items() if k != "results"}, indent=2))
    if args.json:
        out = reports[0] if len(reports) == 1 else {"config": asdict(config), "models": reports}
        out = {"command": "flywheel train " + " ".join(argv), **out}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


def _rl(args: argparse.Namespace) -> int:
    from training.rl import load_rl_recipe, train_rl

    recipe = load_rl_recipe(args.recipe, parse_overrides(args.set))
    final = train_rl(recipe, resume=not args.no_resume, progress=not args.no_progress)
    print(f"model written to {final}")
    return 0


def _tab_parser(sub) -> None:
    p = sub.add_parser(
        "tab", help="completion RL on accepted/rejected suggestions (simulated user or telemetry)"
    )
    p.add_argument("--data", default="", help="RUN/data of `flywheel train repo`: simulated user")
    p.add_argument("--telemetry-db", default="", help="train on logged suggestion outcomes")
    p.add_argument(
        "--workspace",
        default="",
        help="with --telemetry-db: only the suggestions made in files under this folder",
    )
    add_model_argument(
        p,
        default="",
        default_help="the recipe's init",
        servers=False,
        role="the model to start from",
    )
    _recipe_file_arguments(p, TAB_RECIPE, "RL recipe")
    p.add_argument(
        "--min-prefix-chars",
        type=int,
        default=8,
        help="the simulated user accepts a correct start of the line this long",
    )
    p.add_argument("--seq-len", type=int, default=512, help="prompt tokens, completion included")
    p.add_argument("--registry", default=None, help="model registry (default: the user's)")
    p.add_argument("--no-register", action="store_true", help="train only")


def _registry_model(registry, model: str) -> tuple[str | None, str]:
    """(parent version, model folder) for `--model registry[:REF]`, read from `registry` (the
    folder the result goes to); (None, model) for any other model."""
    if registry is None or not (model == "registry" or model.startswith("registry:")):
        return None, model
    from agent.registry import Registry, RegistryError

    try:
        parent = Registry(registry).resolve(model.partition(":")[2] or "promoted")
        return parent, str(Registry(registry).verify(parent))
    except RegistryError as exc:
        raise RecipeError(f"--model {model}: {exc}") from None


def _tab(args: argparse.Namespace) -> int:
    from agent.registry import RegistryError, path_from_cli
    from training.rl import load_rl_recipe
    from training.simulated_user import UserConfig
    from training.tab_rl import TabError, train_tab

    registry = None if args.no_register else path_from_cli(args.registry)
    parent, model = _registry_model(registry, args.model)
    fill = {k: v for k, v in (("init", model), ("out", args.out)) if v}
    recipe = load_rl_recipe(args.recipe, {**parse_overrides(args.set), **fill})
    if recipe.env != "tab":
        raise RecipeError(f"recipe {args.recipe} is for env {recipe.env!r}, not 'tab'")
    user = UserConfig(
        min_prefix_chars=args.min_prefix_chars,
        seq_len=args.seq_len,
        max_new_tokens=recipe.max_tokens,
        seed=recipe.seed,
    )
    try:
        summary = train_tab(
            recipe,
            data=args.data,
            telemetry_db=args.telemetry_db,
            workspace=args.workspace,
            user=user,
            registry_root=registry,
            parent=parent,
            log=lambda line: print(line, flush=True),
        )
    except (TabError, RegistryError) as exc:
        print(f"flywheel train tab: {exc}", file=sys.stderr)
        return 1
    if summary.get("model"):
        print(f"model written to {summary['model']}")
    if summary.get("version"):
        vid = summary["version"]
        print(
            f"registered as {vid}: use --model registry:{vid}, or serve your editor's inline "
            f"completions from it: flywheel models promote {vid} --lane completion"
        )
    return 0


def _repo(args: argparse.Namespace) -> int:
    from agent.registry import RegistryError, path_from_cli
    from telemetry.privacy import DEFAULT_EXCLUDE
    from training.repo_eval import RepoEvalConfig
    from training.repo_files import RepoConfig, RepoError
    from training.repo_pretrain import train_repo

    overrides = parse_overrides(args.set)
    base = load_recipe(args.recipe, overrides)
    out = args.out or base.out
    registry = None if args.no_register else path_from_cli(args.registry)
    parent, model = _registry_model(registry, args.model or base.init)
    if args.promote and parent is None:
        print(
            "flywheel train repo: --promote compares the result with the version it started "
            "from: use --model registry:completion (and no --no-register)",
            file=sys.stderr,
        )
        return 2
    fill = {"out": out, "data": str(Path(out, "data")), "init": model}
    recipe = load_recipe(args.recipe, {**overrides, **fill})
    repo = RepoConfig(
        root=args.workspace,
        exclude=DEFAULT_EXCLUDE + tuple(args.exclude),
        consent=args.consent,
        heldout_fraction=args.heldout,
        seed=recipe.seed,
    )
    try:
        summary = train_repo(
            recipe,
            repo,
            registry,
            resume=not args.no_resume,
            progress=not args.no_progress,
            evaluation=RepoEvalConfig(
                seq_len=recipe.seq_len,
                max_lines=args.eval_lines,
                requests=args.eval_requests,
                device=recipe.device,
            ),
            parent=parent,
        )
    except (RepoError, RegistryError) as exc:
        print(f"flywheel train repo: {exc}", file=sys.stderr)
        return 1
    for side in ("before", "after"):
        s = summary[side]["summary"]
        rate = s.get("accept_rate", {}).get("mean")
        print(
            f"{side}: held-out ppl {s['ppl']['mean']:.3f}, exact line {s['exact']['mean']:.3f}"
            + ("" if rate is None else f", simulated accept rate {rate:.3f}")
        )
    print(f"model written to {summary['model']}")
    if summary.get("version"):
        vid = summary["version"]
        if args.promote:
            from agent.models_cli import promote
            from agent.registry import Registry

            return promote(Registry(registry), vid, force=False, lane="completion")
        print(
            f"registered as {vid}: use --model registry:{vid}, or serve your editor's inline "
            f"completions from it: flywheel models promote {vid} --lane completion"
        )
    return 0


def _stage(args: argparse.Namespace) -> int:
    from training.trainer import train

    recipe = load_recipe(args.recipe, parse_overrides(args.set))
    if recipe.stage != args.stage:
        raise RecipeError(f"recipe {args.recipe} is for stage {recipe.stage}, not {args.stage}")
    final = train(recipe, resume=not args.no_resume, progress=not args.no_progress)
    summary = Path(final, "flywheel.json")
    if summary.exists():
        print(summary.read_text())
    print(f"model written to {final}")
    return 0


# stage -> what runs it (eval, which records its command line, and the recipe stages aside)
_RUNS = {
    "data": _data,
    "tasks": _tasks,
    "apply": _apply,
    "starter": _starter,
    "rl": _rl,
    "repo": _repo,
    "tab": _tab,
}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
