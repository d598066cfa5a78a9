"""Real-code tasks: bugs put into functions of the installed packages, and bodies to write again.

Each task is a small workspace with its own unittest file. The held-out split is for
`flywheel bench agent --real`; the train split becomes oracle trajectories for SFT.

Vocabulary used throughout (extract.py defines function, extract, probe and tests):

    package    a function's top-level module name (`email` for email.utils): the unit of the
               held-out split, so no held-out task shares code with a train one
    task       the broken extract and its tests, an instruction phrased as a user would, the
               verify command and the reference solution (the extract); families
               `bugfix/operator_swap|comparison|off_by_one|swapped_arguments` (bugfix.py's
               `mutations`, inside the function) and `rewrite/body` (the body replaced by `raise
               NotImplementedError`; the instruction names the function and quotes its docstring)
    row        one task as cached: split, package, module, function, solution and the BenchTask

Why generated tests rather than the projects' own: the standard library's tests are whole modules
that need `test.support`, and most packages ship none; neither fits an 8k-token context beside the
code. One small unittest file per function, a test method per probe asserting the outcome of the
original code, needs only the standard library and tests exactly the function of the task. A probe
is kept when the extract gives the same outcome as the installed module's own source (a faithful
extraction) under two hash seeds (no dependence on set order), and the outcome is a literal, a
repr compared as text, or an exception the test can name.

Every task is verified when built: its tests pass on the original and fail on the broken
workspace (a mutant they miss, or one that hangs, is dropped and counted). The build is
deterministic from a seed (which mutants, which phrasing); the split is not: it hashes the package
name, so held-out packages stay held out for every seed. The set is cached under
$FLYWHEEL_CACHE/real-tasks/, keyed by this code, extract.py, bugfix.py, the Python version, the
seed and the source of every module probed.

Why train on it: the synthetic projects (projects.py, templates.py) share one style, and a model
trained only on them guesses a synthetic family on other code instead of reading the bug. The
train split's tasks (whole packages, never held-out ones) become `Task`s, the oracle (oracle.py)
writes their trajectories, and SFT sees real code beside the synthetic projects
(training/recipes/sft_real.toml, an experiment: not a step of `flywheel train starter`).

What it does not do: methods or classes as targets, tasks spanning files, the projects' own tests.

    python -m training.tasks.real build                   # build (or rebuild) the cached set
    python -m training.tasks.real build --out runs/real   # ... into a folder (--real reads it)
    flywheel bench agent --real                           # the held-out split through the harness
    python -m training.tasks.real trajectories --real runs/real --out runs/starter/tasks
        -> real_trajectories.jsonl, real_recovery.jsonl (written whole; the counts are printed)
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import random
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from training.tasks.extract import (
    VERIFY,
    Extract,
    ExtractError,
    bound_names,
    extract,
    record,
    run_tests,
    same,
    usable,
    write_tests,
)
from training.tasks.generation import default_workers, in_order
from training.tasks.task import Task, TaskRejected

MIN_PROBES, MAX_PROBES = 3, 8  # usable probes a function needs (2 of them values, not
# exceptions, so a body that only raises fails), and how many its tests keep
MUTANTS_PER_FUNCTION = 3  # bug tasks per function (of different families when possible)
HELDOUT_FRACTION = 0.3  # of packages, by a hash of the package name
FILES = ("real_trajectories.jsonl", "real_recovery.jsonl")  # what `trajectories` writes

# One line per function, `module.function: probe; probe; ...`: Python expressions calling it.
PROBES_FILE = Path(__file__).with_name("real_probes.txt")


def probe_table(only: list[tuple[str, str]] | None = None) -> dict[tuple[str, str], list[str]]:
    """(module, function) -> probe expressions, from PROBES_FILE (`only`: just these functions)."""
    table: dict[tuple[str, str], list[str]] = {}
    for line in PROBES_FILE.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = re.match(r"([\w.]+)\.(\w+): (.*)$", line)
        if not match:
            raise ValueError(f"{PROBES_FILE.name}: not `module.function: probe; probe`: {line!r}")
        if only is None or (match[1], match[2]) in only:
            probes = [ast.get_source_segment(match[3], e) for e in ast.parse(match[3]).body]
            table.setdefault((match[1], match[2]), []).extend(probes)
    return table


# --- tasks -----------------------------------------------------------------------------------

_BUG_EXAMPLE = [
    "`{call}` {actual}, but it should {expected}. Fix {file}.",
    "In {file}, `{call}` {actual}; it should {expected}. Can you fix the code?",
]
_BUG_GENERAL = [
    "{test} fails. Fix the code in {file}, not the tests.",
    "The tests in {test_file} fail. Find the bug in `{function}()` and fix it.",
    "`{function}()` in {file} gives wrong results for some inputs. Run the tests and fix it.",
    "fix the failing tests",
]
_REWRITE = [
    "`{function}()` in {file} has lost its body: it only raises NotImplementedError. "
    "Write it again.{doc}",
    "Implement `{function}()` in {file}; it raises NotImplementedError now.{doc}",
]


def _says(outcome: list, verb: str) -> str:
    """An outcome in words: "returns `3`" / "raises ValueError" (verb "return": "return `3`")."""
    if outcome[0] == "raises":
        return f"{verb.replace('return', 'raise')} {outcome[1]}"
    return f"{verb} `{outcome[1]}`"


def stem_of(module: str) -> str:
    """The workspace module's name: the last part, suffixed when it would shadow the stdlib."""
    stem = module.rsplit(".", 1)[-1].strip("_")
    return f"{stem}_mod" if stem in sys.stdlib_module_names else stem


def package_of(module: str) -> str:
    return module.split(".")[0]


def is_heldout(package: str, fraction: float = HELDOUT_FRACTION) -> bool:
    digest = hashlib.sha256(f"real-tasks:{package}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


@dataclass
class _Target:
    """One function made ready for tasks: its extract and the tests every task of it shares."""

    module: str
    function: str
    extract: Extract
    tests: str  # test_<stem>.py: passes on the extract
    kept: list[tuple[str, list]]  # the probes the tests assert, each with its outcome

    @property
    def stem(self) -> str:
        return stem_of(self.module)

    @property
    def mod_file(self) -> str:
        return f"{self.stem}.py"

    @property
    def test_file(self) -> str:
        return f"test_{self.stem}.py"

    def workspace(self, module_source: str) -> dict[str, str]:
        """The task's files with `module_source` as the function's module."""
        return {self.mod_file: module_source, self.test_file: self.tests}

    def phrasing(self) -> dict[str, str]:
        """The fields an instruction template names."""
        return {"file": self.mod_file, "test_file": self.test_file, "function": self.function}


def _function_tasks(job: tuple[str, str, list[str], int]) -> tuple[list[dict], Counter]:
    """One function's verified tasks (cache rows) and why candidates were dropped."""
    module, function, probes, seed = job
    try:
        target = _prepare(module, function, probes)
    except ExtractError as exc:
        return [], Counter({exc.reason: 1})
    rng = random.Random(f"real-tasks:{seed}:{module}.{function}")
    drops: Counter = Counter()
    tasks = _bug_tasks(target, rng, drops)
    rewrite = _rewrite_task(target, rng, drops)
    tasks += [rewrite] if rewrite else []
    return [_row(target, *task) for task in tasks], drops


def _prepare(module: str, function: str, probes: list[str]) -> _Target:
    """The extract of `function`, the probes it keeps, and tests that pass on it; raises
    ExtractError with the drop reason otherwise."""
    stem = stem_of(module)
    ex = extract(module, function, f"# {function}() of {module}, with what it needs.")
    kept = _kept_probes(ex, module, stem, probes)
    names = set().union(*(bound_names(s) for s in ast.parse(ex.source).body))
    target = _Target(module, function, ex, write_tests(stem, function, kept, names), kept)
    if run_tests(target.workspace(ex.source)) != 0:
        raise ExtractError("original_fails")
    return target


def _kept_probes(ex: Extract, module: str, stem: str, probes: list[str]) -> list[tuple[str, list]]:
    """The probes (at most MAX_PROBES) whose outcome a test can assert and is the same on the
    extract under two hash seeds and on the installed module's own source, each with that
    outcome; a lazy result is listed. Raises ExtractError when too few are left."""
    with tempfile.TemporaryDirectory(prefix="flywheel-real-") as tmp:
        ws, empty = Path(tmp, "ws"), Path(tmp, "empty")
        ws.mkdir(), empty.mkdir()
        (ws / f"{stem}.py").write_text(ex.source)
        runs = [
            record(ws, stem, probes, 0),
            record(ws, stem, probes, 1),
            record(empty, module, probes, pure=True),
        ]
    if any(r is None for r in runs):
        raise ExtractError("import_fails")
    keep = [
        i
        for i, o in enumerate(runs[0])
        if same(o, runs[1][i]) and same(o, runs[2][i]) and usable(o)
    ][:MAX_PROBES]
    if len(keep) < MIN_PROBES or sum(runs[0][i][0] == "value" for i in keep) < 2:
        raise ExtractError("few_probes")
    return [(f"list({probes[i]})" if runs[0][i][2] else probes[i], runs[0][i]) for i in keep]


def _bug_tasks(target: _Target, rng: random.Random, drops: Counter) -> list[tuple[str, str, str]]:
    """Up to MUTANTS_PER_FUNCTION (family, broken module, instruction), families in turn (shuffled
    within); a mutant that does not parse, that the tests miss or that hangs is dropped."""
    from training.tasks.bugfix import mutations

    ex = target.extract
    candidates = [m for m in mutations(ex.source) if ex.start <= m.line <= ex.end]
    rng.shuffle(candidates)
    tried: Counter = Counter()
    tasks = []
    lines = ex.source.splitlines(keepends=True)
    while candidates and len(tasks) < MUTANTS_PER_FUNCTION:
        m = min(candidates, key=lambda c: tried[c.family])
        candidates.remove(m)
        tried[m.family] += 1
        broken = "".join(lines[: m.line - 1] + [m.after + "\n"] + lines[m.line :])
        try:
            ast.parse(broken)
        except SyntaxError:
            drops["mutant_unparsable"] += 1
            continue
        code = run_tests(target.workspace(broken))
        if code in (0, 124):
            drops["mutant_undetected" if code == 0 else "mutant_hangs"] += 1
            continue
        tasks.append((m.family, broken, _bug_instruction(target, broken, rng)))
    if not tasks:
        drops["no_mutant"] += 1
    return tasks


def _bug_instruction(target: _Target, broken: str, rng: random.Random) -> str:
    """The bug as a user reports it: half the time the first probe the broken code gets wrong
    (when it is short), else the failing test or a general request."""
    with tempfile.TemporaryDirectory(prefix="flywheel-real-") as tmp:
        Path(tmp, target.mod_file).write_text(broken)
        outcomes = record(Path(tmp), target.stem, [e for e, _ in target.kept]) or []
    kept = target.kept
    wrong = [i for i, o in enumerate(outcomes) if o[:2] != kept[i][1][:2]]  # the first one
    (expr, want), got = (kept[wrong[0]], outcomes[wrong[0]]) if wrong else ((None, None), None)
    if wrong and rng.random() < 0.5 and max(len(expr), len(want[1]), len(got[1])) <= 70:
        return rng.choice(_BUG_EXAMPLE).format(
            call=expr,
            actual=_says(got, "returns"),
            expected=_says(want, "return"),
            **target.phrasing(),
        )
    test = f"test_{target.function}_{wrong[0] + 1}" if wrong else None
    return rng.choice(_BUG_GENERAL[0 if test else 1 :]).format(test=test, **target.phrasing())


def _rewrite_task(
    target: _Target, rng: random.Random, drops: Counter
) -> tuple[str, str, str] | None:
    """The function's body replaced by `raise NotImplementedError` (its docstring kept), with an
    instruction that quotes the docstring; None when there is no body or the tests still pass."""
    ex = target.extract
    [node] = [
        s
        for s in ast.parse(ex.source).body
        if isinstance(s, ast.FunctionDef) and s.lineno == ex.start
    ]
    doc = ast.get_docstring(node)
    body = node.body[1:] if doc is not None else node.body
    if not body:
        drops["no_body"] += 1
        return None
    lines = ex.source.splitlines(keepends=True)
    indent = " " * body[0].col_offset
    broken = "".join(
        lines[: body[0].lineno - 1]
        + [f"{indent}raise NotImplementedError\n"]
        + lines[node.end_lineno :]
    )
    if run_tests(target.workspace(broken)) == 0:
        drops["rewrite_undetected"] += 1
        return None
    if doc:
        doc = doc if len(doc) <= 600 else doc.split("\n\n")[0][:600]
        doc = f" Its docstring says:\n\n{doc}"
    else:
        doc = f" The tests in {target.test_file} show what it should do."
    return "rewrite/body", broken, rng.choice(_REWRITE).format(doc=doc, **target.phrasing())


def _row(target: _Target, family: str, broken: str, instruction: str) -> dict:
    """A task as a cache row (see the vocabulary)."""
    from training.benchmark import BenchTask, changed_lines

    module, function = target.module, target.function
    files = target.workspace(broken)
    digest = hashlib.sha256(json.dumps([instruction, files], sort_keys=True).encode())
    task = BenchTask(
        id=f"real/{module}.{function}/{family.split('/')[1]}-{digest.hexdigest()[:8]}",
        source="real",
        family=family,
        instruction=instruction,
        files=files,
        verify=VERIFY,
        verify_files={target.test_file: target.tests},  # restored before verifying
        test_command=None,  # the harness detects it, as on a user's project
        reference_changed_lines=changed_lines(files, target.workspace(target.extract.source)),
    )
    return {
        "split": "heldout" if is_heldout(package_of(module)) else "train",
        "package": package_of(module),
        "module": module,
        "function": function,
        "solution": {target.mod_file: target.extract.source},
        "task": asdict(task),
    }


# --- building, caching and loading -----------------------------------------------------------


def build(
    seed: int = 0,
    only: list[tuple[str, str]] | None = None,
    workers: int = 1,
    log: Callable[[str], None] | None = None,
) -> tuple[list[dict], dict]:
    """Every function's verified tasks (rows: split, package, module, function, solution, task)
    and a manifest with the counts per package and the drop reasons."""
    jobs = [(m, f, probes, seed) for (m, f), probes in probe_table(only).items()]
    rows: list[dict] = []
    drops: Counter = Counter()
    packages: dict[str, dict] = {}
    for (module, function, _, _), (found, dropped) in zip(
        jobs, in_order(_function_tasks, jobs, workers), strict=True
    ):
        rows += found
        drops.update(dropped)
        p = package_of(module)
        entry = packages.setdefault(
            p, {"split": "heldout" if is_heldout(p) else "train", "functions": 0, "tasks": 0}
        )
        entry["functions"] += bool(found)
        entry["tasks"] += len(found)
        if log:
            why = ", ".join(f"{k} {v}" for k, v in sorted(dropped.items()))
            log(f"{module}.{function}: {len(found)} tasks" + (f" (dropped: {why})" if why else ""))
    manifest = {
        "seed": seed,
        "python": sys.version.split()[0],
        "tasks": dict(Counter(r["split"] for r in rows)),
        "packages": dict(sorted(packages.items())),
        "dropped": dict(sorted(drops.items())),
    }
    return rows, manifest


def cache_folder(seed: int = 0) -> Path:
    """Where the set for `seed` is cached, keyed by what it depends on: this code, extract.py,
    the probes, bugfix.py (the mutations), the Python version and the source of every module
    probed."""
    from telemetry.folders import cache_home

    h = hashlib.sha256(f"{seed}:{sys.version}".encode())
    here = Path(__file__)
    for path in [here, here.with_name("extract.py"), PROBES_FILE, here.with_name("bugfix.py")]:
        h.update(Path(path).read_bytes())
    for module in sorted({m for m, _ in probe_table()}):
        spec = importlib.util.find_spec(module)
        if spec and spec.origin and Path(spec.origin).is_file():
            h.update(Path(spec.origin).read_bytes())
    return cache_home() / "real-tasks" / f"seed{seed}-{h.hexdigest()[:16]}"


def write_set(folder: str | Path, rows: list[dict], manifest: dict) -> Path:
    """tasks.jsonl and manifest.json in `folder`, written whole (a temporary folder renamed)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    (tmp / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def read_rows(folder: str | Path) -> list[dict]:
    file = Path(folder) / "tasks.jsonl"
    if not file.is_file():
        raise FileNotFoundError(
            f"no real tasks at {str(folder)!r}; build them with "
            f"`python -m training.tasks.real build --out {folder}`"
        )
    return [json.loads(line) for line in file.read_text().splitlines() if line.strip()]


def real_tasks(
    folder: str | Path | None = None,
    split: str = "heldout",
    seed: int = 0,
    workers: int | None = None,
    log: Callable[[str], None] | None = None,
) -> list:
    """BenchTasks of one split ("heldout", "train" or "all"): from `folder` (written by
    `build --out`), else from the cache, built first (in `workers` processes) when absent."""
    from training.benchmark import BenchTask

    if split not in ("heldout", "train", "all"):
        raise ValueError(f"split must be heldout, train or all, not {split!r}")
    if folder is None:
        folder = cache_folder(seed)
        if not (folder / "tasks.jsonl").is_file():
            if log:
                log(f"building the real-code tasks into {folder} (once)")
            write_set(folder, *build(seed, workers=workers or default_workers(), log=log))
    rows = read_rows(folder)
    return [BenchTask(**r["task"]) for r in rows if split == "all" or r["split"] == split]


# --- the train split as SFT trajectories ------------------------------------------------------


def training_tasks(rows: list[dict]) -> list[Task]:
    """The train split's rows (tasks.jsonl) as Tasks with the notes the oracle's answers use:
    the function, and for a bug its line before and after."""
    tasks = []
    for row in rows:
        if row["split"] != "train":
            continue
        bench, solution = row["task"], row["solution"]
        notes: dict = {"function": row["function"]}
        if bench["family"].startswith("bugfix/"):
            [(path, fixed)] = solution.items()
            broken_lines, fixed_lines = bench["files"][path].splitlines(), fixed.splitlines()
            changed = [
                i for i, (a, b) in enumerate(zip(broken_lines, fixed_lines, strict=True)) if a != b
            ]
            if len(changed) != 1:  # a mutation changes one line; anything else is not ours
                continue
            at = changed[0]
            notes.update(
                line=at + 1, mutated=broken_lines[at].strip(), original=fixed_lines[at].strip()
            )
        tasks.append(
            Task(
                id=bench["id"],
                family=bench["family"],
                project=f"real:{row['package']}",
                split="train",
                instruction=bench["instruction"],
                files=bench["files"],
                solution=solution,
                test_command=bench["verify"],
                notes=notes,
            )
        )
    return tasks


def write_trajectories(
    tasks: list[Task], out: str | Path, seed: int = 0, workers: int = 1
) -> dict[str, int]:
    """real_trajectories.jsonl (one oracle trajectory per task) and real_recovery.jsonl (one
    recovery trajectory per task that allows a mistake) in `out`, each written to a temporary
    name and renamed, so a killed run leaves no partial file. Returns the row counts."""
    from training.tasks.dataset import recovery_row

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    jobs = [(task, seed, 1.0) for task in tasks]  # (task, seed, test_first): see recovery_row
    for name, make in zip(FILES, (_plain_row, recovery_row), strict=True):
        part = out / f"{name}.part"
        count = 0
        with part.open("w") as f:
            for row in in_order(make, jobs, workers):
                if row is not None:
                    f.write(json.dumps(row) + "\n")
                    count += 1
        part.replace(out / name)
        counts[name] = count
    return counts


def _plain_row(job: tuple[Task, int, float]) -> dict | None:
    from training.tasks.oracle import oracle_trajectory

    task, seed, _ = job
    try:
        return oracle_trajectory(task, random.Random(f"real:{seed}:{task.id}"))
    except TaskRejected:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m training.tasks.real", description=__doc__.split("\n")[0]
    )
    commands = p.add_subparsers(dest="command", required=True)
    build_p = commands.add_parser("build", help="build (or rebuild) the set; prints a table")
    build_p.add_argument("--out", default=None, help="folder (default: the cache --real reads)")
    build_p.add_argument("--seed", type=int, default=0)
    build_p.add_argument("--workers", type=int, default=default_workers(), help="processes")
    build_p.add_argument("--only", nargs="*", default=None, help="module:function ... (a subset)")
    build_p.add_argument("--verbose", action="store_true", help="one line per function")
    sft_p = commands.add_parser("trajectories", help="the train split as SFT trajectories")
    sft_p.add_argument(
        "--real", required=True, help="a real-code set (python -m training.tasks.real build --out)"
    )
    sft_p.add_argument("--out", required=True, help="the tasks folder to add the trajectories to")
    sft_p.add_argument("--seed", type=int, default=0)
    sft_p.add_argument("--workers", type=int, default=default_workers())
    args = p.parse_args(argv)
    return _build_command(args) if args.command == "build" else _trajectories_command(args)


def _build_command(args: argparse.Namespace) -> int:
    only = [tuple(x.rsplit(":", 1)) for x in args.only] if args.only is not None else None
    folder = Path(args.out) if args.out else cache_folder(args.seed)
    log = (lambda s: print(s, file=sys.stderr)) if args.verbose else None
    write_set(folder, *build(args.seed, only, args.workers, log))
    manifest = json.loads((folder / "manifest.json").read_text())
    print(f"{'package':<20} {'split':<8} {'functions':>9} {'tasks':>6}")
    for name, entry in manifest["packages"].items():
        print(f"{name:<20} {entry['split']:<8} {entry['functions']:>9} {entry['tasks']:>6}")
    for split in ("heldout", "train"):
        chosen = [e for e in manifest["packages"].values() if e["split"] == split and e["tasks"]]
        print(f"{split}: {manifest['tasks'].get(split, 0)} tasks from {len(chosen)} packages")
    print("dropped: " + ", ".join(f"{k} {v}" for k, v in manifest["dropped"].items()))
    print(f"written: {folder}")
    return 0


def _trajectories_command(args: argparse.Namespace) -> int:
    try:
        tasks = training_tasks(read_rows(args.real))
    except FileNotFoundError as e:
        print(f"python -m training.tasks.real: {e}", file=sys.stderr)
        return 2
    counts = write_trajectories(tasks, args.out, args.seed, args.workers)
    print(f"{len(tasks)} train tasks -> " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
