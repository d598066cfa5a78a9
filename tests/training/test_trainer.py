"""The training loop and the stages, at the smallest scale that shows each behaviour."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from training import stages
from training.recipe import Recipe
from training.trainer import TrainingError, latest_checkpoint, train

ROOT = Path(__file__).parents[2]


def tiny(stage: str, out: Path, **overrides) -> Recipe:
    values = dict(
        name=f"tiny-{stage}",
        stage=stage,
        out=str(out),
        model_size="test",
        seq_len=32,
        batch_size=4,
        steps=6,
        lr=3e-3,
        warmup_steps=1,
        log_every=1,
        eval_every=3,
        eval_batches=1,
        save_every=3,
        device="cpu",
    )
    values.update(overrides)
    return Recipe(**values)


def _records(out: Path, kind: str) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_pretrain_loss_decreases_and_writes_a_loadable_model(tmp_path, corpus):
    from agent.model import load_checkpoint

    out = tmp_path / "run"
    final = train(
        tiny("pretrain", out, data=str(corpus), steps=8, save_every=8, eval_every=8), progress=False
    )
    losses = [r["loss"] for r in _records(out, "train")]
    assert len(losses) == 8 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
    assert (out / "loss.png").stat().st_size > 0
    ckpt = load_checkpoint(final)
    assert json.loads((final / "flywheel.json").read_text())["stage"] == "pretrain"
    assert ckpt.trunk.config.vocab_size >= len(ckpt.tokenizer)


def test_resume_continues_the_step_count_and_the_curve(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    recipe = tiny("pretrain", out, data=str(corpus), steps=6)
    train(recipe, progress=False)
    ckpts = out / "checkpoints"
    uninterrupted = torch.load(ckpts / "step_0000006" / "trainer.pt", weights_only=False)["model"]

    # Now the state a kill during the save at step 6 leaves: step 3 is the last complete
    # checkpoint, a half-written temporary folder, and metrics logged after step 3.
    shutil.rmtree(ckpts / "step_0000006")
    (ckpts / "latest").write_text("step_0000003")
    (ckpts / ".step_0000006.tmp").mkdir()
    (ckpts / ".step_0000006.tmp" / "trainer.pt").write_bytes(b"half")
    with (out / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 5, "kind": "train", "loss": 99.0}\n{"step": 6, "ki')

    capsys.readouterr()
    train(recipe, progress=True)  # stdout is not a terminal here: one line per logged step
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("pretrain step")]
    assert lines[-1].startswith("pretrain step 6/6 loss ") and lines[-1].endswith("about 0s left)")
    records = _records(out, "train")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert 99.0 not in [r["loss"] for r in records]
    assert latest_checkpoint(ckpts).name == "step_0000006"
    assert not list(ckpts.glob(".*.tmp"))
    resumed = torch.load(ckpts / "step_0000006" / "trainer.pt", weights_only=False)["model"]
    assert all(torch.allclose(uninterrupted[k], resumed[k], atol=1e-6) for k in resumed)


def test_refuses_to_resume_another_recipes_checkpoint(tmp_path, corpus):
    out = tmp_path / "run"
    train(tiny("pretrain", out, data=str(corpus), steps=3), progress=False)
    with pytest.raises(TrainingError, match="belongs to recipe 'tiny-pretrain'"):
        train(tiny("pretrain", out, data=str(corpus), steps=6, name="other"), progress=False)


def test_sft_mask_covers_assistant_tokens_only(tokenizer):
    from training.stages import encode_conversation

    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi there"},
        {
            "role": "assistant",
            "content": "let me look",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                }
            ],
        },
        {"role": "tool", "content": "x = 1"},
        {"role": "assistant", "content": "done"},
    ]
    ids, mask = encode_conversation(tokenizer, {"messages": messages}, 10_000)
    learned = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert learned == (
        "let me look\n<tool_call>read_file\n<|arg|>path\na.py\n</tool_call><|im_end|>done<|im_end|>"
    )


def test_an_assistant_turn_of_weight_zero_is_context_not_learned(tokenizer):
    from training.stages import encode_conversation

    messages = [
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "wrong edit", "weight": 0},
        {"role": "tool", "content": "no match"},
        {"role": "assistant", "content": "right edit"},
    ]
    ids, mask = encode_conversation(tokenizer, {"messages": messages}, 10_000)
    learned = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert learned == "right edit<|im_end|>"
    assert "wrong edit" in tokenizer.decode(ids)


def say_data(folder: Path) -> Path:
    """40 one-turn conversations (four to learn, ten times each) in an SFT JSONL file."""
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"say {w}"},
                {"role": "assistant", "content": f"{w} {w} {w}"},
            ]
        }
        for w in ("apple", "pear", "plum", "fig")
    ] * 10
    data = folder / "sft.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    return data


def test_sft_stage_trains_on_trajectories(tmp_path, tiny_checkpoint):
    data = say_data(tmp_path)
    out = tmp_path / "run"
    train(
        tiny(
            "sft",
            out,
            init=str(tiny_checkpoint),
            sft_data=[str(data)],
            steps=15,
            lr=1e-2,
            save_every=15,
            eval_every=15,
        ),
        progress=False,
    )
    losses = [r["loss"] for r in _records(out, "train")]
    assert losses[-1] < losses[0] / 2


def test_mtp_distillation_reduces_kl_with_the_trunk_frozen(tmp_path, corpus, tiny_checkpoint):
    from agent.model import load_checkpoint

    out = tmp_path / "run"
    before = load_checkpoint(tiny_checkpoint).trunk.state_dict()
    final = train(
        tiny(
            "mtp",
            out,
            init=str(tiny_checkpoint),
            data=str(corpus),
            steps=6,
            lr=1e-2,
            eval_every=6,
            save_every=6,
            draft_vocab=16,
        ),
        progress=False,
    )
    train_records = _records(out, "train")
    first, last = train_records[0], train_records[-1]
    assert last["kl_head0"] < first["kl_head0"] and last["kl_head1"] < first["kl_head1"]
    ckpt = load_checkpoint(final)
    assert ckpt.heads is not None and len(ckpt.heads.heads) == 2
    assert len(ckpt.heads.draft_vocab) == 16  # saved with the heads: the most frequent ids
    after = ckpt.trunk.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_mtp_distillation_over_a_draft_vocabulary_is_the_kl_over_those_rows(tiny_checkpoint):
    """With a draft vocabulary the teacher is the trunk's logits on those rows only (renormalised),
    taken from its final hidden state, and the student scores the same rows."""
    import torch.nn.functional as F

    from agent.model import load_checkpoint
    from agent.mtp import MTPConfig, MTPHeads
    from training.stages import mtp_distillation

    trunk = load_checkpoint(tiny_checkpoint).trunk
    torch.manual_seed(0)
    heads = MTPHeads(trunk, MTPConfig(depth=1))
    rows = torch.tensor([5, 2, 9, 40, 7])
    heads.draft_vocab = rows
    ids = torch.randint(0, trunk.config.vocab_size, (2, 12))
    loss, info = mtp_distillation(trunk, heads, ids)

    with torch.no_grad():
        out = trunk(input_ids=ids, output_hidden_states=True)
        teacher = out.logits[:, 1:12, rows]  # the trunk's own output, those columns
        h = heads.forward_head(
            0, out.hidden_states[-1][:, :11], ids[:, 1:12], torch.arange(11)[None]
        )
        student = heads.logits(0, h)[..., rows]
        expected = F.kl_div(
            F.log_softmax(student, -1).flatten(0, 1),
            F.log_softmax(teacher, -1).flatten(0, 1),
            log_target=True,
            reduction="batchmean",
        )
    assert torch.allclose(loss, expected, atol=1e-5)
    assert 0.0 <= info["top1_head0"] <= 1.0


def test_long_context_reports_loss_before_and_after(tmp_path, corpus, tiny_checkpoint):
    out = tmp_path / "run"
    final = train(
        tiny(
            "long_context",
            out,
            init=str(tiny_checkpoint),
            data=str(corpus),
            seq_len=64,
            eval_seq_len=64,
            steps=2,
            eval_every=2,
            save_every=2,
        ),
        progress=False,
    )
    meta = json.loads((final / "flywheel.json").read_text())
    assert meta["long_loss_before"] > 0 and meta["eval_loss_long"] > 0
    config = json.loads((final / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "linear"
    assert config["rope_parameters"]["factor"] == 4.0


def test_skipped_positions_spread_a_short_window_over_the_long_context():
    import numpy as np

    from training.stages import skipped_positions

    positions = skipped_positions(np.random.default_rng(0), 64, 32, 256)
    assert positions.shape == (64, 32) and positions.dtype == torch.int64
    steps = positions.diff(dim=1)
    assert (positions[:, 0] == 0).all() and (positions[:, -1] < 256).all()
    assert ((steps >= 1).all(dim=1)).all()  # increasing: the window stays causal
    assert ((steps > 1).sum(dim=1) <= 1).all()  # one skip at most, between the two chunks
    assert positions[:, -1].max() > 128  # the windows reach far past their own length


def test_long_context_on_short_windows_with_skipped_positions_and_recomputed_activations(
    tmp_path, corpus, tiny_checkpoint
):
    recipe = tiny(
        "long_context",
        tmp_path / "run",
        init=str(tiny_checkpoint),
        data=str(corpus),
        rope_type="yarn",
        rope_factor=2.0,
        seq_len=32,
        context_length=128,
        eval_seq_len=128,
        skip_positions=True,
        activation_checkpointing=True,
        steps=2,
        eval_every=2,
        save_every=2,
    )
    job = stages.build(recipe, torch.device("cpu"))
    batch = job.batch(0)
    assert batch["positions"].shape == batch["window"][:, :-1].shape
    assert job.trunk.is_gradient_checkpointing
    final = train(recipe, progress=False)
    meta = json.loads((final / "flywheel.json").read_text())
    assert meta["long_loss_before"] > 0 and meta["eval_loss_long"] > 0
    config = json.loads((final / "config.json").read_text())
    assert config["max_position_embeddings"] == 128
    assert config["rope_parameters"]["rope_type"] == "yarn"


def test_long_context_windows_carry_facts_to_retrieve(tmp_path, corpus, tiny_checkpoint):
    def first_window(fraction: float):
        recipe = tiny(
            "long_context",
            tmp_path / f"run{fraction}",
            init=str(tiny_checkpoint),
            data=str(corpus),
            seq_len=256,
            eval_seq_len=256,
            retrieval_fraction=fraction,
        )
        job = stages.build(recipe, torch.device("cpu"))
        return job.batch(0)["window"], job.tokenizer

    plain, tokenizer = first_window(0.0)
    facts, _ = first_window(1.0)
    assert facts.shape == plain.shape and not torch.equal(facts, plain)
    kinds = (" number", " code", " key", " id")  # retrieval.KINDS: every fact names one
    assert all(any(k in tokenizer.decode(row.tolist()) for k in kinds) for row in facts)


def test_cli_runs_a_stage_and_reports_bad_input(tmp_path, corpus):
    from training.cli import main

    recipe = ROOT / "training" / "recipes" / "pretrain.toml"
    args = [
        "pretrain",
        "--recipe",
        str(recipe),
        "--no-progress",
        "--set",
        f"data={corpus}",
        "--set",
        f"out={tmp_path / 'run'}",
        "--set",
        "model_size=test",
        "--set",
        "seq_len=16",
        "--set",
        "batch_size=2",
        "--set",
        "steps=2",
        "--set",
        "eval_batches=1",
    ]
    assert main(args) == 0
    assert main(["sft", "--recipe", str(recipe)]) == 1  # recipe for another stage
    assert main(["pretrain", "--recipe", str(tmp_path / "missing.toml")]) == 1


def test_repeat_rows_tile_an_opening_span_and_leave_the_rest():
    import numpy as np

    from training.stages import repeat_rows

    window = torch.arange(4 * 65).reshape(4, 65)  # [batch, seq+1], every token distinct
    assert repeat_rows(window, np.random.default_rng(0), 0.0) is window
    out = repeat_rows(window, np.random.default_rng(0), 1.0)
    for row in out:
        span = int((row == row[0]).nonzero()[1])  # where the opening comes round again
        assert 8 <= span <= 32 and torch.equal(row[span : 2 * span], row[:span])
    many = torch.arange(64 * 65).reshape(64, 65)
    kept = (repeat_rows(many, np.random.default_rng(1), 0.5) == many).all(1)  # [64]
    assert 16 < int(kept.sum()) < 48  # about half the rows are left as they were


def test_pretrain_with_copy_rows_reports_copy_accuracy(tmp_path, corpus):
    out = tmp_path / "run"
    train(tiny("pretrain", out, data=str(corpus), copy_fraction=0.5, steps=3), progress=False)
    evals = _records(out, "eval")
    assert evals and all(0.0 <= r["copy_acc"] <= 1.0 for r in evals)
    with pytest.raises(Exception, match="copy_fraction"):
        tiny("pretrain", out, data=str(corpus), copy_fraction=1.5)


def test_a_bf16_recipe_trains_in_float32_where_bf16_kernels_are_missing(
    tmp_path, corpus, monkeypatch, capsys
):
    """An AVX2-only CPU multiplies bfloat16 on a single-threaded fallback: the loop says so and
    trains in float32 instead (the same recipe runs fast on CPUs with and without the kernels)."""
    import training.trainer as trainer

    seen = []
    real_autocast = torch.autocast

    def autocast(device_type, dtype=None, enabled=True):
        seen.append(enabled)
        return real_autocast(device_type, dtype=dtype, enabled=enabled)

    monkeypatch.setattr(trainer.torch, "autocast", autocast)
    monkeypatch.setattr(trainer, "bf16_is_fast", lambda device: False)
    recipe = tiny("pretrain", tmp_path / "run", data=str(corpus), steps=2, precision="bf16")
    train(recipe, progress=False)
    assert seen == [False]
    assert "no fast bfloat16 matrix kernels on this cpu; training in float32" in (
        capsys.readouterr().out
    )
    assert isinstance(trainer.bf16_is_fast(torch.device("cpu")), bool)


def test_sft_mixes_code_rows_and_reports_their_held_out_loss(tmp_path, tiny_checkpoint):
    """With `code_share`, that share of micro-batches are repository code rows in the
    inline-completion format (their prompt is context, only the middle or continuation is
    trained), and each evaluation scores held-out code beside held-out conversations."""
    from agent.chat_format import FIM_MIDDLE
    from training.repo_files import RepoFile, RepoFiles
    from training.repo_pretrain import write_repo_data

    body = "def total(items):\n    return sum(item.price for item in items)\n" * 4
    files = [RepoFile(f"shop/m{i}.py", f"# module {i}\n{body}") for i in range(6)]
    code = tmp_path / "code"
    write_repo_data(RepoFiles(str(tmp_path / "shop"), files[:5], files[5:]), code)
    data = say_data(tmp_path)
    out = tmp_path / "run"
    recipe = tiny(
        "sft",
        out,
        init=str(tiny_checkpoint),
        sft_data=[str(data)],
        code_data=str(code),
        code_share=0.5,
        seq_len=128,
        code_seq_len=64,
        batch_size=2,
        steps=12,
        lr=1e-2,
        save_every=12,
        eval_every=6,
    )
    job = stages.build(recipe, torch.device("cpu"))
    fim_middle = job.tokenizer.convert_tokens_to_ids(FIM_MIDDLE)
    batches = [job.batch(i) for i in range(40)]
    code_batches = [b for b in batches if b["ids"].shape[0] == 4]  # 2 * 128 // 64 code rows
    assert 0 < len(code_batches) < len(batches)
    assert any(bool((b["ids"] == fim_middle).any()) for b in code_batches)
    for b in code_batches:  # the prompt (repository header, prefix, suffix) is never a target
        ids, mask = b["ids"], b["mask"]
        assert not bool(mask[ids == fim_middle].any())
    train(recipe, progress=False)
    evals = _records(out, "eval")
    assert evals[-1]["eval_code_loss"] < evals[0]["eval_code_loss"]
    missing = replace(recipe, code_data=str(tmp_path / "nowhere"))
    with pytest.raises(stages.StageError, match="has no files.json"):
        stages.build(missing, torch.device("cpu"))


def test_chunked_cross_entropy_equals_the_whole_one_and_its_gradient(monkeypatch):
    """`token_cross_entropy` computes the logits a chunk at a time (and again in the backward
    pass): the loss and the gradients are those of one cross-entropy over every position."""
    import torch.nn.functional as F

    monkeypatch.setattr(stages, "LOGIT_CHUNK", 3)
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 11, bias=False)
    hidden = torch.randn(10, 8, requires_grad=True)
    targets = torch.randint(0, 11, (10,))
    chunked = stages.token_cross_entropy(head, hidden, targets)
    (g_hidden, g_head) = torch.autograd.grad(chunked, (hidden, head.weight))
    whole = F.cross_entropy(head(hidden), targets)
    (w_hidden, w_head) = torch.autograd.grad(whole, (hidden, head.weight))
    assert chunked.item() == pytest.approx(whole.item(), abs=1e-6)
    assert torch.allclose(g_hidden, w_hidden, atol=1e-6) and torch.allclose(
        g_head, w_head, atol=1e-6
    )
