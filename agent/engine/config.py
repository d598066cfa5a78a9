"""How an engine is set up: which model, which backend, how it speculates.

One dataclass per concern, each field commented, checked in `__post_init__`. Command-line flags
(`flywheel serve`, `flywheel generate`, `flywheel bench engine`) map straight onto these fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

from agent.engine.request import BadRequest

# "ngram+mtp": prompt lookup where the output repeats its context, the MTP heads elsewhere
SpecMethod = Literal["none", "ngram", "mtp", "ngram+mtp", "draft"]
SPEC_METHODS: tuple[str, ...] = get_args(SpecMethod)  # what --speculative offers
# the engine's precisions; local/lowbit.py's docstring has a table of what each does
DType = Literal["float32", "bfloat16", "float16", "int8", "int4"]
DTYPES: tuple[str, ...] = get_args(DType)  # what --dtype offers
LOWBIT_DTYPES = ("int8", "int4")  # float32 plus low-bit copies for decoding (local/lowbit.py)
DRAFT_ALTERNATIVES = 1  # SpeculativeConfig's default
MAX_ALTERNATIVES = 8  # SpeculativeConfig.draft_alternatives: rows a verify step adds for them
APPLY_COPY_BIAS = 5.0  # fast apply's logit bonus for copying (local/copy_bias.py), in logits


@dataclass
class SpeculativeConfig:
    method: SpecMethod = "none"  # where draft tokens come from
    num_draft_tokens: int = 4  # draft length per verify step (the start value when adaptive)
    adaptive: bool = True  # grow/shrink the draft length with the recent acceptance rate
    max_draft_tokens: int = 8  # upper bound for the adaptive draft length
    ngram_max: int = 4  # longest suffix n-gram matched by prompt lookup
    ngram_min: int = 1  # shortest suffix n-gram matched by prompt lookup
    draft_model: str | None = None  # checkpoint folder of the draft model (method "draft")
    # MTP: the first head's next best tokens, verified beside its draft as one-token branches
    # (a tree of drafts) where the engine's own attention kernels run the model; 0: a chain
    draft_alternatives: int = DRAFT_ALTERNATIVES

    @property
    def uses_heads(self) -> bool:
        """Whether this method drafts with the checkpoint's MTP heads."""
        return self.method in ("mtp", "ngram+mtp")

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise BadRequest(
                f"unknown speculative method {self.method!r}; use {', '.join(SPEC_METHODS)}"
            )
        if not 1 <= self.num_draft_tokens <= self.max_draft_tokens:
            raise BadRequest(
                f"num_draft_tokens must be in [1, max_draft_tokens={self.max_draft_tokens}], "
                f"got {self.num_draft_tokens}"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise BadRequest("need 1 <= ngram_min <= ngram_max")
        if not 0 <= self.draft_alternatives <= MAX_ALTERNATIVES:
            raise BadRequest(
                f"draft_alternatives must be in [0, {MAX_ALTERNATIVES}], "
                f"got {self.draft_alternatives}"
            )
        if self.method == "draft" and not self.draft_model:
            raise BadRequest("speculative method 'draft' needs draft_model=<checkpoint folder>")


@dataclass
class EngineConfig:
    model: str = "default"  # "default" (the starter model), a checkpoint folder, or an http(s) URL
    backend: Literal["auto", "local", "vllm", "openai"] = "auto"  # auto: URL -> openai, else local
    device: str = "cpu"  # torch device for the local backend
    # weights; "int8", "int4": float32 plus int8 or int4 copies used for decoding (local backend
    # on the CPU, lossy; local/lowbit.py)
    dtype: DType = "float32"
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    api_key: str | None = None  # for the openai backend; None sends no Authorization header
    served_model_name: str | None = None  # model name to ask an OpenAI-compatible server for
    timeout_s: float = 600.0  # per-request timeout for remote backends
    prefix_cache_mb: int = 512  # local backend: memory for cached prompt prefixes; 0 turns it off
    # local backend: run every torch operation (loading included) on one thread the engine owns
    # (scheduler.py). For servers, whose requests come from many threads; a process that runs torch
    # work of its own (training, benchmarks) keeps it off and calls from its own thread.
    own_thread: bool = False
    # local backend: every output the same bits as a cold, unbatched, plain decode of the same
    # request (SGLang's deterministic inference, here). Verify steps compute plain decoding's
    # steps (where cpu_kernels build they do anyway; elsewhere each position attends in a call of
    # its own), and under int8 or int4 every prefill row takes the low-bit product, so a
    # prefix-cache hit computes a cold prefill's bits. Costs cold prefill time; where rows cannot
    # be computed alone (no cpu_kernels, float weights) the prefix cache is off instead. Off: a
    # hit or a chunk boundary can turn a near-tie
    exact: bool = False
    # local backend: the logit bonus of the tokens that continue the original file or the edit
    # sketch in a fast-apply request (local/copy_bias.py); 0 turns it off
    apply_copy_bias: float = APPLY_COPY_BIAS

    def __post_init__(self) -> None:
        if not isinstance(self.prefix_cache_mb, int) or self.prefix_cache_mb < 0:
            raise BadRequest(
                f"prefix_cache_mb must be an integer >= 0, got {self.prefix_cache_mb!r}"
            )
        if not math.isfinite(self.apply_copy_bias) or self.apply_copy_bias < 0:
            raise BadRequest(
                f"apply_copy_bias must be a number >= 0 (0 turns it off), got {self.apply_copy_bias!r}"
            )
        if self.backend == "auto":
            self.backend = "openai" if self.model.startswith(("http://", "https://")) else "local"
        if self.dtype not in DTYPES:
            raise BadRequest(f"unknown dtype {self.dtype!r}; use {', '.join(DTYPES)}")
        on_cpu = self.backend == "local" and self.device.split(":")[0] == "cpu"
        if self.dtype in LOWBIT_DTYPES and not on_cpu:
            raise BadRequest(
                f"dtype {self.dtype} is the local backend's CPU option (CPU {self.dtype} kernels); "
                f"not for backend {self.backend!r} on device {self.device!r}"
            )


def default_speculative(model: str) -> SpecMethod:
    """The drafts a product path uses unless told, all lossless: for the local engine, prompt
    lookup where the output repeats its context (an agent's edits quote the file) and the MTP
    heads elsewhere when the checkpoint has them ("ngram+mtp"), else prompt lookup alone; none
    for a server, which decides that itself."""
    if EngineConfig(model=model).backend != "local":
        return "none"
    from agent.engine.request import EngineError
    from agent.model import checkpoint_folder

    try:
        heads = (checkpoint_folder(model) / "mtp" / "config.json").exists()
    except EngineError:
        heads = False  # the engine names what is wrong with `model` when it loads it
    return "ngram+mtp" if heads else "ngram"


def default_dtype(model: str, backend: str = "auto", device: str = "cpu") -> DType:
    """The weights a product path uses unless told: int8 copies for decoding where they apply
    (the local engine on a CPU; held-out loss and the agent's pass@1 under them are in
    benchmarks/README.md), float32 elsewhere."""
    config = EngineConfig(model=model, backend=backend, device=device)
    return "int8" if config.backend == "local" and device.split(":")[0] == "cpu" else "float32"
