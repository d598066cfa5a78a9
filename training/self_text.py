"""The MTP heads' self-distillation text: what the model itself writes.

Drafts are checked against the trunk's own greedy tokens, so the text the heads should predict
best is the trunk's own output, not human code: its habits (repeated shapes, its choice among
equivalent names) are what a drafter can learn to anticipate. This module makes that text and
the corpus the heads continue on:

    continuations  windows of 30-60 lines of stdlib modules (not the files `flywheel bench
                   engine` times), each continued greedily by the model through the engine
                   (int8, the product's CPU default; requests sent at once share its batched
                   steps), written as JSONL {"text": window + continuation}
    corpus         those documents, plus stdlib modules and train trajectories as before (so
                   the heads keep what they knew on code and on the agent's turns), rendered
                   and packed as `training.data.distillation_corpus` does

    python -m training.self_text --model default --out runs/mtp_self/text
    flywheel train mtp --recipe training/recipes/mtp_self.toml

`flywheel train starter` runs both after its `mtp` step (training/starter.py).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WINDOWS = 640  # prompts continued
CONTINUATION_TOKENS = 160  # greedy tokens per prompt
AT_ONCE = 16  # requests in flight: the engine batches their decode steps
CODE_CHARS = 600_000  # stdlib code beside them in the corpus
CONVERSATIONS = 60  # train trajectories beside them


def stdlib_files() -> list[Path]:
    """Stdlib modules the heads may train on: not tests, not IDLE, not the files that `flywheel
    bench engine` times (its free-text figures are on text the heads never saw)."""
    from agent.bench_prompts import STDLIB, benched_files

    benched = benched_files()
    kept = []
    for path in sorted(STDLIB.glob("*.py")) + sorted(STDLIB.glob("*/*.py")):
        rel = path.relative_to(STDLIB).as_posix()
        if rel not in benched and rel.split("/")[0] not in ("test", "idlelib", "site-packages"):
            kept.append(path)
    return kept


def stdlib_code(chars: int, rng: random.Random | None = None) -> list[str]:
    """Whole `stdlib_files` (in `rng`'s shuffled order, else sorted) until `chars` characters."""
    files = stdlib_files()
    if rng is not None:
        rng.shuffle(files)
    texts: list[str] = []
    for path in files:
        text = path.read_text(errors="replace")
        chars -= len(text)
        if chars < 0:
            break
        texts.append(text)
    return texts


def windows(count: int, seed: int = 0) -> list[str]:
    """`count` windows of 30-60 consecutive lines from modules of at least 80 lines."""
    rng = random.Random(seed)
    files = stdlib_files()
    out: list[str] = []
    while len(out) < count:
        lines = rng.choice(files).read_text(errors="replace").splitlines(keepends=True)
        if len(lines) < 80:
            continue
        n = rng.randint(30, 60)
        start = rng.randint(0, len(lines) - n)
        out.append("".join(lines[start : start + n]))
    return out


def continuations(
    model: str,
    out: Path,
    count: int = WINDOWS,
    max_tokens: int = CONTINUATION_TOKENS,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> Path:
    """`out` (JSONL): each window followed by the model's greedy continuation. Written to a
    temporary file named after the model's version first, so a killed run leaves nothing
    half-written under `out`, and a rerun with the same model keeps the rows already written
    (greedy: they would come out the same) and continues after them."""
    from rich.progress import Progress

    from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig, open_engine

    prompts = windows(count, seed)
    engine = open_engine(
        EngineConfig(
            model=model, dtype="int8", own_thread=True, speculative=SpeculativeConfig("none")
        )
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0, logprobs=False)

    def continue_(prompt: str) -> str:
        return prompt + engine.generate(Request(prompt=prompt, params=params)).completions[0].text

    out.parent.mkdir(parents=True, exist_ok=True)
    version = "".join(c if c.isalnum() or c in "-_." else "_" for c in engine.model_version)
    tmp = out.with_name(f"{out.name}.{version}-{max_tokens}.tmp")
    kept = _complete_rows(tmp, prompts)
    try:
        with (
            tmp.open("r+b" if tmp.exists() else "wb") as f,
            ThreadPoolExecutor(AT_ONCE) as pool,
            Progress(transient=True) as progress,
        ):
            f.truncate(sum(len(row) for row in kept))  # drop a row a kill cut short
            f.seek(0, 2)
            task = progress.add_task(f"{model}: continuations", total=len(prompts))
            progress.advance(task, len(kept))
            # In prompt order, whatever finishes first.
            for text in pool.map(continue_, prompts[len(kept) :]):
                f.write((json.dumps({"text": text}) + "\n").encode())
                f.flush()
                progress.advance(task)
    finally:
        engine.close()
    tmp.replace(out)
    log(f"[self_text] {len(prompts)} continuations -> {out}")
    return out


def _complete_rows(tmp: Path, prompts: list[str]) -> list[bytes]:
    """The whole rows of an earlier run's temporary file, as bytes: each one a parsed JSON line
    that continues its own prompt. Reading stops at the first that is not."""
    if not tmp.exists():
        return []
    kept = []
    for line, prompt in zip(tmp.read_bytes().splitlines(keepends=True), prompts, strict=False):
        try:
            whole = line.endswith(b"\n") and json.loads(line)["text"].startswith(prompt)
        except (ValueError, KeyError, TypeError, AttributeError):
            whole = False
        if not whole:
            break
        kept.append(line)
    return kept


def corpus(
    texts: Path,
    trajectories: Path,
    tokenizer_dir: Path,
    out: Path,
    seed: int = 1,
    code_chars: int = CODE_CHARS,
    conversations: int = CONVERSATIONS,
) -> Path:
    """The heads' corpus under `out`: the continuations, `code_chars` of stdlib modules and
    `conversations` train trajectories (`training.data.distillation_corpus`)."""
    from training.data import distillation_corpus

    rng = random.Random(seed)
    own = [json.loads(line)["text"] for line in texts.read_text().splitlines()]
    code = stdlib_code(code_chars, rng)
    rows = [json.loads(line) for line in trajectories.read_text().splitlines()]
    train = [row for row in rows if row.get("split") == "train"]
    rng.shuffle(train)
    folder, _ = distillation_corpus(
        out,
        tokenizer_dir,
        own + code,
        train[:conversations],
        messages_alone=False,
        heldout_fraction=0.05,
    )
    return folder


def main(argv: list[str] | None = None) -> int:
    from agent.model import add_model_argument, checkpoint_folder, tokenizer_folder

    p = argparse.ArgumentParser(
        prog="python -m training.self_text", description=__doc__.split("\n")[0]
    )
    add_model_argument(p, servers=False, role="the model whose own text the heads learn")
    p.add_argument("--out", required=True, help="folder: continuations.jsonl and corpus/")
    p.add_argument("--trajectories", default="runs/base/tasks/trajectories.jsonl")
    p.add_argument("--count", type=int, default=WINDOWS, help="windows continued")
    p.add_argument(
        "--code-chars", type=int, default=CODE_CHARS, help="stdlib code beside them (characters)"
    )
    p.add_argument(
        "--conversations", type=int, default=CONVERSATIONS, help="train trajectories beside them"
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    texts = out / "continuations.jsonl"
    if not texts.exists():
        continuations(args.model, texts, args.count)
    tokenizer = tokenizer_folder(checkpoint_folder(args.model))
    folder = corpus(
        texts,
        Path(args.trajectories),
        tokenizer,
        out / "text",
        code_chars=args.code_chars,
        conversations=args.conversations,
    )
    print(f"corpus written to {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
