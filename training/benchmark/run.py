"""`run_benchmark`: every task `samples` times through the harness, then scored.

With BenchConfig.oracle_logprob, tasks that carry an oracle trajectory (synthetic tasks made
with `from_synthetic(task, oracle=True)`, as `flywheel cycle` does) are also scored on a local
checkpoint by `oracle_logprob`: the mean log-probability per assistant token of that correct
trajectory (one teacher-forced pass, no sampling). A tiny model rarely passes any task, so
pass@1 alone cannot separate two candidates; this low-noise score can. The gate compares both.

`resume` (journal.py) reuses the samples of an earlier run of the same model and settings;
`journal` appends each new sample to a file as it finishes, so a killed run can resume.

What it does not do: run samples in parallel or judge answers with a model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from training.benchmark.journal import Journal, Previous
from training.benchmark.result import BenchmarkResult, score
from training.benchmark.sample import BenchConfig, SampleResult, run_sample
from training.benchmark.sources import BenchmarkError, BenchTask


def oracle_logprob(checkpoint: Any, oracle: dict, max_seq: int) -> float:
    """Mean log-probability per assistant token of an oracle trajectory under `checkpoint`.

    One teacher-forced forward pass over the trajectory's last `max_seq` tokens (within the
    model's context): a continuous, low-noise measure of how well the model predicts a correct
    solution. A tiny model rarely passes a task, so pass@1 alone cannot separate two of them;
    this can, and it moves with small changes of the weights.
    """
    import torch

    from training.stages import encode_conversation

    ids, mask = encode_conversation(checkpoint.tokenizer, oracle, 1 << 30)
    window = min(max_seq, int(checkpoint.trunk.config.max_position_embeddings))
    ids, mask = ids[-window:], mask[-window:]
    ids_t = torch.tensor([ids], device=checkpoint.trunk.device)  # [1, seq]
    with torch.no_grad():
        logits = checkpoint.trunk(input_ids=ids_t[:, :-1]).logits.float()  # [1, seq-1, vocab]
    logp = torch.log_softmax(logits, -1).gather(-1, ids_t[:, 1:, None])[0, :, 0]  # [seq-1]
    keep = torch.tensor(mask[1:], dtype=torch.bool, device=logp.device)  # [seq-1]
    return round(float(logp[keep].mean() if keep.any() else logp.mean()), 6)


def _oracle_scores(
    engine: Any, tasks: list[BenchTask], config: BenchConfig, log: Callable[[str], None] | None
) -> dict[str, dict[str, float]]:
    """task id -> {"oracle_logprob": ...} for the tasks with an oracle; {} when the model is not
    a local checkpoint (a server gives no log-probabilities of a whole conversation here)."""
    from agent.engine import EngineConfig
    from agent.model import load_checkpoint

    with_oracle = [t for t in tasks if t.oracle is not None]
    if not config.oracle_logprob or not with_oracle:
        return {}
    if not isinstance(engine, EngineConfig) or str(engine.model).startswith(("http:", "https:")):
        if log:
            log("oracle_logprob: skipped (it needs a local checkpoint, not a server)")
        return {}
    checkpoint = load_checkpoint(engine.model, device=engine.device)
    return {
        t.id: {"oracle_logprob": oracle_logprob(checkpoint, t.oracle, config.oracle_max_seq)}
        for t in with_oracle
    }


def run_benchmark(
    engine: Any,
    tasks: list[BenchTask],
    config: BenchConfig | None = None,
    log: Callable[[str], None] | None = None,
    resume: Previous | None = None,
    journal: str | Path | None = None,
) -> BenchmarkResult:
    """Run every task `config.samples` times through the harness and score it.

    `engine`: an `EngineConfig` (opened here and closed after) or an open engine. With
    `config.oracle_logprob`, tasks that carry an oracle trajectory are also scored by it (an
    `EngineConfig` of a local checkpoint only). `resume`: samples of an earlier run, reused
    for the (task, sample index) pairs they cover; `journal`: where to append each sample.
    """
    from agent.engine import EngineConfig, open_engine

    config = config or BenchConfig()
    if not tasks:
        raise BenchmarkError("the task set is empty; nothing to benchmark")
    owned = isinstance(engine, EngineConfig)
    config_engine = engine
    model = engine.model if owned else getattr(engine, "model_version", "engine")
    if owned:
        engine = open_engine(engine)
    t0 = time.monotonic()
    samples: list[SampleResult] = []
    try:
        version = str(engine.model_version)
        earlier = resume.reusable(version, config) if resume else {}
        wanted = {(t.id, j) for t in tasks for j in range(config.samples)}
        reused = [s for key, s in earlier.items() if key in wanted]
        writer = Journal(journal, version, config, reused) if journal else None
        if log and resume:
            log(f"reusing {len(reused)} samples from {resume.path}")
        for i, task in enumerate(tasks, 1):
            for j in range(config.samples):
                s = earlier.get((task.id, j))
                if s is not None:
                    samples.append(s)
                    continue
                s = run_sample(engine, task, config, j)
                samples.append(s)
                if writer:
                    writer.add(s)
                if log:
                    done = sum(x.passed for x in samples)
                    log(
                        f"bench {i}/{len(tasks)} {task.id[:40]:<40} #{j} "
                        f"{'PASS' if s.passed else 'fail'} ({s.stop_reason}, {s.steps} turns, "
                        f"{s.wall_s:.0f}s)  passed so far {done}/{len(samples)}"
                    )
    finally:
        close = getattr(engine, "close", None) if owned else None
        if callable(close):
            close()
    extra = _oracle_scores(config_engine, tasks, config, log)
    scores, summary, shape = score(tasks, samples, config, extra)
    return BenchmarkResult(
        model=str(model),
        model_version=version,
        config=asdict(config),
        seconds=round(time.monotonic() - t0, 2),
        reused=len(reused),
        engine=_engine_settings(config_engine),
        shape=shape,
        summary=summary,
        tasks=scores,
        samples=samples,
    )


def _engine_settings(engine: Any) -> dict[str, Any]:
    """How the samples were decoded, when the benchmark opened the engine itself."""
    from agent.engine import EngineConfig

    if not isinstance(engine, EngineConfig):
        return {}
    return {
        "backend": engine.backend,
        "dtype": engine.dtype,
        "speculative": engine.speculative.method,
    }
