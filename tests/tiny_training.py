"""A few SFT steps on a one-line conversation: enough for tests that need a trained folder."""

from __future__ import annotations

import json
from pathlib import Path


def train_hello(tmp_path: Path, init: Path | str, **recipe: object) -> Path:
    """Train from `init` on "hi" -> "hello" (one step unless `recipe` says otherwise); returns
    the run's model folder."""
    from training.recipe import Recipe
    from training.trainer import train

    rows = tmp_path / "sft.jsonl"
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    rows.write_text("\n".join(json.dumps({"messages": conversation}) for _ in range(4)))
    settings = dict(steps=1, batch_size=2, seq_len=64, device="cpu", log_every=1)
    settings.update(eval_every=100, save_every=100, **recipe)
    run = Recipe(
        name="tiny",
        stage="sft",
        out=str(tmp_path / "run"),
        init=str(init),
        sft_data=[str(rows)],
        **settings,
    )
    train(run, progress=False)
    return tmp_path / "run" / "model"
