"""Durable writes shared by the registry, the training loops and the starter's ledger, and the
reading of the append-only JSONL files they keep."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> None:
    """Replace `path` with `text` so that a reader (or a crash) sees the old file or the new one,
    never a mix: write a uniquely named temporary file beside it, fsync it, rename it over,
    fsync the folder."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_jsonl(path: str | Path) -> list:
    """The rows of an append-only JSONL file (metrics, progress), skipping a line that does not
    parse: the last one, when a kill cut it short. [] when there is no file."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows
