"""Benchmark: int8 (or, with `--dtype int4`, int4) weight-only decoding against float32.

One process loads the model twice, float32 and the low-bit dtype (agent/engine/local/lowbit.py), and
compares (the text says int8; `--dtype int4` puts int4 in its place):
- forward ms over a warm KV cache by number of new rows, with the int8 product forced for every
  row count (int8 must stay ahead up to `Int8Linear.MAX_INT8_ROWS`, a batched step's most rows);
- one decode step and one verify step over 4 drafts (`flywheel bench engine`'s `step_costs`);
- greedy decoding of held-out agent prompts (the prompt before each conversation's first
  assistant turn): decode tokens/s (after the first token) and whether int8 writes the same
  tokens as float32, with the first position where it does not;
- held-out loss: mean next-token cross-entropy on the assistant tokens (what the SFT stage's
  eval_loss scores, `training.stages.encode_conversation`) and on all tokens, plus how often the
  two models' argmax agree. The int8 model scores with the int8 product forced for every row,
  as decoding computes each token; the engine's prefill uses float32, so this is the worst case.

    .venv/bin/python benchmarks/int8.py --model default --threads 2 \
        --json benchmarks/results/int8-2026-12-02.json
    .venv/bin/python benchmarks/int8.py --dtype int4 --model default --threads 2 --json ...
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ROWS = (1, 2, 4, 8, 12, 16, 24, 32, 48)


@contextlib.contextmanager
def lowbit_for_every_row():
    """Run the low-bit products whatever the number of rows (prefill included)."""
    from agent.engine.local.lowbit import Int4Linear, Int8Linear

    before = Int8Linear.MAX_INT8_ROWS, Int4Linear.MAX_INT4_ROWS
    Int8Linear.MAX_INT8_ROWS = Int4Linear.MAX_INT4_ROWS = 1 << 62
    try:
        yield
    finally:
        Int8Linear.MAX_INT8_ROWS, Int4Linear.MAX_INT4_ROWS = before


def heldout(path: Path, count: int) -> list[dict]:
    """The first `count` held-out conversations of a `flywheel train tasks` trajectories file."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("split") == "heldout"][:count]


def forward_ms(models: dict, prompt_ids: list[int], samples: int) -> list[dict]:
    """Median ms of one forward over `rows` new tokens after a warm cache, per model."""
    import torch

    ids = torch.tensor([prompt_ids])
    caches = {}
    out = []
    with torch.inference_mode(), lowbit_for_every_row():
        for name, model in models.items():
            caches[name] = model.new_cache()
            model.forward(ids, caches[name], last_only=True)
        for rows in ROWS:
            times: dict[str, list[float]] = {name: [] for name in models}
            for i in range(samples + 2):  # interleaved; the first 2 warm up
                for name, model in models.items():
                    start = time.perf_counter()
                    model.forward(ids[:, :rows], caches[name])
                    if i >= 2:
                        times[name].append(time.perf_counter() - start)
                    caches[name].crop(-rows)
            out.append(
                {"rows": rows, **{f"{n}_ms": statistics.median(t) * 1000 for n, t in times.items()}}
            )
    return out


def greedy(engines: dict, prompts: list[str], max_tokens: int) -> list[dict]:
    """Greedy output of each engine per prompt: decode tokens/s and where the low-bit one (the
    second) first differs."""
    from agent.engine import Request, SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=False)
    out = []
    for i, prompt in enumerate(prompts):
        order = list(engines) if i % 2 == 0 else list(reversed(engines))
        results = {
            name: engines[name].generate(Request(prompt=prompt, params=params)) for name in order
        }
        row = {"prompt_tokens": results["float32"].metrics.prompt_tokens}
        for name, result in results.items():
            m = result.metrics
            row[f"{name}_tokens"] = m.output_tokens
            row[f"{name}_decode_s"] = m.total_s - m.ttft_s
        a, b = (results[n].completions[0].token_ids for n in engines)
        row["identical"] = a == b
        row["first_difference"] = next(
            (j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None
        )
        if row["first_difference"] is None and len(a) != len(b):
            row["first_difference"] = min(len(a), len(b))
        out.append(row)
    return out


def losses(models: dict, examples: list[tuple[list[int], list[int]]]) -> dict:
    """Assistant-token and all-token cross-entropy per model, and their argmax agreement."""
    import torch
    import torch.nn.functional as F

    sums = {name: {"assistant": 0.0, "all": 0.0} for name in models}
    counts = {"assistant": 0, "all": 0}
    agree = 0
    with torch.inference_mode(), lowbit_for_every_row():
        for ids, mask in examples:
            x = torch.tensor([ids])
            trained = torch.tensor(mask[1:], dtype=torch.bool)
            argmax = []
            for name, model in models.items():
                logits, _ = model.forward(x[:, :-1], model.new_cache())  # [1, L-1, vocab]
                ce = F.cross_entropy(logits[0].float(), x[0, 1:], reduction="none")  # [L-1]
                sums[name]["assistant"] += ce[trained].sum().item()
                sums[name]["all"] += ce.sum().item()
                argmax.append(logits[0].argmax(-1))
                del logits
            agree += int((argmax[0] == argmax[1]).sum())
            counts["assistant"] += int(trained.sum())
            counts["all"] += len(ids) - 1
    out = {f"{name}_{k}": v / counts[k] for name, s in sums.items() for k, v in s.items()}
    low = list(models)[1]
    for k in ("assistant", "all"):
        out[f"relative_change_{k}"] = out[f"{low}_{k}"] / out[f"float32_{k}"] - 1
    return {**out, "tokens": counts, "argmax_agreement": agree / counts["all"]}


def main() -> int:
    from agent.engine.config import LOWBIT_DTYPES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from agent.model import add_model_argument

    add_model_argument(p, servers=False)
    p.add_argument("--dtype", default="int8", choices=LOWBIT_DTYPES, help="low-bit weights to test")
    p.add_argument("--trajectories", default="runs/base/tasks/trajectories.jsonl")
    p.add_argument("--conversations", type=int, default=20, help="held-out ones scored for loss")
    p.add_argument("--prompts", type=int, default=4, help="held-out prompts decoded greedily")
    p.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per prompt")
    p.add_argument("--step-samples", type=int, default=30, help="timed calls per step figure")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    path = Path(args.trajectories)
    if not path.is_file():
        p.error(f"no trajectories at {path}: run `flywheel train tasks` or pass --trajectories")

    import torch

    from agent.engine.local.lowbit import is_lowbit
    from agent.engine.local.model_runner import LoadedModel
    from benchmarks.record import write_json

    torch.set_num_threads(args.threads)
    models = {dtype: LoadedModel.load(args.model, dtype=dtype) for dtype in ("float32", args.dtype)}
    lowbit_layers = sum(is_lowbit(m) for m in models[args.dtype].trunk.modules())
    if not lowbit_layers:
        print(f"the {args.dtype} model has no low-bit layers (see the error above)")
        return 1
    figures = measure(args, models, heldout(path, max(args.conversations, args.prompts)))
    print_figures(args.dtype, figures)
    if args.json:
        write_json(args.json, report(args, path, models, lowbit_layers, figures))
    return 0


def measure(args, models: dict, conversations: list[dict]) -> dict:
    """Every figure of the docstring, on the held-out `conversations`."""
    from agent.chat_format import render_chat
    from agent.engine import EngineConfig
    from agent.engine.local.engine import LocalEngine
    from benchmarks.engine.steps import step_costs
    from training.stages import encode_conversation

    tokenizer = models["float32"].tokenizer
    prompts = []
    for conv in conversations[: args.prompts]:
        first = next(i for i, m in enumerate(conv["messages"]) if m["role"] == "assistant")
        prompts.append(
            render_chat(
                tokenizer, conv["messages"][:first], conv["tools"], add_generation_prompt=True
            )
        )
    prompt_ids = tokenizer.encode(prompts[0], add_special_tokens=False)
    low = args.dtype
    print(f"forward ms by new rows ({len(prompt_ids)} cached tokens, {low} forced) ...", flush=True)
    sweep = forward_ms(models, prompt_ids, args.step_samples)
    print("decode and verify-over-4 steps ...", flush=True)
    steps = {}
    for name, model in models.items():
        decode_ms, verify_ms = step_costs(
            model, prompt_ids, SimpleNamespace(step_samples=args.step_samples, exact=False)
        )
        steps[name] = {
            "decode_step_ms": decode_ms,
            "verify4_step_ms": verify_ms,
            "ratio": verify_ms / decode_ms,
        }
    print(f"greedy decoding of {len(prompts)} held-out prompts ...", flush=True)
    engines = {
        name: LocalEngine(EngineConfig(model=args.model, dtype=name, prefix_cache_mb=0), model)
        for name, model in models.items()
    }
    outputs = greedy(engines, prompts, args.max_tokens)
    decode_tps = {
        name: sum(r[f"{name}_tokens"] - 1 for r in outputs)
        / sum(r[f"{name}_decode_s"] for r in outputs)
        for name in models
    }
    print(f"held-out loss over {args.conversations} conversations ...", flush=True)
    context = models["float32"].context_length
    examples = [
        encode_conversation(tokenizer, c, context) for c in conversations[: args.conversations]
    ]
    return dict(
        sweep=sweep,
        steps=steps,
        outputs=outputs,
        decode_tps=decode_tps,
        loss=losses(models, examples),
        conversations=len(examples),
    )


def print_figures(low: str, figures: dict) -> None:
    sweep, steps, loss = figures["sweep"], figures["steps"], figures["loss"]
    decode_tps, outputs = figures["decode_tps"], figures["outputs"]
    print(f"\n{'forward over rows (ms)':<26}" + "".join(f"{r:>8}" for r in ROWS))
    for name in ("float32", low):
        print(f"{name:<26}" + "".join(f"{s[f'{name}_ms']:>8.1f}" for s in sweep))
    print(f"\n{'':<32}{'float32':>10}{low:>10}{low + '/fp32':>11}")
    table = [
        ("decode tokens/s (greedy)", decode_tps["float32"], decode_tps[low]),
        ("decode step, ms", steps["float32"]["decode_step_ms"], steps[low]["decode_step_ms"]),
        (
            "verify step over 4, ms",
            steps["float32"]["verify4_step_ms"],
            steps[low]["verify4_step_ms"],
        ),
        ("held-out loss, assistant", loss["float32_assistant"], loss[f"{low}_assistant"]),
        ("held-out loss, all tokens", loss["float32_all"], loss[f"{low}_all"]),
    ]
    for label, a, b in table:
        print(f"{label:<32}{a:>10.4f}{b:>10.4f}{b / a:>11.4f}")
    same = sum(r["identical"] for r in outputs)
    print(
        f"relative loss change (assistant tokens): {loss['relative_change_assistant']:+.2%}; "
        f"argmax agreement {loss['argmax_agreement']:.2%} of {loss['tokens']['all']} positions; "
        f"greedy outputs identical on {same} of {len(outputs)} prompts (first differences: "
        f"{[r['first_difference'] for r in outputs]})"
    )


def report(args, path: Path, models: dict, lowbit_layers: int, figures: dict) -> dict:
    from agent.engine.local.lowbit import Int4Linear, Int8Linear
    from benchmarks.record import torch_machine

    return {
        "benchmark": "int8",
        "dtype": args.dtype,
        "command": "python benchmarks/int8.py " + " ".join(sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "machine": torch_machine(),
        "model": args.model,
        "model_version": models["float32"].checkpoint.version,
        "lowbit_layers": lowbit_layers,
        "max_lowbit_rows": min(Int8Linear.MAX_INT8_ROWS, Int4Linear.MAX_INT4_ROWS),
        "forward_ms_by_rows_lowbit_forced": figures["sweep"],
        "steps": figures["steps"],
        "greedy": {
            "max_tokens": args.max_tokens,
            "decode_tokens_per_s": figures["decode_tps"],
            "identical": sum(r["identical"] for r in figures["outputs"]),
            "prompts": figures["outputs"],
        },
        "heldout_loss": {
            "trajectories": str(path),
            "conversations": figures["conversations"],
            "lowbit_scored": "low-bit product forced for every row (as decoding does)",
            **figures["loss"],
        },
    }


if __name__ == "__main__":
    raise SystemExit(main())
