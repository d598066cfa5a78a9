"""What a caller asks the engine for, and what it gets back.

Vocabulary (used throughout `agent/engine`):
- *request*: one prompt (text, token ids, or chat messages) plus `SamplingParams`; it produces
  `n` *samples*, each a `Completion`.
- *speculation*: optional text the caller expects the output to resemble (the original file of an
  apply/rewrite request). Proposers may draft from it; it never changes what is sampled.
- *draft tokens* are proposed cheaply; a *verify step* runs the target model once over them and
  keeps the *accepted* prefix, then one *recovered* token (on a rejection) or one *bonus* token
  (when every draft was accepted). See `local/rejection_sampler.py`.

All errors a caller can cause raise `BadRequest` with a message that names the problem and the
fix; the engine never hangs or dies on them.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

# Lanes of the model's forward passes (`Request.priority`), most urgent first: an editor waiting on
# a keystroke (inline completion); an editor's work done ahead of need (a next edit: it must never
# hold up the ghost text of the next keystroke, which within one lane it would, first come first
# served); an agent turn; RL rollouts and benchmarks. scheduler.py serves them in this order.
LANES = ("interactive", "prefetch", "normal", "background")


class EngineError(Exception):
    """An error inside the engine or its backend (model failed to load, server unreachable)."""


class BadRequest(EngineError, ValueError):
    """The request itself is invalid (bad sampling settings, empty or too-long prompt, ...)."""


class Cancelled(EngineError):
    """A backend could not finish cancelling cleanly. A request whose cancel event is set normally
    ends with `finish_reason="cancelled"` instead of raising."""


FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass
class SamplingParams:
    max_tokens: int = 256  # tokens to generate per sample, at most
    temperature: float = 1.0  # 0 means greedy (argmax)
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    seed: int | None = None  # same seed + same request -> same samples
    stop: list[str] = field(default_factory=list)  # stop strings (not included in the output)
    # stop strings count only where they begin at this character of the output or later: a
    # token-healed prompt's output starts with text the prompt left out, which may hold one
    stop_after: int = 0
    stop_token_ids: list[int] = field(default_factory=list)  # besides the model's own EOS
    n: int = 1  # samples per prompt, decoded together in one batch
    logprobs: bool = True  # report the log-probability of every sampled token

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise BadRequest(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise BadRequest(f"temperature must be >= 0 (0 is greedy), got {self.temperature!r}")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise BadRequest(f"top_p must be in (0, 1], got {self.top_p!r}; use 1 to disable it")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise BadRequest(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        if not isinstance(self.n, int) or not 1 <= self.n <= 64:
            raise BadRequest(f"n must be an integer between 1 and 64, got {self.n!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise BadRequest("stop strings must be non-empty strings")
        if not isinstance(self.stop_after, int) or self.stop_after < 0:
            raise BadRequest(f"stop_after must be an integer >= 0, got {self.stop_after!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Request:
    """One generation request. Exactly one of `prompt` or `messages` is set."""

    prompt: str | list[int] | None = None  # raw text or token ids
    messages: list[dict[str, Any]] | None = None  # chat messages (OpenAI shape, with tool_calls)
    tools: list[dict[str, Any]] | None = None  # tool schemas offered to the model (chat only)
    params: SamplingParams = field(default_factory=SamplingParams)
    speculation: str | None = None  # text the output is expected to resemble (apply/rewrite)
    cancel: threading.Event | None = None  # set it from any thread to stop within one step
    request_id: str | None = None
    # Lane for the model's forward passes (`LANES`, agent/engine/scheduler.py): "interactive" (an editor
    # waiting), "prefetch" (an editor's next edit), "normal" (an agent turn), "background" (RL
    # rollouts, benchmarks).
    priority: str = "normal"
    # Chat with tools: mask tokens that would break a tool call's grammar, so every call parses
    # (agent/engine/local/tool_grammar.py; local backend).
    constrain_tool_calls: bool = True
    # A fast-apply request (agent/chat_format.py `apply_messages`): decoded by the model's
    # fast-apply adapter where its folder has one (agent/model.py APPLY_DIR; local backend).
    apply: bool = False

    def __post_init__(self) -> None:
        if self.priority not in LANES:
            raise BadRequest(
                f"unknown priority {self.priority!r}; expected one of {', '.join(LANES)}"
            )
        if (self.prompt is None) == (self.messages is None):
            raise BadRequest("a request needs exactly one of `prompt` or `messages`")
        if self.messages is not None and not self.messages:
            raise BadRequest("`messages` is empty: send at least one user message")
        if self.prompt is not None and len(self.prompt) == 0:
            raise BadRequest("the prompt is empty: send at least one token of text")

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()


@dataclass
class RequestMetrics:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt's, read from the prefix cache instead of prefilled
    output_tokens: int = 0  # summed over the n samples
    ttft_s: float = 0.0  # time to first token
    total_s: float = 0.0
    drafts_proposed: int = 0  # draft tokens offered to the verifier
    drafts_accepted: int = 0  # draft tokens the verifier kept
    verify_steps: int = 0  # target-model forward passes over drafts (0 without speculation)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.drafts_accepted / self.drafts_proposed if self.drafts_proposed else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verify step: accepted drafts plus the recovered/bonus token."""
        if not self.verify_steps:
            return 0.0
        return (self.drafts_accepted + self.verify_steps) / self.verify_steps

    def as_dict(self) -> dict[str, float]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens,
            "ttft_s": self.ttft_s,
            "total_s": self.total_s,
            "tokens_per_s": self.tokens_per_s,
            "drafts_proposed": self.drafts_proposed,
            "drafts_accepted": self.drafts_accepted,
            "verify_steps": self.verify_steps,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
        }


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass
class Completion:
    """One sample of a request."""

    text: str  # decoded output, stop string removed
    token_ids: list[int]  # sampled token ids (what RL trains on)
    logprobs: list[float] | None  # log p(token) under the sampling distribution, one per token
    finish_reason: FinishReason
    index: int = 0  # which of the n samples
    tool_calls: list[ToolCall] = field(default_factory=list)  # parsed, for chat requests
    tool_call_errors: list[str] = field(default_factory=list)  # malformed calls, for the harness
    model_version: str = ""  # which weights produced it


@dataclass
class Result:
    completions: list[Completion]
    metrics: RequestMetrics


@dataclass
class Delta:
    """A streamed piece of one sample's output."""

    index: int  # sample index
    text: str  # new text since the previous delta of this sample (may be "")
    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason | None = None  # set on the last delta of a sample
