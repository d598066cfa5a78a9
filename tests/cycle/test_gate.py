"""The promotion gate: an equal-or-better candidate passes, a deliberately worse one
(weights perturbed) is rejected with reasons, and undecidable cases are refused."""

from __future__ import annotations

import pytest

from agent.engine import EngineConfig
from agent.gate import GateConfig, GateError, compare, gate_promotion
from training.benchmark import run_benchmark
from training.cycle import CycleBench, cycle_tasks

# The cycle's benchmark at its smallest: 4 held-out synthetic tasks, one harness turn of a few
# tokens each (the tiny model passes none), and the oracle log-probability of each task.
BENCH = CycleBench(projects=1, max_tasks=4, max_steps=1, turn_max_tokens=8)


def bench(folder) -> dict:
    return run_benchmark(
        EngineConfig(model=str(folder)), cycle_tasks(BENCH), BENCH.config()
    ).to_dict()


def rows(values):
    return {
        "task_set": "s",
        "metrics": {"pass": "higher"},
        "tasks": [{"id": f"t{i}", "scores": {"pass": v}} for i, v in enumerate(values)],
    }


def test_worked_example_of_the_docstring():
    current = rows([1, 1, 1, 1, 1, 1])
    assert compare(rows([1, 1, 1, 1, 1, 0]), current).accepted  # one task lost: noise
    worse = compare(rows([-0.2, 0.1, -0.1, 0, -0.3, 0.2]), current)
    assert not worse.accepted
    assert worse.reasons[0] == "rejected: worse than the current version beyond noise on pass"
    (c,) = worse.comparisons
    assert c.interval[1] < 0 and c.tasks == 6 and c.method == "paired bootstrap"


def test_interval_fallback_and_flat_rows():
    cand = {"summary": {"pass": {"mean": 0.2, "ci95": [0.1, 0.3]}}}
    cur = {"summary": {"pass": {"mean": 0.8, "ci95": [0.7, 0.9]}}}
    decision = compare(cand, cur)
    assert not decision.accepted and decision.comparisons[0].method == "interval overlap"
    flat = {
        "results": [
            {"task_id": "a", "passed": True, "wall_s": 3.0},
            {"task_id": "b", "passed": False, "wall_s": 1.0},
        ]
    }
    decision = compare(flat, flat)  # timings are never gated without a declaration
    assert decision.accepted and [c.metric for c in decision.comparisons] == ["passed"]
    with pytest.raises(GateError, match="share 0 scored task"):
        compare(rows([1]), {"tasks": [{"id": "other", "scores": {"pass": 1}}]})


def test_equal_accepted_perturbed_rejected_with_reasons(
    registry, tiny_checkpoint, perturbed_checkpoint
):
    v1 = registry.add(tiny_checkpoint)
    same = registry.add(tiny_checkpoint)
    worse = registry.add(perturbed_checkpoint)
    registry.promote(v1, forced=True)
    for vid in (v1, same, worse):
        registry.attach_benchmark(vid, bench(registry.verify(vid)))

    equal = gate_promotion(registry, same)
    assert equal.accepted, equal.reasons
    assert {c.metric for c in equal.comparisons} == {"pass@1", "oracle_logprob"}
    assert all(c.difference == 0.0 for c in equal.comparisons)  # same weights, same seed

    decision = gate_promotion(registry, worse, GateConfig())
    assert not decision.accepted
    assert decision.reasons[0] == (
        "rejected: worse than the current version beyond noise on oracle_logprob"
    )
    assert any(
        r.startswith("oracle_logprob") and ": worse beyond noise" in r for r in decision.reasons
    )
    by_metric = {c.metric: c for c in decision.comparisons}
    passed, logprob = by_metric["pass@1"], by_metric["oracle_logprob"]
    assert not passed.worse  # pass@1 cannot tell them apart: neither passes a task
    assert logprob.candidate < logprob.current and logprob.interval[1] < -logprob.tolerance

    # The better one (the original, against the perturbed one promoted) passes.
    registry.promote(worse, forced=True)
    assert gate_promotion(registry, v1).accepted


def test_refusals(registry, tiny_checkpoint):
    v1, v2 = registry.add(tiny_checkpoint), registry.add(tiny_checkpoint)
    registry.promote(v1, forced=True)
    with pytest.raises(GateError, match="has no benchmark result"):
        gate_promotion(registry, v2)
    registry.attach_benchmark(v2, rows([1, 1]))
    with pytest.raises(GateError, match="not benchmarked on the task set"):
        gate_promotion(registry, v2)


def test_a_candidate_for_another_base_is_rejected_with_both_names(
    registry, tiny_checkpoint, tmp_path, tokenizer
):
    from tests.conftest import make_checkpoint

    v1 = registry.add(tiny_checkpoint)
    registry.promote(v1, forced=True)
    bigger = registry.add(make_checkpoint(tmp_path / "3m", tokenizer, seed=0, size="3m"))
    registry.attach_benchmark(bigger, rows([1, 1]))  # scores never save it
    decision = gate_promotion(registry, bigger)
    assert not decision.accepted and not decision.comparisons
    (reason,) = decision.reasons
    assert reason.startswith(f"rejected: {bigger} was made for another base (llama of 4 layers")
    assert f"than the promoted {v1} (llama of 2 layers x 64" in reason

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"base_model_name_or_path": "/nowhere"}')
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    (adapter / "flywheel.json").write_text('{"base": "another-base@0123"}')
    decision = gate_promotion(registry, registry.add(adapter))
    assert not decision.accepted
    assert (
        "trained on base 'another-base@0123', but this install's bases are" in decision.reasons[0]
    )


def test_every_shared_task_set_is_judged_and_one_worse_set_rejects(registry, tiny_checkpoint):
    """The cycle scores a repository candidate on the agent tasks and on the repository's held-out
    files; better agent tasks do not hide a worse repository."""

    def result(name: str, task_set: str, metric: str, direction: str, values: list[float]):
        return {
            "benchmark": name,
            "task_set": task_set,
            "metrics": {metric: {"direction": direction}},
            "tasks": [{"id": f"t{i}", "scores": {metric: v}} for i, v in enumerate(values)],
        }

    v1, v2 = registry.add(tiny_checkpoint), registry.add(tiny_checkpoint)
    registry.promote(v1, forced=True)
    registry.attach_benchmark(v1, result("agent", "a", "pass", "higher", [0, 0, 1, 0, 0, 0]))
    registry.attach_benchmark(v1, result("repo_heldout", "r", "nll", "lower", [1.0] * 6))
    registry.attach_benchmark(v2, result("agent", "a", "pass", "higher", [1, 1, 1, 1, 0, 1]))
    registry.attach_benchmark(v2, result("repo_heldout", "r", "nll", "lower", [1.5, 1.6, 1.4] * 2))
    decision = gate_promotion(registry, v2)
    assert not decision.accepted
    assert decision.reasons[0] == (
        "rejected: worse than the current version beyond noise on repo_heldout: nll"
    )
    assert any(r.startswith("agent: pass:") for r in decision.reasons)
    assert {c.metric for c in decision.comparisons} == {"pass", "nll"}
    registry.attach_benchmark(v2, result("repo_heldout", "r", "nll", "lower", [0.9] * 6))
    assert gate_promotion(registry, v2).accepted  # the newest result on each set counts


def test_a_completion_candidate_must_gain_on_the_version_serving_completions(
    registry, tiny_checkpoint
):
    """The completion lane compares with the version that serves completions now, and a
    candidate that is merely not worse on the repository's held-out files stays out."""

    def heldout(nll: list[float]) -> dict:
        return {
            "benchmark": "repo_heldout",
            "task_set": "r",
            "metrics": {"nll": {"direction": "lower"}, "exact": {"direction": "higher"}},
            "tasks": [
                {"id": f"f{i}", "scores": {"nll": v, "exact": 0.5}} for i, v in enumerate(nll)
            ],
        }

    v1, v2, v3 = (registry.add(tiny_checkpoint) for _ in range(3))
    registry.promote(v1, forced=True)
    registry.attach_benchmark(v1, heldout([1.0, 1.1, 0.9] * 2))
    registry.attach_benchmark(v2, heldout([1.0, 1.1, 0.9] * 2))  # the same scores
    same = gate_promotion(registry, v2, lane="completion")
    assert not same.accepted and same.current == v1
    assert same.reasons[0] == (
        "rejected: not worse, but no gain beyond noise on nll or reward (this lane needs one)"
    )
    assert gate_promotion(registry, v2).accepted  # the agent lane asks for no gain
    registry.attach_benchmark(v2, heldout([0.8, 0.85, 0.7] * 2))
    assert gate_promotion(registry, v2, lane="completion").accepted
    registry.promote(v2, lane="completion")
    registry.attach_benchmark(v3, heldout([0.9, 0.95, 0.8] * 2))  # better than v1, not v2
    later = gate_promotion(registry, v3, lane="completion")
    assert later.current == v2 and not later.accepted
    assert later.reasons[0] == "rejected: worse than the current version beyond noise on nll"


def test_a_completion_candidate_may_gain_on_the_simulated_users_reward_instead(
    registry, tiny_checkpoint
):
    """Completion RL leaves the held-out perplexity where it was: a gain in the simulated user's
    reward promotes it, and a reward lost beyond noise keeps it out whatever its perplexity."""

    def heldout(nll: list[float], reward: list[float]) -> dict:
        return {
            "benchmark": "repo_heldout",
            "task_set": "r",
            "metrics": {"nll": {"direction": "lower"}, "reward": {"direction": "higher"}},
            "tasks": [
                {"id": f"f{i}", "scores": {"nll": n, "reward": r}}
                for i, (n, r) in enumerate(zip(nll, reward, strict=True))
            ],
        }

    v1, v2, v3 = (registry.add(tiny_checkpoint) for _ in range(3))
    registry.promote(v1, forced=True)
    registry.attach_benchmark(v1, heldout([1.0, 1.1, 0.9] * 2, [0.1, 0.0, 0.2] * 2))
    registry.attach_benchmark(v2, heldout([1.0, 1.1, 0.9] * 2, [0.3, 0.2, 0.35] * 2))
    taken = gate_promotion(registry, v2, lane="completion")
    assert taken.accepted
    assert taken.reasons[0].endswith("and better beyond noise on reward")
    registry.attach_benchmark(v3, heldout([0.8, 0.85, 0.7] * 2, [-0.2, -0.3, -0.1] * 2))
    lost = gate_promotion(registry, v3, lane="completion")
    assert not lost.accepted
    assert lost.reasons[0] == "rejected: worse than the current version beyond noise on reward"
