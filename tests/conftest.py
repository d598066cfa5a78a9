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


@pytest.fixture(autouse=True, scope="session")
def _projects_tested_without_this_environments_plugins():
    """The projects the tests run pytest in need none of this environment's pytest plugins (its
    test tools, langsmith's), which take seconds to load in every run; the sandbox passes the
    switch on. Set in the process that runs the tests, after its own plugins loaded (a variable
    set at import would reach xdist's workers before theirs)."""
    os.environ.setdefault("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def rows(db: str | Path, sql: str, *args: object) -> list[dict]:
    """The rows `sql` selects from the SQLite file `db`, as dicts."""
    import sqlite3

    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, args)]
    finally:
        conn.close()


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
def stopping_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """A tiny model (4,096-token context, room for the harness's prompt) whose answers end at
    varied lengths: its output layer scores every token 0 but the end-of-text token, whose score
    is a random projection of the context, so some samples stop within a few tokens and others
    run to their limit. RL needs that variety from a random model: a group whose every sample
    is cut off by a limit carries no loss. No MTP heads."""
    import torch

    from agent.model import build_trunk, save_checkpoint

    trunk = build_trunk("test", vocab_size=len(tokenizer), max_position_embeddings=4096, seed=0)
    trunk.config.tie_word_embeddings = False
    hidden = trunk.config.hidden_size
    generator = torch.Generator().manual_seed(3)
    head = torch.zeros(len(tokenizer), hidden)  # [vocab, hidden]
    head[tokenizer.eos_token_id] = torch.randn(hidden, generator=generator) * 8 / hidden**0.5
    trunk.lm_head.weight = torch.nn.Parameter(head)
    meta = {"version": "tiny-stopping"}
    return save_checkpoint(tmp_path_factory.mktemp("stopping"), trunk, tokenizer, None, meta)


@pytest.fixture(scope="session")
def tiny_checkpoint_b(tmp_path_factory, tokenizer) -> Path:
    """The same shape with a different seed: a second model for equivalence tests."""
    return make_checkpoint(tmp_path_factory.mktemp("tiny1"), tokenizer, seed=1)
