"""One inline completion at a cursor of a repository file: the prompt and the decoding.

The prompt is the repository-level fill-in-the-middle prompt (`chat_format.render_repo_fim`):
the repository's name, other train files as context (training/repo_pretrain.py `context_files`,
the same pieces repository pretraining trains on), the current file's text before the cursor and
after the end of the cursor's line. As the language server's prompt, it is token-healed
(`chat_format.heal`): a cursor at a line start or in its indentation ends the prompt before that
line's break, and the model must first write the healed break and indentation. The completion is
what the model writes after them, up to the end of the line: decoding stops at the next line break
or `<|endoftext|>`. An output that does not start with the healed text cannot be shown at the
cursor (the language server drops it too): it counts as no suggestion.

Declining: a model that writes `<|endoftext|>` first proposes nothing. The simulated user then
sees no suggestion (neither accepted nor rejected), and completion RL (training/tab_rl.py) can
learn to do that where its suggestions would be rejected.

Decoding is a plain loop over the trunk with its KV cache (greedy, or sampled at `temperature`
with a seeded generator), returning the sampled ids and their log-probabilities, which the
policy gradient needs. It does not go through the engine (agent/engine): evaluation and RL need
the log-probabilities of a model that is training, in-process.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import torch

from agent.chat_format import EOS, heal, render_repo_fim
from training.repo_files import RepoFile

# Where a word ends inside a line, so a cursor (a request, a FIM middle's start) may stand after it.
WORD_BOUNDARY = re.compile(r"[ (.=,]")


@dataclass
class Cursor:
    path: str  # the file, relative to the repository root
    prefix: str  # the file's text before the cursor
    suffix: str  # the file's text after the cursor's line (from its line break)
    expected: str  # what the author wrote from the cursor to the end of the line

    @property
    def healed(self) -> str:
        """The line break and indentation the healed prompt leaves to the model ("" mid-line)."""
        return heal(self.prefix)[1]


@dataclass
class Completion:
    text: str  # after the healed text, up to the end of the line; "" = no suggestion
    ids: list[int]  # the sampled tokens (the stop token included)
    logprobs: list[float]  # log-probability of each sampled token under the sampling policy
    declined: bool  # the first token was end-of-text
    fits: bool = True  # it wrote the healed text first (the editor can show it at the cursor)


def spread_cursors(files: list[RepoFile], offsets: list[list[int]], budget: int) -> list[Cursor]:
    """At most `budget` cursors, taken from each file's `offsets` in turn (one from each file per
    round, in each list's order), so that every file is represented; in file and text order."""
    take, left = [0] * len(files), budget
    while left > 0 and any(take[i] < len(o) for i, o in enumerate(offsets)):
        for i, o in enumerate(offsets):
            if left > 0 and take[i] < len(o):
                take[i] += 1
                left -= 1
    return [
        cursor_at(f, offset)
        for f, o, n in zip(files, offsets, take, strict=True)
        for offset in sorted(o[:n])
    ]


def cursor_at(file: RepoFile, offset: int) -> Cursor:
    """The cursor at character `offset` of `file`."""
    end = file.text.find("\n", offset)
    end = len(file.text) if end < 0 else end
    return Cursor(file.path, file.text[:offset], file.text[end:], file.text[offset:end])


def cursor_prompt(
    repo: str, context: list[RepoFile], cursor: Cursor, budget_chars: int, context_share: float
) -> str:
    """The repository-level FIM prompt for `cursor` within about `budget_chars` characters,
    healed (the completion starts with `cursor.healed`)."""
    from training.repo_pretrain import context_files

    ctx = context_files(context, cursor.path, int(budget_chars * context_share))
    own = budget_chars - sum(len(p) + len(t) for p, t in ctx)
    prefix = heal(cursor.prefix)[0][-max(own * 2 // 3, 1) :]
    suffix = cursor.suffix[: max(own // 3, 0)]
    return render_repo_fim(repo, ctx, cursor.path, prefix, suffix)


def prompt_ids(tokenizer, prompt: str, max_tokens: int) -> list[int]:
    """The prompt's ids, cut from the left to `max_tokens` (a rare overlong prompt)."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return ids[-max_tokens:]


@torch.no_grad()
def complete(
    trunk,
    tokenizer,
    ids: list[int],
    max_new_tokens: int = 48,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    healed: str = "",
) -> Completion:
    """Decode from prompt `ids` to the end of the line, after `healed` (see the module
    docstring)."""
    (done,) = complete_many(
        trunk, tokenizer, ids, 1, max_new_tokens, temperature, generator, healed
    )
    return done


@torch.no_grad()
def complete_many(
    trunk,
    tokenizer,
    ids: list[int],
    samples: int,
    max_new_tokens: int = 48,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    healed: str = "",
) -> list[Completion]:
    """`samples` completions of one prompt, one after another from a copy of the prompt's KV
    cache: the prompt (most of the cost) runs once. The same as `samples` calls of `complete`
    with the same generator, which the prompt's pass does not draw from."""
    device = next(trunk.parameters()).device
    out = trunk(input_ids=torch.tensor([ids], device=device), use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    logits = out.logits[0, -1].float()  # [vocab]
    return [
        _decode(
            trunk,
            tokenizer,
            copy.deepcopy(cache) if i < samples - 1 else cache,
            logits,
            max_new_tokens,
            temperature,
            generator,
            healed,
        )
        for i in range(samples)
    ]


def _decode(
    trunk, tokenizer, past, logits, max_new_tokens, temperature, generator, healed
) -> Completion:
    device = next(trunk.parameters()).device
    eos = tokenizer.convert_tokens_to_ids(EOS)
    sampled: list[int] = []
    logprobs: list[float] = []
    text = ""
    for _ in range(max_new_tokens):
        if temperature > 0:
            probs = torch.softmax(logits / temperature, -1)
            token = int(torch.multinomial(probs.cpu(), 1, generator=generator))
            logp = float(torch.log_softmax(logits / temperature, -1)[token])
        else:
            token = int(logits.argmax())
            logp = float(torch.log_softmax(logits, -1)[token])
        sampled.append(token)
        logprobs.append(logp)
        if token == eos:
            break
        text = tokenizer.decode(sampled, skip_special_tokens=False)
        if not (text.startswith(healed) or healed.startswith(text)):
            break  # it does not continue the cursor's line: nothing to show
        if "\n" in text[len(healed) :]:
            break
        out = trunk(input_ids=torch.tensor([[token]], device=device), cache=past, use_cache=True)
        past = getattr(out, "cache", None) or out.past_key_values
        logits = out.logits[0, -1].float()
    rest = text[len(healed) :] if text.startswith(healed) else ""
    line = rest.split("\n", 1)[0].split(EOS, 1)[0]
    declined = sampled[:1] == [eos]
    return Completion(line, sampled, logprobs, declined, declined or text.startswith(healed))
