"""The pretraining corpus: source folders and telemetry exports -> clean, deduplicated, packed shards.

Pipeline, in order (each step's counts land in `manifest.json`):

    read       source files under each folder (sorted walk, known suffixes, no hidden folders,
               no binary or oversized files) and the `text` of each line of telemetry's
               pretraining export (JSONL)
    exclude    paths matching the exclusion globs (telemetry's defaults: `.env*`, keys, ...)
    redact     secrets replaced by `[REDACTED:<kind>]` (telemetry.redaction.redact)
    exact dup  identical text (after trimming trailing whitespace) kept once
    near dup   MinHash over word 5-gram shingles + LSH (datasketch); a document whose estimated
               Jaccard similarity with an earlier kept one is >= `near_dup_threshold` is dropped
    split      held out when sha256(document key) falls below `heldout_fraction`: deterministic,
               independent of the order and of the other documents
    tokenize   with the given tokenizer, or a byte-level BPE trained on the train split
    pack       documents concatenated with `<|endoftext|>` after each, written as uint16 `.npy`
               shards, with the start offset of every document beside them (`*.docs.npy`)

Document boundaries: every document ends with EOS, so the model learns that EOS resets the
context. Training windows are cut from the packed stream at random offsets and may span an EOS;
attention is NOT masked at document boundaries (the GPT-2 convention, cheaper and simpler). The
offsets files make document-masked attention possible later without re-tokenizing.

What it does not do: language detection, quality filtering, licence filtering.

    flywheel train data --source /usr/lib/python3.11 --out runs/starter/data
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from agent.chat_format import EOS
from agent.tokenizer import MAX_FILE_BYTES, SOURCE_SUFFIXES

try:  # telemetry owns exclusion and redaction; one implementation for logs and corpora
    from telemetry.privacy import DEFAULT_EXCLUDE, is_excluded
    from telemetry.redaction import redact
except ImportError as exc:  # pragma: no cover - telemetry ships in the same package
    raise ImportError(f"training.data needs telemetry ({exc})") from exc

CORPUS_EXCLUDE = DEFAULT_EXCLUDE + ("*/__pycache__/*", "*/site-packages/*", "*/test/*data*/*")


class CorpusError(ValueError):
    """The corpus cannot be built (nothing readable, all duplicates, ...); the message says why."""


@dataclass
class CorpusConfig:
    sources: list[str] = field(default_factory=list)  # folders of source files
    exports: list[str] = field(default_factory=list)  # telemetry pretraining exports (JSONL)
    tokenizer: str = ""  # tokenizer folder; "" trains a byte-level BPE on the train split
    vocab_size: int = 8192  # when training the tokenizer
    suffixes: tuple[str, ...] = SOURCE_SUFFIXES  # file name endings to read
    exclude: tuple[str, ...] = CORPUS_EXCLUDE  # fnmatch globs on the name and the path
    max_file_bytes: int = MAX_FILE_BYTES  # larger files are skipped (mostly data)
    max_total_bytes: int = 50_000_000  # stop reading after this much kept text
    redact_secrets: bool = True  # run telemetry's redactor on every document
    near_dup_threshold: float = 0.85  # estimated Jaccard at which a document is a near-duplicate
    num_perm: int = 64  # MinHash permutations
    shingle_words: int = 5  # words per shingle
    heldout_fraction: float = 0.02  # share of documents held out (at least one)
    shard_tokens: int = 8_000_000  # tokens per shard file
    seed: int = 0  # salts the held-out hash

    def __post_init__(self) -> None:
        if not self.sources and not self.exports:
            raise CorpusError("no corpus: give at least one source folder or telemetry export")
        if not 0.0 < self.heldout_fraction < 0.5:
            raise ValueError("heldout_fraction must be in (0, 0.5)")
        if not 0.0 < self.near_dup_threshold <= 1.0:
            raise ValueError("near_dup_threshold must be in (0, 1]")


@dataclass
class Document:
    key: str  # where it came from: "source:<relative path>" or "export:<file>:<line>"
    text: str


@dataclass
class CorpusStats:
    seen: int = 0  # candidate files and export lines
    excluded: int = 0  # matched an exclusion glob
    unreadable: int = 0  # I/O error, binary, not UTF-8, oversized, or a bad export line
    redacted: int = 0  # documents in which at least one secret was replaced
    exact_duplicates: int = 0
    near_duplicates: int = 0
    empty: int = 0  # blank after stripping
    train_documents: int = 0
    heldout_documents: int = 0
    train_tokens: int = 0
    heldout_tokens: int = 0


# --- reading ---------------------------------------------------------------------------------


def iter_documents(config: CorpusConfig, stats: CorpusStats) -> Iterator[Document]:
    """Documents from every source folder and export, in a stable order, filtered and redacted."""
    total = 0
    for doc in _iter_raw(config, stats):
        if not doc.text.strip():
            stats.empty += 1
            continue
        if config.redact_secrets:
            clean = redact(doc.text)
            if clean != doc.text:
                stats.redacted += 1
                doc = Document(doc.key, clean)
        total += len(doc.text)
        yield doc
        if total >= config.max_total_bytes:
            return


def _iter_raw(config: CorpusConfig, stats: CorpusStats) -> Iterator[Document]:
    for source in config.sources:
        root = Path(source).expanduser()
        if not root.is_dir():
            raise CorpusError(f"source folder {str(root)!r} does not exist or is not a folder")
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if not name.endswith(config.suffixes):
                    continue
                path = Path(dirpath, name)
                rel = path.relative_to(root).as_posix()
                stats.seen += 1
                if is_excluded(rel, config.exclude) or is_excluded(str(path), config.exclude):
                    stats.excluded += 1
                    continue
                text = _read_text(path, config.max_file_bytes)
                if text is None:
                    stats.unreadable += 1
                    continue
                yield Document(f"source:{root.name}/{rel}", text)
    for export in config.exports:
        yield from _iter_export(Path(export).expanduser(), config, stats)


def _read_text(path: Path, max_bytes: int) -> str | None:
    try:
        if path.stat().st_size > max_bytes:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _iter_export(path: Path, config: CorpusConfig, stats: CorpusStats) -> Iterator[Document]:
    """Lines of telemetry's `pretrain.jsonl`: objects with `text` (and maybe `document_uri`).

    A folder is read as every `*.jsonl` inside it (an export folder with its manifest).
    """
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not path.exists() or not files:
        raise CorpusError(f"telemetry export {str(path)!r} does not exist or holds no .jsonl file")
    for file in files:
        try:
            handle = file.open(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise CorpusError(f"cannot read telemetry export {str(file)!r}: {exc}") from exc
        with handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                stats.seen += 1
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    stats.unreadable += 1
                    continue
                text = row.get("text") if isinstance(row, dict) else None
                if not isinstance(text, str):
                    stats.unreadable += 1
                    continue
                where = row.get("document_uri") or row.get("path")
                if isinstance(where, str) and is_excluded(where, config.exclude):
                    stats.excluded += 1
                    continue
                yield Document(f"export:{file.name}:{number}", text)


# --- deduplication ---------------------------------------------------------------------------

_WORD = re.compile(r"\w+")


def shingles(text: str, width: int) -> set[bytes]:
    """Word `width`-grams of `text` (the whole text as one shingle when it is shorter)."""
    words = _WORD.findall(text)
    if len(words) <= width:
        return {" ".join(words).encode()}
    return {" ".join(words[i : i + width]).encode() for i in range(len(words) - width + 1)}


def deduplicate(
    docs: Iterator[Document], config: CorpusConfig, stats: CorpusStats
) -> list[Document]:
    """Keep the first of every exact and near-duplicate group (first in reading order)."""
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=config.near_dup_threshold, num_perm=config.num_perm)
    seen_hashes: set[bytes] = set()
    kept: list[Document] = []
    for doc in docs:
        digest = hashlib.sha256(_normalise(doc.text).encode("utf-8", "surrogatepass")).digest()
        if digest in seen_hashes:
            stats.exact_duplicates += 1
            continue
        seen_hashes.add(digest)
        minhash = MinHash(num_perm=config.num_perm, seed=1)
        minhash.update_batch(shingles(doc.text, config.shingle_words))
        if lsh.query(minhash):
            stats.near_duplicates += 1
            continue
        lsh.insert(str(len(kept)), minhash)
        kept.append(doc)
    return kept


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def is_heldout(key: str, fraction: float, seed: int = 0) -> bool:
    """Deterministic held-out membership from the document key alone."""
    digest = hashlib.sha256(f"{seed}:{key}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def split(docs: list[Document], config: CorpusConfig) -> tuple[list[Document], list[Document]]:
    if len(docs) < 2:
        raise CorpusError(
            f"only {len(docs)} unique document(s) after filtering and deduplication: a corpus "
            "needs at least two (one to train on, one to hold out); add more source folders"
        )
    train = [d for d in docs if not is_heldout(d.key, config.heldout_fraction, config.seed)]
    heldout = [d for d in docs if is_heldout(d.key, config.heldout_fraction, config.seed)]
    if not heldout:  # tiny corpora: hold out the document whose hash is smallest
        first = min(docs, key=lambda d: hashlib.sha256(f"{config.seed}:{d.key}".encode()).digest())
        heldout = [first]
        train = [d for d in docs if d is not first]
    if not train:
        train, heldout = heldout[1:], heldout[:1]
    return train, heldout


# --- tokenizing and packing ------------------------------------------------------------------


def pack(tokenizer, docs: list[Document], folder: Path, name: str, shard_tokens: int) -> dict:
    """Tokenize `docs`, EOS after each, and write `{name}_{i:03d}.npy` + `.docs.npy` shards."""
    from agent.tokenizer import encode_bytes

    eos = tokenizer.convert_tokens_to_ids(EOS)
    dtype = np.uint16 if len(tokenizer) <= 2**16 else np.uint32
    shards: list[dict] = []
    buffer: list[int] = []
    starts: list[int] = []
    total = 0

    def flush() -> None:
        if not buffer:
            return
        path = folder / f"{name}_{len(shards):03d}.npy"
        array = np.asarray(buffer, dtype=dtype)
        np.save(path, array)
        np.save(path.with_suffix(".docs.npy"), np.asarray(starts, dtype=np.int64))
        shards.append(
            {
                "file": path.name,
                "tokens": int(array.size),
                "documents": len(starts),
                "sha256": hashlib.sha256(array.tobytes()).hexdigest(),
            }
        )
        buffer.clear()
        starts.clear()

    for doc in docs:
        ids = encode_bytes(tokenizer, doc.text.encode("utf-8", "surrogateescape"))
        starts.append(len(buffer))
        buffer.extend(ids)
        buffer.append(eos)
        total += len(ids) + 1
        if len(buffer) >= shard_tokens:
            flush()
    flush()
    return {"tokens": total, "shards": shards}


def build_corpus(config: CorpusConfig, out: str | Path) -> dict:
    """Run the whole pipeline into `out` (shards, tokenizer/, manifest.json); returns the manifest."""
    from transformers import AutoTokenizer

    from agent.tokenizer import train_tokenizer

    out = Path(out)
    stats = CorpusStats()
    docs = deduplicate(iter_documents(config, stats), config, stats)
    if not docs:
        raise CorpusError(
            f"the corpus is empty: {stats.seen} candidate file(s), {stats.excluded} excluded, "
            f"{stats.unreadable} unreadable, {stats.empty} empty; check the source folders and "
            f"suffixes ({', '.join(config.suffixes)})"
        )
    if len(docs) == 1 and stats.exact_duplicates + stats.near_duplicates > 0:
        raise CorpusError(
            f"the corpus is all duplicates: {stats.exact_duplicates} exact and "
            f"{stats.near_duplicates} near-duplicate(s) of one document; add other sources"
        )
    train, heldout = split(docs, config)
    out.mkdir(parents=True, exist_ok=True)
    for stale in list(out.glob("*.npy")):
        stale.unlink()
    if config.tokenizer:
        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)
    else:
        tokenizer = train_tokenizer((d.text for d in train), config.vocab_size)
    tokenizer.save_pretrained(str(out / "tokenizer"))
    packed = {
        "train": pack(tokenizer, train, out, "train", config.shard_tokens),
        "heldout": pack(tokenizer, heldout, out, "heldout", config.shard_tokens),
    }
    stats.train_documents, stats.heldout_documents = len(train), len(heldout)
    stats.train_tokens, stats.heldout_tokens = (
        packed["train"]["tokens"],
        packed["heldout"]["tokens"],
    )
    manifest = {
        "format": "flywheel-corpus/1",
        "config": asdict(config),
        "stats": asdict(stats),
        "tokenizer": "tokenizer",
        "vocab_size": len(tokenizer),
        "eos_token_id": tokenizer.convert_tokens_to_ids(EOS),
        "splits": packed,
    }
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, out / "manifest.json")
    return manifest


def distillation_corpus(
    out: str | Path,
    tokenizer_dir: str | Path,
    texts: list[str],
    conversations: list[dict],
    messages_alone: bool = True,
    heldout_fraction: float = 0.2,
) -> tuple[Path, int]:
    """A corpus for distilling MTP heads from text the model reads and writes: `texts` (code) and
    `conversations` ({"messages", "tools"}) rendered as the engine renders them, plus (with
    `messages_alone`) each message's content on its own, so that near-identical sessions still
    give several documents. Returns the folder and the smaller split's token count."""
    from transformers import AutoTokenizer

    from agent.chat_format import render_chat

    out = Path(out)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    rows = [{"text": text} for text in texts]
    for conversation in conversations:
        messages = conversation["messages"]
        rows.append({"text": render_chat(tokenizer, messages, conversation.get("tools"))})
        if messages_alone:
            rows += [{"text": m["content"]} for m in messages if m.get("content")]
    out.mkdir(parents=True, exist_ok=True)
    export = out / "text.jsonl"
    export.write_text("".join(json.dumps(row) + "\n" for row in rows))
    manifest = build_corpus(
        CorpusConfig(
            exports=[str(export)],
            tokenizer=str(tokenizer_dir),
            near_dup_threshold=0.95,
            heldout_fraction=heldout_fraction,
        ),
        out / "corpus",
    )
    tokens = min(manifest["splits"]["train"]["tokens"], manifest["splits"]["heldout"]["tokens"])
    return out / "corpus", tokens


# --- reading shards back ---------------------------------------------------------------------


class PackedTokens:
    """One split of a built corpus as one token stream (memory-mapped shards).

    `windows(starts, length)` cuts [len(starts), length] windows; `random_starts` and
    `spread_starts` say where.
    """

    def __init__(self, folder: str | Path, split_name: str) -> None:
        folder = Path(folder)
        manifest_path = folder / "manifest.json"
        if not manifest_path.exists():
            raise CorpusError(
                f"{str(folder)!r} is not a built corpus (no manifest.json); "
                "build one with `flywheel train data --source DIR --out FOLDER`"
            )
        manifest = json.loads(manifest_path.read_text())
        if split_name not in manifest["splits"]:
            raise CorpusError(f"corpus {str(folder)!r} has no split {split_name!r}")
        shards = manifest["splits"][split_name]["shards"]
        arrays = [np.load(folder / s["file"], mmap_mode="r") for s in shards]
        self.tokens = np.concatenate(arrays) if len(arrays) != 1 else arrays[0]  # [n]
        self.folder = folder
        self.split = split_name

    def __len__(self) -> int:
        return int(self.tokens.size)

    def check_length(self, length: int) -> None:
        if len(self) < length:
            raise CorpusError(
                f"the {self.split} split of {str(self.folder)!r} has {len(self)} tokens, fewer than "
                f"one window of {length}: use a shorter sequence length or a larger corpus"
            )

    def random_starts(self, rng: np.random.Generator, count: int, length: int) -> np.ndarray:
        self.check_length(length)
        return rng.integers(0, len(self) - length + 1, size=count)

    def spread_starts(self, count: int, length: int) -> np.ndarray:
        """`count` windows that do not overlap, spread evenly over the whole stream (all that fit
        when fewer do): an evaluation reads every part of a split, not its first documents."""
        self.check_length(length)
        grid = np.arange(0, len(self) - length + 1, length)  # every non-overlapping window
        if count >= len(grid):
            return grid
        return grid[np.linspace(0, len(grid) - 1, count).round().astype(np.int64)]

    def windows(self, starts: np.ndarray, length: int):
        import torch

        rows = np.stack([np.asarray(self.tokens[s : s + length], dtype=np.int64) for s in starts])
        return torch.from_numpy(rows)  # [batch, length]
