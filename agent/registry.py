"""The model registry: immutable, verified version folders and an index of their history.

A registry is a folder (the command line's default: `$XDG_DATA_HOME/flywheel/models`):

    index.json           what the registry knows: every version with its lineage, status,
                         benchmark results and gate decisions, the two lanes' pointers, and an
                         event log (add, attach, gate, promote, rollback)
    index.json.bak       the index as it was before the last write (to recover a damaged index)
    index.lock           writers hold an exclusive fcntl lock on it, so two never interleave
    versions/<id>/       one checkpoint per version: its files (read-only copies, or hard links)
                         and MANIFEST.json {"files": {path: {"sha256", "size"}}}
    benchmarks/<id>/     benchmark results attached to a version (JSON, as the benchmark wrote it)
    .staging/            adds in progress; a crash leaves a folder here, never in versions/

Vocabulary:
    version id   `v<N>-<8 hex>`: N counts up, the hex is the sha256 of the weights' manifest.
                 `vN` alone names the same version. The checkpoint's own `flywheel.json` is
                 rewritten with this id, so an engine serving it reports it as `model_version`.
    lane         what a version serves. `agent`: the promoted version, which servers run for
                 everything (the agent, chat, edits) and, by default, for inline completions.
                 `completion`: a version that serves inline completions only (the language
                 server's ghost text and next edits), such as one trained on the user's own
                 repository (training/cycle/repo.py): it may know the repository better and
                 the agent's tool calls worse, so it never replaces the promoted version
    status       candidate (added, not promoted) | promoted (the agent lane's, at most one) |
                 completions (the completion lane's, at most one) | retired (was promoted or
                 served completions, then replaced or rolled back)
    verified     every file named in MANIFEST.json is present with its size and sha256, nothing
                 else is in the folder, and MANIFEST.json hashes to what the index recorded

Writes are atomic: the index is written to a temporary file, fsynced and renamed over the old
one, under the lock. An add copies and hashes the files in `.staging/` first and renames the
folder into `versions/` only when complete; a folder in `versions/` that the index does not
name (a crash between the rename and the index write) is reported by `check()` and never served.
A version folder edited by hand, a missing file, or a damaged index raises `IntegrityError` or
`RegistryError` with a message naming the problem: nothing unverified is ever handed to a server.

What it does not do: decide whether a version is good enough (agent/gate.py does; `promote`
records the decision it is given), read the environment (only `path_from_cli`, for command-line
entry points), or delete versions.

`RegistryWatcher` follows one lane's pointer for a running engine (`flywheel serve`, the
language server): it notices a change of index.json (a cheap stat, every few seconds and before
requests), verifies the newly promoted version and swaps the engine to it; requests already
running finish on the old weights (`Engine.swap`).

    flywheel models add runs/cycle/sft/model --promote --force
    flywheel models list
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from agent.files import atomic_write_text

log = logging.getLogger("flywheel.registry")

FORMAT = "flywheel-registry"
FORMAT_VERSION = 1
STATUSES = ("candidate", "promoted", "completions", "retired")
LANES = ("agent", "completion")
_POINTER = {"agent": "promoted", "completion": "completion"}  # lane -> its key in index.json
_SERVES = {"agent": "promoted version", "completion": "version serving completions"}
MANIFEST = "MANIFEST.json"
META = "flywheel.json"  # the checkpoint's version and lineage file (agent/model.py)


class RegistryError(Exception):
    """The registry cannot do what was asked; the message says why and what to do."""


class IntegrityError(RegistryError):
    """A version folder or the index does not match what was recorded: refuse to use it."""


def path_from_cli(flag: str | None, environ: Mapping[str, str] | None = None) -> Path:
    """For command-line entry points only: `--registry`, else $FLYWHEEL_REGISTRY, else
    $XDG_DATA_HOME/flywheel/models (~/.local/share when XDG_DATA_HOME is unset)."""
    from telemetry.folders import command_line_path

    return command_line_path(flag, "FLYWHEEL_REGISTRY", "models", environ)


def _copy_in(source: Path, staging: Path, link: bool) -> dict[str, dict[str, Any]]:
    """Copy (or hard-link, where the filesystem allows) a checkpoint's files into `staging`,
    all but its metadata and manifest; returns relative path -> sha256 and size."""
    files: dict[str, dict[str, Any]] = {}
    for path in _files(source):
        rel = path.relative_to(source).as_posix()
        if rel in (META, MANIFEST):
            continue
        target = staging / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if link:
            try:
                os.link(path, target)
            except OSError:
                shutil.copy2(path, target)
        else:
            shutil.copy2(path, target)
        files[rel] = {"sha256": file_sha256(target), "size": target.stat().st_size}
    return files


def _seal(
    staging: Path, vid: str, files: dict[str, Any], trained_meta: dict[str, Any], link: bool
) -> str:
    """Write the version's metadata (META, naming it `vid`) and its manifest of `files` into
    `staging`, flush every file to disk and make copies read-only; returns the manifest text."""
    meta = {**trained_meta, "version": vid, "trained_as": trained_meta.get("version")}
    (staging / META).write_text(json.dumps(meta, indent=2) + "\n")
    files[META] = {"sha256": file_sha256(staging / META), "size": (staging / META).stat().st_size}
    manifest = json.dumps({"version": vid, "files": files}, indent=2, sort_keys=True) + "\n"
    (staging / MANIFEST).write_text(manifest)
    for path in _files(staging):
        with path.open("rb") as handle:
            os.fsync(handle.fileno())
        if not link:
            path.chmod(0o444)
    return manifest


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink())


class Registry:
    """One registry folder. Reads need no lock; every write holds `index.lock`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()
        self.index_path = self.root / "index.json"

    # --- reading -----------------------------------------------------------------------------

    def exists(self) -> bool:
        return self.index_path.exists()

    def read_index(self) -> dict[str, Any]:
        """The index; an empty one when the registry does not exist yet."""
        if not self.index_path.exists():
            if self.root.exists() and (self.root / "versions").exists():
                raise RegistryError(
                    f"the registry {self.root} has version folders but no index.json: it was "
                    f"damaged or half-written; restore index.json from index.json.bak"
                )
            return {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "promoted": None,
                "completion": None,
                "versions": {},
                "events": [],
            }
        try:
            index = json.loads(self.index_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RegistryError(self._corrupt(f"it is not readable JSON ({exc})")) from None
        if not isinstance(index, dict) or index.get("format") != FORMAT:
            raise RegistryError(self._corrupt("it is not a flywheel registry index"))
        if index.get("format_version") != FORMAT_VERSION:
            raise RegistryError(
                f"the registry index {self.index_path} has format version "
                f"{index.get('format_version')!r}; this flywheel reads version {FORMAT_VERSION}"
            )
        versions = index.get("versions")
        if not isinstance(versions, dict) or not isinstance(index.get("events"), list):
            raise RegistryError(self._corrupt("its versions or events are missing"))
        index.setdefault("completion", None)  # written before the completion lane existed
        for key in _POINTER.values():
            if index.get(key) is not None and index[key] not in versions:
                raise RegistryError(
                    self._corrupt(f"its {key} version {index[key]!r} is not listed")
                )
        for vid, record in versions.items():
            if not isinstance(record, dict) or record.get("status") not in STATUSES:
                raise RegistryError(self._corrupt(f"version {vid!r} has no valid status"))
        return index

    def _corrupt(self, why: str) -> str:
        return (
            f"the registry index {self.index_path} is damaged: {why}. Nothing was loaded from "
            f"it. Restore it from {self.index_path.name}.bak (the index before the last write) "
            "or move the registry folder away and add the versions again"
        )

    def versions(self) -> list[dict[str, Any]]:
        """Every version record, oldest first."""
        return sorted(self.read_index()["versions"].values(), key=lambda r: r["number"])

    def promoted(self) -> str | None:
        """The id of the promoted version, or None."""
        return self.read_index()["promoted"]

    def serving(self, lane: str = "agent", index: dict[str, Any] | None = None) -> str | None:
        """The version that serves `lane`: the completion lane's own version, else the promoted
        one (which serves completions until a completion version is promoted); None when
        nothing is promoted."""
        index = index or self.read_index()
        return index.get(_POINTER[_lane(lane)]) or index["promoted"]

    def resolve(self, ref: str, index: dict[str, Any] | None = None) -> str:
        """A full version id from an id, `vN`, `promoted`, or `completion` (what serves it)."""
        index = index or self.read_index()
        versions = index["versions"]
        if ref in ("promoted", "current", "completion"):
            vid = self.serving("completion" if ref == "completion" else "agent", index)
            if vid is None:
                raise RegistryError(f"no version of {self.root} is promoted yet")
            return vid
        if ref in versions:
            return ref
        matches = [vid for vid in versions if vid.split("-")[0] == ref]
        if len(matches) == 1:
            return matches[0]
        known = ", ".join(sorted(versions, key=lambda v: versions[v]["number"])) or "none"
        raise RegistryError(f"no version {ref!r} in the registry {self.root} (known: {known})")

    def get(self, ref: str) -> dict[str, Any]:
        index = self.read_index()
        return index["versions"][self.resolve(ref, index)]

    def folder(self, ref: str) -> Path:
        """The version's folder, not verified (for showing; `verify` before loading)."""
        return self.root / "versions" / self.resolve(ref)

    def verify(self, ref: str) -> Path:
        """The version's folder after checking every file against its manifest.

        Raises IntegrityError naming the first problem; returns the folder when all is well.
        """
        index = self.read_index()
        vid = self.resolve(ref, index)
        record = index["versions"][vid]
        folder = self.root / "versions" / vid
        if not folder.is_dir():
            raise IntegrityError(
                f"version {vid} is in the index but its folder {folder} is missing: the registry "
                "was edited by hand; it will not be served"
            )
        manifest_path = folder / MANIFEST
        try:
            raw = manifest_path.read_bytes()
            manifest = json.loads(raw)
            files = manifest["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(
                f"version {vid}: {manifest_path} is missing or unreadable ({exc}); the folder "
                "was edited by hand or half-written; it will not be served"
            ) from None
        if hashlib.sha256(raw).hexdigest() != record.get("manifest_sha256"):
            raise IntegrityError(
                f"version {vid}: {MANIFEST} does not match the one recorded when it was added "
                "(edited by hand); it will not be served"
            )
        present = {p.relative_to(folder).as_posix() for p in _files(folder)} - {MANIFEST}
        extra = sorted(present - set(files))
        missing = sorted(set(files) - present)
        if missing:
            raise IntegrityError(
                f"version {vid} is missing {', '.join(missing[:5])}: the folder was edited by "
                "hand or half-written; it will not be served"
            )
        if extra:
            raise IntegrityError(
                f"version {vid} has files its manifest does not list ({', '.join(extra[:5])}): "
                "the folder was edited by hand; it will not be served"
            )
        for rel, want in sorted(files.items()):
            path = folder / rel
            if path.stat().st_size != want["size"] or file_sha256(path) != want["sha256"]:
                raise IntegrityError(
                    f"version {vid}: {rel} does not match its sha256 in {MANIFEST} (changed "
                    "after it was added); it will not be served"
                )
        return folder

    def benchmarks(self, ref: str) -> list[dict[str, Any]]:
        """The benchmark results attached to a version, oldest first (full JSON)."""
        vid = self.resolve(ref)
        out = []
        for entry in self.get(vid).get("benchmarks", []):
            path = self.root / entry["path"]
            try:
                out.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, json.JSONDecodeError) as exc:
                raise RegistryError(
                    f"benchmark result {path} of {vid} is unreadable: {exc}"
                ) from exc
        return out

    def check(self) -> list[str]:
        """Every problem of the whole registry, in words (empty: all versions verify)."""
        problems = []
        try:
            index = self.read_index()
        except RegistryError as exc:
            return [str(exc)]
        for vid in sorted(index["versions"], key=lambda v: index["versions"][v]["number"]):
            try:
                self.verify(vid)
            except RegistryError as exc:
                problems.append(str(exc))
        folders = self.root / "versions"
        if folders.is_dir():
            for orphan in sorted(set(p.name for p in folders.iterdir()) - set(index["versions"])):
                problems.append(
                    f"{folders / orphan} is not in the index (an add that did not finish, or a "
                    "folder copied in by hand): it is never served; remove it"
                )
        staging = self.root / ".staging"
        if staging.is_dir() and any(staging.iterdir()):
            problems.append(f"{staging} holds unfinished adds: remove them when no add is running")
        return problems

    # --- writing -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """Hold the write lock; yields the current index, to be changed and saved by `_save`."""
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / "index.lock").open("a") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield self.read_index()
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _save(self, index: dict[str, Any]) -> None:
        if self.index_path.exists():
            atomic_write_text(self.root / "index.json.bak", self.index_path.read_text("utf-8"))
        atomic_write_text(self.index_path, json.dumps(index, indent=2, sort_keys=True) + "\n")

    @staticmethod
    def _event(index: dict[str, Any], action: str, version: str, **fields: Any) -> None:
        index["events"].append({"at": time.time(), "action": action, "version": version, **fields})

    def add(
        self,
        source: str | os.PathLike[str],
        *,
        parent: str | None = None,
        data: dict[str, Any] | None = None,
        recipe: dict[str, Any] | None = None,
        reward: dict[str, Any] | str | None = None,
        note: str = "",
        link: bool = False,
    ) -> str:
        """Copy (or hard-link) a checkpoint folder in as a new candidate; returns its id.

        Lineage: `parent` (a version of this registry), `data` (what it was trained on, e.g.
        an export manifest), `recipe` (the stage recipes), `reward` (reward function@version).
        """
        source = Path(source).expanduser()
        if not any((source / f).is_file() for f in ("config.json", "adapter_config.json")):
            raise RegistryError(
                f"{source} is not a checkpoint or adapter folder (no config.json or "
                "adapter_config.json): add the folder that `flywheel train` wrote (RUN/model)"
            )
        if parent is not None:
            parent = self.resolve(parent)
        staging = self.root / ".staging" / f"add-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging.mkdir(parents=True)
        try:
            files = _copy_in(source, staging, link)
            if not files:
                raise RegistryError(f"{source} holds no files to add")
            weights = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
            try:
                trained_meta = json.loads((source / META).read_text("utf-8"))
            except (OSError, json.JSONDecodeError):
                trained_meta = {}
            with self._locked() as index:
                number = 1 + max((r["number"] for r in index["versions"].values()), default=0)
                vid = f"v{number}-{weights[:8]}"
                manifest = _seal(staging, vid, files, trained_meta, link)
                (self.root / "versions").mkdir(exist_ok=True)
                os.rename(staging, self.root / "versions" / vid)
                index["versions"][vid] = {
                    "id": vid,
                    "number": number,
                    "status": "candidate",
                    "created_at": time.time(),
                    "source": str(source.absolute()),
                    "trained_as": trained_meta.get("version"),
                    "stage": trained_meta.get("stage"),
                    "parent": parent,
                    "data": data or {},
                    "recipe": recipe or {},
                    "reward": reward,
                    "note": note,
                    "manifest_sha256": hashlib.sha256(manifest.encode()).hexdigest(),
                    "benchmarks": [],
                    "gate": [],
                }
                self._event(index, "add", vid, parent=parent)
                self._save(index)
            return vid
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def attach_benchmark(self, ref: str, result: dict[str, Any], name: str = "") -> dict[str, Any]:
        """Store a benchmark result (the benchmark's JSON) for a version; returns its summary."""
        if not isinstance(result, dict):
            raise RegistryError("a benchmark result must be a JSON object")
        with self._locked() as index:
            vid = self.resolve(ref, index)
            record = index["versions"][vid]
            name = name or f"{len(record['benchmarks']) + 1:03d}-{result.get('benchmark', 'bench')}"
            rel = Path("benchmarks") / vid / f"{name}.json"
            (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.root / rel, json.dumps(result, indent=2, sort_keys=True) + "\n")
            summary = {
                "name": name,
                "path": rel.as_posix(),
                "at": time.time(),
                "benchmark": result.get("benchmark"),
                "task_set": result.get("task_set"),
                "provisional": bool(result.get("provisional")),
                "summary": result.get("summary") or {},
            }
            record["benchmarks"].append(summary)
            self._event(index, "attach", vid, benchmark=name)
            self._save(index)
        return summary

    def record_gate(self, ref: str, decision: dict[str, Any]) -> None:
        """Keep the gate's decision (accepted, reasons, comparisons) with the candidate."""
        with self._locked() as index:
            vid = self.resolve(ref, index)
            index["versions"][vid]["gate"].append({"at": time.time(), **decision})
            self._event(index, "gate", vid, accepted=bool(decision.get("accepted")))
            self._save(index)

    def promote(
        self, ref: str, *, forced: bool = False, reason: str = "", lane: str = "agent"
    ) -> str | None:
        """Make `ref` the version that serves `lane` (after verifying it); returns the one it
        replaced there.

        The caller has run the gate (agent/gate.py) or was told to skip it (`forced`).
        """
        return self._switch(ref, "promote", forced=forced, reason=reason, lane=lane)

    def rollback(
        self, to: str | None = None, reason: str = "", lane: str = "agent"
    ) -> tuple[str, str]:
        """Serve `lane` again from the version that served it before the current one (or `to`).
        The completion lane with no earlier version of its own goes back to the promoted one.

        Returns (the version that served the lane, the one that serves it now).
        """
        index = self.read_index()
        current = index[_POINTER[_lane(lane)]]
        if current is None:
            what = "is promoted" if lane == "agent" else "serves completions alone"
            raise RegistryError(f"nothing to roll back: no version of {self.root} {what}")
        if to is None:
            earlier = [
                e["version"]
                for e in index["events"]
                if e["action"] in ("promote", "rollback")
                and e.get("lane", "agent") == lane
                and e["version"] not in (current, None)
            ]
            if not earlier and lane == "agent":
                raise RegistryError(
                    f"nothing to roll back to: {current} is the only version ever promoted"
                )
            to = earlier[-1] if earlier else None
        if to is None:  # the completion lane: the promoted version serves completions again
            with self._locked() as index:
                index["versions"][current]["status"] = "retired"
                index["completion"] = None
                self._event(index, "rollback", None, previous=current, reason=reason, lane=lane)
                self._save(index)
            return current, index["promoted"]
        target = self.resolve(to, index)
        if target == current:
            raise RegistryError(f"{target} is already the {_SERVES[lane]}")
        self._switch(
            target,
            "rollback",
            forced=True,
            reason=reason or f"rolled back from {current}",
            lane=lane,
        )
        return current, target

    def _switch(self, ref: str, action: str, *, forced: bool, reason: str, lane: str) -> str | None:
        key = _POINTER[_lane(lane)]
        vid = self.resolve(ref)
        self.verify(vid)  # before taking the lock: hashing may take a while
        with self._locked() as index:
            vid = self.resolve(ref, index)
            previous = index[key]
            if previous == vid:
                raise RegistryError(f"{vid} is already the {_SERVES[lane]}")
            if lane == "completion" and vid == index["promoted"]:
                raise RegistryError(
                    f"{vid} is the promoted version, which serves completions whenever no "
                    "completion version is set: roll the completion lane back instead"
                )
            if previous is not None:
                index["versions"][previous]["status"] = "retired"
            if lane == "agent" and index["completion"] == vid:
                index["completion"] = None  # promoted, it serves both lanes
            record = index["versions"][vid]
            record["status"] = "promoted" if lane == "agent" else "completions"
            record["promoted_at"] = time.time()
            index[key] = vid
            self._event(
                index, action, vid, previous=previous, forced=forced, reason=reason, lane=lane
            )
            self._save(index)
        return previous


def _lane(lane: str) -> str:
    if lane not in LANES:
        raise RegistryError(f"no lane {lane!r}: the registry's lanes are {', '.join(LANES)}")
    return lane


class RegistryWatcher:
    """Keeps a running engine on the version that serves a lane (`lane`; the promoted one).

    `pending()` says which verified version to switch to, if any (cheap when index.json has not
    changed: one stat); `check()` also switches, through `swap(folder) -> version`
    (`Engine.swap`); `start()` runs `check()` every `interval_s` in a thread. A version that
    fails verification is refused with one logged error and the engine keeps its weights.
    Switches are serialised: a promotion that lands during a swap is picked up right after it.
    """

    def __init__(
        self,
        registry: Registry,
        swap: Callable[[str], str],
        version: str | None,
        interval_s: float = 2.0,
        on_change: Callable[[str | None, str], None] | None = None,
        lane: str = "agent",
    ) -> None:
        if interval_s <= 0:
            raise ValueError("the registry poll interval must be > 0 seconds")
        self.registry = registry
        self.lane = _lane(lane)
        self.swap = swap
        self.version = version  # the version the engine runs now
        self.interval_s = interval_s
        self.on_change = on_change
        self.error: str | None = None  # the last refusal, until a version loads
        self._seen: tuple[int, int, int] | None = None  # index.json (inode, size, mtime)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.registry.index_path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def pending(self) -> tuple[str, Path] | None:
        """(version, verified folder) when the lane's version differs from `version`."""
        stamp = self._stamp()
        if stamp == self._seen:
            return None
        try:
            promoted = self.registry.serving(self.lane)
            if promoted is None or promoted == self.version:
                self._seen = stamp
                return None
            folder = self.registry.verify(promoted)
        except RegistryError as exc:
            self._seen = stamp  # retried when the index changes again
            self._refuse(str(exc))
            return None
        return promoted, folder

    def mark(self, version: str) -> None:
        """The engine now runs `version` (a caller that swapped by itself says so)."""
        self.version, self.error = version, None
        self._seen = None  # look again: a promotion may have landed while it loaded

    def defer(self, message: str) -> None:
        """The switch failed (`message`): keep the current weights until the index changes."""
        self._seen = self._stamp()
        self._refuse(message)

    def _refuse(self, message: str) -> None:
        if message != self.error:
            log.error("registry: %s; still serving %s", message, self.version)
        self.error = message

    def check(self) -> str | None:
        """Switch to the promoted version if it changed; returns the new version or None."""
        with self._lock:
            switched = None
            while (target := self.pending()) is not None:  # again: it may change during a swap
                version, folder = target
                old = self.version
                try:
                    loaded = self.swap(str(folder))
                except Exception as exc:  # the engine refused the weights: keep the old ones
                    self.defer(f"could not load {version}: {exc}")
                    return switched
                if loaded != version:
                    log.warning("registry: %s loaded as %r", version, loaded)
                self.mark(version)
                switched = version
                log.info("registry: now serving %s (was %s)", version, old)
                if self.on_change is not None:
                    self.on_change(old, version)
            return switched

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                try:
                    self.check()
                except Exception:  # the watcher must outlive any one bad read
                    log.exception("registry watch failed")

        self._thread = threading.Thread(target=loop, name="flywheel-registry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
