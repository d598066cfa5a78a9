"""Test-only launcher: `flywheel lsp` on a first start, with a tiny stand-in for the base model.

    FLYWHEEL_CACHE=EMPTY python -m tests.lsp.first_start_server CHECKPOINT --model base --db T.db

It runs the shipped command (`agent.cli main(["lsp", ...])`) unchanged, except that the base's
release file is a few small parts installed into a temporary site folder, `agent.base.BASES`
names them, and the GGUF reader (`agent.base._load_gguf`) returns the tiny CHECKPOINT's trunk and
tokenizer: the real assembly, hash check, conversion and cache, in seconds instead of a minute
and a half. The stand-in reader is noisy on purpose, as libraries are: it prints to
`sys.stdout` and writes to file descriptor 1 directly. None of that may reach the LSP stream.

This file lives in tests/ on purpose: no test double ships in the package.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from pathlib import Path

PARTS = [bytes([n]) * 40_000 for n in range(1, 4)]  # three parts: three assembly reports
NOISE_PRINT = "noise: a library printed this to stdout"
NOISE_FD = "noise: a C extension wrote this to file descriptor 1"


def arguments(checkpoint: Path, db: Path) -> list[str]:
    """This launcher's module and arguments, after `python -m`: the base on a first start."""
    return ["tests.lsp.first_start_server", str(checkpoint), "--model", "base", "--db", str(db)]


def install_stand_in(checkpoint: Path, site: Path) -> None:
    import agent.base as base

    for n, data in enumerate(PARTS, 1):
        (site / f"tinyfirst_part{n}" / "data").mkdir(parents=True)
        (site / f"tinyfirst_part{n}" / "__init__.py").write_text("")
        (site / f"tinyfirst_part{n}" / "data" / f"part{n:02d}.bin").write_bytes(data)
    sys.path.insert(0, str(site))
    whole = b"".join(PARTS)
    base.BASES["base"] = base.Base(
        flag="base",
        name="tiny-first-base",
        parts=len(PARTS),
        requirement="tinyfirst-part{n}==1.0",
        package="tinyfirst_part{n}",
        part_file="data/part{n:02d}.bin",
        gguf="tiny-first-base.gguf",
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        needed_bytes=1 << 20,
    )

    def read_tiny(source: Path):
        print(NOISE_PRINT)
        sys.stdout.flush()
        os.write(1, (NOISE_FD + "\n").encode())
        from transformers import AutoModelForCausalLM, AutoTokenizer

        trunk = AutoModelForCausalLM.from_pretrained(str(checkpoint))
        return trunk.eval(), AutoTokenizer.from_pretrained(str(checkpoint))

    base._load_gguf = read_tiny


def main(argv: list[str]) -> int:
    checkpoint, rest = Path(argv[0]), argv[1:]
    with tempfile.TemporaryDirectory(prefix="flywheel-site-") as site:
        install_stand_in(checkpoint, Path(site))
        from agent.cli import main as cli_main

        return cli_main(["lsp", *rest])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
