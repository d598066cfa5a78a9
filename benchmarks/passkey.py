"""`flywheel bench passkey`: can a model retrieve a number hidden in a long prompt?

    flywheel bench passkey --model base --length 4096 --length 16384 --samples 10 --json pk.json
    flywheel bench passkey --model base --length 16384 --rope yarn --rope-factor 2   # no training
    flywheel bench passkey --model base --length 16384 --loss-data runs/x/corpus      # + loss

Each sample is the usual passkey prompt (Mohtashami and Jaggi, 2023): a line that says a pass
key is hidden, filler sentences repeated up to `length` tokens, one sentence with a random
5-digit key at a depth spread evenly over the samples (from near the start to near the end),
and the question "What is the pass key? The pass key is". Greedy decoding of 8 tokens; a sample
passes when they contain the key. Reported per length: passes, and the depths that failed; with
`--loss-data` (a corpus from `flywheel train data`), also the mean next-token loss over
`--loss-windows` held-out windows of that length.

The model runs through `transformers` directly (one forward pass over the prompt), not the
engine: the engine refuses prompts beyond the model's declared context, and measuring what
happens there is the point. `--rope`/`--rope-factor` rescale the positions of the loaded model
first (`training.stages.set_rope_scaling`), to compare a training-free extension with a trained
one (a checkpoint whose config already carries its scaling).

What it does not do: tasks harder than retrieval.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

INTRO = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about it.\n"
)
FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
QUESTION = "\nWhat is the pass key? The pass key is"
ANSWER_TOKENS = 8


@dataclass
class PasskeySample:
    length: int  # prompt tokens
    depth: float  # where the key sits, 0 (start) .. 1 (end)
    key: int
    answer: str
    passed: bool
    seconds: float


def passkey_prompt(tokenizer, length: int, depth: float, key: int) -> list[int]:
    """Token ids of a passkey prompt of about `length` tokens with `key` at `depth`."""
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    fixed = len(tokenizer.encode(INTRO + needle + QUESTION, add_special_tokens=False))
    # repeated, the sentences may tokenize across their boundaries: measure them repeated
    per_filler = len(tokenizer.encode(FILLER * 16, add_special_tokens=False)) / 16
    fillers = max(0, int((length - fixed) / per_filler))
    before = round(fillers * depth)
    text = INTRO + FILLER * before + needle + FILLER * (fillers - before) + QUESTION
    return tokenizer.encode(text, add_special_tokens=False)


def run(
    model: str,
    lengths: list[int],
    samples: int,
    rope: str | None = None,
    factor: float = 2.0,
    seed: int = 0,
    log=print,
    loss_data: str | None = None,
    loss_windows: int = 2,
    device: str = "cpu",
) -> dict:
    """{model, rope, lengths: {length: {passed, samples, failed_depths[, heldout_loss]}},
    samples: [...]}."""
    import torch

    from agent.model import load_checkpoint
    from training.data import PackedTokens
    from training.stages import heldout_loss, set_rope_scaling

    heldout = PackedTokens(loss_data, "heldout") if loss_data else None  # a bad folder: now
    checkpoint = load_checkpoint(model, device=device)
    trunk, tokenizer = checkpoint.trunk.eval(), checkpoint.tokenizer
    declared = int(trunk.config.max_position_embeddings)
    if rope:
        set_rope_scaling(trunk, rope, factor, int(declared * factor))
    rng = random.Random(seed)
    results: list[PasskeySample] = []
    by_length = {}
    for length in lengths:
        mine = []
        for i in range(samples):
            depth = (i + 0.5) / samples
            key = rng.randint(10_000, 99_999)
            ids = torch.tensor([passkey_prompt(tokenizer, length, depth, key)], device=device)
            start = time.perf_counter()
            with torch.inference_mode():
                out = trunk.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=ANSWER_TOKENS,
                    do_sample=False,
                    pad_token_id=tokenizer.eos_token_id,
                )
            answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            sample = PasskeySample(
                length=ids.shape[1],
                depth=round(depth, 3),
                key=key,
                answer=answer,
                passed=str(key) in answer,
                seconds=round(time.perf_counter() - start, 2),
            )
            mine.append(sample)
            log(
                f"{length:>6} depth {depth:.2f} key {key} -> {answer.strip()[:20]!r} "
                f"{'PASS' if sample.passed else 'fail'} ({sample.seconds:.0f}s)"
            )
        results += mine
        by_length[str(length)] = {
            "passed": sum(s.passed for s in mine),
            "samples": len(mine),
            "failed_depths": [s.depth for s in mine if not s.passed],
        }
        if heldout is not None:
            loss = heldout_loss(trunk, heldout, length, loss_windows, 1, torch.device(device))
            by_length[str(length)]["heldout_loss"] = round(loss, 4)
            log(f"{length:>6} held-out loss {loss:.4f} ({loss_windows} windows)")
    return {
        "model": model,
        "version": checkpoint.version,
        "declared_context": declared,
        "rope": {"type": rope, "factor": factor} if rope else None,
        "lengths": by_length,
        "samples": [asdict(s) for s in results],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="flywheel bench passkey", description="passkey retrieval at long prompt lengths"
    )
    from agent.model import add_model_argument

    add_model_argument(parser, default="base", servers=False)
    parser.add_argument("--length", type=int, action="append", help="prompt tokens (repeatable)")
    parser.add_argument("--samples", type=int, default=10, help="keys per length")
    parser.add_argument("--rope", choices=("linear", "dynamic", "yarn"), help="rescale first")
    parser.add_argument("--rope-factor", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    parser.add_argument("--loss-data", help="corpus folder: also the held-out loss per length")
    parser.add_argument("--loss-windows", type=int, default=2, help="held-out windows per length")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    import torch

    from agent.engine.request import EngineError
    from training.data import CorpusError

    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = args.length or [4096, 16384]
    if args.samples < 1 or min(lengths) < 64:
        print("flywheel bench passkey: need --samples >= 1 and lengths >= 64", file=sys.stderr)
        return 2
    try:
        report = run(
            args.model,
            lengths,
            args.samples,
            args.rope,
            args.rope_factor,
            args.seed,
            log=lambda line: print(line, flush=True),  # each sample takes a while at 16k
            loss_data=args.loss_data,
            loss_windows=args.loss_windows,
            device=args.device,
        )
    except (EngineError, CorpusError) as exc:
        print(f"flywheel bench passkey: {exc}", file=sys.stderr)
        return 1
    print(f"\n{'length':>8} {'passed':>8} {'held-out loss':>14}")
    for length, row in report["lengths"].items():
        loss = f"{row['heldout_loss']:.4f}" if "heldout_loss" in row else "-"
        print(f"{length:>8} {row['passed']:>4}/{row['samples']:<3} {loss:>14}")
    if args.json:
        report["command"] = "flywheel bench passkey " + " ".join(argv)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0
