"""Benchmark: how long an editor's completion waits behind an agent's prefill, in one engine.

One thread plays an agent: it sends long prompts (`--agent-words` random code words, about 2-3k
tokens) one after another, each prefilled in chunks. The main thread plays the editor: at random
moments it sends an interactive completion (`priority="interactive"`, a prompt of
`--completion-words`, `--max-tokens` greedy tokens) and times it. Two policies alternate in one
run on the same weights and random schedule:

- `long-chunks`: the agent's prefill always runs PREFILL_CHUNK tokens per forward pass, so a
  completion may wait for a whole long chunk (its cost grows with the context before it);
- `short-when-editing`: while an editor is active (an interactive request in the last
  URGENT_WINDOW_S seconds, the engine's default), the agent's prefill runs YIELDING_CHUNK tokens
  per pass.

The prefix cache is off so that every prompt is prefilled in full. Prints p50/p95/mean per policy
and writes JSON.

    .venv/bin/python benchmarks/completion_wait.py --model default --rounds 2 \
        --json benchmarks/results/completion-wait.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORDS = [
    "def",
    "total",
    "values",
    "return",
    "sum",
    "for",
    "in",
    "if",
    "else",
    "while",
    "class",
    "self",
    "import",
    "from",
    "None",
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from agent.model import add_model_argument

    add_model_argument(p, servers=False)
    p.add_argument("--rounds", type=int, default=2, help="rounds of both policies, alternating")
    p.add_argument("--completions", type=int, default=8, help="timed completions per round")
    p.add_argument("--agent-words", type=int, default=2400)
    p.add_argument("--completion-words", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=4, help="tokens per completion")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="where to write the results")
    args = p.parse_args()

    import torch

    import agent.engine.local.engine as local
    from agent.engine import EngineConfig, Request, SamplingParams, open_engine
    from benchmarks.lsp_latency import latency_summary

    torch.set_num_threads(args.threads)
    engine = open_engine(EngineConfig(model=args.model, prefix_cache_mb=0))
    rng = random.Random(args.seed)

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    agent_prompts = [text(args.agent_words) for _ in range(4)]
    completion_prompts = [text(args.completion_words) for _ in range(4)]
    default_window = local.URGENT_WINDOW_S

    def one_round(window: float) -> list[float]:
        local.URGENT_WINDOW_S = window
        stop = threading.Event()

        def agent() -> None:
            i = 0
            while not stop.is_set():
                prompt = agent_prompts[i % len(agent_prompts)] + f" {i}"
                engine.generate(Request(prompt=prompt, params=SamplingParams(max_tokens=2)))
                i += 1

        thread = threading.Thread(target=agent)
        thread.start()
        latencies = []
        try:
            for k in range(args.completions):
                time.sleep(rng.uniform(0.3, 1.5))  # the editor's next keystroke
                params = SamplingParams(max_tokens=args.max_tokens, temperature=0)
                prompt = completion_prompts[k % len(completion_prompts)]
                started = time.perf_counter()
                engine.generate(Request(prompt=prompt, params=params, priority="interactive"))
                latencies.append((time.perf_counter() - started) * 1000)
        finally:
            stop.set()
            thread.join()
        return latencies

    policies = {"long-chunks": 0.0, "short-when-editing": default_window}
    samples: dict[str, list[float]] = {name: [] for name in policies}
    for _ in range(args.rounds):
        for name, window in policies.items():
            samples[name] += one_round(window)
    local.URGENT_WINDOW_S = default_window
    engine.close()

    report = dict(
        benchmark="completion_wait",
        command="python " + " ".join(sys.argv),
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        machine=dict(platform=platform.platform(), torch_threads=args.threads),
        model=args.model,
        settings=dict(
            vars(args),
            prefill_chunk=local.PREFILL_CHUNK,
            yielding_chunk=local.YIELDING_CHUNK,
            urgent_window_s=default_window,
        ),
        policies={name: latency_summary(xs) for name, xs in samples.items()},
        samples_ms=samples,
    )
    long_p50 = report["policies"]["long-chunks"]["p50_ms"]
    short_p50 = report["policies"]["short-when-editing"]["p50_ms"]
    report["short_vs_long_p50"] = short_p50 / long_p50
    print(f"{'policy':<22}{'p50 ms':>10}{'p95 ms':>10}{'mean ms':>10}")
    for name, s in report["policies"].items():
        print(f"{name:<22}{s['p50_ms']:>10.0f}{s['p95_ms']:>10.0f}{s['mean_ms']:>10.0f}")
    print(f"short-when-editing / long-chunks at p50: {report['short_vs_long_p50']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
