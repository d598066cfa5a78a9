"""`flywheel bench agent` gives the same scores for the same seed on the local engine and through
`flywheel serve`: a real server subprocess, the openai backend, sampled
(temperature 0.8) runs with per-sample seeds; everything but wall time must match.
"""

from __future__ import annotations

from agent.engine import EngineConfig
from tests.flywheel_server import running_server
from training.benchmark import BenchConfig, BenchTask, load_tasks, run_benchmark


def test_local_and_served_model_score_the_same_with_the_same_seed(bench_checkpoint):
    tasks = load_tasks(humaneval=1) + [
        BenchTask(
            id="sessions/s1",
            source="sessions",
            family="session",
            instruction="Fix add() in calc.py.",
            files={"calc.py": "def add(a, b):\n    return a - b\n"},
            verify="python -c 'import calc; assert calc.add(1, 2) == 3'",
        )
    ]
    config = BenchConfig(
        samples=2, ks=(1, 2), seed=7, temperature=0.8, max_steps=2, turn_max_tokens=16
    )
    local = run_benchmark(EngineConfig(model=str(bench_checkpoint)), tasks, config)
    with running_server(bench_checkpoint) as url:
        served = run_benchmark(EngineConfig(model=url), tasks, config)
    assert served.model == url and local.model_version == served.model_version
    assert local.scores() == served.scores()
    assert local.engine == {"backend": "local", "dtype": "float32", "speculative": "none"}
    assert served.engine["backend"] == "openai"  # how the samples were decoded, in the JSON
    assert sum(s.tokens for s in local.samples) > 0
    # sampled, not greedy: different seeds gave different outputs somewhere
    assert len({(s.tokens, s.final_chars) for s in local.samples}) > 1
