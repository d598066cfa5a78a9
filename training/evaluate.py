"""Agent evaluation: a model runs held-out synthetic tasks through the real harness.

For each task: a fresh copy of its workspace, `agent.harness.Harness` over a local engine on the
checkpoint (greedy; the task's own test command for `run_tests`, as in the oracle's
trajectories), until the model answers or a limit stops it. Then the test files are restored
from the task (a model must not pass by editing the tests) and the task's verifying command
decides success. Each task is one sample of the benchmark (training/benchmark `run_sample`,
without the lint delta); this module reports it as the training loop's evaluation.

Vocabulary:

    tool call     one call the model wrote between `<tool_call>` markers
    parsed        a call with a name and well-formed arguments (agent.chat_format
                  .parse_assistant); `parse_rate` = parsed / all calls written
    valid         a parsed call to a known tool whose arguments fit its schema
    pass@1        share of tasks whose verifying command passes after one greedy attempt

With `transcripts`, each task's conversation as the harness saw it (every turn, tool call, tool
result and the stop) is written as JSONL, to read why a task failed. With `progress`, each finished
task's result is appended to a JSONL file with the model version and settings it ran under, and a
rerun with the same ones takes those tasks from it instead of running them again: a killed
evaluation resumes (greedy decoding makes a task's result the same either way).

What it does not do: sampling several attempts (pass@k), or score code quality; `flywheel bench
agent` (training/benchmark) does, and the promotion gate reads its results.

    flywheel train eval --model runs/starter/model --tasks runs/starter/tasks --json eval.json
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agent.engine.config import DTYPES
from agent.files import read_jsonl
from training.benchmark import pick_tasks
from training.tasks.dataset import load_tasks
from training.tasks.task import TEST_TIMEOUT_S, Task

__all__ = [
    "EvalConfig",
    "EvalReport",
    "TaskResult",
    "evaluate_agent",
    "evaluate_apply",
    "pick_tasks",
    "run_task",
]


@dataclass
class EvalConfig:
    split: str = "heldout"  # which tasks: heldout | train | all
    limit: int = 0  # at most this many tasks (spread over families); 0 = all
    max_steps: int = 12  # model turns per task (the oracle needs at most 8)
    max_wall_s: float = 180.0  # running time per task
    turn_max_tokens: int = 2048  # output tokens per model turn (the harness's default)
    device: str = "cpu"
    dtype: str = "float32"  # engine weights (agent/engine/config.py DTYPES; int8, int4 are lossy)
    speculative: str = "ngram"  # engine drafts (greedy: the output is the same as without)
    transcripts: str = ""  # folder: each task's harness events as <task id>.jsonl ("" = none)
    constrain_tool_calls: bool = True  # tool calls decoded under their grammar, as in the harness
    progress: str = ""  # JSONL of finished tasks, to resume a killed run from ("" = none)

    def __post_init__(self) -> None:
        if self.split not in ("heldout", "train", "all"):
            raise ValueError(f"split must be heldout, train or all, not {self.split!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")
        if self.limit < 0 or self.max_steps < 1 or self.max_wall_s <= 0 or self.turn_max_tokens < 1:
            raise ValueError(
                "limit must be >= 0, max_steps >= 1, max_wall_s > 0 and turn_max_tokens >= 1"
            )


@dataclass
class TaskResult:
    task_id: str
    family: str
    passed: bool
    stop_reason: str
    steps: int
    calls: int  # tool calls written
    parsed: int  # of which parsed
    valid: int  # of which named a known tool with fitting arguments
    seconds: float
    detail: str = ""


@dataclass
class EvalReport:
    model: str
    tasks: int
    pass_at_1: float
    parse_rate: float  # parsed / written tool calls (1.0 when none were written)
    valid_rate: float  # valid / written tool calls
    by_family: dict[str, float] = field(default_factory=dict)  # family -> pass@1
    stop_reasons: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    constrain_tool_calls: bool = True  # tool calls decoded under their grammar (the harness's)
    dtype: str = "float32"  # the engine's weights
    model_version: str = ""  # what `model` named when it ran ("default" changes with each ship)
    speculative: str = "ngram"  # the engine's drafts (greedy: the same output without)
    results: list[TaskResult] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def run_task(engine, task: Task, config: EvalConfig) -> TaskResult:
    """One task through the harness on a scratch copy of its workspace (greedy): the
    benchmark's `run_sample`, reported in this module's terms."""
    from training.benchmark import BenchConfig, from_synthetic, run_sample

    bench = BenchConfig(
        max_steps=config.max_steps,
        max_wall_s=config.max_wall_s,
        turn_max_tokens=config.turn_max_tokens,
        verify_timeout_s=TEST_TIMEOUT_S,
        temperature=0.0,
        lint=False,
        constrain_tool_calls=config.constrain_tool_calls,
    )
    if not config.transcripts:
        s = run_sample(engine, from_synthetic(task), bench, 0)
    else:
        folder = Path(config.transcripts)
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / f"{task.id.replace('/', '_')}.jsonl").open("w", encoding="utf-8") as out:

            def write(event: dict) -> None:
                out.write(json.dumps(event, default=str, ensure_ascii=False) + "\n")

            write({"kind": "task", "id": task.id, "family": task.family, "task": task.instruction})
            s = run_sample(engine, from_synthetic(task), bench, 0, on_event=write)
            write({"kind": "verdict", "passed": s.passed, "verdict": s.verdict})
    return TaskResult(
        task_id=task.id,
        family=task.family,
        passed=s.passed,
        stop_reason=s.stop_reason,
        steps=s.steps,
        calls=s.tool_calls,
        parsed=s.parsed_calls,
        valid=s.tool_calls - s.invalid_calls,
        seconds=round(s.wall_s, 2),
        detail=s.detail,
    )


def evaluate_agent(
    model: str,
    tasks: str | Path | list[Task],
    config: EvalConfig | None = None,
    log: Callable[[str], None] | None = None,
) -> EvalReport:
    """Run `tasks` (a tasks folder/file or a list) with the checkpoint `model`; see the module doc."""
    from agent.engine import EngineConfig, SpeculativeConfig, open_engine

    config = config or EvalConfig()
    if not isinstance(tasks, list):
        tasks = load_tasks(tasks, None if config.split == "all" else config.split)
    tasks = pick_tasks(tasks, config.limit)
    if not tasks:
        raise ValueError(f"no {config.split} tasks to evaluate")
    engine = open_engine(
        EngineConfig(
            model=str(model),
            device=config.device,
            dtype=config.dtype,
            speculative=SpeculativeConfig(config.speculative),
        )
    )
    t0 = time.monotonic()
    results = []
    version = engine.model_version
    key = _settings(str(model), version, config)
    finished = _finished(Path(config.progress), key) if config.progress else {}
    try:
        for i, task in enumerate(tasks, 1):
            result = finished.get(task.id)
            if result is None:
                result = run_task(engine, task, config)
                if config.progress:
                    _append(Path(config.progress), {"settings": key, "result": asdict(result)})
            results.append(result)
            if log:
                done = sum(r.passed for r in results)
                log(
                    f"eval {i}/{len(tasks)} {task.family:<24} "
                    f"{'PASS' if result.passed else 'fail'} ({result.stop_reason}, "
                    f"{result.steps} turns, {result.seconds:.0f}s"
                    f"{', from the progress file' if task.id in finished else ''})"
                    f"  pass@1 so far {done}/{i}"
                )
    finally:
        close = getattr(engine, "close", None)
        if callable(close):
            close()
    calls = sum(r.calls for r in results)
    families: dict[str, list[bool]] = {}
    reasons: dict[str, int] = {}
    for r in results:
        families.setdefault(r.family, []).append(r.passed)
        reasons[r.stop_reason] = reasons.get(r.stop_reason, 0) + 1
    return EvalReport(
        model=str(model),
        tasks=len(results),
        pass_at_1=round(sum(r.passed for r in results) / len(results), 4),
        parse_rate=round(sum(r.parsed for r in results) / calls, 4) if calls else 1.0,
        valid_rate=round(sum(r.valid for r in results) / calls, 4) if calls else 1.0,
        by_family={f: round(sum(v) / len(v), 3) for f, v in sorted(families.items())},
        stop_reasons=reasons,
        seconds=round(time.monotonic() - t0, 1),
        constrain_tool_calls=config.constrain_tool_calls,
        dtype=config.dtype,
        model_version=version,
        speculative=config.speculative,
        results=results,
    )


def _settings(model: str, version: str, config: EvalConfig) -> dict:
    """What a task's result depends on besides the task: a progress row counts only under these."""
    kept = ("split", "max_steps", "max_wall_s", "turn_max_tokens", "device", "dtype")
    return {
        "model": model,
        "model_version": version,
        "constrain_tool_calls": config.constrain_tool_calls,
        **{name: getattr(config, name) for name in kept},
    }


def _finished(path: Path, settings: dict) -> dict[str, TaskResult]:
    """Results in a progress file that ran under `settings`, by task id. A line cut short by a
    kill, or a row of an older format, is skipped (that task runs again)."""
    found: dict[str, TaskResult] = {}
    for row in read_jsonl(path):
        try:
            if row["settings"] == settings:
                result = TaskResult(**row["result"])
                found[result.task_id] = result
        except (KeyError, TypeError):
            continue
    return found


def _append(path: Path, row: dict) -> None:
    """One row on a line of its own, even after a line a kill cut short."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as out:  # writes go to the end whatever was read
        size = out.seek(0, 2)
        cut = False
        if size:
            out.seek(size - 1)
            cut = out.read(1) != b"\n"
        out.write(b"\n" * cut + (json.dumps(row) + "\n").encode())


def write_report(report: EvalReport, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report.to_dict(), indent=2) + "\n")


def evaluate_apply(
    model: str,
    examples: str | Path,
    limit: int = 12,
    dtype: str = "float32",
    log: Callable[[str], None] = print,
    copy_bias: float | None = None,
) -> dict:
    """Fast apply on the held-out rows of `examples` (training/code_apply.py: an original file,
    an edit sketch, the whole updated file): each is sent as a fast-apply request (the model's
    apply/ adapter where it has one), greedily, with n-gram drafts from the original file
    (lossless). Returns exact copies, mean difflib similarity to the expected file, tokens/s."""
    import difflib

    from agent.chat_format import apply_parts
    from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig
    from agent.engine.local.engine import LocalEngine

    rows = [json.loads(line) for line in Path(examples).read_text().splitlines() if line]
    rows = [row for row in rows if row.get("split") == "heldout"][:limit]
    if not rows:
        raise ValueError(f"no held-out examples in {examples}")
    spec = SpeculativeConfig("ngram", max_draft_tokens=16)
    # the copy bias: the engine's default (agent/engine/local/copy_bias.py) unless given
    bias = {} if copy_bias is None else {"apply_copy_bias": copy_bias}
    engine = LocalEngine(EngineConfig(model=model, dtype=dtype, speculative=spec, **bias))
    per_example, tokens, seconds, version = [], 0, 0.0, engine.model_version
    try:
        for row in rows:
            *messages, answer = row["messages"]
            parts = apply_parts(messages[1]["content"])
            original = parts[1] if parts else messages[1]["content"]
            expected = answer["content"]
            # room for about twice the expected file (code runs 3-4 characters per token)
            params = SamplingParams(temperature=0, max_tokens=len(expected) // 2 + 64)
            request = Request(messages=messages, speculation=original, params=params, apply=True)
            result = engine.generate(request)
            text, version = result.completions[0].text, result.completions[0].model_version
            similar = difflib.SequenceMatcher(None, text, expected, autojunk=False).ratio()
            exact = text.strip() == expected.strip()
            tokens += result.metrics.output_tokens
            seconds += result.metrics.total_s
            per_example.append(
                {"family": row["family"], "exact": exact, "similarity": round(similar, 4)}
            )
            log(f"{model:32} {row['family']:24} {'exact' if exact else '     '} {similar:.3f}")
    finally:
        engine.close()
    return {
        "version": version,  # what decoded them: the apply adapter's version, if any
        "exact": sum(e["exact"] for e in per_example),
        "examples": len(per_example),
        "mean_similarity": round(sum(e["similarity"] for e in per_example) / len(rows), 4),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else 0.0,
        "per_example": per_example,
    }
