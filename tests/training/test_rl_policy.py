"""The RL trainer scores exactly what the engine sampled; a non-finite loss changes nothing; the
harness environment records real turns; unusable tasks are refused."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from agent.engine import EngineConfig, Request, SamplingParams, open_engine
from training.rl.environments import HarnessEnv, RecordingEngine, count_tests, policy_version
from training.rl.grpo import collate, turn_row
from training.rl.policy import Policy
from training.rl.recipe import rl_recipe_from_dict
from training.tasks.task import Task


def _recipe(tmp_path, init, **kw):
    values = dict(
        name="t",
        out=str(tmp_path / "run"),
        init=str(init),
        env="magic",
        lr=1e-2,
        temperature=0.7,
        max_tokens=6,
        micro_batch_rows=3,
        loss_tokens=1,
    )
    return rl_recipe_from_dict({**values, **kw})


def test_trainer_logprobs_equal_the_engines_sampling_logprobs(tmp_path, tiny_checkpoint):
    """Same weights, same temperature: a full forward over prompt + sampled ids gives back the
    engine's per-token sampling logprobs (KV-cached decoding), so nothing was re-tokenized."""
    recipe = _recipe(tmp_path, tiny_checkpoint)
    engine = open_engine(EngineConfig(model=str(tiny_checkpoint), backend="local"))
    prompt = [40, 41, 42, 43, 44]
    params = SamplingParams(max_tokens=6, temperature=0.7, seed=3, n=4)
    result = engine.generate(Request(prompt=prompt, params=params))
    policy = Policy.load(str(tiny_checkpoint), recipe)
    rows = [turn_row(prompt, c.token_ids, c.logprobs, 1.0, 0) for c in result.completions]
    batch = collate(rows, policy.pad_id)  # ragged lengths: right padding must not matter
    with torch.no_grad():
        logprobs, entropy = policy.score(batch)
    for i, comp in enumerate(result.completions):
        got = logprobs[i][batch.mask[i] > 0].tolist()
        assert got == pytest.approx(comp.logprobs, abs=1e-4)
    assert bool((entropy[batch.mask > 0] > 0).all())


def test_update_moves_towards_positive_advantage_and_nan_changes_nothing(tmp_path, tiny_checkpoint):
    recipe = _recipe(tmp_path, tiny_checkpoint)
    policy = Policy.load(str(tiny_checkpoint), recipe)
    prompt = [40, 41]
    good, bad = 100, 200

    def logp(token: int) -> float:
        batch = collate([turn_row(prompt, [token], [0.0], 0.0, 0)], policy.pad_id)
        with torch.no_grad():
            return policy.score(batch)[0][0, -1].item()

    before = logp(good), logp(bad)
    rows = [
        turn_row(prompt, [good], [before[0]], 0.5, 0),
        turn_row(prompt, [bad], [before[1]], -0.5, 0),
    ]
    metrics = policy.update(rows, n_trajectories=2)
    assert metrics["skipped"] == 0 and metrics["kl_sampling_trained"] == pytest.approx(0, abs=1e-6)
    assert metrics["ess"] == pytest.approx(1.0)
    assert logp(good) > before[0] and logp(bad) < before[1]

    weights = {k: v.clone() for k, v in policy.trunk.state_dict().items()}
    with torch.no_grad():
        policy.trunk.lm_head.weight[5, 0] = float("nan")  # a broken weight -> a NaN loss
    metrics = policy.update(rows, n_trajectories=2)
    assert metrics["skipped"] == 1 and "nan" in metrics["skip_reason"]
    for key, value in policy.trunk.state_dict().items():
        same = torch.equal(value, weights[key]) or key.endswith(
            ("lm_head.weight", "embed_tokens.weight")
        )
        assert same, f"{key} changed by a skipped update"
    assert not policy.weights_finite()


def _tiny_task(command: str = "python -m unittest") -> Task:
    files = {
        "calc.py": "def add(a, b):\n    return a - b\n",
        "test_calc.py": (
            "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
            "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
            "    def test_zero(self):\n        self.assertEqual(add(0, 0), 0)\n"
        ),
    }
    solution = {"calc.py": "def add(a, b):\n    return a + b\n"}
    return Task(
        "tiny1",
        "bugfix/operator_swap",
        "p:0",
        "train",
        "Fix add in calc.py.",
        files,
        solution,
        test_command=command,
    )


@pytest.fixture(scope="module")
def long_checkpoint(tmp_path_factory, tokenizer) -> Path:
    """The tiny model with a 4,096-token context: the harness's system prompt and tool schemas
    alone take about 2,200 tokens of the 1,024-token test tokenizer."""
    from agent.model import build_trunk, save_checkpoint

    trunk = build_trunk("test", vocab_size=len(tokenizer), max_position_embeddings=4096, seed=0)
    return save_checkpoint(tmp_path_factory.mktemp("long"), trunk, tokenizer)


def test_harness_rollout_records_the_engines_turns(long_checkpoint, tokenizer):
    """One rollout of a real task through the real harness with a (random) tiny model."""
    engine = open_engine(EngineConfig(model=str(long_checkpoint), backend="local"))
    env = HarnessEnv("unused", max_turns=2, turn_max_tokens=12, temperature=1.0, wall_s=60)
    task = _tiny_task()
    assert env.check(task) == ""
    generate, constrained = engine.generate, []
    engine.generate = lambda request: (
        constrained.append(request.constrain_tool_calls) or generate(request)
    )
    traj = env.one(engine, tokenizer, task, sample=0, seed=7)
    assert constrained and not any(constrained)  # sampled from the policy itself, unmasked
    assert traj.error == "", traj.error  # prompt ids matched the engine's own count
    assert traj.stop_reason != "engine_error", traj.signals["stop_detail"]
    assert 1 <= len(traj.turns) <= 2
    for turn in traj.turns:
        assert len(turn.output_ids) == len(turn.logprobs) >= 1
        assert turn.version == 0
        assert tokenizer.decode(turn.prompt_ids).endswith("<|im_start|>assistant\n")
    assert not traj.passed  # a random model does not fix the bug
    assert traj.signals["tests_after_passed"] == 1 and traj.signals["tests_after_failed"] == 1
    assert len(traj.signals["final_diff"]) == 12  # a fingerprint of its change to the workspace
    assert traj.stop_reason in ("answered", "max_steps", "repeated_failure")
    assert traj.truncated == (
        traj.stop_reason == "max_steps" or traj.turns[-1].finish_reason == "length"
    )


def test_a_groups_samples_run_at_once_and_come_back_in_order():
    """A barrier only all three samples together can pass: run one after another, they fail."""
    env = HarnessEnv("unused")
    barrier = threading.Barrier(3, timeout=60)

    def one(engine, tokenizer, task, sample, seed):
        barrier.wait()
        return (sample, seed)

    env.one = one
    assert env.rollout(None, None, _tiny_task(), 3, seed=10) == [(0, 10), (1, 11), (2, 12)]


def test_a_group_rolls_out_concurrently_on_an_engine_with_its_own_thread(
    long_checkpoint, tokenizer
):
    config = EngineConfig(model=str(long_checkpoint), backend="local", own_thread=True)
    engine = open_engine(config)
    env = HarnessEnv("unused", max_turns=2, turn_max_tokens=12, temperature=1.0, wall_s=60)
    group = env.rollout(engine, tokenizer, _tiny_task(), 2, seed=7)
    engine.close()
    assert [traj.sample for traj in group] == [0, 1]
    for traj in group:
        assert traj.error == "", traj.error
        assert traj.stop_reason != "engine_error", traj.signals["stop_detail"]
        assert 1 <= len(traj.turns) <= 2


def test_recording_engine_keeps_the_sampled_ids(tiny_checkpoint, tokenizer):
    engine = open_engine(EngineConfig(model=str(tiny_checkpoint), backend="local"))
    rec = RecordingEngine(engine, tokenizer)
    messages = [{"role": "user", "content": "hello"}]
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=1)
    result = rec.generate(Request(messages=messages, params=params))
    assert rec.turns[0].output_ids == result.completions[0].token_ids
    assert rec.turns[0].logprobs == result.completions[0].logprobs
    assert len(rec.turns[0].prompt_ids) == result.metrics.prompt_tokens and not rec.errors


def test_a_task_whose_verifier_cannot_run_is_refused():
    env = HarnessEnv("unused")
    reason = env.check(_tiny_task("no-such-verifier-program --check"))
    assert "cannot run" in reason and "no-such-verifier-program" in reason


def test_test_counts_and_versions():
    assert count_tests(1, "Ran 5 tests in 0.1s\n\nFAILED (failures=1, errors=1)") == (3, 2)
    assert count_tests(0, "Ran 2 tests in 0.0s\n\nOK") == (2, 0)
    assert count_tests(1, "===== 3 passed, 1 failed in 0.2s =====") == (3, 1)
    assert count_tests(2, "no idea") == (0, 1)
    assert policy_version("toy@rl12") == 12 and policy_version("tiny-seed0") == 0


def test_policy_export_is_a_loadable_checkpoint(tmp_path, tiny_checkpoint):
    from agent.model import load_checkpoint

    policy = Policy.load(str(tiny_checkpoint), _recipe(tmp_path, tiny_checkpoint))
    folder = policy.export(Path(tmp_path / "v3"), {"version": "t@rl3"})
    loaded = load_checkpoint(folder)
    assert loaded.version == "t@rl3" and loaded.heads is not None
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_policy_from_an_adapter_trains_every_trunk_weight(tmp_path, tiny_checkpoint):
    """The default model is an adapter merged into its base at load, frozen as peft leaves it:
    RL must still update the whole trunk."""
    from tests.test_base import _lora_adapter

    adapter = _lora_adapter(tmp_path, tiny_checkpoint)
    policy = Policy.load(str(adapter), _recipe(tmp_path, tiny_checkpoint))
    assert policy.params and len(policy.params) == len(list(policy.trunk.parameters()))
    assert all(p.requires_grad for p in policy.params)


def test_a_shared_row_scores_each_turn_as_its_own_row_would(tmp_path, tiny_checkpoint):
    """Causal attention: the first turn's output scores the same inside the longer row."""
    from training.rl.grpo import trajectory_rows
    from training.rl.trajectory import Trajectory, Turn

    policy = Policy.load(str(tiny_checkpoint), _recipe(tmp_path, tiny_checkpoint))
    first = Turn([40, 41, 42], [50, 51], [-1.0, -1.0], 0)
    second = Turn([40, 41, 42, 50, 51, 60, 61], [70, 71, 72], [-1.0] * 3, 0)
    shared = trajectory_rows(Trajectory("t", 0, [first, second]), 1.0, 0, True)
    apart = [turn_row(t.prompt_ids, t.output_ids, t.logprobs, 1.0, 0) for t in (first, second)]
    assert len(shared) == 1

    def masked(rows):
        batch = collate(rows, policy.pad_id)
        with torch.no_grad():
            logprobs, _ = policy.score(batch)
        return [x for i in range(len(rows)) for x in logprobs[i][batch.mask[i] > 0].tolist()]

    assert masked(shared) == pytest.approx(masked(apart), abs=1e-5)
