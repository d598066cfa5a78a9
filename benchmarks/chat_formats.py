"""Which tool-call format costs the base least to learn: the same trajectories in four formats.

Each oracle trajectory (training/tasks) is rendered four ways that differ only in how a tool call
is written; the system prompt's one sentence describing the call format differs accordingly.

    hermes     Qwen's native Hermes JSON inside its own <tool_call> tokens
               <tool_call>\\n{"name": "edit_file", "arguments": {...}}\\n</tool_call>
    qwen_xml   raw-text arguments inside <tool_call>, with XML-ish text markers (no new tokens)
               <tool_call>\\n<function=edit_file>\\n<parameter=path>\\na.py\\n</parameter>\\n...
    qwen_arg   raw-text arguments inside <tool_call>, one new token <|arg|> before each argument
               <tool_call>edit_file\\n<|arg|>path\\na.py\\n<|arg|>search\\n...</tool_call>
    markers    three new tokens: <|tool_call|>edit_file\\n<|arg|>path\\n...<|/tool_call|>

For each it reports the base's negative log-likelihood of the assistant's tokens (what SFT must
teach), in total per conversation and without the new tokens' own positions (a new token's
row starts at the mean embedding, so its first cost says little about how fast it is learned),
and the number of assistant tokens (what decoding pays for). Lower is better for all three.

    python benchmarks/chat_formats.py --tasks runs/fmt/tasks/trajectories.jsonl --limit 8
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

FORMATS = ("hermes", "qwen_xml", "qwen_arg", "markers")
CALL_SENTENCE = {
    "hermes": 'To call a tool, write <tool_call>, then on one line a JSON object {"name": NAME, '
    '"arguments": {ARGUMENT: VALUE, ...}}, then </tool_call>.',
    "qwen_xml": "To call a tool, write <tool_call>, then <function=NAME>, then each argument as "
    "<parameter=ARGUMENT> on its own line followed by its raw value (code exactly as in the "
    "file, never escaped) and </parameter>, then </function> and </tool_call>.",
    "qwen_arg": "To call a tool, write <tool_call>NAME, then each argument as <|arg|>ARGUMENT "
    "on its own line followed by its raw value (code exactly as in the file, never escaped), "
    "then </tool_call>.",
    "markers": "To call a tool, write <|tool_call|>NAME, then each argument as <|arg|>ARGUMENT "
    "on its own line followed by its raw value (code exactly as in the file, never escaped), "
    "then <|/tool_call|>.",
}
NEW_TOKENS = {
    "hermes": [],
    "qwen_xml": [],
    "qwen_arg": ["<|arg|>"],
    "markers": ["<|tool_call|>", "<|/tool_call|>", "<|arg|>"],
}


def _raw_args(args: dict, arg: str, sep: str = "\n") -> str:
    out = ""
    for key, value in args.items():
        if key == "hunks" and isinstance(value, list):
            for hunk in value:
                out += f"{arg}search\n{hunk['search']}\n{arg}replace\n{hunk['replace']}\n"
        else:
            shown = value if isinstance(value, str) else json.dumps(value)
            out += f"{arg}{key}\n{shown}\n"
    return out


def render_call(fmt: str, name: str, args: dict) -> str:
    if fmt == "hermes":
        return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"
    if fmt == "qwen_xml":
        body = ""
        for key, value in args.items():
            pairs = (
                [(k, h[k]) for h in value for k in ("search", "replace")]
                if key == "hunks" and isinstance(value, list)
                else [(key, value if isinstance(value, str) else json.dumps(value))]
            )
            for k, v in pairs:
                body += f"<parameter={k}>\n{v}\n</parameter>\n"
        return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"
    if fmt == "qwen_arg":
        return f"<tool_call>{name}\n{_raw_args(args, '<|arg|>')}</tool_call>"
    return f"<|tool_call|>{name}\n{_raw_args(args, '<|arg|>')}<|/tool_call|>"


def render(fmt: str, row: dict) -> tuple[str, list[tuple[int, int]]]:
    """(text, character spans of the assistant's turns including their <|im_end|>)."""
    text, spans = "", []
    tools = "# Tools" + "".join(
        f"\n- {t['function']['name']}: {t['function'].get('description', '')}" for t in row["tools"]
    )
    for message in row["messages"]:
        content = message.get("content") or ""
        if message["role"] == "system":
            start = content.find("To call a tool")
            end = content.find("When the task is done")
            if start >= 0 and end > start:
                content = content[:start] + CALL_SENTENCE[fmt] + " " + content[end:]
            content += "\n" + tools
        if message["role"] == "assistant":
            calls = [
                render_call(fmt, c["function"]["name"], _arguments(c["function"]["arguments"]))
                for c in message.get("tool_calls") or []
            ]
            content = "\n".join(([content] if content else []) + calls)
            text += "<|im_start|>assistant\n"
            start = len(text)
            text += content + "<|im_end|>"
            spans.append((start, len(text)))
            text += "\n"
        else:
            text += f"<|im_start|>{message['role']}\n{content}<|im_end|>\n"
    return text, spans


def _arguments(value) -> dict:
    return json.loads(value) if isinstance(value, str) else value


@torch.no_grad()
def score(model, tokenizer, text: str, spans, new_ids: set[int], max_tokens: int) -> dict:
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    ids = enc["input_ids"][:max_tokens]
    offsets = enc["offset_mapping"][:max_tokens]
    targets = [
        i for i in range(1, len(ids)) if any(start <= offsets[i][0] < end for start, end in spans)
    ]
    hidden = model.model(torch.tensor([ids])).last_hidden_state[0]
    logits = model.lm_head(hidden[[t - 1 for t in targets]]).float()
    nll = torch.nn.functional.cross_entropy(
        logits, torch.tensor([ids[t] for t in targets]), reduction="none"
    )
    content = [float(n) for n, t in zip(nll, targets, strict=True) if ids[t] not in new_ids]
    return {
        "tokens": len(targets),
        "nll": float(nll.sum()),
        "nll_without_new_tokens": sum(content),
        "truncated": len(enc["input_ids"]) > max_tokens,
    }


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent.base import ensure_base

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", required=True, help="trajectories.jsonl (flywheel train tasks)")
    parser.add_argument("--limit", type=int, default=8, help="conversations (train split)")
    parser.add_argument("--max-tokens", type=int, default=3072)
    parser.add_argument("--out", default="benchmarks/results/chat-formats.json")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = [json.loads(line) for line in Path(args.tasks).read_text().splitlines()]
    rows = [r for r in rows if r.get("split") != "heldout"][: args.limit]
    folder = ensure_base()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval()
    vocab = tokenizer.get_vocab()
    results = {}
    for fmt in FORMATS:
        new_ids = {vocab[t] for t in NEW_TOKENS[fmt] if t in vocab}
        t0 = time.perf_counter()
        per = [score(model, tokenizer, *render(fmt, r), new_ids, args.max_tokens) for r in rows]
        results[fmt] = {
            "conversations": len(per),
            "assistant_tokens_mean": statistics.mean(p["tokens"] for p in per),
            "nll_per_conversation": statistics.mean(p["nll"] for p in per),
            "nll_without_new_tokens": statistics.mean(p["nll_without_new_tokens"] for p in per),
            "nll_per_token": sum(p["nll"] for p in per) / sum(p["tokens"] for p in per),
            "truncated": sum(p["truncated"] for p in per),
            "seconds": round(time.perf_counter() - t0, 1),
        }
    print(f"{'format':<10} {'tokens':>8} {'nll':>9} {'nll w/o new':>12} {'nll/token':>10}")
    for fmt, r in results.items():
        print(
            f"{fmt:<10} {r['assistant_tokens_mean']:>8.1f} {r['nll_per_conversation']:>9.1f} "
            f"{r['nll_without_new_tokens']:>12.1f} {r['nll_per_token']:>10.3f}"
        )
    Path(args.out).write_text(
        json.dumps(
            {
                "command": "python benchmarks/chat_formats.py "
                f"--tasks {args.tasks} --limit {args.limit} --max-tokens {args.max_tokens}",
                "model": "base (qwen2.5-coder-0.5b-instruct, bf16)",
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
