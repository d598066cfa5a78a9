"""What does a model write next, after a given history of tool calls on a workspace?

Replays tool calls (the harness's own tools, on a scratch copy of the workspace) after the task's
opening messages, then asks the model for its next turn, greedy: once as the harness would, and
once after each `--prefix`, text forced at the start of the turn (the model continues it). It
separates what a model cannot do from what it does not choose to do: given the failing tests and
the module, does it find the line; told the line, does it fix it?

    python benchmarks/next_turn.py --model default \\
        --call run_tests '{}' --call read_file '{"path": "inventory.py"}' \\
        --prefix 'The bug is on line 11 of inventory.py: `'

Defaults to the demo's project and instruction (agent/demo.py). Prints each turn; `--json F`
writes them with the command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_parser() -> argparse.ArgumentParser:
    from agent.demo import INSTRUCTION, SAMPLE
    from agent.model import add_model_argument

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_argument(p, servers=False)
    p.add_argument("--workspace", default=str(SAMPLE), help="folder copied to a scratch folder")
    p.add_argument("--instruction", default=INSTRUCTION)
    p.add_argument("--test-command", default="", help="default: what the harness detects")
    p.add_argument("--call", nargs=2, action="append", default=[], metavar=("TOOL", "ARGS_JSON"))
    p.add_argument("--prefix", action="append", default=[], help="forced start of the turn")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--json", help="write the turns here")
    return p


def probe_scratch(args: argparse.Namespace):
    """A scratch copy of the workspace, as a task of the harness."""
    from agent.harness import Workspace
    from agent.harness.project import detect_test_command
    from training.tasks.oracle import HarnessScratch
    from training.tasks.task import Task

    root = Path(args.workspace)
    files = {
        str(f.relative_to(root)): f.read_text()
        for f in sorted(root.rglob("*"))
        if f.is_file() and "__pycache__" not in f.parts
    }
    found = detect_test_command(Workspace(root))
    command = args.test_command or (found.command if found else "")
    task = Task("probe", "probe", "probe", "heldout", args.instruction, files, {}, command)
    return HarnessScratch(task)


def replay_calls(scratch, args: argparse.Namespace) -> list[dict]:
    """The first messages, then each `--call` and the harness's real result."""
    from agent.harness import HarnessConfig
    from agent.harness.context import render_context
    from agent.harness.prompts import first_messages

    context = render_context(scratch.workspace, args.instruction, None, HarnessConfig().map_tokens)
    messages = first_messages(args.instruction, context)
    for i, (name, raw) in enumerate(args.call):
        call_id = f"call_{i + 1}"
        function = {"name": name, "arguments": raw}
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        result, _ = scratch.call(name, json.loads(raw))
        messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": result})
    return messages


def next_turns(args: argparse.Namespace, messages: list[dict]) -> list[dict]:
    """The model's greedy next turn, and one after each forced `--prefix`."""
    from transformers import AutoTokenizer

    from agent.chat_format import render_chat
    from agent.engine import EngineConfig, SpeculativeConfig, open_engine
    from agent.engine.config import default_dtype
    from agent.engine.request import Request, SamplingParams
    from agent.harness.prompts import tool_schemas
    from agent.model import checkpoint_folder, tokenizer_folder

    engine = open_engine(
        EngineConfig(
            model=args.model, dtype=default_dtype(args.model), speculative=SpeculativeConfig("none")
        )
    )
    try:
        tools = tool_schemas()
        greedy = SamplingParams(temperature=0, max_tokens=args.max_tokens)
        request = Request(messages=messages, tools=tools, params=greedy)
        turns = [{"prefix": None, "text": _turn(engine, request)}]
        tokenizer = AutoTokenizer.from_pretrained(
            str(tokenizer_folder(checkpoint_folder(args.model)))
        )
        prompt = render_chat(tokenizer, messages, tools, add_generation_prompt=True)
        for prefix in args.prefix:
            text = _turn(engine, Request(prompt=prompt + prefix, params=greedy))
            turns.append({"prefix": prefix, "text": text})
        return turns
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    scratch = probe_scratch(args)
    try:
        turns = next_turns(args, replay_calls(scratch, args))
    finally:
        scratch.close()
    for turn in turns:
        print(f"--- after {turn['prefix']!r}:" if turn["prefix"] is not None else "--- next turn:")
        print(turn["text"])
    if args.json:
        record = {
            "command": "python benchmarks/next_turn.py "
            + " ".join(map(_quote, argv or sys.argv[1:]))
        }
        record.update(model=args.model, calls=args.call, turns=turns)
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return 0


def _turn(engine, request) -> str:
    """The turn's text up to its end (a raw prompt's continuation runs on past it)."""
    text = engine.generate(request).completions[0].text or ""
    end = text.find("</tool_call>")
    return text if end < 0 else text[: end + len("</tool_call>")]


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


if __name__ == "__main__":
    sys.exit(main())
