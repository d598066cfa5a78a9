"""`flywheel bench lsp`: what the language server adds to an inline completion, idle and busy.

    flywheel bench lsp --model ./ckpt --iterations 30 --json lsp-bench.json
    flywheel bench lsp --model default --file-tokens 1500 --during-agent --json lsp-busy.json

One run measures the same completions two ways, alternating:
  direct  the engine call the server makes (same prompt, sampling and seed), in this process
  lsp     `textDocument/inlineCompletion` sent by a real LSP client (pygls) to `flywheel lsp`
          running as a subprocess over stdio, timed from request to response, telemetry on
Each iteration uses a new document text, so the server's suggestion cache never answers: a tiny
new function each time, or with `--file-tokens N` a real source file of about N tokens typed into
a new line start per request, two thirds of the way down (the file's start never changes,
so the engine's prefix cache may reuse it; no text extends the previous one, so the server's
typed-through suggestions never answer).

With `--during-agent` a third series follows: the same kind of completions sent while the same
server runs agent tasks (`flywheel.ask` on the demo's sample project, started again whenever one
ends), so the completion competes with agent turns for the model; only requests that began and
ended while a task ran count. It prints a table (p50, p95, mean in milliseconds, the server's
overhead at p50 and p95, and the busy p50 against the idle one) and writes JSON. Targets: the
server adds <= 15 ms at p50; a completion during an agent task answers within 400 ms at p50.

What it does not do: measure the editor's own delays (Neovim waits ~200 ms before asking) or
the debounce (set to 0 here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types

SUFFIX = "\n\nprint(total)\n"


# What the user is typing in a file: line starts, each with a new name, so that no request's
# text extends the previous one (the server would answer that from the suggestion it showed).
TYPED = (
    "result_{i} = weighted_total(",
    "def handle_{i}(request, ",
    "total_{i} = sum(value * ",
    "if count_{i} > ",
)


def _document(i: int) -> tuple[str, types.Position]:
    prefix = f"import os\n\n\ndef step_{i}(values):\n    total = {i}\n    for v in values:\n        total"
    return prefix + SUFFIX, _end(prefix)


def _end(prefix: str) -> types.Position:
    lines = prefix.split("\n")
    return types.Position(line=len(lines) - 1, character=len(lines[-1]))


def source_text(chars: int) -> str:
    """About `chars` characters of real Python: standard-library modules, whole lines."""
    import json as json_package

    text = ""
    for path in sorted(Path(json_package.__file__).parent.glob("*.py")):
        text += path.read_text(encoding="utf-8") + "\n\n"
        if len(text) >= chars:
            break
    cut = text.rfind("\n", 0, chars)
    return text[: cut + 1 if cut > 0 else chars]


class TypedFile:
    """A source file being typed into: request i sees a new line start (`TYPED`, numbered i)
    before the last top-level definition in the file's first two thirds; the text before that
    line never changes."""

    def __init__(self, text: str) -> None:
        lines = text.splitlines(keepends=True)
        cut = (2 * len(lines)) // 3
        # before a top-level definition, so that the typing is code, not inside a docstring
        tops = [k for k, line in enumerate(lines[:cut]) if line.startswith(("def ", "class "))]
        cut = tops[-1] if tops else cut
        self.head, self.tail = "".join(lines[:cut]), "".join(lines[cut:])

    def __call__(self, i: int) -> tuple[str, types.Position]:
        prefix = self.head + TYPED[i % len(TYPED)].format(i=i)
        return prefix + "\n" + self.tail, _end(prefix)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def latency_summary(values: list[float]) -> dict[str, float]:
    """p50, p95 (nearest rank) and mean of latencies in ms, as the benchmarks report them."""
    return {
        "p50_ms": _percentile(values, 0.5),
        "p95_ms": _percentile(values, 0.95),
        "mean_ms": statistics.fmean(values),
    }


async def _run(args: argparse.Namespace) -> dict:
    """Time the same completions directly and through the server, then (with `--during-agent`)
    through the server while it runs agent tasks; the report."""
    from agent.engine import open_engine
    from lsp.model_host import engine_config
    from lsp.settings import CompletionSettings, ModelSettings

    settings = CompletionSettings(
        debounce_ms=0, max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    engine = open_engine(engine_config(ModelSettings(name=args.model)))  # what the server opens
    direct = Direct(engine, settings, args)
    document = _documents(args, direct)
    editor = await Editor.start(args)
    times: dict[str, list[float]] = {"direct": [], "lsp": [], "lsp_during_agent": []}
    agent = {"running": False, "started": 0, "finished": 0, "stop": False}
    try:
        for i in range(-args.warmup, args.iterations):
            text, pos = document(i + 10_000)  # the same documents both ways, never seen before
            d = direct(text, _offset(text, pos))
            s = await editor.complete(text, pos)
            if i >= 0:
                times["direct"].append(d)
                times["lsp"].append(s)
        if args.during_agent:
            await _time_during_agent(args, document, editor, agent, times["lsp_during_agent"])
    finally:
        await editor.stop()
        engine.close()
    # An empty suggestion (the model ended at once) is a real answer and costs the same on both
    # paths; many of them mean the server is failing, and then the figures mean nothing.
    if editor.answered < 0.9 * editor.requests:
        raise RuntimeError(
            f"the server answered only {editor.answered} of {editor.requests} requests with a "
            "suggestion; the comparison would be meaningless (see the server log above)"
        )
    return _report(args, engine.model_version, direct.prompt_tokens, editor, times, agent)


class Direct:
    """The engine call the server makes for a completion (same prompt, sampling and seed), in
    this process; calling it returns the milliseconds it took."""

    def __init__(self, engine, settings, args: argparse.Namespace) -> None:
        self.engine, self.settings, self.args = engine, settings, args
        self.max_prompt = engine.context_length - settings.max_tokens - 8
        self.prompt_tokens: list[int] = []  # of each request

    def __call__(self, text: str, offset: int) -> float:
        from agent.engine import Request, SamplingParams
        from lsp.completion import build_prompt, completion_stops

        settings = self.settings
        before, after = text[:offset], text[offset:]
        prompt = build_prompt(before, after, "python", [], settings, self.max_prompt)
        stop, stop_after = completion_stops(before, settings)  # as the server asks
        request = Request(
            prompt=prompt,
            params=SamplingParams(
                max_tokens=settings.max_tokens,
                temperature=self.args.temperature,
                seed=self.args.seed,
                stop=stop,
                stop_after=stop_after,
                logprobs=False,
            ),
        )
        started = time.perf_counter()
        result = self.engine.generate(request)
        self.prompt_tokens.append(result.metrics.prompt_tokens)
        return (time.perf_counter() - started) * 1000


def _documents(args: argparse.Namespace, direct: Direct):
    """i -> (text, cursor) of request i: a tiny new function, or with `--file-tokens` a real
    file of about that many of the model's tokens (sized with one direct call)."""
    if not args.file_tokens:
        return _document
    # ~3.5 characters per token for Python; corrected once with the model's own count
    typed = TypedFile(source_text(int(args.file_tokens * 3.5)))
    text, pos = typed(0)
    direct(text, _offset(text, pos))
    chars = int(args.file_tokens * 3.5 * args.file_tokens / max(1, direct.prompt_tokens.pop()))
    return TypedFile(source_text(chars))


async def start_server(client, model: str, folder: Path, options: dict) -> None:
    """Start `flywheel lsp --model MODEL` (telemetry in `folder`) under the pygls `client` and
    initialize it for the workspace `folder` with the server settings `options`."""
    await client.start_io(
        sys.executable, "-m", "lsp.cli", "--model", model, "--db", str(folder / "t.db")
    )
    await client.initialize_async(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(),
            root_uri=folder.as_uri(),
            initialization_options=options,
        )
    )
    client.initialized(types.InitializedParams())


class Editor:
    """A real LSP client (pygls) driving `flywheel lsp` over stdio, on one document of a copy of
    the demo's sample project (what the agent tasks work on)."""

    def __init__(self, client, folder: Path) -> None:
        self.client, self.folder = client, folder
        self.uri = (folder / "bench.py").as_uri()
        self.version = 0
        self.requests = self.answered = 0  # answered: with a suggestion
        self.task_ids: list[str] = []  # agent tasks, in the order their first step was seen

    @classmethod
    async def start(cls, args: argparse.Namespace) -> Editor:
        from pygls.lsp.client import LanguageClient

        from agent.demo import SAMPLE
        from lsp.protocol import TASK_STEP

        folder = Path(tempfile.mkdtemp(prefix="flywheel-bench-lsp-"))
        shutil.copytree(SAMPLE, folder, dirs_exist_ok=True)
        client = LanguageClient("flywheel-bench", "1")
        client.feature("flywheel/status")(lambda ls, params: None)
        editor = cls(client, folder)

        @client.feature(TASK_STEP)
        def task_step(ls, params) -> None:
            task = getattr(params, "taskId", None)
            if task and task not in editor.task_ids:
                editor.task_ids.append(task)

        options = {
            "completion": {
                "debounceMs": 0,
                "maxTokens": args.max_tokens,
                "temperature": args.temperature,
                "seed": args.seed,
            },
            "agent": {"approval": "never", "maxSteps": 12},
        }
        await start_server(client, args.model, folder, options)
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=editor.uri, language_id="python", version=0, text=""
                )
            )
        )
        return editor

    async def complete(self, text: str, pos: types.Position) -> float:
        """The document becomes `text`; an inline completion at `pos`, timed from request to
        response in milliseconds."""
        self.version += 1
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(
                    uri=self.uri, version=self.version
                ),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
            )
        )
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=self.uri),
            position=pos,
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Invoked
            ),
        )
        started = time.perf_counter()
        result = await self.client.text_document_inline_completion_async(params)
        elapsed = (time.perf_counter() - started) * 1000
        self.requests += 1
        self.answered += bool(result and result.items)
        return elapsed

    async def command(self, command: str, argument) -> None:
        await self.client.workspace_execute_command_async(
            types.ExecuteCommandParams(command=command, arguments=[argument])
        )

    async def stop(self) -> None:
        await self.client.shutdown_async(None)
        self.client.exit(None)
        await self.client.stop()


async def _time_during_agent(args, document, editor: Editor, agent: dict, times: list) -> None:
    """Completions sent while the server runs agent tasks, one after another, until `times`
    holds `--iterations` of them (only those that began and ended while a task ran)."""
    from agent.demo import INSTRUCTION

    async def agent_tasks() -> None:
        while not agent["stop"]:
            agent["running"], agent["started"] = True, agent["started"] + 1
            try:
                await editor.command("flywheel.ask", {"question": INSTRUCTION})
            finally:
                agent["running"] = False
                agent["finished"] += 1

    runner = asyncio.create_task(agent_tasks())
    i = 20_000
    while len(times) < args.iterations:
        if runner.done():
            runner.result()  # the task loop failed: say why
        i += 1
        text, pos = document(i)
        busy = agent["running"]
        s = await editor.complete(text, pos)
        if busy and agent["running"]:
            times.append(s)
        await asyncio.sleep(0.1)  # a keystroke's gap: the agent's turn goes on meanwhile
    agent["stop"] = True
    if editor.task_ids:  # the task still running: stop it rather than wait for its end
        await editor.command("flywheel.cancelTask", editor.task_ids[-1])
    await asyncio.wait_for(runner, timeout=600)


def _report(args, model_version: str, prompt_tokens, editor: Editor, times, agent) -> dict:
    direct_s, lsp_s = latency_summary(times["direct"]), latency_summary(times["lsp"])
    report = {
        "answered_with_suggestion": editor.answered,
        "requests": editor.requests,
        "model": args.model,
        "model_version": model_version,
        "iterations": args.iterations,
        "max_tokens": args.max_tokens,
        "prompt_tokens_p50": _percentile(prompt_tokens, 0.5),
        "direct": direct_s,
        "lsp": lsp_s,
        "overhead_p50_ms": lsp_s["p50_ms"] - direct_s["p50_ms"],
        "overhead_p95_ms": lsp_s["p95_ms"] - direct_s["p95_ms"],
        "target_overhead_p50_ms": 15.0,
        "samples_ms": times,
    }
    if args.during_agent:
        busy = latency_summary(times["lsp_during_agent"])
        report.update(
            lsp_during_agent=busy,
            during_agent_vs_idle_p50=busy["p50_ms"] / lsp_s["p50_ms"],
            agent_tasks_started=agent["started"],
            target_during_agent_p50_ms=400.0,
        )
    return report


def _offset(text: str, pos: types.Position) -> int:
    """The character offset of `pos` (the benchmark's texts are ASCII)."""
    lines = text.split("\n")
    return sum(len(line) + 1 for line in lines[: pos.line]) + pos.character


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="flywheel bench lsp",
        description="Inline-completion latency through `flywheel lsp` over stdio versus the same "
        "engine call made directly (p50/p95; table and JSON).",
    )
    from agent.model import add_model_argument

    add_model_argument(p)
    p.add_argument("--iterations", type=int, default=30, help="timed completions per path")
    p.add_argument("--warmup", type=int, default=3, help="untimed completions first")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens per completion")
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0: greedy; a tiny random test model needs sampling (1.0) to say anything",
    )
    p.add_argument("--seed", type=int, default=0, help="sampling seed, the same both ways")
    p.add_argument(
        "--file-tokens",
        type=int,
        default=0,
        help="type into a real source file of about this many tokens (0: a tiny new function "
        "per request)",
    )
    p.add_argument(
        "--during-agent",
        action="store_true",
        help="then time the same completions while the server runs agent tasks",
    )
    p.add_argument("--json", default="lsp-bench.json", help="where to write the results")
    args = p.parse_args(argv)
    if args.iterations < 1 or args.warmup < 0 or args.max_tokens < 1 or args.file_tokens < 0:
        p.error("--iterations and --max-tokens must be >= 1, --warmup and --file-tokens >= 0")
    try:
        report = asyncio.run(_run(args))
    except Exception as exc:  # the engine or the server could not start: say why, once
        print(f"flywheel bench lsp: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"prompt: {report['prompt_tokens_p50']} tokens at p50")
    print(f"{'path':<18}{'p50 ms':>10}{'p95 ms':>10}{'mean ms':>10}")
    for name in ("direct", "lsp", "lsp_during_agent"):
        s = report.get(name)
        if s:
            print(f"{name:<18}{s['p50_ms']:>10.1f}{s['p95_ms']:>10.1f}{s['mean_ms']:>10.1f}")
    verdict = "ok" if report["overhead_p50_ms"] <= 15 else "over the 15 ms target"
    print(
        f"server overhead: p50 {report['overhead_p50_ms']:.1f} ms, "
        f"p95 {report['overhead_p95_ms']:.1f} ms ({verdict})"
    )
    if args.during_agent:
        p50 = report["lsp_during_agent"]["p50_ms"]
        print(
            f"during agent tasks ({report['agent_tasks_started']} started): p50 {p50:.0f} ms, "
            f"{report['during_agent_vs_idle_p50']:.2f}x idle "
            f"({'ok' if p50 <= 400 else 'over the 400 ms target'})"
        )
    report["command"] = " ".join(["flywheel", "bench", "lsp", *argv])
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
