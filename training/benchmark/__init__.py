"""`flywheel bench agent`: score a model through the real harness on held-out coding tasks.

    sources.py   the tasks: logged sessions, synthetic, HumanEval and real-code tasks
    sample.py    one sample: a harness run on a scratch workspace, then the verifier
    result.py    per-task scores, pass@k and bootstrap intervals per source, the result JSON
    run.py       run_benchmark: every task through the harness, then scored
    journal.py   samples.jsonl as samples end; --resume reuses an earlier run's samples
    report.py    the plain-text table and the offline HTML report
    cli.py       the command line

API (the promotion gate and `flywheel cycle` read its results):

    tasks = load_tasks(synthetic="runs/starter/tasks", humaneval=20)
    result = run_benchmark(EngineConfig(model="default"), tasks, BenchConfig(samples=1, seed=0))
    result.task_scores()            # task id -> pass@1, for a paired comparison
    result.to_dict()                # the JSON the registry stores and agent/gate.py judges

    flywheel bench agent --model default --synthetic runs/starter/tasks --humaneval 20 --out bench/
"""

from agent.stats import Interval, bootstrap, pass_at_k
from training.benchmark.cli import main
from training.benchmark.journal import Journal, Previous, read_previous
from training.benchmark.result import (
    FORMAT,
    MEASURES,
    ORACLE_TOLERANCE,
    BenchmarkResult,
    TaskScore,
    compare,
    iter_groups,
    score,
    task_set_id,
    task_set_shape,
)
from training.benchmark.run import oracle_logprob, run_benchmark
from training.benchmark.sample import (
    BenchConfig,
    SampleResult,
    lint_count,
    run_sample,
    run_verifier,
    sample_seed,
)
from training.benchmark.sources import (
    HUMANEVAL_CHECK,
    HUMANEVAL_FILE,
    SOURCES,
    BenchmarkError,
    BenchTask,
    changed_lines,
    diff_changed_lines,
    from_synthetic,
    humaneval_tasks,
    load_tasks,
    oracle_of,
    pick_tasks,
    session_tasks,
    synthetic_tasks,
)

__all__ = [
    "FORMAT",
    "HUMANEVAL_CHECK",
    "HUMANEVAL_FILE",
    "MEASURES",
    "ORACLE_TOLERANCE",
    "SOURCES",
    "BenchConfig",
    "BenchTask",
    "BenchmarkError",
    "BenchmarkResult",
    "Interval",
    "Journal",
    "Previous",
    "SampleResult",
    "TaskScore",
    "bootstrap",
    "changed_lines",
    "compare",
    "diff_changed_lines",
    "from_synthetic",
    "humaneval_tasks",
    "iter_groups",
    "lint_count",
    "load_tasks",
    "main",
    "oracle_logprob",
    "oracle_of",
    "pass_at_k",
    "pick_tasks",
    "read_previous",
    "run_benchmark",
    "run_sample",
    "run_verifier",
    "sample_seed",
    "score",
    "session_tasks",
    "synthetic_tasks",
    "task_set_id",
    "task_set_shape",
]
