"""`flywheel generate`: run one prompt through the engine and print the text and its metrics.

    flywheel generate --model runs/ckpt --prompt "def add(a, b):" --temperature 0
    flywheel generate --model runs/ckpt --prompt-file edit.txt --speculative ngram --stream
    flywheel generate --model runs/ckpt --prompt "x" --speculative draft --draft-model runs/small
    flywheel generate --prompt "def add(a, b):" --dtype int8
    flywheel generate --prompt "def add(a, b):" --dtype int4

Flags map straight onto `EngineConfig`, `SpeculativeConfig` and `SamplingParams`. Metrics go to
stderr so stdout holds only the generated text.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from agent.engine.config import DRAFT_ALTERNATIVES, DTYPES, SPEC_METHODS

    parser = argparse.ArgumentParser(
        prog="flywheel generate", description="Generate text from a prompt with the engine."
    )
    model = parser.add_argument_group("model")
    from agent.model import add_model_argument

    add_model_argument(model)
    model.add_argument(
        "--backend", default="auto", choices=["auto", "local", "vllm", "openai"], help="backend"
    )
    model.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's)")
    model.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="weights; int8, int4: low-bit copies for decoding on the CPU, lossy "
        "(agent/engine/local/lowbit.py; default: %(default)s)",
    )
    model.add_argument(
        "--exact",
        action="store_true",
        help="output the bits of a cold, unbatched, plain decode (see EngineConfig.exact)",
    )
    prompt = parser.add_argument_group("prompt")
    source = prompt.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", help="read the prompt from this file ('-' for stdin)")
    prompt.add_argument("--speculation", help="file whose text the output should resemble")
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--max-tokens", type=int, default=128, help="tokens per sample")
    sampling.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    sampling.add_argument("--top-p", type=float, default=1.0, help="nucleus mass kept")
    sampling.add_argument("--top-k", type=int, default=0, help="keep the k likeliest (0: all)")
    sampling.add_argument("--seed", type=int, default=None, help="sampling seed")
    sampling.add_argument("--n", type=int, default=1, help="samples per prompt")
    sampling.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    spec = parser.add_argument_group("speculative decoding")
    spec.add_argument(
        "--speculative",
        default="none",
        choices=SPEC_METHODS,
        help="where draft tokens come from",
    )
    spec.add_argument("--num-draft", type=int, default=4, help="draft tokens per verify step")
    spec.add_argument(
        "--draft-alternatives",
        type=int,
        default=DRAFT_ALTERNATIVES,
        help="MTP: alternatives to the first draft, verified as a tree (0: a chain)",
    )
    spec.add_argument("--no-adaptive", action="store_true", help="fixed draft length")
    spec.add_argument("--draft-model", help="checkpoint folder of the draft model")
    out = parser.add_argument_group("output")
    out.add_argument("--stream", action="store_true", help="print text as it is decoded")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from agent.engine import (
        EngineConfig,
        EngineError,
        Request,
        SamplingParams,
        SpeculativeConfig,
        open_engine,
    )

    try:
        if args.prompt is not None:
            prompt = args.prompt
        elif args.prompt_file == "-":
            prompt = sys.stdin.read()
        else:
            prompt = Path(args.prompt_file).read_bytes()
            with contextlib.suppress(UnicodeDecodeError):  # else raw bytes, tokenized as such
                prompt = prompt.decode("utf-8")
        speculation = Path(args.speculation).read_text() if args.speculation else None
    except OSError as exc:
        print(f"flywheel generate: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        spec = SpeculativeConfig(
            method=args.speculative,
            num_draft_tokens=args.num_draft,
            max_draft_tokens=max(8, args.num_draft),
            adaptive=not args.no_adaptive,
            draft_model=args.draft_model,
            draft_alternatives=args.draft_alternatives,
        )
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            n=args.n,
            stop=args.stop,
        )
        engine = open_engine(
            EngineConfig(
                model=args.model,
                backend=args.backend,
                dtype=args.dtype,
                speculative=spec,
                exact=args.exact,
            )
        )
        request = Request(prompt=prompt, params=params, speculation=speculation)
        if args.stream:
            stream = engine.stream(request)
            for delta in stream:
                sys.stdout.write(delta.text)
                if delta.finish_reason and args.n > 1:
                    sys.stdout.write(f"\n--- sample {delta.index}: {delta.finish_reason}\n")
                sys.stdout.flush()
            result = stream.result
            print()
        else:
            result = engine.generate(request)
            for c in result.completions:
                if args.n > 1:
                    print(f"--- sample {c.index} ({c.finish_reason})")
                print(c.text)
    except EngineError as exc:
        print(f"flywheel generate: {exc}", file=sys.stderr)
        return 1
    m = result.metrics
    print(
        f"[{engine.model_version}] prompt {m.prompt_tokens} tokens, output {m.output_tokens} "
        f"tokens, ttft {m.ttft_s * 1000:.0f} ms, {m.tokens_per_s:.1f} tokens/s"
        + (
            f", drafts {m.drafts_accepted}/{m.drafts_proposed} accepted, mean acceptance "
            f"length {m.mean_acceptance_length:.2f} over {m.verify_steps} verify steps"
            if m.verify_steps
            else ""
        ),
        file=sys.stderr,
    )
    return 0
