"""`flywheel bench lsp`: what the language server adds to an inline completion.

    flywheel bench lsp --model ./ckpt --iterations 30 --json lsp-bench.json

One run measures the same completions two ways, alternating:
  direct  the engine call the server makes (same FIM prompt, sampling and seed), in this process
  lsp     `textDocument/inlineCompletion` sent by a real LSP client (pygls) to `flywheel lsp`
          running as a subprocess over stdio, timed from request to response, telemetry on
Each iteration uses a new document text, so the server's cache never answers. It prints a table
(p50, p95, mean in milliseconds, and the server's overhead at p50 and p95) and writes JSON.
Target: the server adds <= 15 ms at p50.

What it does not do: measure the editor's own delays (Neovim waits ~200 ms before asking) or
the debounce (set to 0 here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types

SUFFIX = "\n\nprint(total)\n"


def _document(i: int) -> tuple[str, types.Position]:
    prefix = f"import os\n\n\ndef step_{i}(values):\n    total = {i}\n    for v in values:\n        total"
    lines = prefix.split("\n")
    return prefix + SUFFIX, types.Position(line=len(lines) - 1, character=len(lines[-1]))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def _summary(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": _percentile(values, 0.5),
        "p95_ms": _percentile(values, 0.95),
        "mean_ms": statistics.fmean(values),
    }


async def _run(args: argparse.Namespace) -> dict:
    from pygls.lsp.client import LanguageClient

    from agent.engine import EngineConfig, Request, SamplingParams, open_engine
    from lsp.completion import STOP, build_prompt
    from lsp.settings import CompletionSettings

    settings = CompletionSettings(
        debounce_ms=0, max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    engine = open_engine(EngineConfig(model=args.model))
    max_prompt = engine.context_length - settings.max_tokens - 8

    def direct(i: int) -> float:
        text, pos = _document(i)
        offset = len(text) - len(SUFFIX)
        prompt = build_prompt(text[:offset], text[offset:], "python", [], settings, max_prompt)
        request = Request(
            prompt=prompt,
            params=SamplingParams(
                max_tokens=settings.max_tokens,
                temperature=args.temperature,
                seed=args.seed,
                stop=list(STOP),
                logprobs=False,
            ),
        )
        started = time.perf_counter()
        engine.generate(request)
        return (time.perf_counter() - started) * 1000

    tmp = Path(tempfile.mkdtemp(prefix="flywheel-bench-lsp-"))
    client = LanguageClient("flywheel-bench", "1")
    client.feature("flywheel/status")(lambda ls, params: None)
    answered = 0
    await client.start_io(
        sys.executable, "-m", "lsp.cli", "--model", args.model, "--db", str(tmp / "t.db")
    )
    await client.initialize_async(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(),
            root_uri=tmp.as_uri(),
            initialization_options={
                "completion": {
                    "debounceMs": 0,
                    "maxTokens": args.max_tokens,
                    "temperature": args.temperature,
                    "seed": args.seed,
                }
            },
        )
    )
    client.initialized(types.InitializedParams())
    uri = (tmp / "bench.py").as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=0, text="")
        )
    )

    async def via_lsp(i: int) -> float:
        text, pos = _document(i)
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=i + 1),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
            )
        )
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=pos,
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Invoked
            ),
        )
        nonlocal answered
        started = time.perf_counter()
        result = await client.text_document_inline_completion_async(params)
        elapsed = (time.perf_counter() - started) * 1000
        answered += bool(result and result.items)
        return elapsed

    times: dict[str, list[float]] = {"direct": [], "lsp": []}
    try:
        for i in range(-args.warmup, args.iterations):
            d = direct(i + 10_000)  # the same documents both ways, never seen before
            s = await via_lsp(i + 10_000)
            if i >= 0:
                times["direct"].append(d)
                times["lsp"].append(s)
    finally:
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()
        engine.close()
    direct_s, lsp_s = _summary(times["direct"]), _summary(times["lsp"])
    total = args.iterations + args.warmup
    # An empty suggestion (the model ended at once) is a real answer and costs the same on both
    # paths; many of them mean the server is failing, and then the figures mean nothing.
    if answered < 0.9 * total:
        raise RuntimeError(
            f"the server answered only {answered} of {total} requests with a suggestion; the "
            "comparison would be meaningless (see the server log above)"
        )
    return {
        "answered_with_suggestion": answered,
        "requests": total,
        "model": args.model,
        "model_version": engine.model_version,
        "iterations": args.iterations,
        "max_tokens": args.max_tokens,
        "direct": direct_s,
        "lsp": lsp_s,
        "overhead_p50_ms": lsp_s["p50_ms"] - direct_s["p50_ms"],
        "overhead_p95_ms": lsp_s["p95_ms"] - direct_s["p95_ms"],
        "target_overhead_p50_ms": 15.0,
        "samples_ms": times,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="flywheel bench lsp",
        description="Inline-completion latency through `flywheel lsp` over stdio versus the same "
        "engine call made directly (p50/p95; table and JSON).",
    )
    p.add_argument("--model", default="default", help="checkpoint folder, 'default', or a URL")
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
    p.add_argument("--json", default="lsp-bench.json", help="where to write the results")
    args = p.parse_args(argv)
    if args.iterations < 1 or args.warmup < 0 or args.max_tokens < 1:
        p.error("--iterations and --max-tokens must be >= 1, --warmup >= 0")
    try:
        report = asyncio.run(_run(args))
    except Exception as exc:  # the engine or the server could not start: say why, once
        print(f"flywheel bench lsp: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"{'path':<8}{'p50 ms':>10}{'p95 ms':>10}{'mean ms':>10}")
    for name in ("direct", "lsp"):
        s = report[name]
        print(f"{name:<8}{s['p50_ms']:>10.1f}{s['p95_ms']:>10.1f}{s['mean_ms']:>10.1f}")
    verdict = "ok" if report["overhead_p50_ms"] <= 15 else "over the 15 ms target"
    print(
        f"server overhead: p50 {report['overhead_p50_ms']:.1f} ms, "
        f"p95 {report['overhead_p95_ms']:.1f} ms ({verdict})"
    )
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
