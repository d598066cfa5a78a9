"""The `local` backend: torch decoding with a KV cache and lossless speculative decoding.

    from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig, open_engine
    engine = open_engine(EngineConfig(model="runs/ckpt", speculative=SpeculativeConfig("ngram")))
    result = engine.generate(Request(prompt="def add(a, b):", params=SamplingParams(temperature=0)))

How a request runs:
1. `_prepare` validates and tokenizes it (text, bytes, token ids, or chat messages rendered with
   the tokenizer's chat template) and clips `max_tokens` to what fits in the context: a prompt
   that leaves no room for one output token is refused with `BadRequest`.
2. Prefill: forward passes over the prompt fill a KV cache (kv_cache.py); it starts from the
   longest prefix already computed on the same weights (prefix_cache.py), so a conversation's
   next turn or a group's next sample prefills only what is new (`RequestMetrics.cached_tokens`).
3. Decoding, one of:
   - plain (`SpeculativeConfig.method == "none"`): the n samples are n rows of one batch sharing
     the prefill (the cache is repeated n times); rows leave the batch as they finish;
   - speculative: the samples run one after another, each on its own copy of the shared prefill
     cache (batching ragged acceptance lengths is not worth it on a CPU). Each `step()` is
     propose drafts -> verify (one target forward over them + the rejection sampler) ->
     append (crop the rejected positions from the cache, record the emitted tokens) -> stop.
     The draft length adapts: +2 after a step that accepted every draft, -1 otherwise, within
     [1, max_draft_tokens] (and the head depth for mtp).
   A chat request with tools decodes under the tool-call grammar (tool_grammar.py): at each
   position, plain or verified, the tokens that would break a call are masked first. A
   fast-apply request decodes under the copy bias (copy_bias.py) the same way: the tokens that
   continue the original file or the edit sketch get a logit bonus.
4. Each sample's `SampleOutput` turns tokens into text and applies stop tokens, stop strings and
   max tokens; streaming yields its deltas.

Concurrency: requests may run from several threads, under one of the two schedulers of
agent/engine/scheduler.py. With `EngineConfig.own_thread` (servers) every request's generator
runs on the engine's own thread (`EngineThread`), which takes the next step from the most urgent
lane: torch then uses one thread, as it is fastest on a CPU. Without it, requests run on their
callers' threads and one priority lock (`PriorityLock`) serialises the forward calls (a CPU has
no spare capacity for parallel forwards anyway); it is never held across a `yield`. Either way,
between two steps of an agent turn a waiting editor completion
(`Request.priority="interactive"`) goes first, and while an editor is active an agent's prompt
is prefilled in short chunks, so that a completion waits for little. A request holds a
reference to the weights it started on, so `swap` never disturbs it.
Cancellation (`Request.cancel`) is checked before every forward pass: the request ends within one
decode or verify step with finish reason "cancelled" (no exception).

Batching across requests: every trunk forward pass is a `Forward` step that the request's
generator yields. On the engine's thread the scheduler runs the waiting decode and verify steps
of a lane's requests (on the same weights) in one pass (batched.py: their tokens concatenated
through the linear layers, attention per request on its own cache); on callers' threads each
runs alone.

Not here: paged attention, CUDA graphs.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass

import torch

from agent.chat_format import parse_assistant
from agent.engine import Stream
from agent.engine.config import EngineConfig
from agent.engine.local.batched import Admission, Forward, takes_trees
from agent.engine.local.copy_bias import CopyBias
from agent.engine.local.kv_cache import reuse_freed_memory
from agent.engine.local.model_runner import LoadedModel
from agent.engine.local.prefix_cache import PrefixCache, restore
from agent.engine.local.proposers import (
    HYBRID_MIN_MATCH,
    MTP_WINDOW,
    Draft,
    DraftModelProposer,
    MTPProposer,
    NgramProposer,
    NgramThenMTPProposer,
    Proposer,
)
from agent.engine.local.rejection_sampler import verify_greedy, verify_sampled
from agent.engine.local.sampling import (
    make_generator,
    next_tokens,
    sample,
    target_probs,
    token_logprobs,
)
from agent.engine.local.tool_grammar import ToolGrammar
from agent.engine.prompt import prepare_prompt
from agent.engine.request import Delta, EngineError, Request, RequestMetrics, Result, SamplingParams
from agent.engine.sample_output import SampleOutput
from agent.engine.scheduler import BATCH_ROWS, EngineThread, PriorityLock, Scheduler

log = logging.getLogger("flywheel.engine")
MAX_GRAMMARS = 32  # tool sets whose grammar stays built, per loaded model
PREFILL_CHUNK = 512  # prompt tokens per prefill forward pass (the lock is free between them)
# While a more urgent lane is active (an editor asked for a completion in the last
# URGENT_WINDOW_S seconds), less urgent prefills run in chunks this short: a completion then
# waits for a short chunk, not a long one (a chunk's cost grows with the context before it).
YIELDING_CHUNK = 64
URGENT_WINDOW_S = 10.0
RESERVED_OUTPUT = 1024  # output positions a request's KV cache holds from the start, at most


@dataclass
class Job:
    """A validated request, bound to the weights it runs on."""

    request: Request
    params: SamplingParams  # max_tokens clipped to the context
    prompt_ids: list[int]
    stop_ids: set[int]
    model: LoadedModel
    generator: torch.Generator
    chat: bool
    # what shapes the logits at each position: the tool-call grammar (chat with tools, calls
    # that always parse) or the copy bias (fast apply, copy_bias.py); None for neither
    rule: ToolGrammar | CopyBias | None = None
    speculation_ids: list[int] | None = None  # the request's speculation, tokenized once


class LocalEngine:
    """Implements `agent.engine.Engine` on torch."""

    def __init__(
        self,
        config: EngineConfig,
        model: LoadedModel | None = None,
        draft: LoadedModel | None = None,
    ) -> None:
        """Load `config.model` (and the draft model), or use models already in memory."""
        self.config = config
        self.spec = config.speculative
        # the thread every torch operation runs on, or else a lock around every forward call
        self._scheduler: Scheduler = EngineThread() if config.own_thread else PriorityLock()
        if config.own_thread:  # a server: requests come and go all day
            reuse_freed_memory()
        self._swap_lock = threading.Lock()  # one swap at a time
        self._draft: LoadedModel | None = None
        try:
            if model is None:
                model = self._call(self._load, config.model)
            self._with_prefix_cache(model)
            if config.prefix_cache_mb and not self._caches_prefixes(model):
                log.warning(
                    "exact: %s computes prefill rows together (dtype int8 or int4 with "
                    "Flywheel's kernels computes each alone), so the prefix cache is off",
                    model.checkpoint.path,
                )
            if self.spec.method == "draft":
                self._draft = draft or self._call(self._load, self.spec.draft_model)
            self._check(model)
        except BaseException:
            self._scheduler.close()  # no engine: its thread (and torch's team on it) ends
            raise
        self._model = model

    # -- the Engine protocol -------------------------------------------------------------

    @property
    def model_version(self) -> str:
        return self._model.checkpoint.version

    @property
    def context_length(self) -> int:
        return self._model.context_length

    @property
    def show_min_confidence(self) -> float | None:
        return self._model.show_min_confidence

    def generate(self, request: Request) -> Result:
        return self.stream(request).finish()

    def stream(self, request: Request) -> Stream:
        model = self._model
        if request.apply:  # the fast-apply adapter's weights, loaded on first use
            model = self._call(model.for_apply)
            self._with_prefix_cache(model)
        job = self._prepare(request, model)  # bad input raises here, before any output
        return Stream(self._scheduler.stream(self._run(job), request.priority))

    def swap(self, model: str) -> str:
        with self._swap_lock:
            new = self._call(self._load, model)
            self._check(new)
            self._with_prefix_cache(new)
            self._model = new  # running requests keep their own reference to the old one
        return new.checkpoint.version

    def close(self) -> None:
        self._scheduler.close()  # open requests finish, then its thread (if any) ends
        self._draft = None
        if self._model.prefix_cache is not None:
            self._model.prefix_cache.clear()

    def prefix_cache_stats(self) -> dict[str, int]:
        """Tokens looked up and found, entries and bytes of the current weights' prefix cache."""
        cache = self._model.prefix_cache
        return dict(vars(cache.stats)) if cache is not None else {}

    # -- threads -------------------------------------------------------------------------

    def _call(self, fn, *args):
        """`fn(*args)` on the engine's thread, or here without one."""
        return self._scheduler.call(fn, *args)

    def _hold(self, lane: str):
        """Around model work between steps (on the engine's thread nothing else runs anyway)."""
        return self._scheduler.hold(lane)

    def _urgent(self, lane: str) -> bool:
        return self._scheduler.urgent_within(lane, URGENT_WINDOW_S)

    # -- set-up --------------------------------------------------------------------------

    def _load(self, model: str) -> LoadedModel:
        config = self.config
        return LoadedModel.load(model, config.device, config.dtype, exact=config.exact)

    def _caches_prefixes(self, model: LoadedModel) -> bool:
        """Whether requests on `model` reuse cached prefixes: with `exact`, only where a hit
        computes a cold prefill's bits (`LoadedModel.rows_alone`)."""
        return bool(self.config.prefix_cache_mb) and (not self.config.exact or model.rows_alone)

    def _with_prefix_cache(self, model: LoadedModel) -> None:
        if self._caches_prefixes(model) and model.prefix_cache is None:
            model.prefix_cache = PrefixCache(self.config.prefix_cache_mb << 20)

    def _check(self, model: LoadedModel) -> None:
        """Refuse weights the configured speculation cannot run with."""
        where = model.checkpoint.path
        if self.spec.uses_heads and model.checkpoint.heads is None:
            raise EngineError(
                f"speculative method {self.spec.method!r} needs MTP heads, but {where!r} has none "
                "(no mtp/ folder): train them (flywheel train mtp) or use --speculative ngram"
            )
        if self._draft is not None:
            ours, theirs = model.tokenizer.get_vocab(), self._draft.tokenizer.get_vocab()
            if ours != theirs:
                raise EngineError(
                    f"the draft model {self._draft.checkpoint.path!r} has a different tokenizer "
                    f"than {where!r}: a draft model must share the target's tokenizer"
                )

    def _prepare(self, request: Request, model: LoadedModel) -> Job:
        prompt = prepare_prompt(request, model.tokenizer, model.vocab_size, model.context_length)
        return Job(
            request=request,
            params=prompt.params,
            prompt_ids=prompt.ids,
            stop_ids=prompt.stop_ids,
            model=model,
            generator=make_generator(prompt.params.seed, model.device),
            chat=prompt.chat,
            speculation_ids=(
                model.tokenizer.encode(request.speculation, add_special_tokens=False)
                if request.speculation
                else None
            ),
        )

    def _rule(self, job: Job) -> ToolGrammar | CopyBias | None:
        """The tool-call grammar of a chat request with tools, the copy bias of a fast-apply
        request with a speculation, else None."""
        request, model = job.request, job.model
        if job.chat and request.tools:
            return _grammar(request, model)
        if request.apply:
            return CopyBias.for_request(
                job.prompt_ids,
                request.speculation,
                job.speculation_ids,
                model.tokenizer,
                self.config.apply_copy_bias,
            )
        return None

    def _proposer(self, job: Job) -> Proposer:
        spec, model = self.spec, job.model
        if spec.method in ("ngram", "ngram+mtp"):
            spec_ids = job.speculation_ids
            if spec.method == "ngram":
                return NgramProposer(spec.ngram_min, spec.ngram_max, spec_ids)
            least = max(spec.ngram_min, HYBRID_MIN_MATCH)
            ngram = NgramProposer(least, max(spec.ngram_max, least), spec_ids)
            return NgramThenMTPProposer(
                ngram, self._heads_proposer(job), spec.num_draft_tokens, spec.adaptive
            )
        if spec.method == "mtp":
            return self._heads_proposer(job)
        assert self._draft is not None
        return DraftModelProposer(self._draft, job.params, job.generator, model.vocab_size)

    def _heads_proposer(self, job: Job) -> MTPProposer:
        """The MTP heads' proposer, with alternatives to its first draft where a verify step
        can take a tree of drafts and stay lossless (`batched.takes_trees`)."""
        trees = takes_trees(job.model.trunk)
        return MTPProposer(job.model, alternatives=self.spec.draft_alternatives if trees else 0)

    # -- decoding ------------------------------------------------------------------------

    def _run(self, job: Job) -> Generator[Delta, None, Result]:
        """The request's deltas, and the trunk forward passes it needs (`Forward` steps) for
        the scheduler to run: on the engine's thread it batches them across requests."""
        params, model = job.params, job.model
        metrics = RequestMetrics(prompt_tokens=len(job.prompt_ids))
        outputs = [
            SampleOutput.for_request(i, model.token_bytes, job.stop_ids, params)
            for i in range(params.n)
        ]
        started = time.perf_counter()
        try:
            # built on the thread that runs the model (its masks are vocabulary-sized)
            job.rule = self._rule(job)
            if self.spec.method == "none":
                yield from self._decode_plain(job, outputs, metrics, started)
            else:
                yield from self._decode_speculative(job, outputs, metrics, started)
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"generation failed in the local engine: {exc}") from exc
        metrics.total_s = time.perf_counter() - started
        metrics.output_tokens = sum(len(o.token_ids) for o in outputs)
        completions = [o.completion(model.checkpoint.version) for o in outputs]
        if job.chat:
            for c in completions:
                _, c.tool_calls, c.tool_call_errors = parse_assistant(c.text, job.request.tools)
        return Result(completions, metrics)

    def _prefill(self, job: Job, metrics: RequestMetrics) -> Generator[object, None, tuple]:
        """Cache, last-position logits [1, vocab], hidden states [1, m, hidden] of the m
        positions computed (the prompt after its cached prefix), and the cached length;
        yields each chunk's `Forward`."""
        model, ids = job.model, job.prompt_ids
        # Leave at least one position to compute (its logits start decoding), and MTP heads the
        # hidden states of their attention window.
        limit = len(ids) - 1 - (MTP_WINDOW if self.spec.uses_heads else 0)
        prefixes = self._prefixes(model)
        lane = job.request.priority
        if prefixes is not None and len(ids) > BATCH_ROWS:  # shorter: one small batched step
            yield Admission(model, len(ids))  # look up after the prefills that came before
        with self._hold(lane), torch.inference_mode():
            # room for the prompt, the output (up to RESERVED_OUTPUT: past that it grows) and one
            # verify step's drafts past its end
            output = min(job.params.max_tokens, RESERVED_OUTPUT) + self.spec.max_draft_tokens
            cache = model.new_cache(len(ids) + output)
            start, entry = 0, None
            if prefixes is not None:
                start, entry = prefixes.lookup(ids, limit)
                if entry is not None:
                    restore(cache, entry, start)
        # In chunks, each a forward pass of its own: a more urgent request waits for one chunk,
        # not for the whole prompt.
        hiddens, at = [], start
        while at < len(ids):
            size = YIELDING_CHUNK if self._urgent(lane) else PREFILL_CHUNK
            chunk = torch.tensor([ids[at : at + size]], device=model.device)
            step = Forward(model, chunk, cache, last_only=True)
            yield step
            logits, hidden = step.result()
            hiddens.append(hidden)
            at += size
        with torch.inference_mode():
            hidden = torch.cat(hiddens, dim=1) if len(hiddens) > 1 else hiddens[0]
            if prefixes is not None:
                with self._hold(lane):
                    prefixes.store(ids, cache)
        metrics.cached_tokens = start
        return cache, logits[:, -1], hidden, start

    def _decode_plain(self, job: Job, outputs: list[SampleOutput], metrics, started):
        """n rows in one batch over a shared prefill; finished rows leave the batch."""
        model, params, n = job.model, job.params, job.params.n
        cache, logits, _, _ = yield from self._prefill(job, metrics)
        with torch.inference_mode():
            if n > 1:
                cache.batch_repeat_interleave(n)
                logits = logits.expand(n, -1)
        rows = list(range(n))  # sample index of each batch row
        states = [job.rule.start() for _ in range(n)] if job.rule else None
        while True:
            if job.request.cancelled:
                yield from _finish(outputs, "cancelled")
                return
            with torch.inference_mode():
                if states:
                    logits = logits.clone()  # [rows, vocab], each row under its own state
                    for r, sample in enumerate(rows):
                        states[sample].adjust_(logits[r])
                tokens, logprobs = next_tokens(logits, params, job.generator)  # [rows]
            token_list = tokens.tolist()
            for row, sample in enumerate(rows if states else ()):
                states[sample].advance(token_list[row])
            logprob_list = logprobs.tolist() if logprobs is not None else [None] * len(rows)
            if not metrics.ttft_s:
                metrics.ttft_s = time.perf_counter() - started
            keep = []
            for row, sample in enumerate(rows):
                if not outputs[sample].add(token_list[row], logprob_list[row]):
                    keep.append(row)
            yield from _deltas(outputs[s] for s in rows)
            if not keep:
                if n == 1:  # the cache holds the prompt and every token but the last
                    self._remember(job, job.prompt_ids + outputs[0].token_ids[:-1], cache)
                return
            with torch.inference_mode():
                if len(keep) < len(rows):
                    index = torch.tensor(keep, device=model.device)
                    cache.batch_select_indices(index)
                    tokens = tokens[index]
                    rows = [rows[r] for r in keep]
            step = Forward(model, tokens[:, None], cache)
            yield step
            logits = step.result()[0][:, -1]

    def _decode_speculative(self, job: Job, outputs: list[SampleOutput], metrics, started):
        """The samples one after another, each from a copy of the shared prefill."""
        cache, logits, hidden, cached = yield from self._prefill(job, metrics)
        for i, output in enumerate(outputs):
            if job.request.cancelled:
                yield from _finish(outputs[i:], "cancelled")
                return
            with torch.inference_mode():
                own_cache = cache if i == len(outputs) - 1 else copy.deepcopy(cache)
            seq = SpeculativeSequence(self, job, output, own_cache, metrics)
            seq.start(logits, hidden[0], cached)
            if not metrics.ttft_s:
                metrics.ttft_s = time.perf_counter() - started
            yield from _deltas([output])
            while not output.finished:
                if job.request.cancelled:
                    yield from _finish(outputs[i:], "cancelled")
                    return
                yield from seq.step()
                yield from _deltas([output])
            if len(outputs) == 1:
                self._remember(job, seq.tokens[:-1], seq.cache)

    def _prefixes(self, model: LoadedModel) -> PrefixCache | None:
        """The model's prefix cache, or None when the engine runs without one."""
        return model.prefix_cache if self._caches_prefixes(model) else None

    def _remember(self, job: Job, tokens: list[int], cache) -> None:
        """Store a finished one-sample request's prompt and output in the prefix cache: an
        agent's next turn starts with both (vLLM and SGLang cache generated tokens too). The
        cache holds at least these tokens' keys and values, and the request writes no more."""
        prefixes = self._prefixes(job.model)
        if prefixes is not None:
            with self._hold(job.request.priority), torch.inference_mode():
                prefixes.store(tokens, cache)


class SpeculativeSequence:
    """One sample under speculative decoding: `step()` = propose, verify, append, stop."""

    def __init__(self, engine: LocalEngine, job: Job, output: SampleOutput, cache, metrics):
        self.engine = engine
        self.job = job
        self.output = output
        self.cache = cache  # target KV cache: prompt + accepted tokens except the newest one
        self.metrics = metrics
        self.tokens = list(job.prompt_ids)  # prompt + every emitted token
        self.proposer = engine._proposer(job)
        spec = engine.spec
        self.max_k = min(spec.max_draft_tokens, self.proposer.max_depth)
        # a proposer that adapts its own draft lengths gets only the cap
        adapts = getattr(self.proposer, "adapts", False)
        self.k = self.max_k if adapts else min(spec.num_draft_tokens, self.max_k)
        self.adaptive = spec.adaptive and not adapts
        self.rule = job.rule.start() if job.rule else None

    def start(self, logits: torch.Tensor, hidden: torch.Tensor, cached: int = 0) -> None:
        """The first token, from the prefill's logits [1, vocab]; hidden: [prompt - cached,
        hidden], the positions after the `cached` ones read from the prefix cache."""
        with torch.inference_mode():
            if self.rule:
                logits = self.rule.constrain(logits)
            token, logprob = next_tokens(logits, self.job.params, self.job.generator)
        if cached:
            self.proposer.skip(cached)
        self.proposer.observe(hidden)
        self.add([int(token[0])], None if logprob is None else logprob.tolist())

    def step(self) -> Generator[Forward, None, bool]:
        """Propose drafts, verify them (yields the target's forward pass over them), append what
        survives; returns True when the sample stopped."""
        with self.engine._hold(self.job.request.priority), torch.inference_mode():
            draft = self.propose()
        ids = [[self.tokens[-1], *draft.token_ids, *draft.alternatives]]
        forward = Forward(
            self.job.model,
            torch.tensor(ids, device=self.job.model.device),
            self.cache,
            alone=self.engine.config.exact,
            parents=draft.parents(),
        )
        yield forward
        with self.engine._hold(self.job.request.priority), torch.inference_mode():
            emitted, logprobs, kept, hidden = self.verify(draft, *forward.result())
            self.append(draft, kept, hidden)
        return self.add(emitted, logprobs)

    def propose(self) -> Draft:
        remaining = self.job.params.max_tokens - len(self.output.token_ids)
        k = min(self.k, remaining - 1)  # the verify step always adds one token of its own
        return self.proposer.propose(self.tokens, k) if k > 0 else Draft([])

    def verify(
        self, draft: Draft, logits: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[list[int], list[float] | None, list[int], torch.Tensor]:
        """The rejection sampler over the target's forward pass over [last token, drafts,
        alternatives]: logits [1, k + 1 + a, vocab], hidden [1, k + 1 + a, hidden]. Returns the
        emitted tokens, their logprobs, the rows kept in the cache (the last token's and the
        accepted drafts') and their hidden states.

        An alternative costs the sampler nothing: when the chain's first draft is rejected, the
        token emitted in its place is drawn as always; if it is an alternative, that branch's
        row is the decode step after it, so the token that follows comes from its row."""
        model, params = self.job.model, self.job.params
        logits = logits[0]  # [k + 1 + a, vocab]
        k = len(draft.token_ids)
        draft_ids = torch.tensor(draft.token_ids, dtype=torch.long, device=model.device)  # [k]
        if self.rule:  # row j's rule: the state after the drafts on its branch
            logits, state = logits.clone(), self.rule.copy()
            for j in range(k + 1):
                state.adjust_(logits[j])
                if j < k:
                    state.advance(draft.token_ids[j])
            for i, token in enumerate(draft.alternatives):
                branch = self.rule.copy()
                branch.advance(token)
                branch.adjust_(logits[k + 1 + i])
        if params.greedy:
            emitted, accepted = verify_greedy(draft_ids, logits[: k + 1].argmax(-1))
            probs = None
        else:
            probs = target_probs(logits, params)  # [k + 1 + a, vocab]
            emitted, accepted = verify_sampled(
                draft_ids, draft.probs, probs[: k + 1], self.job.generator
            )
        kept = list(range(accepted + 1))
        if accepted == 0 and emitted[0] in draft.alternatives:
            row = k + 1 + draft.alternatives.index(emitted[0])
            kept.append(row)
            following = (
                logits[row].argmax()
                if probs is None
                else sample(probs[row][None], self.job.generator)
            )
            emitted.append(int(following))
        logprobs = None
        if params.logprobs:
            rows = torch.tensor(kept, device=model.device)
            emitted_t = torch.tensor(emitted, device=model.device)
            logprobs = token_logprobs(
                logits[rows], None if probs is None else probs[rows], emitted_t
            ).tolist()
        return emitted, logprobs, kept, hidden[0, kept]

    def append(self, draft: Draft, kept: list[int], hidden: torch.Tensor) -> None:
        """Keep the cache's rows `kept` of the verify step (the last token's and the accepted
        drafts'); update metrics and the draft length."""
        k, rows = len(draft.token_ids), 1 + len(draft.token_ids) + len(draft.alternatives)
        accepted = len(kept) - 1
        if kept[-1] == accepted:  # a prefix of the rows: the chain's
            if rows > len(kept):
                self.cache.crop(len(kept) - rows)  # drop the rejected drafts' keys and values
        else:  # an alternative's branch: its row moves up beside the last token's
            self.cache.keep_new(rows, kept)
        if self.proposer.needs_hidden:
            self.proposer.observe(hidden)  # [accepted + 1, hidden]
        if k:
            self.metrics.verify_steps += 1
            self.metrics.drafts_proposed += rows - 1
            self.metrics.drafts_accepted += accepted
            if self.adaptive:
                self.k = min(self.k + 2, self.max_k) if accepted == k else max(self.k - 1, 1)

    def add(self, emitted: list[int], logprobs: list[float] | None) -> bool:
        """Record emitted tokens until a stop condition; the rest of the step is discarded."""
        for j, token in enumerate(emitted):
            self.tokens.append(token)
            if self.rule:
                self.rule.advance(token)
            if self.output.add(token, None if logprobs is None else logprobs[j]):
                return True
        return False


def _grammar(request: Request, model: LoadedModel) -> ToolGrammar | None:
    """The tool-call grammar of a chat request's tools, built once per tool set and weights."""
    if not request.tools or not request.constrain_tool_calls:
        return None
    key = json.dumps(request.tools, sort_keys=True)
    if key not in model.grammars:
        if len(model.grammars) >= MAX_GRAMMARS:  # clients may send many tool sets: oldest out
            model.grammars.pop(next(iter(model.grammars)))
        model.grammars[key] = ToolGrammar.build(model.tokenizer, model.token_bytes, request.tools)
    return model.grammars[key]


def _deltas(outputs) -> Generator[Delta, None, None]:
    for output in outputs:
        delta = output.delta()
        if delta is not None:
            yield delta


def _finish(outputs: list[SampleOutput], reason) -> Generator[Delta, None, None]:
    for output in outputs:
        output.finish(reason)
    yield from _deltas(outputs)
