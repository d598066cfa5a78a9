"""Byte-level BPE tokenizer, trained with `tokenizers` from a folder of source files.

Every byte sequence round-trips: the 256 byte symbols are in the initial alphabet, so text that is
not valid UTF-8 (decoded with `surrogateescape` by callers that read raw bytes) still encodes, and
`decode(encode(text)) == text` for any string. Special tokens (chat roles, end of turn, tool calls,
fill-in-the-middle) come from `chat_format.py`; the saved folder is a Hugging Face tokenizer with
the chat template, loadable by `AutoTokenizer.from_pretrained` and by vLLM.

    flywheel tokenizer --source /usr/lib/python3 --vocab-size 8192 --out runs/tokenizer
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from agent.chat_format import CHAT_TEMPLATE, END, EOS, PAD, SPECIAL_TOKENS

SOURCE_SUFFIXES = (".py", ".pyi", ".js", ".ts", ".go", ".rs", ".c", ".h", ".md", ".toml", ".json")
MAX_FILE_BYTES = 256 * 1024  # larger files are mostly data, not code


def iter_source_texts(root: str | Path, max_bytes: int = 50_000_000) -> Iterator[str]:
    """Text of the source files under `root`, up to `max_bytes` in all, in a stable order."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "node_modules")
        for name in sorted(filenames):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            path = Path(dirpath, name)
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if len(data) > MAX_FILE_BYTES or b"\0" in data:
                continue
            total += len(data)
            yield data.decode("utf-8", errors="replace")
            if total >= max_bytes:
                return


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192):
    """Train a byte-level BPE and wrap it as a `PreTrainedTokenizerFast` with our chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS) + 1}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    count = 0

    def counted() -> Iterator[str]:
        nonlocal count
        for text in texts:
            count += 1
            yield text

    tok.train_from_iterator(counted(), trainer=trainer)
    if count == 0:
        raise ValueError("no training text: the source folder has no readable source files")
    return wrap(tok)


def wrap(tok):
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (EOS, PAD)],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _byte_alphabet() -> dict[int, str]:
    """The byte-level alphabet: each byte as the printable character that stands for it.

    Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, ...) map to
    U+0100 onwards in byte order. This is the mapping `tokenizers`' ByteLevel uses.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = _byte_alphabet()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def encode_bytes(tokenizer, data: bytes) -> list[int]:
    """Token ids for arbitrary bytes, invalid UTF-8 included (each bad byte is its byte token)."""
    ids: list[int] = []
    text = data.decode("utf-8", errors="surrogateescape")
    run: list[str] = []
    for ch in text + "\0":  # the sentinel flushes the last run
        if "\udc80" <= ch <= "\udcff" or ch == "\0":
            if run:
                ids += tokenizer.encode("".join(run), add_special_tokens=False)
                run = []
            if ch != "\0":
                ids.append(tokenizer.convert_tokens_to_ids(BYTE_TO_CHAR[ord(ch) - 0xDC00]))
        else:
            run.append(ch)
    if b"\0" in data:  # NUL is a real byte too; redo exactly with NULs as byte tokens
        parts = data.split(b"\0")
        ids = []
        nul = tokenizer.convert_tokens_to_ids(BYTE_TO_CHAR[0])
        for i, part in enumerate(parts):
            if i:
                ids.append(nul)
            if part:
                ids += encode_bytes(tokenizer, part)
    return ids


def decode_bytes(tokenizer, ids: list[int]) -> bytes:
    """The exact bytes that `ids` stand for (special tokens as their UTF-8 text)."""
    out = bytearray()
    special = set(tokenizer.all_special_tokens)
    for token in tokenizer.convert_ids_to_tokens(list(ids)):
        if token in special:
            out += token.encode()
        else:
            out += bytes(CHAR_TO_BYTE[c] for c in token)
    return bytes(out)


def stop_token_ids(tokenizer) -> list[int]:
    """Tokens that end a turn: end of text and end of a chat message."""
    return [tokenizer.convert_tokens_to_ids(EOS), tokenizer.convert_tokens_to_ids(END)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="flywheel tokenizer", description="Train a byte-level BPE tokenizer."
    )
    parser.add_argument("--source", required=True, help="folder of source files to learn from")
    parser.add_argument("--out", required=True, help="folder to save the tokenizer in")
    parser.add_argument("--vocab-size", type=int, default=8192, help="vocabulary size")
    parser.add_argument("--max-mb", type=float, default=50.0, help="read at most this much text")
    args = parser.parse_args(argv)
    if not Path(args.source).is_dir():
        parser.error(f"--source {args.source!r} is not a folder")
    tok = train_tokenizer(iter_source_texts(args.source, int(args.max_mb * 1e6)), args.vocab_size)
    tok.save_pretrained(args.out)
    print(f"saved a {len(tok)}-token tokenizer to {args.out}")
    return 0
