"""Run inside the vLLM environment by tests/vllm/test_vllm.py: vLLM vs the local backend.

    VLLM_CPU_KVCACHE_SPACE=1 $FLYWHEEL_VLLM_PYTHON tests/vllm/compare.py JOB.json OUT.json

JOB.json holds {"checkpoint": folder, "repeating": folder, "prompts": [...], "max_tokens": N,
"chat": {"messages": [...], "tools": [...]}}. OUT.json gets, per engine ("reference", "vllm",
"vllm-ngram"), the greedy token ids of every prompt and the metrics, plus the chat completion,
a streaming check and n=3 sampling; and under "repeating" the same comparison with ngram only on
the second checkpoint (a model whose greedy output repeats, so drafts get accepted). The reference is the
local backend (`agent.engine.local.engine.LocalEngine`) when it imports, else Hugging Face `generate`.
vLLM spawns its engine core, hence the `__main__` guard.
"""

from __future__ import annotations

import json
import sys
import time


def reference(checkpoint: str, prompts: list[str], max_tokens: int, chat: dict) -> dict:
    from agent.engine import EngineConfig, Request, SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=max_tokens)
    try:
        from agent.engine.local.engine import LocalEngine
    except ImportError:
        LocalEngine = None  # noqa: N806
    if LocalEngine is not None:
        engine = LocalEngine(EngineConfig(model=checkpoint, backend="local"))
        tokens = [
            engine.generate(Request(prompt=p, params=greedy)).completions[0].token_ids
            for p in prompts
        ]
        chat_ids = (
            engine.generate(Request(messages=chat["messages"], tools=chat["tools"], params=greedy))
            .completions[0]
            .token_ids
        )
        return {"name": "local", "tokens": tokens, "chat": chat_ids}
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()

    def run(ids: list[int], eos: list[int]) -> list[int]:
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos
        )
        return out[0, len(ids) :].tolist()

    tokens = [run(tok.encode(p, add_special_tokens=False), [tok.eos_token_id]) for p in prompts]
    text = tok.apply_chat_template(
        chat["messages"], tools=chat["tools"], add_generation_prompt=True, tokenize=False
    )
    from agent.tokenizer import stop_token_ids

    chat_ids = run(tok.encode(text, add_special_tokens=False), stop_token_ids(tok))
    return {"name": "hf-generate", "tokens": tokens, "chat": chat_ids}


def with_vllm(
    checkpoint: str,
    method: str,
    prompts: list[str],
    max_tokens: int,
    chat: dict,
    swap_to: str | None = None,
) -> dict:
    from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig
    from agent.engine.backends.vllm import VLLMEngine

    started = time.perf_counter()
    engine = VLLMEngine(
        EngineConfig(model=checkpoint, backend="vllm", speculative=SpeculativeConfig(method))
    )
    startup_s = time.perf_counter() - started
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens)
    tokens, metrics = [], []
    for p in prompts:
        result = engine.generate(Request(prompt=p, params=greedy))
        tokens.append(result.completions[0].token_ids)
        metrics.append(result.metrics.as_dict())
    out = {
        "startup_s": startup_s,
        "tokens": tokens,
        "metrics": metrics,
        "version": engine.model_version,
    }
    if method == "none":
        done = engine.generate(
            Request(messages=chat["messages"], tools=chat["tools"], params=greedy)
        )
        c = done.completions[0]
        out["chat"] = {
            "token_ids": c.token_ids,
            "text": c.text,
            "tool_calls": [{"name": t.name, "arguments": t.arguments} for t in c.tool_calls],
            "tool_call_errors": c.tool_call_errors,
            "finish_reason": c.finish_reason,
        }
        stream = engine.stream(Request(prompt=prompts[0], params=greedy))
        deltas = list(stream)
        out["stream"] = {
            "deltas": len(deltas),
            "token_ids": [t for d in deltas for t in d.token_ids],
            "text": "".join(d.text for d in deltas),
            "result_text": stream.result.completions[0].text,
            "logprobs": sum(len(d.logprobs or []) for d in deltas),
        }
        sampled = engine.generate(
            Request(
                prompt=prompts[0], params=SamplingParams(temperature=1.0, n=3, seed=7, max_tokens=8)
            )
        )
        out["sampled"] = [
            {"token_ids": c.token_ids, "logprobs": c.logprobs, "index": c.index}
            for c in sampled.completions
        ]
        out["concurrent"] = concurrent(engine, prompts, greedy)
        out["cancel"] = cancel(engine, prompts[0])
    if swap_to:  # a request running across the swap finishes on the old weights
        running = engine.stream(Request(prompt=prompts[0], params=greedy))
        first = next(running)
        started = time.perf_counter()
        new_version = engine.swap(swap_to)
        out["swap"] = {
            "swap_s": time.perf_counter() - started,
            "old_tokens": first.token_ids + [t for d in running for t in d.token_ids],
            "old_version": running.result.completions[0].model_version,
            "new_version": new_version,
            "new_tokens": engine.generate(Request(prompt=prompts[0], params=greedy))
            .completions[0]
            .token_ids,
        }
    engine.close()
    return out


def concurrent(engine, prompts: list[str], greedy) -> list[list[int]]:
    """The same greedy requests from several threads at once (vLLM batches them)."""
    from concurrent.futures import ThreadPoolExecutor

    from agent.engine import Request

    with ThreadPoolExecutor(len(prompts)) as pool:
        results = pool.map(lambda p: engine.generate(Request(prompt=p, params=greedy)), prompts)
        return [r.completions[0].token_ids for r in results]


def cancel(engine, prompt: str) -> dict:
    """Set the cancel event after the first delta of a long request."""
    import threading

    from agent.engine import Request, SamplingParams

    event = threading.Event()
    stream = engine.stream(
        Request(prompt=prompt, params=SamplingParams(temperature=0, max_tokens=400), cancel=event)
    )
    tokens = 0
    for delta in stream:
        tokens += len(delta.token_ids)
        event.set()
    c = stream.result.completions[0]
    return {"finish_reason": c.finish_reason, "tokens": tokens, "token_ids": len(c.token_ids)}


def main() -> int:
    job_path, out_path = sys.argv[1:3]
    with open(job_path) as f:
        job = json.load(f)
    checkpoint, prompts, max_tokens, chat = (
        job["checkpoint"],
        job["prompts"],
        job["max_tokens"],
        job["chat"],
    )
    started = time.perf_counter()
    out = {"reference": reference(checkpoint, prompts, max_tokens, chat)}
    out["reference_s"] = time.perf_counter() - started
    for method in ("none", "ngram"):
        started = time.perf_counter()
        out["vllm" if method == "none" else f"vllm-{method}"] = with_vllm(
            checkpoint, method, prompts, max_tokens, chat
        )
        out[f"vllm-{method}_s"] = time.perf_counter() - started
    started = time.perf_counter()
    out["repeating"] = {
        "reference": reference(job["repeating"], prompts, max_tokens, chat),
        "vllm-ngram": with_vllm(
            job["repeating"], "ngram", prompts, max_tokens, chat, swap_to=checkpoint
        ),
    }
    out["repeating_s"] = time.perf_counter() - started
    with open(out_path, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
