"""Fixtures for the harness tests: a sample workspace, a fresh telemetry database."""

from __future__ import annotations

from pathlib import Path

import pytest

SAMPLE = {
    "calc.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n",
    "test_calc.py": "from calc import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_mul():\n    assert mul(2, 3) == 6\n",
    ".gitignore": "build/\n*.log\n",
}


@pytest.fixture
def workspace(tmp_path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    for name, text in SAMPLE.items():
        (root / name).write_text(text)
    return root


@pytest.fixture
def recorder(tmp_path):
    from telemetry.recorder import Recorder

    rec = Recorder(tmp_path / "telemetry.db")
    yield rec
    rec.close()


@pytest.fixture(scope="session")
def long_context_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """The tiny test model (random weights, seed 0) with an 8k context: the harness's system
    prompt and tool schemas alone are ~2k tokens with the 1k-token test tokenizer."""
    from agent.model import build_trunk, save_checkpoint

    trunk = build_trunk("test", vocab_size=len(tokenizer), max_position_embeddings=8192, seed=0)
    folder = tmp_path_factory.mktemp("tiny8k")
    return save_checkpoint(folder, trunk, tokenizer, None, meta={"version": "tiny-8k-seed0"})
