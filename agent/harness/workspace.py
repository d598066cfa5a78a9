"""Where the agent's files live: the filesystem, or editor buffers laid over it.

What it does:
- Resolves every path a tool names and confines it to the workspace root. `..` that climbs out,
  absolute paths outside the root, and symlinks (anywhere on the path) that lead outside are
  refused with a `WorkspaceError` that says which path and why. Nothing outside is ever opened.
- Reads text safely: binary files (a NUL byte in the first 8 KiB) and files over
  `max_file_bytes` are refused with a clear message; invalid UTF-8 is decoded with
  `surrogateescape`, so bytes that are not UTF-8 survive a read-edit-write round trip unchanged
  (`display()` shows them as U+FFFD to the model).
- Two modes:
  * filesystem (`buffers=None`, headless runs and RL rollouts): writes go to disk;
  * editor overlay (`buffers={path: text}`): the editor's unsaved text wins over the disk, and
    writes/deletes are kept as *proposals* (`proposals()`), never written; the editor shows them
    for review.
- Remembers the original text of every file it changes, so `diff()` is the task's whole change.

What it does not do: run commands (sandbox.py; commands see the disk, not unsaved buffers), or
decide what needs approval (graph.py).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

MAX_FILE_BYTES = 2_000_000  # larger files are refused whole; read them by line range instead
BINARY_SNIFF_BYTES = 8192
SKIP_DIRS = frozenset({".git", "node_modules", "__pycache__", ".venv", ".mypy_cache", ".tox"})


class WorkspaceError(Exception):
    """A path or file the agent may not or cannot use; the message is shown to the model."""


class Workspace:
    """Files under one root folder, with an optional overlay of editor buffers."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        buffers: dict[str, str] | None = None,  # relative path -> unsaved editor text
        max_file_bytes: int = MAX_FILE_BYTES,
    ) -> None:
        root_path = Path(root).expanduser()
        if not root_path.is_dir():
            raise WorkspaceError(f"workspace folder {str(root_path)!r} does not exist")
        self.root = root_path.resolve()
        self.overlay = buffers is not None
        self.max_file_bytes = max_file_bytes
        self._buffers: dict[str, str | None] = {}  # rel -> text (None: deleted in the overlay)
        for path, text in (buffers or {}).items():
            self._buffers[self.rel(path)] = text
        self._original: dict[str, str | None] = {}  # rel -> text before our first change
        self._ignore = None

    # --- paths --------------------------------------------------------------------------------

    def check_alive(self) -> None:
        if not self.root.is_dir():
            raise WorkspaceError(
                f"the workspace folder {str(self.root)!r} no longer exists (deleted or unmounted "
                "during the run); nothing more can be read or written"
            )

    def resolve(self, path: str) -> Path:
        """The absolute path inside the workspace that `path` names, or `WorkspaceError`."""
        if not isinstance(path, str) or not path.strip():
            raise WorkspaceError("a path is required (relative to the workspace root)")
        if "\0" in path:
            raise WorkspaceError(f"path {path!r} contains a NUL character")
        self.check_alive()
        raw = Path(path.strip())
        joined = raw if raw.is_absolute() else self.root / raw
        lexical = Path(os.path.normpath(joined))
        if not _inside(lexical, self.root):
            raise WorkspaceError(
                f"path {path!r} is outside the workspace {str(self.root)!r}; use a path relative "
                "to the workspace root"
            )
        real = Path(os.path.realpath(joined))
        if not _inside(real, self.root):
            raise WorkspaceError(
                f"path {path!r} goes through a symlink that leads outside the workspace "
                f"(to {str(real)!r}); refused"
            )
        return real

    def rel(self, path: str) -> str:
        """The workspace-relative, '/'-separated form of `path` (checked like `resolve`)."""
        resolved = self.resolve(path)
        return resolved.relative_to(self.root).as_posix() or "."

    # --- reading ------------------------------------------------------------------------------

    def exists(self, path: str) -> bool:
        rel = self.rel(path)
        if rel in self._buffers:
            return self._buffers[rel] is not None
        return self.resolve(path).exists()

    def is_file(self, path: str) -> bool:
        rel = self.rel(path)
        if rel in self._buffers:
            return self._buffers[rel] is not None
        return self.resolve(path).is_file()

    def read_text(self, path: str) -> str:
        """The file's text (buffer first); invalid UTF-8 bytes kept as surrogate escapes."""
        rel = self.rel(path)
        if rel in self._buffers:
            text = self._buffers[rel]
            if text is None:
                raise WorkspaceError(f"{rel} was deleted in this session")
            return text
        full = self.resolve(path)
        if full.is_dir():
            raise WorkspaceError(f"{rel} is a folder; use list_files to see what it holds")
        if not full.is_file():
            raise WorkspaceError(f"{rel} does not exist")
        size = full.stat().st_size
        if size > self.max_file_bytes:
            raise WorkspaceError(
                f"{rel} is {size / 1e6:.1f} MB, over the {self.max_file_bytes / 1e6:.1f} MB limit "
                "for whole-file reads and edits; read it by line range or search it instead"
            )
        data = full.read_bytes()
        if is_binary(data):
            raise WorkspaceError(f"{rel} is a binary file ({size} bytes); it cannot be shown")
        return data.decode("utf-8", errors="surrogateescape")

    def iter_lines(self, path: str) -> Iterator[str]:
        """Lines of a text file of any size (streamed from disk unless a buffer holds it)."""
        rel = self.rel(path)
        if rel in self._buffers:
            yield from self.read_text(path).splitlines(keepends=True)
            return
        full = self.resolve(path)
        if not full.is_file():
            raise WorkspaceError(
                f"{rel} does not exist" if not full.is_dir() else f"{rel} is a folder"
            )
        with open(full, "rb") as f:
            if is_binary(f.read(BINARY_SNIFF_BYTES)):
                raise WorkspaceError(f"{rel} is a binary file; it cannot be shown")
            f.seek(0)
            for line in f:
                yield line.decode("utf-8", errors="surrogateescape")

    def files(self, under: str = ".") -> Iterator[str]:
        """Relative paths of the files under `under`, sorted, skipping ignored ones."""
        base = self.resolve(under)
        seen: set[str] = set()
        if base.is_file():
            yield self.rel(under)
            return
        for dirpath, dirnames, filenames in os.walk(base):
            dp = Path(dirpath)
            kept = []
            for d in sorted(dirnames):
                rel_dir = (dp / d).relative_to(self.root).as_posix()
                if d in SKIP_DIRS or (dp / d).is_symlink() or self.ignored(rel_dir + "/"):
                    continue
                kept.append(d)
            dirnames[:] = kept
            for name in sorted(filenames):
                rel = (dp / name).relative_to(self.root).as_posix()
                if self.ignored(rel) or rel in self._buffers:
                    continue
                real = os.path.realpath(dp / name)
                if not _inside(Path(real), self.root):
                    continue
                seen.add(rel)
                yield rel
        base_rel = base.relative_to(self.root).as_posix()
        for rel, text in sorted(self._buffers.items()):
            if text is not None and (base_rel == "." or rel.startswith(base_rel + "/")):
                yield rel

    def ignored(self, rel: str) -> bool:
        """Whether .gitignore (at the workspace root) excludes `rel`."""
        if self._ignore is None:
            import pathspec

            lines: list[str] = []
            gi = self.root / ".gitignore"
            if gi.is_file():
                lines = gi.read_text(errors="replace").splitlines()
            self._ignore = pathspec.GitIgnoreSpec.from_lines(lines)
        return bool(self._ignore.match_file(rel))

    @staticmethod
    def display(text: str) -> str:
        """Text safe to show the model: surrogate escapes (invalid UTF-8) become U+FFFD."""
        try:
            data = text.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError:  # lone surrogates that are not escaped bytes
            data = text.encode("utf-8", errors="surrogatepass")
        return data.decode("utf-8", errors="replace")

    # --- writing ------------------------------------------------------------------------------

    def write_text(self, path: str, text: str) -> None:
        """Write (or propose, in overlay mode) the whole text of a file."""
        rel = self.rel(path)
        full = self.resolve(path)
        if full.is_dir():
            raise WorkspaceError(f"{rel} is a folder, not a file")
        self._remember(rel)
        if self.overlay:
            self._buffers[rel] = text
            return
        full.parent.mkdir(parents=True, exist_ok=True)
        with open(full, "w", encoding="utf-8", errors="surrogateescape", newline="") as f:
            f.write(text)

    def delete(self, path: str) -> None:
        rel = self.rel(path)
        if not self.is_file(path):
            raise WorkspaceError(f"{rel} is not a file (only files can be deleted)")
        self._remember(rel)
        if self.overlay:
            self._buffers[rel] = None
            return
        self.resolve(path).unlink()

    def _remember(self, rel: str) -> None:
        if rel in self._original:
            return
        try:
            self._original[rel] = self.read_text(rel) if self.is_file(rel) else None
        except WorkspaceError:
            self._original[rel] = None

    # --- the task's change --------------------------------------------------------------------

    def changes(self) -> dict[str, tuple[str | None, str | None]]:
        """rel -> (original text or None if new, current text or None if deleted)."""
        out: dict[str, tuple[str | None, str | None]] = {}
        for rel, before in sorted(self._original.items()):
            try:
                after = self.read_text(rel) if self.is_file(rel) else None
            except WorkspaceError:
                after = None
            if before != after:
                out[rel] = (before, after)
        return out

    def changes_digest(self) -> str:
        """A short hash of `changes()`' current texts: equal digests mean the agent's edits have
        not moved on in between."""
        now = {rel: after for rel, (_, after) in self.changes().items()}
        blob = json.dumps(now, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()[:12]

    def proposals(self) -> dict[str, str | None]:
        """Overlay mode: rel -> proposed new text (None: delete). Empty in filesystem mode."""
        if not self.overlay:
            return {}
        return {rel: after for rel, (_, after) in self.changes().items()}

    def snapshot(self, max_files: int = 400, max_chars: int = 1_000_000) -> dict[str, str] | None:
        """Every text file the agent can see (the editor's unsaved buffers included), as
        {path: text}: the task's starting state, so a logged task can be replayed. None when the
        workspace has more than `max_files` files or `max_chars` characters of text."""
        out: dict[str, str] = {}
        total = 0
        for rel in self.files():
            if len(out) >= max_files:
                return None
            try:
                text = self.read_text(rel)
            except (WorkspaceError, OSError, UnicodeDecodeError):
                continue  # binary or unreadable: not part of a replayable text snapshot
            total += len(text)
            if total > max_chars:
                return None
            out[rel] = text
        return out

    def diff(self) -> str:
        """A unified diff (a/ b/ prefixes) of everything changed in this session."""
        parts: list[str] = []
        for rel, (before, after) in self.changes().items():
            a = self.display(before or "").splitlines(keepends=True)
            b = self.display(after or "").splitlines(keepends=True)
            lines = difflib.unified_diff(
                a,
                b,
                "/dev/null" if before is None else f"a/{rel}",
                "/dev/null" if after is None else f"b/{rel}",
            )
            for line in lines:
                parts.append(
                    line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                )
        return "".join(parts)


def is_binary(data: bytes) -> bool:
    return b"\0" in data[:BINARY_SNIFF_BYTES]


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents
