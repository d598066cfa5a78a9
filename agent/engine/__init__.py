"""The inference engine: one small interface, three backends.

    from agent.engine import EngineConfig, Request, SamplingParams, open_engine
    engine = open_engine(EngineConfig(model="path/to/checkpoint"))
    result = engine.generate(Request(prompt="def add(a, b):", params=SamplingParams(temperature=0)))
    print(result.completions[0].text, result.metrics.tokens_per_s)

Backends (`EngineConfig.backend`):
- `local` (`local/`): torch, KV cache, lossless speculative decoding (ngram | mtp | draft).
- `vllm` (`backends/vllm.py`): vLLM in-process, passing a `speculative_config`.
- `openai` (`backends/openai.py`): any OpenAI-compatible server, streaming, tool calls.

Every backend implements `Engine`; callers (the harness, the language server, RL rollouts,
`flywheel serve`) depend only on this module and `request.py`.

What sits here, shared by the backends: `config.py` (EngineConfig), `request.py` (requests,
results, lanes), `prompt.py` (a request's prompt as token ids), `sample_output.py` (tokens to
text, stop conditions), `scheduler.py` (lanes and sessions: who runs the next step), and
`generate.py` (`flywheel generate`).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Protocol, runtime_checkable

from agent.engine.config import EngineConfig, SpeculativeConfig
from agent.engine.request import (
    BadRequest,
    Cancelled,
    Completion,
    Delta,
    EngineError,
    Request,
    RequestMetrics,
    Result,
    SamplingParams,
    ToolCall,
)

__all__ = [
    "BadRequest",
    "Cancelled",
    "Completion",
    "Delta",
    "Engine",
    "EngineConfig",
    "EngineError",
    "Request",
    "RequestMetrics",
    "Result",
    "SamplingParams",
    "SpeculativeConfig",
    "Stream",
    "ToolCall",
    "open_engine",
]


class Stream(Iterator[Delta]):
    """Deltas of a running request; `result` holds the full `Result` once iteration ends."""

    def __init__(self, deltas: Generator[Delta, None, Result]) -> None:
        self._deltas = deltas
        self.result: Result | None = None

    def __next__(self) -> Delta:
        try:
            return next(self._deltas)
        except StopIteration as stop:
            self.result = stop.value
            raise

    def finish(self) -> Result:
        """Run to the end and return the whole result (what `Engine.generate` does)."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def close(self) -> None:
        self._deltas.close()


@runtime_checkable
class Engine(Protocol):
    """What every backend provides. Thread-safe: requests may run concurrently."""

    @property
    def model_version(self) -> str:
        """Identifies the weights that new requests will use."""
        ...

    @property
    def context_length(self) -> int:
        """Longest prompt + output the model accepts, in tokens."""
        ...

    @property
    def show_min_confidence(self) -> float | None:
        """The served model's confidence threshold for inline suggestions (agent/confidence.py);
        None: show every suggestion."""
        ...

    def generate(self, request: Request) -> Result:
        """Run a request to the end (all n samples) and return every sample with metrics."""
        ...

    def stream(self, request: Request) -> Stream:
        """Run a request, yielding output pieces as they are decoded."""
        ...

    def swap(self, model: str) -> str:
        """Load other weights; running requests finish on the old ones. Returns the new version."""
        ...

    def close(self) -> None: ...


def open_engine(config: EngineConfig | None = None) -> Engine:
    """Start the backend `config` asks for."""
    config = config or EngineConfig()
    if config.backend == "local":
        from agent.engine.local.engine import LocalEngine

        return LocalEngine(config)
    if config.backend == "openai":
        from agent.engine.backends.openai import OpenAIEngine

        return OpenAIEngine(config)
    if config.backend == "vllm":
        from agent.engine.backends.vllm import VLLMEngine

        return VLLMEngine(config)
    raise BadRequest(f"unknown backend {config.backend!r}; use local, vllm or openai")
