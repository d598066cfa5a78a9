"""Repository pretraining: which files are read, the split, the samples, the run, the evaluation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from training.repo_files import RepoConfig, RepoError, read_repo

ROOT = Path(__file__).parents[2]

CODE = '''"""Prices of the shop."""


def price_with_tax(price, rate):
    total = price * (1 + rate)
    return round(total, 2)


def discount(price, percent):
    cut = price * percent / 100
    return price - cut
'''


def make_workspace(root: Path, files: int = 12) -> Path:
    """A small Python repository with everything the reader must skip beside its code."""
    (root / "shop").mkdir(parents=True)
    for i in range(files):
        (root / "shop" / f"mod{i:02d}.py").write_text(CODE.replace("price", f"price{i}"))
    (root / ".gitignore").write_text("build/\n*.gen.py\n")
    (root / "build").mkdir()
    (root / "build" / "out.py").write_text("x = 1\n")
    (root / "shop" / "schema.gen.py").write_text("y = 2\n")
    (root / ".env").write_text("TOKEN=abc\n")
    (root / "shop" / "secret_settings.py").write_text("KEY = 'x'\n")
    (root / "shop" / "huge.py").write_text("# filler\n" * 40_000)
    (root / "shop" / "blob.py").write_bytes(b"x = 1\n\x00\x01\x02")
    (root / "shop" / "latin.py").write_bytes("name = 'caf\xe9'\n".encode("latin-1"))
    (root / "shop" / "blank.py").write_text("\n\n")
    (root / "shop" / "keys.py").write_text(
        CODE + 'AWS_KEY = "AKIAIOSFODNN7EXAMPLE"\npassword = "hunter2hunter2"\n'
    )
    return root


def test_reader_skips_with_a_counted_reason_and_redacts(tmp_path):
    files = read_repo(RepoConfig(root=str(make_workspace(tmp_path / "ws")), max_file_bytes=100_000))
    m = files.manifest()
    assert m["skipped"] == {
        "binary": ["shop/blob.py"],
        "empty": ["shop/blank.py"],
        "excluded": ["shop/secret_settings.py"],
        "gitignored": ["build/out.py", "shop/schema.gen.py"],
        "not_utf8": ["shop/latin.py"],
        "too_large": ["shop/huge.py"],
    }
    kept = {f.path: f.text for f in files.train + files.heldout}
    assert len(kept) == 13 and "AKIAIOSFODNN7EXAMPLE" not in kept["shop/keys.py"]
    assert "[REDACTED" in kept["shop/keys.py"] and m["redacted"] == 1


def test_split_is_by_path_deterministic_and_stable_under_edits(tmp_path):
    ws = make_workspace(tmp_path / "ws", files=40)
    first = read_repo(RepoConfig(root=str(ws), heldout_fraction=0.2))
    assert first.heldout and first.train
    assert not {f.path for f in first.train} & {f.path for f in first.heldout}
    (ws / "shop" / "mod03.py").write_text("changed = True\n")
    (ws / "shop" / "new.py").write_text("new = 1\n")
    second = read_repo(RepoConfig(root=str(ws), heldout_fraction=0.2))
    old = {f.path for f in first.heldout}
    assert old <= {f.path for f in second.heldout} | {"shop/new.py"}
    assert {f.path for f in second.heldout} - {"shop/new.py"} == old
    assert first.fingerprint() != second.fingerprint()


def test_a_small_held_out_share_is_topped_up_in_hash_order():
    from training.data import is_heldout
    from training.repo_files import RepoFile, heldout_key, split_files

    paths = [f"pkg/m{i:02d}.py" for i in range(30)]
    by_hash = [p for p in paths if is_heldout(p, 0.2, 0)]
    assert 0 < len(by_hash) < 10
    # the files the hash holds out are one line each, the rest long: a few percent held out
    files = [RepoFile(p, "x = 1\n" if p in by_hash else "y = 2\n" * 100) for p in paths]
    train, held = split_files(files, 0.2, 0)
    total = sum(len(f.text) for f in files)
    assert sum(len(f.text) for f in held) >= 0.1 * total
    assert set(by_hash) <= {f.path for f in held} and train
    order = sorted(paths, key=lambda p: heldout_key(0, p))
    assert [f.path for f in sorted(held, key=lambda f: heldout_key(0, f.path))] == order[
        : len(held)
    ]
    # with even sizes the hash alone decides, as before
    even = [RepoFile(p, "z = 3\n") for p in paths]
    assert {f.path for f in split_files(even, 0.2, 0)[1]} == set(by_hash)


def test_a_repository_without_python_and_one_without_consent_are_refused(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# hello\n")
    with pytest.raises(RepoError, match=r"no \.py file to learn from .*Python code"):
        read_repo(RepoConfig(root=str(tmp_path)))
    ws = make_workspace(tmp_path / "ws")
    with pytest.raises(RepoError, match="consent is 'metrics'.*needs consent 'code'"):
        read_repo(RepoConfig(root=str(ws), consent="metrics"))
    with pytest.raises(RepoError, match="does not exist"):
        read_repo(RepoConfig(root=str(tmp_path / "nowhere")))


def test_samples_train_only_the_continuation_or_the_middle(tmp_path, tokenizer):
    from agent.chat_format import EOS, FIM_MIDDLE, FIM_SUFFIX, heal
    from training.repo_pretrain import make_sample

    files = read_repo(RepoConfig(root=str(make_workspace(tmp_path / "ws")))).train
    starts = set()
    for fim in (0.0, 1.0):
        for seed in range(12):
            ids, mask = make_sample(
                tokenizer, "ws", files, np.random.default_rng(seed), 96, fim, 0.25
            )
            assert len(ids) == len(mask) <= 97 and 0 < sum(mask) < len(mask)
            first = mask.index(1)
            assert all(mask[first:]) and not any(mask[:first])  # one trained span, at the end
            text = tokenizer.decode(ids[:first])
            assert "<|repo_name|>ws" in text and "<|file_sep|>shop/" in text
            before = text.split(FIM_SUFFIX)[0] if fim else text
            # healed, as the language server's prompts are: never ended inside an indentation
            assert not before.endswith(" ") or heal(before)[1] == ""
            if fim:
                assert text.endswith(FIM_MIDDLE) and tokenizer.decode(ids).endswith(EOS)
                starts.add(tokenizer.decode(ids[first:]).startswith("\n"))
    assert starts == {True, False}  # middles start at (healed) line starts and inside lines


def test_with_train_context_the_prompts_code_is_learnt_too(tmp_path, tokenizer):
    """The context files, prefix and suffix are train code: with `train_prompt` every token of
    them is a target, but no special token and not the repository's name."""
    from agent.chat_format import SPECIAL_TOKENS
    from training.repo_pretrain import make_sample

    files = read_repo(RepoConfig(root=str(make_workspace(tmp_path / "ws")))).train
    special = set(tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS))
    for seed in range(6):
        args = (tokenizer, "ws", files, np.random.default_rng(seed), 96, 0.5, 0.25)
        ids, only_target = make_sample(*args)
        same, mask = make_sample(*args[:3], np.random.default_rng(seed), 96, 0.5, 0.25, True)
        assert same == ids and sum(mask) > sum(only_target)
        assert all(m for m, t in zip(mask, only_target, strict=True) if t)  # the target still is
        trained = [t for t, m in zip(ids, mask, strict=True) if m]
        assert not special & set(trained[:-1])  # (a FIM row's last target is its end token)
        head = len(tokenizer("<|repo_name|>ws\n", add_special_tokens=False)["input_ids"])
        assert tokenizer.decode(ids[:head]) == "<|repo_name|>ws\n" and not any(mask[:head])


def test_lines_are_picked_deterministically_and_spread_over_files(tmp_path):
    from training.repo_eval import pick_lines

    files = read_repo(RepoConfig(root=str(make_workspace(tmp_path / "ws")))).train
    a = pick_lines(files, 10, 4, seed=0)
    assert [(c.path, len(c.prefix)) for c in a] == [
        (c.path, len(c.prefix)) for c in pick_lines(files, 10, 4, seed=0)
    ]
    assert len(a) == 10 and len({c.path for c in a}) == 10
    for c in a:
        line = c.prefix.rsplit("\n", 1)[-1] + c.expected
        assert c.prefix.endswith(line[: len(line) - len(line.lstrip())])  # after indentation
        assert len(c.expected.strip()) >= 4 and not c.expected.startswith("#")


def _repo_argv(tmp_path, model, ws) -> list[str]:
    """`flywheel train repo` on `ws` from `model`, into tmp_path/run and tmp_path/registry."""
    return [
        "repo",
        "--workspace",
        str(ws),
        "--model",
        str(model),
        "--out",
        str(tmp_path / "run"),
        "--registry",
        str(tmp_path / "registry"),
    ]


def _run_cli(tmp_path, model, ws, *extra):
    cmd = [
        sys.executable,
        "-m",
        "agent.cli",
        "train",
        *_repo_argv(tmp_path, model, ws),
        "--eval-lines",
        "4",
        "--eval-requests",
        "5",
        "--no-progress",
        *[
            a
            for kv in (
                "steps=3",
                "seq_len=64",
                "batch_size=2",
                "lora_rank=4",
                "lr=1e-2",
                "save_every=1",
                "log_every=1",
                "eval_every=3",
                'precision="fp32"',
                'device="cpu"',
            )
            for a in ("--set", kv)
        ],
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_train_repo_registers_an_adapter_with_its_split_and_scores(tmp_path, tiny_checkpoint):
    from agent.model import load_checkpoint
    from agent.registry import Registry

    ws = make_workspace(tmp_path / "ws")
    out = _run_cli(tmp_path, tiny_checkpoint, ws)
    assert out.returncode == 0, out.stderr
    assert "registered as v1-" in out.stdout and "before: held-out ppl" in out.stdout
    split = json.loads((tmp_path / "run" / "data" / "split.json").read_text())
    assert split["heldout"] and split["skipped"]["binary"] == ["shop/blob.py"]
    registry = Registry(tmp_path / "registry")
    (version,) = registry.versions()
    assert version["data"]["repo"]["fingerprint"] == split["fingerprint"]
    (bench,) = registry.benchmarks(version["id"])
    assert bench["benchmark"] == "repo_heldout" and bench["summary"]["lines"]["mean"] == 4
    assert len(bench["requests"]) == 5 and "accept_rate" in bench["summary"]
    assert {t["id"] for t in bench["tasks"]} <= set(split["heldout"])
    load_checkpoint(registry.verify(version["id"]))  # the registered adapter loads


def test_a_failed_run_registers_nothing_and_says_so_in_one_line(
    tmp_path, tiny_checkpoint, monkeypatch, capsys
):

    from agent.registry import Registry
    from training import cli, repo_pretrain

    def diverged(trunk, batch):
        return torch.tensor(float("nan"), requires_grad=True), {}

    monkeypatch.setattr(repo_pretrain, "masked_loss", diverged)
    ws = make_workspace(tmp_path / "ws")
    code = cli.main(
        [
            *_repo_argv(tmp_path, tiny_checkpoint, ws),
            "--no-progress",
            "--set",
            "seq_len=64",
            "--set",
            "lora_rank=4",
            "--set",
            'precision="fp32"',
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("flywheel train repo: loss is nan at step 0")
    assert not Registry(tmp_path / "registry").versions()


def test_a_killed_run_resumes_on_its_recorded_split(tmp_path, tiny_checkpoint):
    ws = make_workspace(tmp_path / "ws")
    quiet = ("--no-register", "--eval-lines", "0", "--eval-requests", "0")  # the split is the point
    first = _run_cli(tmp_path, tiny_checkpoint, ws, *quiet, "--set", "steps=1")
    assert first.returncode == 0, first.stderr
    (ws / "shop" / "late.py").write_text(CODE)  # the workspace changes while the run waits
    again = _run_cli(tmp_path, tiny_checkpoint, ws, *quiet)
    assert again.returncode == 0, again.stderr
    assert "resuming on the recorded split" in again.stdout
    assert "resuming repo from step_0000001" in again.stdout
    split = json.loads((tmp_path / "run" / "data" / "split.json").read_text())
    assert "shop/late.py" not in split["train"] + split["heldout"]
    from training.recipe import Recipe
    from training.repo_pretrain import prepare

    recipe = Recipe(  # --no-resume: the workspace is read again, as it is now
        name="repo",
        stage="repo",
        out=str(tmp_path / "run"),
        init=str(tiny_checkpoint),
        data=str(tmp_path / "run" / "data"),
    )
    split = prepare(recipe, RepoConfig(root=str(ws)), resume=False, log=lambda line: None)
    assert "shop/late.py" in split["train"] + split["heldout"]


def test_a_workspace_without_python_is_one_line(tmp_path, tiny_checkpoint):
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "notes.txt").write_text("nothing\n")
    out = _run_cli(tmp_path, tiny_checkpoint, tmp_path / "ws")
    assert out.returncode == 1 and out.stderr.count("\n") == 1
    assert out.stderr.startswith("flywheel train repo: no .py file to learn from")


def test_a_full_disk_is_one_line(tmp_path, tiny_checkpoint, monkeypatch, capsys):
    """The run folder cannot be written (as on a full disk): one line, nothing registered."""
    import errno

    from training import cli, repo_pretrain

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "run/data/files.json")

    monkeypatch.setattr(repo_pretrain, "write_repo_data", full)
    ws = make_workspace(tmp_path / "ws")
    code = cli.main(_repo_argv(tmp_path, tiny_checkpoint, ws))
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "No space left on device" in err
    assert "free disk space" in err and not (tmp_path / "registry").exists()


def test_started_from_a_registry_version_the_result_can_be_gated_against_it(
    tmp_path, tiny_checkpoint
):
    from agent.gate import gate_promotion
    from agent.registry import Registry

    registry = Registry(tmp_path / "registry")
    v1 = registry.add(tiny_checkpoint)
    registry.promote(v1, forced=True)
    out = _run_cli(tmp_path, "registry:v1", make_workspace(tmp_path / "ws"))
    assert out.returncode == 0, out.stderr
    v2 = registry.versions()[-1]
    assert v2["parent"] == v1
    (before,) = registry.benchmarks(v1)
    (after,) = registry.benchmarks(v2["id"])
    assert before["task_set"] == after["task_set"] and before["model_version"] == v1
    decision = gate_promotion(registry, v2["id"])
    assert {c.metric for c in decision.comparisons} == {"nll", "exact", "reward"}
    missing = _run_cli(tmp_path, "registry:v9", tmp_path / "ws")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1
    assert missing.stderr.startswith("flywheel train repo: --model registry:v9:")


def test_promote_serves_completions_from_the_result_when_the_gate_finds_a_gain(
    tmp_path, tiny_checkpoint
):
    from agent.registry import Registry

    registry = Registry(tmp_path / "registry")
    v1 = registry.add(tiny_checkpoint)
    registry.promote(v1, forced=True)
    ws = make_workspace(tmp_path / "ws")
    out = _run_cli(tmp_path, "registry:completion", ws, "--promote")
    v2 = registry.versions()[-1]["id"]
    decision = registry.get(v2)["gate"][-1]
    assert decision["current"] == v1 and decision["reasons"][0] in out.stdout
    if decision["accepted"]:
        assert out.returncode == 0 and f"serving completions from {v2}" in out.stdout
        assert registry.serving("completion") == v2
    else:
        assert out.returncode == 1 and registry.serving("completion") == v1
    assert registry.promoted() == v1  # the agent's version never changes for it
    alone = _run_cli(tmp_path / "alone", tiny_checkpoint, ws, "--promote")
    assert alone.returncode == 2 and alone.stderr.count("\n") == 1
    assert "--model registry:completion" in alone.stderr


def test_repo_eval_command_scores_a_model_on_a_split(tmp_path, tiny_checkpoint, capsys):
    from training import repo_eval
    from training.repo_pretrain import write_repo_data

    write_repo_data(read_repo(RepoConfig(root=str(make_workspace(tmp_path / "ws")))), tmp_path)
    out = tmp_path / "eval.json"
    argv = ["--model", str(tiny_checkpoint), "--data", str(tmp_path), "--lines", "3"]
    argv += ["--requests", "4"]
    assert repo_eval.main([*argv, "--seq-len", "64", "--json", str(out)]) == 0
    assert "held-out ppl" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["summary"]["lines"]["mean"] == 3 and len(result["requests"]) == 4
    assert all(set(t["scores"]) <= {"nll", "exact", "reward"} for t in result["tasks"])
    # each request's tab reward, averaged per held-out file: the task the request was asked in
    asked = {r["id"].rpartition(":")[0] for r in result["requests"]}
    assert {t["id"] for t in result["tasks"] if "reward" in t["scores"]} == asked
    assert result["reward"] == "tab@2" and "reward" in result["metrics"]
    assert repo_eval.main([*argv, "--data", str(tmp_path / "nothing")]) == 1
    assert capsys.readouterr().err.startswith("repo eval: ")


def test_perplexity_windows_score_every_file_token_once_with_the_header_as_context(
    tiny_checkpoint,
):
    import torch.nn.functional as F

    from agent.model import load_checkpoint
    from training.repo_eval import file_nll

    ckpt = load_checkpoint(tiny_checkpoint)
    trunk, tok = ckpt.trunk.eval(), ckpt.tokenizer
    header = tok("<|repo_name|>shop\n<|file_sep|>a.py\n", add_special_tokens=False)["input_ids"]
    ids = tok(CODE, add_special_tokens=False)["input_ids"]
    with torch.no_grad():  # the whole file in one window: the plain causal loss on its tokens
        row = torch.tensor([header + ids])
        logits = trunk(input_ids=row[:, :-1]).logits[0]
        direct = F.cross_entropy(logits[len(header) - 1 :], row[0, len(header) :], reduction="sum")
    total, count = file_nll(trunk, tok, header, CODE, 4 * len(ids), 10_000, "cpu")
    assert count == len(ids) and abs(total - float(direct)) < 1e-3
    total, count = file_nll(trunk, tok, header, CODE, len(header) + 16, 10_000, "cpu")
    assert count == len(ids) and total > 0  # many short windows, still each token once
    assert file_nll(trunk, tok, header, CODE, 4 * len(ids), 10, "cpu")[1] == 10
