"""Fixtures for training tests: a tiny corpus built from part of the standard library."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import STDLIB


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, tokenizer) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, tokenizer_dir) -> Path:
    """The stdlib `json` package, tokenized with the shared 1,024-token tokenizer."""
    from training.data import CorpusConfig, build_corpus

    out = tmp_path_factory.mktemp("corpus")
    build_corpus(
        CorpusConfig(
            sources=[str(STDLIB / "json")], tokenizer=str(tokenizer_dir), heldout_fraction=0.2
        ),
        out,
    )
    return out
