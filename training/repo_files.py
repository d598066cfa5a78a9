"""A workspace's own code, read for repository pretraining: which files, which split, why not.

Reading, in order (every file that is not kept gets one counted reason, in `RepoFiles.skipped`):

    walk       every file under the root, sorted; hidden folders (`.git`, `.venv`, ...) and
               `__pycache__` are not entered
    suffix     only `suffixes` (Python by default: the evaluation is Python line completion)
    ignored    `.gitignore` at the root (pathspec's git semantics) -> reason "gitignored"
    excluded   the privacy policy's exclusion globs (telemetry/privacy.py: `.env*`, keys,
               certificates, credentials, plus the workspace's own `--exclude`) -> "excluded"
    size       over `max_file_bytes` -> "too_large" (generated or data files, not code)
    bytes      a NUL byte -> "binary"; not UTF-8 -> "not_utf8"; an I/O error -> "unreadable"
    blank      nothing but whitespace -> "empty"
    redact     secrets replaced by `[REDACTED:<kind>]` (telemetry.redaction.redact); counted in
               `redacted`, the file is kept

Consent: training reads code, so a workspace whose telemetry consent is not `code` is refused
with one line naming the setting (the same rule telemetry applies before it stores any code).

Split: a file is held out when sha256(seed:path) falls below `heldout_fraction`
(`training.data.is_heldout`): decided by its path, so an edit of a file does not move it between
train and held-out, and a new file leaves the others where they were. At least one file is held
out and one trained on, and the held-out files hold at least half of `heldout_fraction` of the
characters: where the hash alone holds out less, the next files in hash order are added
(`split_files`). `RepoFiles.manifest()` is what a run records (`split.json`).

What it does not do: read files outside the root (symlinks out of it are skipped), follow
nested `.gitignore` files, or decide what the model learns from a file (training/repo_pretrain.py).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from telemetry.privacy import CONSENT_LEVELS, DEFAULT_EXCLUDE, is_excluded
from telemetry.redaction import redact

SKIP_REASONS = (
    "gitignored",
    "excluded",
    "too_large",
    "binary",
    "not_utf8",
    "unreadable",
    "empty",
    "outside_root",
)


class RepoError(ValueError):
    """The workspace cannot be trained or evaluated on; the message says why and what to do."""


@dataclass
class RepoConfig:
    root: str  # the workspace folder
    suffixes: tuple[str, ...] = (".py",)  # file name endings to read
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE  # privacy globs: these files are never read
    consent: str = "code"  # the workspace's telemetry consent; training needs "code"
    max_file_bytes: int = 200_000  # larger files are skipped ("too_large")
    heldout_fraction: float = 0.1  # share of files (by path hash) held out for evaluation
    seed: int = 0  # salts the split's hash

    def __post_init__(self) -> None:
        if self.consent not in CONSENT_LEVELS:
            raise RepoError(f"consent must be one of {', '.join(CONSENT_LEVELS)}")
        if not 0.0 < self.heldout_fraction < 0.5:
            raise RepoError("heldout_fraction must be in (0, 0.5)")
        if self.max_file_bytes < 1:
            raise RepoError("max_file_bytes must be >= 1")


@dataclass
class RepoFile:
    path: str  # relative to the root, POSIX separators
    text: str  # after redaction


@dataclass
class RepoFiles:
    root: str
    train: list[RepoFile]
    heldout: list[RepoFile]
    skipped: dict[str, list[str]] = field(default_factory=dict)  # reason -> paths
    redacted: int = 0  # kept files in which a secret was replaced
    seed: int = 0
    heldout_fraction: float = 0.1

    def fingerprint(self) -> str:
        """A hash of every kept file's path and text: it changes when the code does."""
        digest = hashlib.sha256()
        for f in sorted(self.train + self.heldout, key=lambda f: f.path):
            digest.update(f"{f.path}\0{f.text}\0".encode("utf-8", "surrogatepass"))
        return digest.hexdigest()[:16]

    def manifest(self) -> dict:
        """The split as a run records it: the paths of each side and every skip with its reason."""
        return {
            "root": self.root,
            "fingerprint": self.fingerprint(),
            "seed": self.seed,
            "heldout_fraction": self.heldout_fraction,
            "train": [f.path for f in self.train],
            "heldout": [f.path for f in self.heldout],
            "train_chars": sum(len(f.text) for f in self.train),
            "heldout_chars": sum(len(f.text) for f in self.heldout),
            "redacted": self.redacted,
            "skipped": {k: sorted(v) for k, v in sorted(self.skipped.items())},
        }


def heldout_key(seed: int, path: str) -> bytes:
    return hashlib.sha256(f"{seed}:{path}".encode("utf-8", "surrogatepass")).digest()


def read_repo(config: RepoConfig) -> RepoFiles:
    """The workspace's files, filtered, redacted and split (see the module docstring)."""
    root = Path(config.root).expanduser()
    if not root.is_dir():
        raise RepoError(f"workspace {str(root)!r} does not exist or is not a folder")
    if config.consent != "code":
        raise RepoError(
            f"the workspace's telemetry consent is {config.consent!r}: training on its code "
            "needs consent 'code' (set telemetry.consent, or pass --consent code)"
        )
    ignore = _gitignore(root)
    kept: list[RepoFile] = []
    skipped: dict[str, list[str]] = {}
    redacted = 0
    real_root = root.resolve()
    for path in _walk(root):
        rel = path.relative_to(root).as_posix()
        if not rel.endswith(config.suffixes):
            continue
        reason = _why_not(path, rel, real_root, ignore, config)
        text = None
        if reason is None:
            text, reason = _read(path, config.max_file_bytes)
        if reason is not None:
            skipped.setdefault(reason, []).append(rel)
            continue
        clean = redact(text)
        redacted += clean != text
        kept.append(RepoFile(rel, clean))
    if not kept:
        found = sum(len(v) for v in skipped.values())
        raise RepoError(
            f"no {'/'.join(config.suffixes)} file to learn from in {root} ({found} found, all "
            f"skipped: {', '.join(f'{k} {len(v)}' for k, v in sorted(skipped.items())) or 'none'})"
            ": point --workspace at a repository with Python code"
        )
    if len(kept) < 2:
        raise RepoError(
            f"only one usable file in {root} ({kept[0].path}): repository training needs at "
            "least two, one to train on and one to hold out"
        )
    train, heldout = split_files(kept, config.heldout_fraction, config.seed)
    return RepoFiles(
        str(root), train, heldout, skipped, redacted, config.seed, config.heldout_fraction
    )


def split_files(
    kept: list[RepoFile], fraction: float, seed: int
) -> tuple[list[RepoFile], list[RepoFile]]:
    """(train, held-out) by a seeded hash of each path; at least one file on each side when
    there are two or more.

    A file is held out when its hash falls below `fraction`. Where those files hold less than
    half of `fraction` of the characters (a small repository whose few held-out files are
    short), the files with the next smallest hashes are held out too until they do: a held-out
    set of a few percent of the code measures little. Only then can an edit move a file
    between the sides (files enter and leave the top-up as sizes change)."""
    from training.data import is_heldout

    held = {f.path for f in kept if is_heldout(f.path, fraction, seed)}
    total = sum(len(f.text) for f in kept)
    chars = sum(len(f.text) for f in kept if f.path in held)
    for f in sorted(kept, key=lambda f: heldout_key(seed, f.path)):  # the hash order
        if (held and chars >= fraction / 2 * total) or len(held) >= len(kept) - 1:
            break
        if f.path not in held:
            held.add(f.path)
            chars += len(f.text)
    if len(held) == len(kept):
        held.discard(max(kept, key=lambda f: heldout_key(seed, f.path)).path)
    return [f for f in kept if f.path not in held], [f for f in kept if f.path in held]


def _walk(root: Path):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for name in sorted(filenames):
            yield Path(dirpath, name)


def _gitignore(root: Path):
    import pathspec

    file = root / ".gitignore"
    try:
        lines = file.read_text("utf-8", errors="replace").splitlines() if file.is_file() else []
    except OSError:
        lines = []
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _why_not(path: Path, rel: str, real_root: Path, ignore, config: RepoConfig) -> str | None:
    if ignore.match_file(rel):
        return "gitignored"
    if is_excluded(rel, config.exclude):
        return "excluded"
    if path.is_symlink() and not path.resolve().is_relative_to(real_root):
        return "outside_root"
    return None


def _read(path: Path, max_bytes: int) -> tuple[str | None, str | None]:
    """(text, None) or (None, reason)."""
    try:
        if path.stat().st_size > max_bytes:
            return None, "too_large"
        data = path.read_bytes()
    except OSError:
        return None, "unreadable"
    if b"\0" in data:
        return None, "binary"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not_utf8"
    if not text.strip():
        return None, "empty"
    return text, None
