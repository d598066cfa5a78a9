"""The `vllm` backend: the Engine interface over vLLM, in-process.

    engine = open_engine(EngineConfig(model="runs/ckpt", backend="vllm",
                                      speculative=SpeculativeConfig("ngram")))
    result = engine.generate(Request(prompt="def add(a, b):", params=SamplingParams(temperature=0)))

vLLM pins its own torch and transformers, so it lives in a separate environment: `make test-vllm`
installs it (tests/vllm/install.sh), or `pip install 'flywheel[vllm]'` in an environment of its
own. `import vllm` happens only when a `VLLMEngine` is built. vLLM starts its engine core in a
spawned process: a script that builds one needs an `if __name__ == "__main__":` guard. On a CPU,
set `VLLM_CPU_KVCACHE_SPACE` (GiB of KV cache, e.g. 2) before building one; the caller (the CLI,
a test) does that, not this module.

How it runs: one `vllm.LLM` per set of weights (a `_Runner`), whose `LLMEngine` is stepped by one
background thread; requests are handed to that thread and their outputs come back on a queue
per request, so requests from several threads are batched together by vLLM. Tokenization, stop
tokens and the decoded text are Flywheel's own (the same code path as the local backend:
`SampleOutput`), so both backends give the same `Completion` for the same tokens; vLLM is asked
for token ids and logprobs (`logprobs_mode="processed_logprobs"`: under the sampling
distribution) and also checks stop strings and stop tokens itself so it stops computing early.

Speculative decoding (`SpeculativeConfig.method`), passed to vLLM as `speculative_config`:
- `ngram` -> {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max/min": ...};
- `draft` -> {"method": "draft_model", "model": draft folder, "num_speculative_tokens": k};
- `mtp` -> {"method": "mtp", "model": exported draft, "num_speculative_tokens": 1}: the
  checkpoint's first MTP head, exported in vLLM's MiMo MTP layout into a temporary folder per
  loaded model (`agent.engine.backends.vllm_draft`, which says what is exact and what is not), plus
  `hf_overrides` on the target; a checkpoint without heads is an EngineError.
vLLM keeps the draft length fixed (`num_draft_tokens`, 1 for mtp; `adaptive` is ignored) and
does not use a request's `speculation` text, nor a model folder's fast-apply adapter (an `apply`
request runs on the model itself). Draft counters come from vLLM's per-request
spec-decode metrics.

Not here: `swap` builds a whole new `vllm.LLM` (tens of seconds on a CPU) and keeps the old one
until its running requests finish, so two engines live side by side for a while. Streaming is
incremental (one delta per vLLM step). Cancellation takes effect within one vLLM step.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import tempfile
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.chat_format import parse_assistant
from agent.engine import (
    BadRequest,
    Delta,
    EngineError,
    Request,
    RequestMetrics,
    Result,
    Stream,
)
from agent.engine.config import EngineConfig
from agent.engine.prompt import prepare_prompt
from agent.engine.request import FinishReason, SamplingParams
from agent.engine.sample_output import SampleOutput

INSTALL_HINT = (
    "install it with `make test-vllm` (a separate environment under ~/.cache/flywheel/venv-vllm) "
    "or `pip install 'flywheel[vllm]'` in an environment of its own (it pins torch and "
    "transformers)"
)
POLL_S = 0.05  # how often a waiting request re-checks its cancel event
_ABORTED = object()  # put on a request's queue when its runner aborted it
_ids = itertools.count()


def _import_vllm():
    try:
        import vllm
    except ImportError as exc:
        raise EngineError(
            f"the vllm backend needs vLLM, which is not installed: {INSTALL_HINT}"
        ) from exc
    except Exception as exc:  # e.g. a CUDA torchvision: "operator torchvision::nms does not exist"
        raise EngineError(
            f"vLLM is installed but fails to import ({type(exc).__name__}: {exc}); "
            f"reinstall it: {INSTALL_HINT}"
        ) from exc
    return vllm


@dataclass
class _Job:
    """A validated request, bound to the runner (weights) it runs on."""

    request: Request
    params: SamplingParams  # max_tokens clipped to the context
    prompt_ids: list[int]
    stop_ids: set[int]
    runner: _Runner
    chat: bool


class VLLMEngine:
    """Implements `agent.engine.Engine` with vLLM in this process (its engine core is spawned)."""

    def __init__(
        self,
        config: EngineConfig,
        enforce_eager: bool = True,
        max_model_len: int | None = None,
        **llm_kwargs: Any,
    ) -> None:
        """Build a `vllm.LLM` for `config.model`.

        enforce_eager: skip torch.compile and graph capture (starts in ~30 s instead of ~80 s on a
            CPU; decoding speed is similar for small models).
        max_model_len: context length; default: the model's `max_position_embeddings`.
        llm_kwargs: passed on to `vllm.LLM` (e.g. `max_num_seqs`, `kv_cache_memory_bytes`).
        """
        self.config = config
        self._speculative = self._speculative_config()  # before the import: clear errors first
        self._vllm = _import_vllm()
        self._llm_kwargs = dict(enforce_eager=enforce_eager, max_model_len=max_model_len)
        self._llm_kwargs.update(llm_kwargs)
        self._swap_lock = threading.Lock()
        self._runner = self._start(config.model)

    # -- the Engine protocol -------------------------------------------------------------

    @property
    def model_version(self) -> str:
        return self._runner.version

    @property
    def context_length(self) -> int:
        return self._runner.context_length

    @property
    def show_min_confidence(self) -> float | None:
        return self._runner.show_min

    def generate(self, request: Request) -> Result:
        return self.stream(request).finish()

    def stream(self, request: Request) -> Stream:
        job = self._prepare(request, self._runner)  # bad input raises here, before any output
        return Stream(self._run(job))

    def swap(self, model: str) -> str:
        """Start a new `vllm.LLM` on `model`; the old one finishes its requests, then stops."""
        with self._swap_lock:
            new = self._start(model)
            old, self._runner = self._runner, new
            old.close(drain=True)
        return new.version

    def close(self) -> None:
        """Abort running requests and shut vLLM down (waits up to 60 s for it to stop)."""
        self._runner.close(drain=False)
        self._runner.join(60.0)

    # -- set-up --------------------------------------------------------------------------

    def _speculative_config(self) -> dict[str, Any] | None:
        spec = self.config.speculative
        if spec.method == "none":
            return None
        if spec.method == "ngram":
            return {
                "method": "ngram",
                "num_speculative_tokens": spec.num_draft_tokens,
                "prompt_lookup_max": spec.ngram_max,
                "prompt_lookup_min": spec.ngram_min,
            }
        if spec.method == "ngram+mtp":
            raise EngineError(
                "vLLM drafts with one method per server: use --speculative ngram or mtp there "
                "(ngram+mtp is the local engine's)"
            )
        if spec.method == "draft":
            return {
                "method": "draft_model",
                "model": str(Path(spec.draft_model).expanduser()),
                "num_speculative_tokens": spec.num_draft_tokens,
            }
        from agent.model import resolve_model

        folder = resolve_model(self.config.model)
        if not (folder / "mtp" / "config.json").exists():
            raise EngineError(
                f"speculative method 'mtp' needs MTP heads, and {str(folder)!r} has none "
                "(mtp/config.json): train them (flywheel train, mtp stage) or use ngram or draft"
            )
        return {"method": "mtp"}  # the draft is exported per loaded model, in _start

    def _start(self, model: str) -> _Runner:
        from agent.confidence import threshold
        from agent.engine.local.model_runner import decode_table
        from agent.model import checkpoint_folder, checkpoint_version, merged_folder

        if model.startswith(("http://", "https://")):
            raise EngineError(
                f"the vllm backend loads a local checkpoint folder, not {model!r}; "
                "use the openai backend for a server URL"
            )
        source = checkpoint_folder(model)
        folder = merged_folder(source)  # vLLM loads whole folders
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder))
        except Exception as exc:
            raise EngineError(f"could not load the tokenizer in {str(folder)!r}: {exc}") from exc
        if tokenizer.eos_token_id is None:
            raise EngineError(f"tokenizer in {str(folder)!r} has no end-of-text token")
        kwargs = dict(
            model=str(folder),
            tokenizer=str(folder),
            dtype=self.config.dtype,
            seed=0,
            logprobs_mode="processed_logprobs",
            speculative_config=self._speculative,
            **self._llm_kwargs,
        )
        if self._speculative is not None:
            kwargs["per_request_spec_decode_metrics"] = "summary"
        draft_dir = None  # the exported MTP draft of this model; removed when its runner ends
        if self.config.speculative.method == "mtp":
            from agent.engine.backends.vllm_draft import export_vllm_draft, vllm_kwargs

            draft_dir = tempfile.TemporaryDirectory(prefix="flywheel-vllm-draft-")
            try:
                kwargs.update(vllm_kwargs(export_vllm_draft(folder, draft_dir.name)))
            except BaseException:
                draft_dir.cleanup()
                raise
        try:
            llm = self._vllm.LLM(**kwargs)
        except Exception as exc:  # vLLM raises many types; name the folder and the cause
            if draft_dir is not None:
                draft_dir.cleanup()
            raise EngineError(f"vLLM could not load the model in {str(folder)!r}: {exc}") from exc
        engine = llm.llm_engine
        vocab = int(engine.model_config.get_vocab_size())
        if len(tokenizer) > vocab:
            llm.llm_engine.engine_core.shutdown()
            if draft_dir is not None:
                draft_dir.cleanup()
            raise EngineError(
                f"tokenizer in {str(folder)!r} has {len(tokenizer)} tokens but the model's "
                f"vocabulary has {vocab}: the tokenizer does not belong to this model"
            )
        table = decode_table(tokenizer)
        token_bytes = table[:vocab] + [b""] * max(0, vocab - len(table))
        return _Runner(
            llm=llm,
            tokenizer=tokenizer,
            token_bytes=token_bytes,
            version=checkpoint_version(folder),
            context_length=int(engine.model_config.max_model_len),
            vocab_size=vocab,
            draft_dir=draft_dir,
            show_min=threshold(source),  # an adapter's own, not the merged copy's
        )

    def _prepare(self, request: Request, runner: _Runner) -> _Job:
        p = prepare_prompt(request, runner.tokenizer, runner.vocab_size, runner.context_length)
        return _Job(request, p.params, p.ids, p.stop_ids, runner, p.chat)

    def _sampling_params(self, job: _Job):
        """Ours -> vLLM's. EOS handling is ours: `ignore_eos` plus an explicit stop-id list, so
        vLLM does not add the ids of generation_config.json (which stop chat turns)."""
        p = job.params
        return self._vllm.SamplingParams(
            n=p.n,
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,  # 0 keeps all, in both
            seed=p.seed,
            max_tokens=p.max_tokens,
            stop=(list(p.stop) or None) if not p.stop_after else None,  # then ours alone
            stop_token_ids=sorted(job.stop_ids),
            ignore_eos=True,
            logprobs=0 if p.logprobs else None,  # 0: the sampled token's logprob only
            skip_special_tokens=False,  # stop strings are matched on the text we produce
            spaces_between_special_tokens=False,
            output_kind=self._vllm.sampling_params.RequestOutputKind.DELTA,
        )

    # -- decoding ------------------------------------------------------------------------

    def _run(self, job: _Job) -> Generator[Delta, None, Result]:
        params, runner = job.params, job.runner
        metrics = RequestMetrics(prompt_tokens=len(job.prompt_ids))
        outputs = [
            SampleOutput.for_request(i, runner.token_bytes, job.stop_ids, params)
            for i in range(params.n)
        ]
        request_id = job.request.request_id or f"flywheel-{next(_ids)}"
        started = time.perf_counter()
        inbox = runner.submit(request_id, job.prompt_ids, self._sampling_params(job))
        done = False
        try:
            while not done:
                if job.request.cancelled:
                    runner.abort(request_id)
                    yield from _finish(outputs, "cancelled")
                    break
                try:
                    item = inbox.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if isinstance(item, BaseException):
                    raise item
                if item is _ABORTED:
                    yield from _finish(outputs, "cancelled")
                    break
                for out in item.outputs:
                    self._absorb(outputs[out.index], out, metrics)
                if not metrics.ttft_s and any(o.token_ids for o in outputs):
                    metrics.ttft_s = time.perf_counter() - started
                done = item.finished or all(o.finished for o in outputs)
                for output in outputs:
                    if done:
                        output.finish("length")  # no-op unless vLLM ended it without a reason
                    delta = output.delta()
                    if delta is not None:
                        yield delta
        finally:
            if not done:  # cancelled, failed, or the caller closed the stream early
                runner.abort(request_id)
        metrics.total_s = time.perf_counter() - started
        metrics.output_tokens = sum(len(o.token_ids) for o in outputs)
        completions = [o.completion(runner.version) for o in outputs]
        if job.chat:
            for c in completions:
                _, c.tool_calls, c.tool_call_errors = parse_assistant(c.text, job.request.tools)
        return Result(completions, metrics)

    @staticmethod
    def _absorb(output: SampleOutput, out, metrics: RequestMetrics) -> None:
        """Feed one vLLM CompletionOutput delta (new token ids + logprobs) into a SampleOutput."""
        token_ids = list(out.token_ids)
        logprobs = out.logprobs or [None] * len(token_ids)
        for token, entry in zip(token_ids, logprobs, strict=False):
            logprob = entry[token].logprob if entry and token in entry else None
            if output.add(int(token), logprob):
                break
        if out.finish_reason is not None and not output.finished:
            output.finish(_FINISH.get(out.finish_reason, "stop"))
        spec = getattr(out, "spec_decode_metrics", None)
        if spec is not None:
            steps = sum(spec.histogram)
            metrics.verify_steps += steps
            metrics.drafts_proposed += spec.num_draft_tokens
            metrics.drafts_accepted += sum(j * c for j, c in enumerate(spec.histogram))


_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "cancelled"}


def _finish(outputs: list[SampleOutput], reason: FinishReason) -> Generator[Delta, None, None]:
    for output in outputs:
        output.finish(reason)
        delta = output.delta()
        if delta is not None:
            yield delta


class _Runner:
    """One `vllm.LLM` (one set of weights) and the thread that steps its engine.

    Only the thread touches the `LLMEngine` (it is not thread-safe): requests arrive as commands
    on `_commands`, and each request's outputs (vLLM `RequestOutput` deltas, an exception, or
    `_ABORTED`) go to that request's own queue.
    """

    def __init__(
        self,
        llm,
        tokenizer,
        token_bytes,
        version,
        context_length,
        vocab_size,
        draft_dir=None,
        show_min=None,
    ) -> None:
        self.llm = llm
        self.show_min = show_min  # the model's confidence threshold (agent/confidence.py)
        self.tokenizer = tokenizer
        self.token_bytes = token_bytes  # [vocab] the exact bytes of each token id
        self.version = version
        self.context_length = context_length
        self.vocab_size = vocab_size
        self.draft_dir = draft_dir  # TemporaryDirectory of the exported MTP draft, or None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._inboxes: dict[str, queue.SimpleQueue] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"vllm-{version}", daemon=True)
        self._thread.start()

    def submit(self, request_id: str, prompt_ids: list[int], sampling_params) -> queue.SimpleQueue:
        if self._closed:
            raise EngineError("this vLLM engine was closed: open a new one")
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._commands.put(("add", request_id, prompt_ids, sampling_params, inbox))
        return inbox

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def close(self, drain: bool) -> None:
        """Stop after the running requests finish (drain) or abort them now; returns at once."""
        self._closed = True
        self._commands.put(("close", drain))

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _loop(self) -> None:
        engine = self.llm.llm_engine
        closing = draining = False
        try:
            while True:
                busy = engine.has_unfinished_requests()
                block = not busy and not closing
                while True:  # take every pending command; wait for one only when idle
                    try:
                        command = self._commands.get(block=block)
                    except queue.Empty:
                        break
                    block = False
                    closing, draining = self._handle(engine, command, closing, draining)
                idle = not engine.has_unfinished_requests()
                if closing and (not draining or not self._inboxes or idle):
                    break  # any inbox left gets _ABORTED below
                if idle:
                    continue
                for out in engine.step():
                    inbox = self._inboxes.get(out.request_id)
                    if inbox is not None:
                        inbox.put(out)
                        if out.finished:
                            del self._inboxes[out.request_id]
        except Exception as exc:
            error = EngineError(f"vLLM failed while generating: {type(exc).__name__}: {exc}")
            for inbox in self._inboxes.values():
                inbox.put(error)
            self._inboxes.clear()
            self._closed = True
        finally:
            for inbox in self._inboxes.values():
                inbox.put(_ABORTED)
            self._inboxes.clear()
            self._drain_commands()
            with contextlib.suppress(Exception):  # best effort: the engine is going away
                engine.engine_core.shutdown()
            if self.draft_dir is not None:
                self.draft_dir.cleanup()

    def _handle(self, engine, command, closing: bool, draining: bool) -> tuple[bool, bool]:
        kind = command[0]
        if kind == "add":
            _, request_id, prompt_ids, sampling_params, inbox = command
            if closing and not draining:
                inbox.put(_ABORTED)
                return closing, draining
            try:
                engine.add_request(request_id, {"prompt_token_ids": prompt_ids}, sampling_params)
            except Exception as exc:  # vLLM validates the request here
                inbox.put(BadRequest(f"vLLM refused the request: {exc}"))
            else:
                self._inboxes[request_id] = inbox
        elif kind == "abort":
            inbox = self._inboxes.pop(command[1], None)
            if inbox is not None:
                engine.abort_request([command[1]])
                inbox.put(_ABORTED)
        elif kind == "close":
            closing, draining = True, command[1]
            if not draining:
                ids = list(self._inboxes)
                if ids:
                    engine.abort_request(ids)
                for inbox in self._inboxes.values():
                    inbox.put(_ABORTED)
                self._inboxes.clear()
        return closing, draining

    def _drain_commands(self) -> None:
        """Answer requests that arrived after the loop ended."""
        while True:
            try:
                command = self._commands.get(block=False)
            except queue.Empty:
                return
            if command[0] == "add":
                command[4].put(EngineError("this vLLM engine was closed: open a new one"))
