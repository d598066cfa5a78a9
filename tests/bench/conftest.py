"""Fixtures for the benchmarks: a tiny model whose context holds the harness's prompts, and the
training tests' tiny corpus (`flywheel bench passkey --loss-data` reads one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.conftest import corpus, tokenizer_dir  # noqa: F401 - fixtures


@pytest.fixture(scope="session")
def bench_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """The tiny test model (random weights, seed 0) with an 8k context: the harness's system
    prompt and tool schemas alone are ~2k tokens with the 1k-token test tokenizer."""
    from agent.model import build_trunk, save_checkpoint

    trunk = build_trunk("test", vocab_size=len(tokenizer), max_position_embeddings=8192, seed=0)
    folder = tmp_path_factory.mktemp("bench8k")
    return save_checkpoint(folder, trunk, tokenizer, None, meta={"version": "tiny-8k-seed0"})
