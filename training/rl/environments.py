"""Where rollouts happen: the agent's own harness on verifiable tasks, and a toy bandit.

An environment is a small picklable object with three methods, called in the rollout worker:

    tasks(split)                         -> the tasks of "train" or "heldout"
    ready()                              -> "" or why no rollout can run here (once, at start)
    check(task)                          -> "" or why the task cannot be used (run once at start)
    rollout(engine, tokenizer, task, G, seed) -> G `Trajectory`s with their signals

`HarnessEnv` is the product itself: for each sample a fresh copy of the task's workspace, the real
`agent.harness.Harness` (same tools, limits and sandbox as `flywheel run`; seed = seed + sample,
the recipe's temperature; a group's samples run at once, each on a thread of its own, so that an
engine on its own thread decodes their turns in one batched pass), then the test files are restored from the task (a model must not pass
by editing the tests) and the task's verifying command decides `passed`. The engine is wrapped in
`RecordingEngine`, which records each model turn: the prompt token ids as the engine tokenized
them (checked against the engine's own prompt token count), the output ids exactly as sampled
(`Completion.token_ids`), the sampling logprobs and the policy version. Signals for the reward
are the telemetry vocabulary: test counts after, tool calls, tool errors, invalid and repeated
calls, the final answer and the stop reason; and `final_diff`, a short hash of the rollout's
change to the workspace (its non-test files against the task's), so that identical answers in a
group can be counted. A trajectory stopped by a limit (turns, tokens, running time, context) or
whose last turn hit `max_tokens` is *truncated*.

`MagicTokenEnv` ("say the magic token") is the toy that proves the loop learns: task i is a fixed
three-token prompt, the answer is the one sampled token, and it pays when token % every ==
i % every (so chance is 1/every); its `final_diff` is the sampled token. It has no held-out
split: its evaluation reuses its prompts.

Tasks whose verifier cannot run (missing program, permission) are dropped by `check` with the
reason; a verifier that crashes or hangs during a rollout makes that trajectory an error, left
out of training.

The agent's commands run in the harness's sandbox (agent/harness/sandbox.py, bubblewrap). Where
it cannot run (bwrap missing, or no user namespaces), `HarnessEnv.ready` says so and the run does
not start: rollouts whose every command is refused would teach the model a harness users never
see. On a throwaway machine `unconfined` (the recipe's `unconfined_commands`) runs them
unconfined instead, with approval off (a rollout has nobody to ask). The verifier runs beside the
harness, never in the sandbox, at most `test_workers` at once across every rollout of the process
(0: one per CPU core), so that a GPU's many concurrent samples do not oversubscribe the cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.chat_format import render_chat
from agent.engine import EngineError, Request, Result, SamplingParams
from training.rl.trajectory import Trajectory, Turn

LIMIT_STOPS = ("max_steps", "max_tokens", "wall_time", "context_overflow")
VERSION_RE = re.compile(r"@rl(\d+)$")


def policy_version(model_version: str) -> int:
    """The integer policy version in a checkpoint version like "run@rl12" (0 for the initial)."""
    match = VERSION_RE.search(model_version or "")
    return int(match.group(1)) if match else 0


def version_name(run: str, version: int) -> str:
    return f"{run}@rl{version}"


# --- the toy ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MagicTask:
    id: str
    index: int
    prompt_ids: tuple[int, ...]


@dataclass
class MagicTokenEnv:
    tasks_count: int = 4  # prompts
    every: int = 8  # token t pays on task i when t % every == i % every
    max_tokens: int = 1  # output tokens sampled (only the first one is judged)
    temperature: float = 1.0

    def tasks(self, split: str) -> list[MagicTask]:
        return [
            MagicTask(f"magic-{i}", i, (40 + i, 50 + i, 60 + i)) for i in range(self.tasks_count)
        ]

    def ready(self) -> str:
        return ""

    def check(self, task: MagicTask) -> str:
        return ""

    def paid(self, task: MagicTask, token: int) -> bool:
        return token % self.every == task.index % self.every

    def rollout(self, engine, tokenizer, task: MagicTask, group_size: int, seed: int):
        params = SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, seed=seed, n=group_size
        )
        result = engine.generate(Request(prompt=list(task.prompt_ids), params=params))
        out = []
        for i, comp in enumerate(result.completions):
            hit = bool(comp.token_ids) and self.paid(task, comp.token_ids[0])
            version = policy_version(comp.model_version or engine.model_version)
            turn = Turn(
                list(task.prompt_ids),
                list(comp.token_ids),
                list(comp.logprobs or []),
                version,
                comp.finish_reason,
            )
            signals = {
                "tests_after_passed": int(hit),
                "tests_after_failed": int(not hit),
                "final_diff": " ".join(map(str, comp.token_ids)),
            }
            out.append(Trajectory(task.id, i, [turn], signals, "answered", passed=hit))
        return out


# --- the harness -----------------------------------------------------------------------------


class RecordingEngine:
    """An Engine that passes requests through to `engine` and records every model turn."""

    def __init__(self, engine, tokenizer) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.turns: list[Turn] = []
        self.errors: list[str] = []

    @property
    def model_version(self) -> str:
        return self.engine.model_version

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    @property
    def show_min_confidence(self) -> float | None:
        return self.engine.show_min_confidence

    def prompt_ids(self, request: Request) -> list[int]:
        """The prompt as the local engine tokenizes it (chat template, no special tokens added)."""
        if request.messages is not None:
            text = render_chat(self.tokenizer, request.messages, request.tools, True)
            return self.tokenizer.encode(text, add_special_tokens=False)
        if isinstance(request.prompt, str):
            return self.tokenizer.encode(request.prompt, add_special_tokens=False)
        return list(request.prompt or [])

    def generate(self, request: Request) -> Result:
        result = self.engine.generate(request)
        prompt = self.prompt_ids(request)
        if len(prompt) != result.metrics.prompt_tokens:
            self.errors.append(
                f"prompt token ids do not match the engine's ({len(prompt)} here, "
                f"{result.metrics.prompt_tokens} in the engine): the tokenizer differs"
            )
        for comp in result.completions[:1]:
            version = policy_version(comp.model_version or self.engine.model_version)
            self.turns.append(
                Turn(
                    prompt,
                    list(comp.token_ids),
                    list(comp.logprobs or []),
                    version,
                    comp.finish_reason,
                )
            )
        return result

    def stream(self, request: Request):
        raise EngineError("rollouts record model turns through generate(); stream is not used")

    def swap(self, model: str) -> str:
        return self.engine.swap(model)

    def close(self) -> None:
        pass  # the worker owns the engine


_UNITTEST_RAN = re.compile(r"^Ran (\d+) tests?", re.MULTILINE)
_UNITTEST_FAILED = re.compile(r"FAILED \(([^)]*)\)")
_PYTEST = re.compile(r"(\d+) (passed|failed|error|errors)\b")


def count_tests(code: int, output: str) -> tuple[int, int]:
    """(passed, failed) from unittest or pytest output; (1, 0) / (0, 1) by exit code otherwise."""
    ran = _UNITTEST_RAN.search(output)
    if ran:
        total = int(ran.group(1))
        failed = 0
        bad = _UNITTEST_FAILED.search(output)
        if bad:
            failed = sum(int(n) for n in re.findall(r"(?:failures|errors)=(\d+)", bad.group(1)))
        if total:
            return total - min(failed, total), min(failed, total)
    counts = {"passed": 0, "failed": 0}
    for n, kind in _PYTEST.findall(output):
        counts["passed" if kind == "passed" else "failed"] += int(n)
    if counts["passed"] or counts["failed"]:
        return counts["passed"], counts["failed"]
    return (1, 0) if code == 0 else (0, 1)


def is_test_file(path: str) -> bool:
    return Path(path).name.startswith("test_")


def final_diff(root: Path, files: dict[str, str]) -> str:
    """A short hash of what changed in `root` against the starting `files`: the non-test files
    added, edited or deleted (caches and dot folders left out)."""
    from agent.harness.scratch import read_files

    after = {
        path: text
        for path, text in read_files(root).items()
        if not any(part.startswith(".") for part in Path(path).parts)
    }
    changed = sorted(
        (path, after.get(path))
        for path in set(after) | set(files)
        if not is_test_file(path) and after.get(path) != files.get(path)
    )
    return hashlib.sha256(json.dumps(changed).encode()).hexdigest()[:12]


_VERIFIER_SLOTS: dict[int, threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


def verifier_slots(workers: int) -> threading.BoundedSemaphore:
    """The process's semaphore bounding concurrent verifier runs (0: one per CPU core)."""
    size = workers or os.cpu_count() or 1
    with _SLOTS_LOCK:
        return _VERIFIER_SLOTS.setdefault(size, threading.BoundedSemaphore(size))


def load_rl_tasks(path: str | Path, split: str) -> list:
    """Synthetic tasks (`flywheel train tasks`) or telemetry's rl_tasks/benchmark.jsonl rows."""
    from training.tasks.dataset import load_tasks
    from training.tasks.task import Task

    path = Path(path)
    file = path / "tasks.jsonl" if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(
            f"no tasks at {str(file)!r}: make them with `flywheel train tasks --out DIR` or "
            "export them with `flywheel telemetry export`"
        )
    first = next((line for line in file.read_text().splitlines() if line.strip()), "{}")
    if "workspace" not in json.loads(first):
        return load_tasks(file, split)
    # A telemetry export: rl_tasks.jsonl trains, benchmark.jsonl beside it is held out.
    source = file if split == "train" else file.with_name("benchmark.jsonl")
    if not source.exists():
        return []
    tasks = []
    for line in source.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if not row.get("verify"):
            continue
        tasks.append(
            Task(
                row["id"],
                row.get("family", "telemetry"),
                row["id"],
                split,
                row["instruction"],
                row["workspace"],
                {},
                test_command=row["verify"],
            )
        )
    return tasks


@dataclass
class HarnessEnv:
    tasks_path: str
    max_turns: int = 8  # model turns per rollout
    turn_max_tokens: int = 512
    temperature: float = 1.0
    wall_s: float = 120.0  # the harness's running-time limit per rollout
    limit: int = 0  # at most this many training tasks
    # A group's samples run at once (each its own thread): an engine on its own thread batches
    # their steps (agent/engine/scheduler.py). Off: one after another.
    concurrent: bool = True
    test_workers: int = 0  # verifier runs at once in this process; 0 = one per CPU core
    unconfined: bool = False  # without a working sandbox: commands unconfined, approval off

    def tasks(self, split: str) -> list:
        tasks = load_rl_tasks(self.tasks_path, split)
        if split == "train" and self.limit:
            tasks = tasks[: self.limit]
        return tasks

    def sandbox_config(self):
        from agent.harness.sandbox import SandboxConfig

        return SandboxConfig(allow_unconfined=self.unconfined)

    def ready(self) -> str:
        """ "" when the agent's commands can run in the sandbox here, else one line saying why
        and what to do (the module docstring)."""
        from agent.harness.sandbox import Sandbox

        with tempfile.TemporaryDirectory(prefix="flywheel-sandbox-check-") as root:
            result = Sandbox(root, self.sandbox_config()).run("true", 30)
        if result.exit_code == 0:
            return ""
        why = result.output.strip().splitlines()[-1] if result.output.strip() else "no output"
        return (
            f"the agent's commands cannot run in the sandbox here ({why[:200]}): install "
            "bubblewrap (apt-get install bubblewrap; `make rl-gpu-wheels` carries its package), "
            "or on a throwaway machine set unconfined_commands = true in the recipe"
        )

    def check(self, task) -> str:
        """The verifier must run on the untouched workspace (it is expected to fail there)."""
        from training.tasks.task import run_tests

        try:
            code, output = run_tests(task.files, task.test_command, timeout=60)
        except OSError as exc:
            return f"verifier {task.test_command!r} cannot run: {exc}"
        if code in (126, 127):
            return f"verifier {task.test_command!r} cannot run (exit {code}): {output[-200:]}"
        return ""

    def rollout(self, engine, tokenizer, task, group_size: int, seed: int) -> list[Trajectory]:
        if not self.concurrent or group_size == 1:
            return [self.one(engine, tokenizer, task, i, seed + i) for i in range(group_size)]
        with ThreadPoolExecutor(group_size, thread_name_prefix="rollout-sample") as pool:
            samples = [
                pool.submit(self.one, engine, tokenizer, task, i, seed + i)
                for i in range(group_size)
            ]
            return [sample.result() for sample in samples]

    def one(self, engine, tokenizer, task, sample: int, seed: int) -> Trajectory:
        from agent.harness.scratch import run_unattended, scratch_copy

        t0 = time.monotonic()
        recording = RecordingEngine(engine, tokenizer)
        calls = _CallCounts()
        traj = Trajectory(task.id, sample, [])
        config = self._harness_config(task, seed)
        try:
            with scratch_copy(task.files, prefix="flywheel-rollout-") as root:
                outcome = run_unattended(
                    recording, root, task.instruction, config, task.test_command, calls.on_event
                )
                diff = final_diff(root, task.files)
                code, output, traj.error = self._verify(root, task)
            passed, failed = count_tests(code, output)
            traj.turns = recording.turns
            traj.stop_reason = outcome.stop_reason or "waiting"
            traj.passed = code == 0 and not traj.error
            last = recording.turns[-1].finish_reason if recording.turns else ""
            traj.truncated = traj.stop_reason in LIMIT_STOPS or last == "length"
            traj.signals = {
                "tests_after_passed": passed,
                "tests_after_failed": failed,
                "final_message": outcome.final,
                "final_message_chars": len(outcome.final or ""),
                "stop_reason": traj.stop_reason,
                "stop_detail": outcome.detail,
                "repeated_tool_calls": calls.repeated,
                "final_diff": diff,
                **calls.counts,
            }
            if code == 124:
                traj.error = traj.error or "the verifier timed out"
            if recording.errors:
                traj.error = traj.error or recording.errors[0]
        except Exception as exc:  # a crashed rollout is one bad trajectory, not a dead run
            traj.turns = recording.turns
            traj.error = f"rollout crashed: {type(exc).__name__}: {exc}"
        traj.seconds = time.monotonic() - t0
        return traj

    def _harness_config(self, task, seed: int):
        """The harness settings of one rollout: this environment's limits and sampling, the
        task's own test command, unattended."""
        from agent.harness import HarnessConfig
        from agent.harness.config import ApprovalPolicy
        from training.tasks.oracle import task_tools_config

        return HarnessConfig(
            max_steps=self.max_turns,
            max_wall_s=self.wall_s,
            turn_max_tokens=self.turn_max_tokens,
            temperature=self.temperature,
            seed=seed,
            editor="rollout",
            priority="background",  # an editor sharing the engine goes first
            tools=task_tools_config(task),
            sandbox=self.sandbox_config(),
            # unconfined commands would each wait for an approval nobody gives
            approval=ApprovalPolicy(commands="never") if self.unconfined else ApprovalPolicy(),
            # The trainer scores the policy's own distribution: tokens sampled under the tool-call
            # grammar's mask would carry masked log-probabilities and bias the importance weights.
            constrain_tool_calls=False,
        )

    def _verify(self, root: Path, task) -> tuple[int, str, str]:
        """The task's tests on the rollout's workspace, with its test files restored first (an
        edited test cannot pass the task): (exit code, output, error when they could not run)."""
        from training.tasks.task import TEST_TIMEOUT_S, _run

        for path, text in task.files.items():
            if is_test_file(path):
                Path(root, path).write_text(text)
        try:
            with verifier_slots(self.test_workers):
                code, output = _run(task.test_command, str(root), TEST_TIMEOUT_S)
        except OSError as exc:
            return 1, "", f"verifier {task.test_command!r} could not run: {exc}"
        return code, output, ""


class _CallCounts:
    """A rollout's tool calls, counted from the harness's progress events: calls, invalid ones,
    failed ones, and calls identical to an earlier one (`repeated`)."""

    def __init__(self) -> None:
        self.counts: dict[str, Any] = {"tool_calls": 0, "tool_errors": 0, "invalid_tool_calls": 0}
        self.repeated = 0
        self._seen: set[str] = set()

    def on_event(self, event: dict) -> None:
        from agent.harness.nodes import call_fingerprint

        if event.get("kind") == "assistant":
            calls = event.get("calls") or []
            self.counts["tool_calls"] += len(calls) + len(event.get("errors") or [])
            self.counts["invalid_tool_calls"] += len(event.get("errors") or [])
            for call in calls:
                fp = call_fingerprint(call["name"], call["arguments"])
                self.repeated += fp in self._seen
                self._seen.add(fp)
        elif event.get("kind") == "tool" and event.get("is_error"):
            self.counts["tool_errors"] += 1


def make_env(recipe) -> MagicTokenEnv | HarnessEnv:
    if recipe.env == "magic":
        return MagicTokenEnv(
            recipe.magic_tasks, recipe.magic_every, recipe.max_tokens, recipe.temperature
        )
    return HarnessEnv(
        recipe.tasks,
        max_turns=recipe.max_turns,
        turn_max_tokens=recipe.max_tokens,
        temperature=recipe.temperature,
        wall_s=recipe.rollout_wall_s,
        limit=recipe.task_limit,
        test_workers=recipe.test_workers,
        unconfined=recipe.unconfined_commands,
    )
