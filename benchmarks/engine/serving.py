"""`flywheel bench engine`'s serving workloads: what a running server does besides one request.

Three workloads, each on the engine's own loaded weights, each with its target:

- *RL group*: the n samples of one prompt (temperature 1, as a rollout group) decoded in one
  batch (`SamplingParams(n=...)`) against the same n requests one after another: output tokens
  per second, target >= 3x. Greedy, every batched row must equal the single greedy output.
- *agent turn*: an agent's second turn (the first turn's prompt, its output and a tool result)
  with the prefix cache warm from the first turn, against the same prompt prefilled cold: time to
  first token, target <= 0.2x. Greedy, the warm turn's output is checked against the cold one's
  (the same bits under `EngineConfig.exact`). The second prompt appends the first turn's output
  tokens as they were generated; a real agent's re-rendered conversation matches them as far as
  its tokenisation agrees.
- *concurrent completions*: k editor completions (priority "interactive") sent at once from k
  threads, against each alone: p50 latency, target <= 1.5x; each output is checked against its
  output alone. It runs in a fresh process (`concurrent_completions_fresh`) on an engine opened
  as servers open it, on its own thread (`EngineConfig.own_thread`), whose loop batches the
  requests' steps. In this process, whose
  main thread ran torch work, every caller thread would grow an OpenMP team of its own and be
  slowed by the others (`benchmarks/omp_threads.py`); `benchmarks/concurrent_completions.py`
  compares that path too.

Timings interleave the compared sides and keep the best (or median) of `repeats`, like the rest
of `flywheel bench engine`; only ratios within one run are compared.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time

RL_GROUP_TARGET = 3.0
AGENT_TURN_TARGET = 0.2
CONCURRENT_TARGET = 1.5


def serving_targets(engine, cold_engine, model, model_path: str, items: list[dict], args) -> dict:
    """{rl_group, agent_turn, concurrent_completions}: each a dict with its ratio, its target
    and whether it passed. `engine` (plain decoding) has the prefix cache on, `cold_engine` (the
    same weights, `model`, loaded from `model_path`) off. The agent turn continues the chat-shaped *apply* prompt with a
    tool result (a piece of the file); the others use the last *free* prompt."""
    apply = next(item for item in items if item["workload"] == "apply")
    free = [item for item in items if item["workload"] == "free"][-1]
    tool_result = model.tokenizer.encode(apply["speculation"][:600], add_special_tokens=False)
    return dict(
        rl_group=rl_group(engine, free["prompt_ids"], args),
        agent_turn=agent_turn(engine, cold_engine, model, apply["prompt_ids"], tool_result, args),
        concurrent_completions=concurrent_completions_fresh(
            model_path,
            args.dtype,
            free["prompt_ids"],
            args.concurrent,
            args.repeats,
            args.threads,
            exact=args.exact,
        ),
    )


def rl_group(engine, prompt_ids: list[int], args) -> dict:
    from agent.engine import Request, SamplingParams

    n, max_tokens = args.group_size, args.max_tokens

    def run(batched: bool, seed: int, temperature: float = 1.0) -> tuple[int, float, list]:
        params = dict(max_tokens=max_tokens, temperature=temperature, logprobs=False)
        start = time.perf_counter()
        if batched:
            out = engine.generate(
                Request(prompt=prompt_ids, params=SamplingParams(n=n, seed=seed, **params))
            ).completions
        else:
            out = [
                engine.generate(
                    Request(prompt=prompt_ids, params=SamplingParams(seed=seed + i, **params))
                ).completions[0]
                for i in range(n)
            ]
        return sum(len(c.token_ids) for c in out), time.perf_counter() - start, out

    batched_tps, single_tps = [], []
    for repeat in range(args.repeats):
        for batched, rates in ((True, batched_tps), (False, single_tps)):
            tokens, seconds, _ = run(batched, seed=1000 * repeat)
            rates.append(tokens / seconds)
    _, _, greedy_rows = run(True, seed=0, temperature=0.0)
    _, _, greedy_one = run(False, seed=0, temperature=0.0)
    identical = all(c.token_ids == greedy_one[0].token_ids for c in greedy_rows)
    ratio = max(batched_tps) / max(single_tps)
    return dict(
        samples=n,
        max_tokens=max_tokens,
        batched_tokens_per_s=max(batched_tps),
        one_by_one_tokens_per_s=max(single_tps),
        ratio=ratio,
        target=f">= {RL_GROUP_TARGET}",
        passed=ratio >= RL_GROUP_TARGET,
        greedy_rows_identical=identical,
    )


def agent_turn(
    engine, cold_engine, model, prompt_ids: list[int], tool_result: list[int], args
) -> dict:
    from agent.engine import Request, SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0, logprobs=False)
    first = engine.generate(Request(prompt=prompt_ids, params=params))  # warms the cache
    second = prompt_ids + first.completions[0].token_ids + tool_result
    one = SamplingParams(max_tokens=1, temperature=0, logprobs=False)
    warm_s, cold_s, cached = [], [], 0
    prefixes = model.prefix_cache
    for _ in range(args.repeats):
        cold = cold_engine.generate(Request(prompt=second, params=one))
        cold_s.append(cold.metrics.ttft_s)
        # the warm side's cache holds the first turn only (its prompt and output), as after a
        # real first turn
        prefixes.clear()
        engine.generate(Request(prompt=prompt_ids, params=params))
        warm = engine.generate(Request(prompt=second, params=one))
        warm_s.append(warm.metrics.ttft_s)
        cached = warm.metrics.cached_tokens
    # the whole second turn, greedy: what the cache hit decodes against what a cold prefill does
    prefixes.clear()
    engine.generate(Request(prompt=prompt_ids, params=params))
    warm_out = engine.generate(Request(prompt=second, params=params)).completions[0].token_ids
    cold_out = cold_engine.generate(Request(prompt=second, params=params)).completions[0].token_ids
    ratio = min(warm_s) / min(cold_s)
    return dict(
        prompt_tokens=len(second),
        cached_tokens=cached,
        warm_ttft_ms=min(warm_s) * 1000,
        cold_ttft_ms=min(cold_s) * 1000,
        ratio=ratio,
        target=f"<= {AGENT_TURN_TARGET}",
        passed=ratio <= AGENT_TURN_TARGET,
        greedy_identical=warm_out == cold_out,
    )


def concurrent_completions(engine, prompt_ids: list[int], args) -> dict:
    from agent.engine import Request, SamplingParams

    k = args.concurrent
    # k editors, each on its own file: distinct prompts of the same length, cached once first
    prompts = [prompt_ids[i:] for i in range(k)]
    params = SamplingParams(max_tokens=16, temperature=0, logprobs=False)
    outputs: dict[int, set[tuple[int, ...]]] = {i: set() for i in range(k)}  # greedy outputs

    def complete(i: int) -> float:
        start = time.perf_counter()
        request = Request(prompt=prompts[i], params=params, priority="interactive")
        result = engine.generate(request)
        outputs[i].add(tuple(result.completions[0].token_ids))
        return time.perf_counter() - start

    for i in range(k):
        complete(i)
    alone, together = [], []
    for _ in range(args.repeats):
        alone += [complete(i) for i in range(k)]
        latencies = [0.0] * k
        threads = [threading.Thread(target=_timed, args=(complete, i, latencies)) for i in range(k)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        together += latencies
    ratio = statistics.median(together) / statistics.median(alone)
    return dict(
        completions=k,
        alone_p50_ms=statistics.median(alone) * 1000,
        concurrent_p50_ms=statistics.median(together) * 1000,
        ratio=ratio,
        target=f"<= {CONCURRENT_TARGET}",
        passed=ratio <= CONCURRENT_TARGET,
        greedy_identical=all(len(seen) == 1 for seen in outputs.values()),
    )


def _timed(complete, i: int, into: list[float]) -> None:
    into[i] = complete(i)


def concurrent_completions_fresh(
    model: str,
    dtype: str,
    prompt_ids: list[int],
    k: int,
    repeats: int,
    threads: int,
    own_thread: bool = True,
    exact: bool = False,
) -> dict:
    """`concurrent_completions` in a fresh process: the engine on its own thread (a server's)
    or, with `own_thread=False`, each request on its caller's thread."""
    job = dict(model=model, dtype=dtype, prompt_ids=prompt_ids, k=k, repeats=repeats)
    job.update(threads=threads, own_thread=own_thread, exact=exact)
    command = [sys.executable, "-m", "benchmarks.engine.serving"]
    done = subprocess.run(
        command, input=json.dumps(job), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the concurrent completions process failed: {done.stderr[-1500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fresh_process() -> None:
    """The process `concurrent_completions_fresh` starts: its job on stdin, its result out."""
    import types

    import torch

    from agent.engine import EngineConfig
    from agent.engine.local.engine import LocalEngine

    job = json.loads(sys.stdin.read())
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    config = EngineConfig(
        model=job["model"], dtype=job["dtype"], own_thread=job["own_thread"], exact=job["exact"]
    )
    engine = LocalEngine(config)
    args = types.SimpleNamespace(concurrent=job["k"], repeats=job["repeats"])
    result = concurrent_completions(engine, job["prompt_ids"], args)
    engine.close()
    print(
        json.dumps(dict(result, engine="own thread" if job["own_thread"] else "callers' threads"))
    )


if __name__ == "__main__":
    _fresh_process()
