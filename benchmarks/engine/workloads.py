"""The prompts `flywheel bench engine` decodes, and the random models it runs without `--model`.

Workloads (greedy, the same prompts and weights for every method), built from the local Python
standard library's files that agent/bench_prompts.py names (training leaves them out):
- *apply*: rewrite a ~150-line Python file with a one-line change; the original file is the
  request's `speculation` (the "fast apply" trick). With a chat model the prompt is the engine's
  own fast-apply conversation (agent/chat_format.py `apply_messages`: the file, an edit sketch,
  "reply with the whole updated file"), and `expected` is what a correct apply writes;
- *completion*: one inline completion, cold, as `flywheel lsp` asks for it in a file of about
  1,500 tokens: the prompt `lsp/completion.py build_prompt` makes at an indented line three
  quarters of the way down (the author's line removed; the completion settings' defaults: 4,000
  characters before the cursor, 300 after), in the held-out module that
  benchmarks/typing_latency.py types into. Its time is what a user waits for a suggestion when
  nothing is cached;
- *free*: continue code prompts.

Without `--model`, a 10m-size trunk (`SIZES["10m"]`) with 2 random MTP heads, a 3m random draft
model and a tokenizer trained on the standard library are built in a temporary folder: speeds
are real, acceptance rates are not (random weights mostly repeat a token, which flatters n-gram
lookup, and random MTP heads are never right).
"""

from __future__ import annotations

import re
from pathlib import Path

from agent.bench_prompts import APPLY_FILE, FREE_PROMPTS, STDLIB


def build_default_models(folder: Path) -> tuple[str, str]:
    """A random 10m target with MTP heads and a random 3m draft, sharing a stdlib tokenizer."""
    import torch

    from agent.model import build_trunk, save_checkpoint
    from agent.mtp import MTPConfig, MTPHeads
    from agent.tokenizer import iter_source_texts, train_tokenizer

    print(f"building a random-weight 10m model; tokenizer trained on {STDLIB} ...", flush=True)
    tokenizer = train_tokenizer(iter_source_texts(STDLIB, max_bytes=3_000_000), vocab_size=8192)
    trunk = build_trunk("10m", vocab_size=len(tokenizer), seed=0)
    torch.manual_seed(1)
    heads = MTPHeads(trunk, MTPConfig(depth=2))
    target = save_checkpoint(
        folder / "target", trunk, tokenizer, heads, meta={"version": "bench-10m"}
    )
    draft = build_trunk("3m", vocab_size=len(tokenizer), seed=2)
    draft_path = save_checkpoint(folder / "draft", draft, tokenizer, meta={"version": "bench-3m"})
    return str(target), str(draft_path)


def workloads(tokenizer) -> list[dict]:
    """[{workload, name, prompt, speculation}] built from the local Python standard library."""
    from agent.chat_format import apply_messages, render_chat

    original = (STDLIB / APPLY_FILE).read_text()
    match = re.search(r"^def (\w+)\((.*)$", original, re.M)
    assert match, f"{APPLY_FILE} has no function to rename"
    old_name, rest = match.groups()
    if getattr(tokenizer, "chat_template", None):  # the engine's fast-apply conversation
        sketch = (
            f"# ... existing code ...\ndef {old_name}_checked({rest}\n# ... existing code ...\n"
        )
        apply_prompt = render_chat(
            tokenizer, apply_messages(APPLY_FILE, original, sketch), add_generation_prompt=True
        )
    else:
        apply_prompt = (
            f"# Apply this change: rename `{old_name}` to `{old_name}_checked`.\n"
            f"# Original {APPLY_FILE}:\n{original}\n# Updated {APPLY_FILE}:\n"
        )
    # what a correct fast apply writes (the sketch renames the definition only)
    expected = original.replace(f"def {old_name}(", f"def {old_name}_checked(", 1)
    items = [
        dict(
            workload="apply",
            name=APPLY_FILE,
            prompt=apply_prompt,
            speculation=original,
            expected=expected,
        ),
        completion_item(),
    ]
    for name, lines in FREE_PROMPTS:
        text = "".join((STDLIB / name).read_text().splitlines(keepends=True)[:lines])
        items.append(dict(workload="free", name=name, prompt=text, speculation=None))
    for item in items:
        item["prompt_ids"] = tokenizer.encode(item["prompt"], add_special_tokens=False)
    return items


COMPLETION_FILE_CHARS = 7000  # about 1,500 tokens of Python


def completion_item() -> dict:
    """The *completion* workload's request: the cursor at the start of the last indented line in
    the first three quarters of the held-out module's first COMPLETION_FILE_CHARS characters,
    that line removed."""
    from benchmarks.typing_latency import typing_text
    from lsp.completion import build_prompt
    from lsp.settings import CompletionSettings

    path, text = typing_text(COMPLETION_FILE_CHARS)
    lines = text.splitlines(keepends=True)
    k = max(i for i, line in enumerate(lines[: len(lines) * 3 // 4]) if line[:1] in (" ", "\t"))
    indent = lines[k][: len(lines[k]) - len(lines[k].lstrip())]
    before, after = "".join(lines[:k]) + indent, "".join(lines[k + 1 :])
    settings, uri = CompletionSettings(), f"file:///workspace/{path}"
    prompt = build_prompt(before, after, "python", [], settings, 1 << 20, uri=uri)
    return dict(workload="completion", name=path, prompt=prompt, speculation=None)
