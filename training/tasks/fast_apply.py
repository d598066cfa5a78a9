"""Fast-apply examples: an original file plus an edit sketch -> the whole updated file.

The prompt is agent/chat_format.py's `apply_messages`, the one the engine's apply path uses
(with the original file as its n-gram speculation).
"""

from __future__ import annotations

import difflib
import random

from agent.chat_format import apply_messages
from training.tasks.task import Task


def edit_sketch(old: str, new: str, context: int = 1) -> str:
    """The changed lines of `new` with `context` lines around them; gaps become markers."""
    a, b = old.splitlines(), new.splitlines()
    out: list[str] = []
    groups = list(difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context))
    for k, group in enumerate(groups):
        j1, j2 = group[0][3], group[-1][4]
        if j1 > 0 or k > 0:
            out.append("# ... existing code ...")
        out += b[j1:j2]
    if groups and groups[-1][-1][4] < len(b):
        out.append("# ... existing code ...")
    return "\n".join(out) + "\n"


def fast_apply_example(task: Task, rng: random.Random) -> dict:
    path = next(iter(task.solution))
    original, updated = task.files[path], task.solution[path]
    sketch = edit_sketch(original, updated, rng.choice([0, 1, 2]))
    return {
        "task_id": task.id,
        "family": "apply",
        "split": task.split,
        "messages": apply_messages(path, original, sketch, updated),
    }
