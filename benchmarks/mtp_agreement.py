"""How often each MTP head agrees with the trunk on the text `flywheel bench engine` decodes.

The heads' training reports top-1 agreement on its own held-out windows; what speculative decoding
gains depends on the agreement on the text being decoded. For each of the engine benchmark's free
prompts (agent/bench_prompts.py) the trunk continues the prompt greedily (`--max-tokens`), then
the prompt and its continuation are run once more, teacher-forced, through the trunk and the
heads as training runs them (`mtp_distillation`'s inputs): head k at position i reads h_k-1[i]
and token i+k+1 and agrees when its argmax, mapped from the draft vocabulary to token ids, is the
trunk's own argmax for token i+k+2 over the whole vocabulary (what the verify step accepts).
Agreement is reported on the prompt's positions and on the continuation's, with the share of the
continuation's tokens that the draft vocabulary holds.

    .venv/bin/python benchmarks/mtp_agreement.py --model runs/mtp05/model \
        --json benchmarks/results/mtp-agreement-2026-12-07.json

Teacher-forced agreement is an upper bound of the drafts' acceptance: while drafting, head 1
reads head 0's draft where the training read the true token. Float32 weights (the trunk's
precision in training).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.record import machine, write_json  # noqa: E402


def agreement(checkpoint, text: str, max_tokens: int) -> dict:
    """Per head: top-1 agreement on the prompt's and the continuation's positions."""
    import torch

    trunk, heads, tok = checkpoint.trunk.eval(), checkpoint.heads.eval(), checkpoint.tokenizer
    rows = heads.draft_rows()
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        out = trunk.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False
        )
        forward = trunk(input_ids=out, output_hidden_states=True)
        argmax = forward.logits[0].argmax(-1)  # [seq] the trunk's choice for token i+1
        hidden = forward.hidden_states[-1]
        prompt, seq = ids.shape[1], out.shape[1]
        result: dict = {"prompt_tokens": prompt, "continuation_tokens": seq - prompt}
        if heads.draft_vocab is not None:
            vocab = set(heads.draft_vocab.tolist())
            kept = sum(int(t) in vocab for t in out[0, prompt:].tolist())
            result["continuation_in_draft_vocab"] = kept / max(seq - prompt, 1)
        for k in range(len(heads.heads)):
            length = seq - k - 1
            hidden = heads.forward_head(
                k, hidden[:, :length], out[:, k + 1 : k + 1 + length], torch.arange(length)[None]
            )
            best = heads.logits(k, hidden, rows)[0].argmax(-1)
            if heads.draft_vocab is not None:
                best = heads.draft_vocab[best]
            same = (best == argmax[k + 1 : k + 1 + length]).float()  # [length]
            # position i predicts token i+k+2: the continuation's start at i = prompt - k - 2
            split = max(prompt - k - 2, 0)
            result[f"head{k}"] = {
                "prompt": same[:split].mean().item(),
                "continuation": same[split:].mean().item(),
            }
    return result


def main(argv: list[str] | None = None) -> int:
    from agent.model import add_model_argument

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_argument(p, required=True, servers=False, role="a checkpoint with MTP heads (mtp/)")
    p.add_argument("--max-tokens", type=int, default=128, help="continuation per prompt")
    p.add_argument("--json", default="", help="result file")
    args = p.parse_args(argv)
    import torch

    from agent.bench_prompts import FREE_PROMPTS, STDLIB
    from agent.engine.request import EngineError
    from agent.model import load_checkpoint, resolve_model

    torch.set_num_threads(2)
    try:
        checkpoint = load_checkpoint(resolve_model(args.model))
    except EngineError as exc:
        print(f"mtp_agreement: {exc}", file=sys.stderr)
        return 2
    if checkpoint.heads is None:
        print(f"mtp_agreement: {args.model} has no MTP heads (mtp/)", file=sys.stderr)
        return 2
    rows = {}
    for name, lines in FREE_PROMPTS:
        text = "".join((STDLIB / name).read_text().splitlines(keepends=True)[:lines])
        rows[name] = agreement(checkpoint, text, args.max_tokens)
        heads = [k for k in rows[name] if k.startswith("head")]
        cells = "  ".join(
            f"{k} {rows[name][k]['prompt']:.1%} / {rows[name][k]['continuation']:.1%}"
            for k in heads
        )
        print(f"{name:<16} prompt / continuation: {cells}", flush=True)
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "mtp_agreement",
                "command": "benchmarks/mtp_agreement.py "
                + " ".join(argv if argv is not None else sys.argv[1:]),
                "machine": machine(),
                "model": args.model,
                "max_tokens": args.max_tokens,
                "prompts": rows,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
