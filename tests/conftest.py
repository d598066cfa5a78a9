"""Fixtures shared by every test tier: tiny models and tokenizers built in-process, never downloaded."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Tiny models run many times slower with several torch threads on a busy 2-core machine, and the
# servers the tests start as subprocesses inherit this.
os.environ.setdefault("OMP_NUM_THREADS", "1")

STDLIB = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="session")
def tokenizer():
    """A 1,024-token byte-level BPE trained on part of the Python standard library."""
    from agent.tokenizer import iter_source_texts, train_tokenizer

    return train_tokenizer(iter_source_texts(STDLIB / "json", max_bytes=2_000_000), vocab_size=1024)


def make_checkpoint(
    folder: Path, tokenizer, seed: int, size: str = "test", mtp_depth: int = 2
) -> Path:
    """A randomly initialised checkpoint (trunk + tokenizer + MTP heads) with a fixed seed."""
    import torch

    from agent.model import build_trunk, save_checkpoint
    from agent.mtp import MTPConfig, MTPHeads

    trunk = build_trunk(size, vocab_size=len(tokenizer), seed=seed)
    torch.manual_seed(seed + 1000)
    heads = MTPHeads(trunk, MTPConfig(depth=mtp_depth)) if mtp_depth else None
    return save_checkpoint(folder, trunk, tokenizer, heads, meta={"version": f"tiny-seed{seed}"})


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """A ~0.6M-parameter Llama with 2 MTP heads (seed 0)."""
    return make_checkpoint(tmp_path_factory.mktemp("tiny0"), tokenizer, seed=0)


@pytest.fixture(scope="session")
def tiny_checkpoint_b(tmp_path_factory, tokenizer) -> Path:
    """The same shape with a different seed: a second model for equivalence tests."""
    return make_checkpoint(tmp_path_factory.mktemp("tiny1"), tokenizer, seed=1)
