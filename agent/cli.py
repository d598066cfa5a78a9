"""The `flywheel` command.

Each subcommand lives in its own module and is imported only when it runs, so `flywheel --help`
answers without importing torch, transformers or langgraph. A subcommand module exposes
`main(argv: list[str]) -> int` and builds its own argparse parser (with `--help`).

To add a subcommand, add one line to COMMANDS, run `python -m agent.cli_docs` (it adds the
command's options to docs/cli.md) and describe the command there; tests/test_cli.py fails until
docs/cli.md has a `## flywheel NAME` section and every command's options as its parser has them.
"""

from __future__ import annotations

import importlib
import os
import sys

# name -> (module that implements it, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("agent.demo", "the main job: an agent task on a sample project, logged and scored"),
    "run": ("agent.run", "run an agent task headless in a workspace"),
    "lsp": ("lsp.cli", "language server for editors (stdio; --tcp for debugging)"),
    "serve": ("agent.serve", "OpenAI-compatible HTTP server over the engine (127.0.0.1)"),
    "generate": ("agent.engine.generate", "generate text from a prompt with the engine"),
    "export-draft": (
        "agent.engine.backends.vllm_draft",
        "export a checkpoint's MTP heads as a vLLM `mtp` draft (MiMo layout)",
    ),
    "bench": (
        "",
        "benchmarks: engine (decoding speed), lsp (completion latency), agent (tasks), infill, "
        "passkey",
    ),
    "models": (
        "agent.models_cli",
        "the model registry: list, show, add, promote (gated), rollback",
    ),
    "cycle": (
        "training.cycle",
        "train on new sessions, benchmark, gate, promote (--watch repeats)",
    ),
    "train": ("training.cli", "build data and tasks; run a training stage from a recipe"),
    "tokenizer": ("agent.tokenizer", "train a byte-level BPE tokenizer from source files"),
    "dashboard": ("training.dashboard", "local web page: sessions, acceptance, rewards, models"),
    "telemetry": ("telemetry.cli", "the local session log: stats, export, import, forget, rewards"),
}


# Commands with subcommands that live in different packages: name -> {sub: (module, help)}.
GROUPS: dict[str, dict[str, tuple[str, str]]] = {
    "bench": {
        "engine": (
            "benchmarks.engine.decoding",
            "decoding speed: plain and speculative vs HF generate",
        ),
        "lsp": (
            "benchmarks.lsp_latency",
            "inline-completion latency through the server vs the engine",
        ),
        "agent": ("training.benchmark", "agent tasks through the harness: pass@k with CIs"),
        "infill": ("benchmarks.infill", "single-line infilling on HumanEval (inline completion)"),
        "passkey": ("benchmarks.passkey", "passkey retrieval in long prompts (context length)"),
    },
}


def _group_usage(name: str) -> str:
    subs = GROUPS[name]
    width = max(len(sub) for sub in subs)
    lines = [f"usage: flywheel {name} {{{','.join(subs)}}} [ARGS...]", "", f"{name} commands:"]
    lines += [f"  {sub:<{width}}  {help_}" for sub, (_, help_) in subs.items()]
    lines += ["", f"Run `flywheel {name} COMMAND --help` for its options."]
    return "\n".join(lines)


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [
        "usage: flywheel COMMAND [ARGS...]",
        "",
        "A self-hostable coding agent that learns from its own use.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `flywheel COMMAND --help` for the options of one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        code = _dispatch(argv)
        if not sys.stdout.closed:  # (the language server closes its stdio when it exits)
            sys.stdout.flush()  # inside the try: a buffered write fails here, not at exit
        return code
    except KeyboardInterrupt:  # Ctrl-C: one line, not the traceback of wherever it landed
        command = " ".join(argv[:2] if argv and argv[0] in GROUPS else argv[:1])
        print(f"flywheel {command}: interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT
    except BrokenPipeError:
        # The reader went away (`flywheel models | head`): stop quietly, as Unix tools do, and
        # point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by the signal


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from importlib.metadata import version

        print(f"flywheel {version('flywheel')}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"flywheel: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if name in GROUPS:
        if not rest or rest[0] in ("-h", "--help"):
            print(_group_usage(name))
            return 0
        if rest[0] not in GROUPS[name]:
            print(
                f"flywheel {name}: unknown command {rest[0]!r}\n\n{_group_usage(name)}",
                file=sys.stderr,
            )
            return 2
        module = importlib.import_module(GROUPS[name][rest[0]][0])
        return int(module.main(rest[1:]) or 0)
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
