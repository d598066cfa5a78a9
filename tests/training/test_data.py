"""The corpus builder: filtering, redaction, deduplication, split, packing, and its errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from training.data import CorpusConfig, CorpusError, PackedTokens, build_corpus, is_heldout

BODY = "\n".join(f"def function_{i}(value):\n    return value * {i} + {i * 7}\n" for i in range(40))


def _write(root, files: dict[str, str]):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_build_filters_dedups_redacts_and_packs(tmp_path, tokenizer_dir, tokenizer):
    src = _write(
        tmp_path / "src",
        {
            "a.py": BODY,
            "copy_of_a.py": BODY,  # exact duplicate
            "near_a.py": BODY.replace("function_39", "function_thirty_nine"),  # near duplicate
            "b.py": "import os\n\nAPI_TOKEN = 'ghp_" + "a1B2" * 9 + "'\nprint(os.name)\n",
            "c.py": "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n",
            "d.md": "# Notes\n\nA short document about nothing in particular.\n",
            ".env": "PASSWORD=hunter2hunter2\n",
            "keys/server.pem": "not really a key\n",
            "blob.py": "binary\0data",
        },
    )
    (src / ".env").rename(src / "settings.env")  # hidden files are skipped anyway; test the glob
    manifest = build_corpus(
        CorpusConfig(
            sources=[str(src)],
            tokenizer=str(tokenizer_dir),
            suffixes=(".py", ".md", ".env", ".pem"),
        ),
        tmp_path / "out",
    )
    stats = manifest["stats"]
    assert stats["exact_duplicates"] == 1
    assert stats["near_duplicates"] == 1
    assert stats["excluded"] == 2  # settings.env, server.pem
    assert stats["unreadable"] == 1  # the NUL byte
    assert stats["redacted"] == 1
    assert stats["train_documents"] + stats["heldout_documents"] == 4
    assert stats["heldout_documents"] >= 1

    train = np.concatenate(
        [np.load(tmp_path / "out" / s["file"]) for s in manifest["splits"]["train"]["shards"]]
    )
    heldout = np.load(tmp_path / "out" / "heldout_000.npy")
    assert train.dtype == np.uint16
    eos = manifest["eos_token_id"]
    assert int((train == eos).sum()) == stats["train_documents"]  # one EOS after each document
    assert train[-1] == eos and heldout[-1] == eos
    text = tokenizer.decode(np.concatenate([train, heldout]).tolist())
    assert "ghp_" not in text and "[REDACTED:" in text
    assert "hunter2" not in text
    starts = np.load(tmp_path / "out" / "train_000.docs.npy")
    assert starts[0] == 0 and all(train[s - 1] == eos for s in starts[1:])
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["vocab_size"] == len(
        tokenizer
    )


def test_split_is_deterministic_by_key():
    keys = [f"source:x/{i}.py" for i in range(2000)]
    first = [is_heldout(k, 0.1) for k in keys]
    assert first == [is_heldout(k, 0.1) for k in reversed(keys)][::-1]
    assert 100 < sum(first) < 300


def test_empty_corpus_is_a_clear_error(tmp_path, tokenizer_dir):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "image.png").write_bytes(b"\x89PNG")
    with pytest.raises(CorpusError, match="corpus is empty"):
        build_corpus(
            CorpusConfig(sources=[str(tmp_path / "src")], tokenizer=str(tokenizer_dir)),
            tmp_path / "out",
        )
    with pytest.raises(CorpusError, match="does not exist"):
        build_corpus(CorpusConfig(sources=[str(tmp_path / "nope")]), tmp_path / "out")
    with pytest.raises(CorpusError, match="no corpus"):
        CorpusConfig()


def test_all_duplicates_is_a_clear_error(tmp_path, tokenizer_dir):
    src = _write(tmp_path / "src", {f"copy{i}.py": BODY for i in range(5)})
    with pytest.raises(CorpusError, match="all duplicates"):
        build_corpus(CorpusConfig(sources=[str(src)], tokenizer=str(tokenizer_dir)), tmp_path / "o")


def test_telemetry_export_lines_are_documents(tmp_path, tokenizer_dir):
    export = tmp_path / "pretrain.jsonl"
    rows = [
        {"id": "1", "text": BODY, "source": "file", "document_uri": "file:///w/a.py"},
        {"id": "2", "text": "x = 1\n" * 30, "source": "file", "document_uri": "file:///w/.env"},
        {"id": "3", "text": "def other():\n    return 'something else entirely'\n"},
    ]
    export.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    manifest = build_corpus(
        CorpusConfig(exports=[str(export)], tokenizer=str(tokenizer_dir)), tmp_path / "out"
    )
    assert manifest["stats"]["excluded"] == 1 and manifest["stats"]["unreadable"] == 1
    assert manifest["stats"]["train_documents"] + manifest["stats"]["heldout_documents"] == 2


def test_packed_windows(corpus):
    train = PackedTokens(corpus, "train")
    rng = np.random.default_rng(0)
    batch = train.windows(train.random_starts(rng, 3, 33), 33)
    assert tuple(batch.shape) == (3, 33)
    with pytest.raises(CorpusError, match="fewer than one window"):
        train.spread_starts(1, len(train) + 1)
    grid = np.arange(0, len(train) - 7, 8)  # every window of 8 that fits
    starts = train.spread_starts(3, 8)
    assert starts[0] == 0 and starts[-1] == grid[-1] and len(set(starts.tolist())) == 3
    assert np.all(np.diff(starts) >= 8)  # none overlap
    assert train.spread_starts(len(grid) + 5, 8).tolist() == grid.tolist()
