"""The model registry: versions, lineage, promotion, rollback, and refusing anything
that does not verify (tampered, half-written, damaged index)."""

from __future__ import annotations

import json
import os
import threading

import pytest

from agent import models_cli
from agent.registry import IntegrityError, RegistryError


def test_add_promote_rollback_and_lineage(registry, tiny_checkpoint, tiny_checkpoint_b):
    v1 = registry.add(tiny_checkpoint, note="base")
    v2 = registry.add(
        tiny_checkpoint_b,
        parent="v1",
        data={"sessions": 3},
        recipe={"sft": {"steps": 4}},
        reward="total@1",
    )
    assert v1.startswith("v1-") and v2.startswith("v2-")
    assert registry.get("v2")["parent"] == v1 and registry.get(v2)["reward"] == "total@1"
    assert registry.get(v1)["status"] == "candidate" and registry.promoted() is None
    # The served copy reports the registry id as its version (flywheel.json is rewritten).
    meta = json.loads((registry.verify(v2) / "flywheel.json").read_text())
    assert meta["version"] == v2 and meta["trained_as"] == "tiny-seed1"

    assert registry.promote(v1, forced=True) is None
    assert registry.promote(v2, forced=True) == v1
    assert {r["id"]: r["status"] for r in registry.versions()} == {v1: "retired", v2: "promoted"}
    assert registry.rollback() == (v2, v1)
    assert registry.promoted() == v1 and registry.get(v2)["status"] == "retired"
    actions = [
        (e["action"], e["version"]) for e in json.loads(registry.index_path.read_text())["events"]
    ]
    assert actions[-3:] == [("promote", v1), ("promote", v2), ("rollback", v1)]
    with pytest.raises(RegistryError, match="already the promoted"):
        registry.promote(v1, forced=True)


def test_tampered_and_half_written_folders_are_refused(registry, tiny_checkpoint):
    v1 = registry.add(tiny_checkpoint)
    folder = registry.folder(v1)
    weights = folder / "model.safetensors"
    weights.chmod(0o644)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in the weights
    weights.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="model.safetensors does not match its sha256"):
        registry.verify(v1)
    with pytest.raises(IntegrityError):
        registry.promote(v1, forced=True)  # never promoted, so never served
    assert registry.promoted() is None

    v2 = registry.add(tiny_checkpoint)
    (registry.folder(v2) / "extra.txt").write_text("dropped in by hand")
    with pytest.raises(IntegrityError, match="files its manifest does not list"):
        registry.verify(v2)
    v3 = registry.add(tiny_checkpoint)
    os.remove(registry.folder(v3) / "tokenizer.json")
    with pytest.raises(IntegrityError, match="missing tokenizer.json"):
        registry.verify(v3)
    # An add that crashed after its rename but before the index write: an orphan folder.
    (registry.root / "versions" / "v9-deadbeef").mkdir()
    (registry.root / ".staging" / "add-1-x").mkdir(parents=True)
    problems = "\n".join(registry.check())
    assert "v9-deadbeef is not in the index" in problems and "unfinished adds" in problems
    with pytest.raises(RegistryError, match="no version 'v9'"):
        registry.verify("v9")


def test_damaged_index_is_refused_with_a_clear_message(registry, tiny_checkpoint, capsys):
    registry.add(tiny_checkpoint)
    registry.add(tiny_checkpoint)
    registry.index_path.write_text('{"format": "flywheel-registry", "versi')  # cut short
    with pytest.raises(RegistryError, match=r"damaged: it is not readable JSON.*index.json.bak"):
        registry.promoted()
    assert models_cli.main(["--registry", str(registry.root), "list"]) == 2
    assert "damaged" in capsys.readouterr().err
    registry.index_path.write_text((registry.root / "index.json.bak").read_text())
    assert [r["number"] for r in registry.versions()] == [1]  # the index before the last add
    registry.index_path.unlink()
    with pytest.raises(RegistryError, match="no index.json"):
        registry.versions()


def test_two_writers_never_interleave(registry, tiny_checkpoint):
    ids: list[str] = []
    workers = [
        threading.Thread(target=lambda: ids.append(registry.add(tiny_checkpoint))) for _ in range(4)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert sorted(r["number"] for r in registry.versions()) == [1, 2, 3, 4]
    assert registry.check() == []


def test_models_command(registry, tiny_checkpoint, tiny_checkpoint_b, tmp_path, capsys):
    reg = ["--registry", str(registry.root)]
    assert models_cli.main([*reg, "list"]) == 0
    assert "no versions yet" in capsys.readouterr().out
    assert models_cli.main([*reg, "add", str(tiny_checkpoint), "--promote"]) == 1
    assert "has no benchmark result" in capsys.readouterr().err  # refused unless --force
    assert models_cli.main([*reg, "promote", "v1", "--force"]) == 0
    assert models_cli.main([*reg, "add", str(tiny_checkpoint_b), "--parent", "v1"]) == 0
    bench = tmp_path / "bench.json"
    for version, score in (("v1", 0.5), ("v2", 0.6)):
        tasks = [{"id": f"t{i}", "scores": {"pass": score + 0.01 * i}} for i in range(5)]
        bench.write_text(
            json.dumps(
                {"benchmark": "b", "task_set": "s1", "tasks": tasks, "metrics": {"pass": "higher"}}
            )
        )
        assert models_cli.main([*reg, "attach", version, str(bench)]) == 0
    assert models_cli.main([*reg, "promote", "v2"]) == 0
    assert "accepted: not worse" in capsys.readouterr().out
    assert registry.get("v2")["gate"][-1]["accepted"] is True
    assert models_cli.main([*reg, "rollback"]) == 0
    assert "v1-" in capsys.readouterr().out
    assert models_cli.main([*reg, "list"]) == 0
    listing = capsys.readouterr().out
    assert "promoted" in listing and "retired" in listing
    assert models_cli.main(reg) == 0  # no command: the same listing
    assert capsys.readouterr().out == listing
    assert models_cli.main([*reg, "show", "v2"]) == 0
    assert "files        verified" in capsys.readouterr().out
    assert models_cli.main([*reg, "verify"]) == 0
    assert models_cli.main([*reg, "show", "v7"]) == 2
    assert "no version 'v7'" in capsys.readouterr().err
    assert models_cli.main([*reg, "add", str(tmp_path)]) == 2
    assert "not a checkpoint or adapter folder" in capsys.readouterr().err


def test_an_adapter_folder_is_a_version_too(registry, tmp_path):
    """The shipped default is an adapter on the base (agent/starter): a cycle starting from it
    registers the adapter folder, verified by hash like any checkpoint."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    version = registry.add(adapter)
    assert (registry.verify(version) / "adapter_config.json").exists()


def test_the_completion_lane_serves_completions_beside_the_promoted_version(
    registry, tiny_checkpoint, tiny_checkpoint_b, perturbed_checkpoint
):
    v1, v2, v3 = (
        registry.add(c) for c in (tiny_checkpoint, tiny_checkpoint_b, perturbed_checkpoint)
    )
    registry.promote(v1, forced=True)
    assert registry.serving("completion") == v1  # the promoted version, until one of its own
    assert registry.resolve("completion") == v1
    with pytest.raises(RegistryError, match="the promoted version, which serves completions"):
        registry.promote(v1, forced=True, lane="completion")
    assert registry.promote(v2, forced=True, lane="completion") is None
    assert (registry.promoted(), registry.serving("completion")) == (v1, v2)
    assert registry.get(v2)["status"] == "completions"
    # no earlier version of its own: completions come from the promoted version again
    assert registry.rollback(lane="completion") == (v2, v1)
    assert registry.serving("completion") == v1 and registry.get(v2)["status"] == "retired"
    with pytest.raises(RegistryError, match="nothing to roll back"):
        registry.rollback(lane="completion")
    registry.promote(v2, forced=True, lane="completion")
    assert registry.promote(v3, forced=True, lane="completion") == v2
    assert registry.rollback(lane="completion") == (v3, v2)
    assert registry.serving("completion") == v2 and registry.get(v3)["status"] == "retired"
    # agent rollbacks never pick a completion version; promoting one makes it serve both lanes
    registry.promote(v3, forced=True, lane="completion")
    registry.promote(v3, forced=True)  # the agent lane
    assert registry.promoted() == v3 and registry.read_index()["completion"] is None
    assert registry.rollback() == (v3, v1)
    with pytest.raises(RegistryError, match="no lane 'tab'"):
        registry.serving("tab")


def test_an_index_from_before_the_completion_lane_is_read(registry, tiny_checkpoint):
    v1 = registry.add(tiny_checkpoint)
    registry.promote(v1, forced=True)
    index = json.loads(registry.index_path.read_text())
    del index["completion"]
    registry.index_path.write_text(json.dumps(index))
    assert registry.serving("completion") == v1 and registry.read_index()["completion"] is None


def test_models_promote_and_rollback_a_completion_version(
    registry, tiny_checkpoint, tiny_checkpoint_b, capsys
):
    reg = ["--registry", str(registry.root)]
    registry.promote(registry.add(tiny_checkpoint), forced=True)
    v2 = registry.add(tiny_checkpoint_b)
    assert models_cli.main([*reg, "promote", "v2", "--force", "--lane", "completion"]) == 0
    assert f"serving completions from {v2}" in capsys.readouterr().out
    assert models_cli.main([*reg, "list"]) == 0
    assert "completions" in capsys.readouterr().out
    assert models_cli.main([*reg, "rollback", "--lane", "completion"]) == 0
    assert "inline completions come from v1-" in capsys.readouterr().out
