"""`flywheel train starter`: the built-in default model, from offline sources, in one command.

    base   Qwen2.5-Coder-0.5B-Instruct from its wheels, converted once (agent/base.py)
    tasks  synthetic tasks + oracle trajectories in the harness's own format (training/tasks/),
           and recovery trajectories (tasks/recovery.jsonl)
    sft    a LoRA adapter (plus the `<|arg|>` row) on the base, trained on the trajectories and
           the recovery trajectories, with a quarter of its micro-batches code rows from stdlib
           modules in the inline-completion format (code/; training/recipes/sft.toml)
    mtp    2 MTP heads self-distilled from the SFT'd model, trunk frozen, over a 4,096-token
           draft vocabulary (mtp_starter.toml), on stdlib code, the train trajectories and the
           apply examples (mtp_text/)
    mtp_self  the heads continued on the model's own text: its greedy continuations of stdlib
           windows beside code and trajectories (training/self_text.py, mtp_self.toml)
    apply  a fast-apply adapter of its own on the base (apply.toml: LoRA on the attention's
           query, value and output layers), on examples made from stdlib files
           (tasks/apply_code.jsonl, training/code_apply.py); the engine decodes fast-apply
           requests with it
    eval   held-out tasks through the real harness, with the product's weights and drafts
           (int8 and prompt lookup on a CPU; training/evaluate.py; each task's
           conversation in eval-transcripts/) -> model/ (the last SFT adapter plus mtp/ and
           apply/)

Every stage reads its recipe from training/recipes/; this module only points their paths into the
run folder. Each step is skipped when its output already exists and training resumes from its
checkpoints, so a killed run continues where it stopped. `quick` shrinks every step to seconds
(a smoke test of the chain, not a model).

The result, `OUT/model/`, is an adapter folder (`agent.model.load_checkpoint` merges it into the
base) carrying `flywheel.json` with version `starter-<date>` and its lineage: the base, the
recipes (text and sha256), the task manifest's hash, the stage's final metrics, the evaluation
and the time of each step over every invocation (OUT/timings.json, `Ledger`).
training/starter_ship.py copies it into agent/starter/ (its MTP heads in int4, to fit the
package's budget). `status()` says where a run stands: each step done or not, its time so far,
and the running training stage's step with an estimate of what is left.

What it does not do: use telemetry exports (the starter is trained from offline sources only),
RL (`flywheel train rl`) or continued pretraining on the base.

    nice -n 5 flywheel train starter --out runs/starter
    flywheel train starter --out /tmp/smoke --quick                # a few minutes: the chain runs
    flywheel train starter --out runs/starter --status             # where that run stands
    flywheel train starter --out runs/starter --ship               # ... then copy to agent/starter
"""

from __future__ import annotations

import datetime
import json
import shutil
import threading
import time
import tomllib
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.files import read_jsonl
from agent.model import APPLY_DIR
from agent.registry import file_sha256

RECIPES = Path(__file__).resolve().parent / "recipes"
STAGE_ORDER = ("sft",)
MTP_RECIPE = "mtp_starter"  # the MTP heads, distilled from the last stage's model
MTP_SELF_RECIPE = "mtp_self"  # ... then continued on that model's own continuations
APPLY_RECIPE = "apply"  # the fast-apply adapter, on the base
APPLY_EXAMPLES = 2000  # fast-apply examples made from stdlib files
MTP_CODE_BYTES = 12_000_000  # stdlib code in the heads' corpus (about half; the rest: trajectories)
# The task set keeps the first five templates, those the shipped adapter was trained on, and
# its oracle's share of bug fixes that run the tests before the first edit.
TASK_TEMPLATES = ("account", "grades", "ranges", "text", "totals")
TASK_TEST_FIRST = 0.7


@dataclass
class StarterConfig:
    out: str  # run folder: tasks/, sft/, model/
    quick: bool = False  # seconds per stage: checks the chain, makes no useful model
    projects: int = 160  # synthetic projects (about 8 tasks each)
    samples: int = 1  # oracle trajectories per task
    eval_tasks: int = 27  # held-out tasks evaluated through the harness (0 = none)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.quick:
            self.projects = min(self.projects, 2)
            self.samples = 1
            self.eval_tasks = min(self.eval_tasks, 1)


# Overrides that make each stage take seconds (quick mode); the recipes stay the real ones.
QUICK = {
    stage: {"seq_len": 4096, "batch_size": 1, "grad_accum": 1, "steps": 2, "eval_batches": 1}
    for stage in STAGE_ORDER
}

# Quick mode evaluates train tasks too (2 projects may hold none out), one short turn each.
QUICK_EVAL = {"split": "all", "max_steps": 1, "max_wall_s": 30.0}


def stage_overrides(config: StarterConfig, stage: str) -> dict:
    """Paths of `stage` inside the run folder (plus the quick sizes in quick mode)."""
    out = Path(config.out)
    recipe = tomllib.loads((RECIPES / f"{stage}.toml").read_text())
    data = [str(out / "tasks" / Path(path).name) for path in recipe["sft_data"]]
    index = STAGE_ORDER.index(stage)  # each stage continues the one before, in a new order
    paths = {
        "init": "base" if index == 0 else str(out / STAGE_ORDER[index - 1] / "model"),
        "sft_data": data,
        "seed": config.seed + index,
    }
    if recipe.get("code_share"):
        paths["code_data"] = str(out / "code")
    extra = {"out": str(out / stage)}
    if config.quick:
        extra.update(QUICK[stage], log_every=1, eval_every=1000, save_every=1000)
    return {**paths, **extra}


def run(config: StarterConfig, log: Callable[[str], None] = print) -> Path:
    """The whole chain; returns OUT/model. See the module docstring."""
    from agent.base import ensure_base
    from training.recipe import load_recipe
    from training.trainer import train

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out / "timings.json", log)

    def stage(step: str, recipe_name: str, overrides: dict, data: Path | None = None, make=None):
        """Train one recipe unless its model exists; `make()` first writes its `data` if absent."""
        with ledger.step(step):
            recipe = load_recipe(RECIPES / f"{recipe_name}.toml", overrides)
            if (Path(recipe.out) / "model" / "flywheel.json").exists():
                return
            if make is not None and not data.exists():
                log(f"[starter] {step}: data -> {data}")
                make()
            log(f"[starter] {step}: {recipe.steps} steps of {recipe.batch_size}x{recipe.seq_len}")
            train(recipe, resume=True, progress=True)

    with ledger.step("base"):
        ensure_base(progress=lambda fraction, message: log(f"[starter] base: {message}"))
    tasks_dir = out / "tasks"
    with ledger.step("tasks"):
        make_tasks(config, tasks_dir, log)
    steps = training_steps(config)
    heads_text = Path(steps["mtp"][1]["data"]) / "manifest.json"
    own_text = Path(steps["mtp_self"][1]["data"]) / "manifest.json"
    examples = Path(steps["apply"][1]["sft_data"][0])
    code = out / "code" / "files.json"
    makers = {  # the data a step makes first, and how
        "sft": (code, lambda: code_files(config, code.parent)),
        "mtp": (heads_text, lambda: mtp_corpus(config)),
        "mtp_self": (own_text, lambda: self_text_corpus(config)),
        "apply": (examples, lambda: apply_examples(config, examples)),
    }
    for name, (recipe_name, overrides) in steps.items():
        stage(name, recipe_name, overrides, *makers.get(name, (None, None)))

    evaluation = None
    if config.eval_tasks:
        with ledger.step("eval"):
            evaluation = evaluate_agent_stage(config, log)
        with ledger.step("eval_apply"):
            evaluation["apply"] = evaluate_apply_stage(config, log)

    final = finish(config, evaluation, ledger.timings)
    log(f"[starter] model written to {final} in {time.monotonic() - ledger.t0:.0f}s")
    return final


def training_steps(config: StarterConfig) -> dict[str, tuple[str, dict]]:
    """The chain's training steps in order: step name -> (recipe name, its overrides)."""
    steps = {name: (name, stage_overrides(config, name)) for name in STAGE_ORDER}
    steps["mtp"] = (MTP_RECIPE, mtp_overrides(config))
    steps["mtp_self"] = (MTP_SELF_RECIPE, mtp_self_overrides(config))
    steps["apply"] = (APPLY_RECIPE, apply_overrides(config))
    return steps


def status(config: StarterConfig) -> list[tuple[str, str, str]]:
    """Where the run in `config.out` stands, without touching it: (step, state, time so far)
    for each step in order. A training step that has begun shows its last logged step and, from
    its time so far, about how long is left."""
    from agent.base import base_folder
    from training.recipe import load_recipe
    from training.trainer import clock

    out = Path(config.out)
    try:
        timings = json.loads((out / "timings.json").read_text())
    except (OSError, ValueError):
        timings = {}
    rows = []

    def add(step: str, state: str) -> None:
        spent = timings.get(step)
        rows.append((step, state, "-" if spent is None else clock(spent)))

    converted = (base_folder() / "flywheel.json").is_file()  # its files are checked on use
    add("base", "converted" if converted else "not converted yet")
    tasks = out / "tasks"
    done = (tasks / "manifest.json").exists() and (tasks / "recovery.jsonl").exists()
    add("tasks", "done" if done else "not started")
    for name, (recipe_name, overrides) in training_steps(config).items():
        recipe = load_recipe(RECIPES / f"{recipe_name}.toml", overrides)
        folder = Path(recipe.out)
        if (folder / "model" / "flywheel.json").exists():
            add(name, "done")
            continue
        records = read_jsonl(folder / "metrics.jsonl")
        trained = max((r.get("step", 0) for r in records if r.get("kind") == "train"), default=0)
        if not trained:
            add(name, "not started")
            continue
        left = timings.get(name, 0.0) / trained * (recipe.steps - trained)
        add(name, f"step {trained}/{recipe.steps}, about {clock(left)} left")
    progress = read_jsonl(out / "eval-progress.jsonl")
    kept = f"{len(progress)} of {config.eval_tasks} tasks done" if progress else "not started"
    add("eval", "done" if (out / "eval.json").exists() else kept)
    add("eval_apply", "done" if (out / "eval-apply.json").exists() else "not started")
    try:
        state = "written: " + json.loads((out / "model" / "flywheel.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        state = "not written yet"
    rows.append(("model", state, clock(sum(timings.values()))))
    return rows


class Ledger:
    """Seconds each step of a run has taken, over every invocation (a killed run resumes, and
    the time it spent counts): OUT/timings.json. The running step's figure is rewritten every
    `every` seconds, so a kill loses at most that much of it; a step that was already done
    adds nothing."""

    def __init__(self, path: Path, log: Callable[[str], None], every: float = 30.0):
        self.path, self.log, self.every = path, log, every
        self.t0 = time.monotonic()
        try:
            self.timings: dict[str, float] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.timings = {}

    def _write(self, step: str, seconds: float) -> None:
        from agent.files import atomic_write_text  # a kill mid-write leaves the old ledger

        self.timings[step] = round(seconds, 1)
        atomic_write_text(self.path, json.dumps(self.timings, indent=2) + "\n")

    @contextmanager
    def step(self, step: str):
        before, start = self.timings.get(step, 0.0), time.monotonic()
        done = threading.Event()

        def beat() -> None:
            while not done.wait(self.every):
                self._write(step, before + time.monotonic() - start)

        thread = threading.Thread(target=beat, name=f"ledger-{step}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            seconds = time.monotonic() - start
            if seconds >= 1.0:  # the step ran (a finished step is skipped in no time)
                self._write(step, before + seconds)
        total = time.monotonic() - self.t0
        self.log(f"[starter] {step} done in {seconds:.0f}s (total {total:.0f}s)")


def make_tasks(config: StarterConfig, tasks_dir: Path, log: Callable[[str], None]) -> None:
    """Synthetic tasks (from TASK_TEMPLATES), oracle and recovery trajectories in `tasks_dir`,
    unless already there."""
    from training.tasks.dataset import export, load_tasks, write_recovery
    from training.tasks.generation import default_workers, generate_tasks

    if not (tasks_dir / "manifest.json").exists():
        log(f"[starter] tasks: {config.projects} projects -> {tasks_dir}")
        workers = default_workers()
        tasks = generate_tasks(
            config.projects, seed=config.seed, workers=workers, templates=list(TASK_TEMPLATES)
        )
        export(
            tasks,
            tasks_dir,
            config.seed,
            samples_per_task=config.samples,
            workers=workers,
            test_first=TASK_TEST_FIRST,
        )
    elif not (tasks_dir / "recovery.jsonl").exists():  # a run from before recovery existed
        log(f"[starter] tasks: recovery trajectories -> {tasks_dir / 'recovery.jsonl'}")
        write_recovery(
            load_tasks(tasks_dir), tasks_dir, config.seed, default_workers(), TASK_TEST_FIRST
        )


def evaluate_agent_stage(config: StarterConfig, log: Callable[[str], None]) -> dict:
    """The last SFT stage's model on held-out tasks through the real harness, with the weights
    and drafts a product path gives it (agent/engine/config.py `default_dtype`,
    `default_speculative`), kept in OUT/eval.json for a rerun of the same model and settings."""
    from agent.engine.config import default_dtype, default_speculative
    from training.evaluate import EvalConfig, evaluate_agent, write_report

    out = Path(config.out)
    model = str(out / STAGE_ORDER[-1] / "model")
    settings = EvalConfig(
        limit=config.eval_tasks,
        dtype=default_dtype(model),
        speculative=default_speculative(model),
        transcripts=str(out / "eval-transcripts"),
        progress=str(out / "eval-progress.jsonl"),  # a killed evaluation resumes
        **(QUICK_EVAL if config.quick else {}),
    )
    path = out / "eval.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    same = (model, settings.dtype, settings.speculative)
    if (kept.get("model"), kept.get("dtype"), kept.get("speculative")) == same:
        return {k: v for k, v in kept.items() if k != "results"}  # a rerun, e.g. to --ship
    report = evaluate_agent(model, out / "tasks", settings, log=lambda x: log(f"[starter] {x}"))
    write_report(report, path)
    return {k: v for k, v in report.to_dict().items() if k != "results"}


APPLY_EVAL_EXAMPLES = 12  # held-out fast-apply examples the starter's evaluation runs


def evaluate_apply_stage(config: StarterConfig, log: Callable) -> dict:
    """The fast-apply adapter on held-out files (training/evaluate.py `evaluate_apply`), kept in
    OUT/eval-apply.json for a rerun of the same adapter."""
    from agent.model import checkpoint_version
    from training.evaluate import evaluate_apply

    out = Path(config.out)
    model = out / "apply" / "model"
    kept = out / "eval-apply.json"
    if kept.exists():
        report = json.loads(kept.read_text())
        if report.get("version") == checkpoint_version(model):
            return report
    limit = 1 if config.quick else APPLY_EVAL_EXAMPLES
    examples = out / "tasks" / "apply_code.jsonl"
    try:
        report = evaluate_apply(str(model), examples, limit, log=lambda x: log(f"[starter] {x}"))
    except ValueError as exc:  # quick mode's few examples may hold no file out
        log(f"[starter] apply evaluation skipped: {exc}")
        return {"skipped": str(exc)}
    report.pop("per_example")
    kept.write_text(json.dumps(report, indent=2) + "\n")
    return report


def _stage_summary(folder: Path) -> dict:
    """A training stage's version, size and final metrics, from its run folder."""
    records = read_jsonl(folder / "metrics.jsonl")
    meta = json.loads((folder / "model" / "flywheel.json").read_text())
    return {
        "version": meta.get("version"),
        "steps": meta.get("step"),
        "seq_len": meta.get("seq_len"),
        "final_train": _last(records, "train"),
        "final_eval": _last(records, "eval"),
    }


def _last(records: list[dict], kind: str) -> dict:
    picked = [r for r in records if r.get("kind") == kind]
    return picked[-1] if picked else {}


def mtp_overrides(config: StarterConfig) -> dict:
    """The MTP recipe's paths inside the run folder (plus the quick sizes in quick mode)."""
    out = Path(config.out)
    extra = {
        "init": str(out / STAGE_ORDER[-1] / "model"),
        "data": str(out / "mtp_text" / "corpus"),
        "out": str(out / "mtp"),
        "seed": config.seed,
    }
    if config.quick:
        extra.update(seq_len=64, batch_size=1, steps=2, eval_batches=1, draft_vocab=256)
        extra.update(log_every=1, eval_every=1000, save_every=1000)
    return extra


def mtp_self_overrides(config: StarterConfig) -> dict:
    """The self-text recipe's paths inside the run folder (plus the quick sizes in quick mode):
    it continues the heads of the `mtp` step."""
    out = Path(config.out)
    extra = {
        "init": str(out / "mtp" / "model"),
        "data": str(out / "mtp_self" / "text" / "corpus"),
        "out": str(out / "mtp_self"),
        "seed": config.seed,
    }
    if config.quick:
        extra.update(seq_len=64, batch_size=1, steps=2, eval_batches=1)
        extra.update(log_every=1, eval_every=1000, save_every=1000)
    return extra


def self_text_corpus(config: StarterConfig) -> Path:
    """The `mtp` step's model's own continuations and the corpus around them
    (training/self_text.py), under OUT/mtp_self/."""
    from agent.model import tokenizer_folder
    from training import self_text

    out = Path(config.out)
    model = out / "mtp" / "model"
    texts = self_text.continuations(
        str(model),
        out / "mtp_self" / "continuations.jsonl",
        count=4 if config.quick else self_text.WINDOWS,
        max_tokens=8 if config.quick else self_text.CONTINUATION_TOKENS,
    )
    trajectories = out / "tasks" / "trajectories.jsonl"
    code = self_text.CODE_CHARS // (100 if config.quick else 1)
    text = out / "mtp_self" / "text"
    return self_text.corpus(texts, trajectories, tokenizer_folder(model), text, code_chars=code)


def apply_overrides(config: StarterConfig) -> dict:
    """The fast-apply recipe's paths inside the run folder (plus the quick sizes)."""
    out = Path(config.out)
    extra = {
        "init": "base",
        "sft_data": [str(out / "tasks" / "apply_code.jsonl")],
        "out": str(out / "apply"),
    }
    if config.quick:
        extra.update(seq_len=1024, batch_size=1, grad_accum=1, steps=2, eval_batches=1)
        extra.update(log_every=1, eval_every=1000, save_every=1000)
    return extra


def apply_examples(config: StarterConfig, out: Path) -> dict:
    """Fast-apply examples from the local standard library (training/code_apply.py)."""
    import sysconfig

    from training.code_apply import CodeApplyConfig, build

    count = 40 if config.quick else APPLY_EXAMPLES
    stdlib = sysconfig.get_paths()["stdlib"]
    return build(CodeApplyConfig(sources=[stdlib], count=count, seed=config.seed), out)


def code_files(config: StarterConfig, folder: Path) -> dict:
    """The SFT stage's code rows (`code_data`): stdlib modules as one repository's data folder
    (training/repo_pretrain.py), split by path like a workspace. Never the files `flywheel bench
    engine` times, nor tests (`self_text.stdlib_files`)."""
    import sysconfig

    from training.repo_files import RepoFile, RepoFiles, split_files
    from training.repo_pretrain import write_repo_data
    from training.self_text import stdlib_files

    root = Path(sysconfig.get_paths()["stdlib"])
    paths = stdlib_files()[: 40 if config.quick else None]
    files = [RepoFile(p.relative_to(root).as_posix(), p.read_text(errors="replace")) for p in paths]
    train, held = split_files(files, 0.1, config.seed)
    return write_repo_data(RepoFiles(str(root), train, held, seed=config.seed), folder)


def mtp_corpus(config: StarterConfig) -> Path:
    """The heads' corpus: stdlib modules (not the files `flywheel bench engine` times, so its
    free-text figures are on text the heads never saw), the train trajectories and the train
    fast-apply examples, rendered as the engine renders them."""
    from agent.model import checkpoint_folder, tokenizer_folder
    from training.data import distillation_corpus
    from training.self_text import stdlib_code

    texts = stdlib_code(MTP_CODE_BYTES // (100 if config.quick else 1))
    tasks = Path(config.out) / "tasks"
    conversations = [
        row
        for name in ("trajectories.jsonl", "apply.jsonl")
        for row in map(json.loads, (tasks / name).read_text().splitlines())
        if row.get("split") == "train"
    ]
    model = checkpoint_folder(mtp_overrides(config)["init"])
    corpus, _ = distillation_corpus(
        Path(config.out) / "mtp_text",
        tokenizer_folder(model),
        texts,
        conversations,
        messages_alone=False,
        heldout_fraction=0.05,
    )
    return corpus


def _lineage(recipe: str, overrides: dict, corpus: Path | None = None) -> dict:
    """What a step trained from: its recipe file and hash, the overrides, its corpus's manifest."""
    entry = {
        "file": f"training/recipes/{recipe}.toml",
        "sha256": file_sha256(RECIPES / f"{recipe}.toml"),
        "overrides": overrides,
    }
    if corpus is not None:
        entry["corpus_manifest_sha256"] = file_sha256(corpus / "manifest.json")
    return entry


def finish(config: StarterConfig, evaluation: dict | None, timings: dict) -> Path:
    """OUT/model: the last stage's adapter folder, with the starter's version and lineage."""
    from agent.base import base_version
    from training.tasks.dataset import stable_sha256

    out = Path(config.out)
    last = out / STAGE_ORDER[-1] / "model"
    stages, recipes = {}, {}
    for stage in STAGE_ORDER:
        stages[stage] = _stage_summary(out / stage)
        recipes[stage] = _lineage(stage, stage_overrides(config, stage))
    stages["mtp"] = _stage_summary(out / "mtp")
    recipes["mtp"] = _lineage(MTP_RECIPE, mtp_overrides(config), out / "mtp_text" / "corpus")
    stages["mtp_self"] = _stage_summary(out / "mtp_self")
    recipes["mtp_self"] = _lineage(
        MTP_SELF_RECIPE, mtp_self_overrides(config), out / "mtp_self" / "text" / "corpus"
    )
    stages["apply"] = _stage_summary(out / "apply")
    recipes["apply"] = _lineage(APPLY_RECIPE, apply_overrides(config))
    data = {
        "tasks_manifest_sha256": file_sha256(out / "tasks" / "manifest.json"),
        "apply_examples_sha256": file_sha256(out / "tasks" / "apply_code.jsonl"),
        # Over the files with test durations and scratch-folder names masked (`stable_sha256`),
        # so that re-running the tasks stage can reproduce them.
        "trajectories_stable_sha256": stable_sha256(out / "tasks" / "trajectories.jsonl"),
        "recovery_stable_sha256": stable_sha256(out / "tasks" / "recovery.jsonl"),
        "tasks": json.loads((out / "tasks" / "manifest.json").read_text())["counts"],
    }
    split = out / "code" / "split.json"
    if split.exists():  # the code rows' files, by the fingerprint of their text and the split
        code = json.loads(split.read_text())
        data["code"] = {k: code[k] for k in ("fingerprint", "train_chars", "heldout_chars")}
    meta = {
        "version": f"starter-{datetime.datetime.now():%Y%m%d-%H%M}"
        + ("-quick" if config.quick else ""),
        "stage": "starter",
        "base": base_version(),
        "parent": stages[STAGE_ORDER[-1]]["version"],
        "config": asdict(config),
        "recipes": recipes,
        "data": data,
        "stages": stages,
        "evaluation": evaluation,
        "timings_s": {
            **timings,
            "total": round(sum(timings.values()), 1),
        },
        "machine": _machine(),
        "reproduce": f"nice -n 5 flywheel train starter --out {config.out}"
        + (" --quick" if config.quick else ""),
    }
    final = out / "model"
    tmp = out / ".model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(last, tmp)
    shutil.copytree(out / "mtp_self" / "model" / "mtp", tmp / "mtp")  # the heads, same trunk
    shutil.copytree(out / "apply" / "model", tmp / APPLY_DIR)  # the fast-apply adapter
    (tmp / "flywheel.json").write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def _machine() -> str:
    """The training machine in a few words, for the model card's reproduction figures."""
    import os

    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{os.cpu_count()} CPU cores, {gpu}"
