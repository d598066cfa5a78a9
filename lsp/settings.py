"""The language server's settings: one nested dataclass per concern, each field commented.

Where they come from, later wins:
  1. the defaults below,
  2. `flywheel lsp` flags (`--model`, `--consent`, `--db`),
  3. the client's `initializationOptions` (the same nesting as here, camelCase or snake_case),
  4. `workspace/configuration` for the section "flywheel" (asked after `initialized` and on every
     `workspace/didChangeConfiguration`).

    {"model": {"name": "/path/to/checkpoint"}, "telemetry": {"consent": "metrics"},
     "completion": {"debounceMs": 50}, "agent": {"approval": "edits"}}

What it does not do: read the environment or files (the CLI does), or apply a setting (the server
does). `parse_settings` never raises on user input: an unknown key or a value of the wrong type is
skipped and named in the returned warnings, which the server shows once.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_type_hints

from agent.engine.config import DType
from telemetry.privacy import CONSENT_LEVELS, DEFAULT_EXCLUDE

APPROVAL_POLICIES = ("always", "edits", "never")


@dataclass
class ModelSettings:
    name: str = "default"  # "default" (the starter model), a checkpoint folder, or an http(s) URL
    backend: Literal["auto", "local", "vllm", "openai"] = "auto"  # auto: URL -> openai, else local
    device: str = "cpu"  # torch device for the local backend
    # local engine drafts (lossless); auto: n-gram plus MTP heads for a local model with heads,
    # n-gram for one without, none for a server
    speculative: Literal["auto", "none", "ngram", "mtp", "ngram+mtp"] = "auto"
    # weights; auto: int8 copies for decoding with the local engine on a CPU, else float32
    dtype: Literal["auto", DType] = "auto"  # DType: agent/engine/config.py's list


@dataclass
class CompletionSettings:
    enabled: bool = True  # answer textDocument/inlineCompletion and textDocument/completion
    debounce_ms: int = 30  # wait this long after an automatic trigger; a newer request cancels it
    max_tokens: int = 48  # tokens generated per suggestion, at most
    temperature: float = 0.0  # 0 is greedy: the same context gives the same suggestion
    seed: int = -1  # >= 0: a fixed sampling seed (reproducible sampling); -1: none
    max_prefix_chars: int = 4000  # text before the cursor put in the prompt
    max_suffix_chars: int = 300  # text after the cursor put in the prompt: recomputed on every
    # keystroke (it follows the typed text); benchmarks/completion_suffix.py weighs it
    max_neighbour_chars: int = 1000  # text from other open files of the same language
    prompt_style: str = "fim"  # "fim": prefix and suffix with the fill-in-the-middle tokens and
    # the other open files as repository context (Qwen2.5-Coder); "prefix": the text before the
    # cursor (any causal model)
    cache_size: int = 64  # suggestions kept for repeated or typed-through contexts
    cache_ttl_s: float = 60.0  # how long a cached suggestion stays usable
    multiline: str = "auto"  # "auto": a suggestion spans lines only where a block starts (after
    # a block opener, or on an empty line below one), else it ends with its line; "always":
    # lines never end it

    def __post_init__(self) -> None:
        if self.multiline not in ("auto", "always"):
            raise ValueError("completion.multiline must be 'auto' or 'always'")
        for name in ("debounce_ms", "max_prefix_chars", "max_suffix_chars", "max_neighbour_chars"):
            if getattr(self, name) < 0:
                raise ValueError(f"completion.{name} must be >= 0")
        if self.max_tokens < 1:
            raise ValueError("completion.maxTokens must be >= 1")
        if self.temperature < 0:
            raise ValueError("completion.temperature must be >= 0 (0 is greedy)")
        if self.prompt_style not in ("prefix", "fim"):
            raise ValueError("completion.promptStyle must be 'prefix' or 'fim'")


@dataclass
class NextEditSettings:
    enabled: bool = True  # answer flywheel/nextEdit
    max_tokens: int = 256  # tokens generated for the rewritten region, at most
    temperature: float = 0.0  # 0 is greedy
    seed: int = -1  # >= 0: a fixed sampling seed; -1: none
    context_lines: int = 6  # lines above and below the last edit (and the cursor) in the region
    recent_edits: int = 6  # the user's latest edits shown to the model
    max_prompt_chars: int = 8000  # the prompt, at most: old edits are cut, then dropped
    max_wall_ms: int = 5000  # a request still running after this is stopped (no next edit)

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.recent_edits < 1:
            raise ValueError("nextEdit.maxTokens and nextEdit.recentEdits must be >= 1")
        if self.max_prompt_chars < 256 or self.max_wall_ms < 1:
            raise ValueError("nextEdit.maxPromptChars must be >= 256 and maxWallMs >= 1")
        if self.context_lines < 0 or self.temperature < 0:
            raise ValueError("nextEdit.contextLines and nextEdit.temperature must be >= 0")


@dataclass
class TelemetrySettings:
    consent: str = "code"  # off (nothing written) | metrics (no code) | code (everything)
    exclude: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDE))  # never store code
    db_path: str = ""  # SQLite file; empty: the CLI's default (FLYWHEEL_DB or the XDG data folder)

    def __post_init__(self) -> None:
        if self.consent not in CONSENT_LEVELS:
            raise ValueError(f"telemetry.consent must be one of {', '.join(CONSENT_LEVELS)}")


@dataclass
class AgentSettings:
    # when the agent asks first (window/showMessageRequest): always: before every write, edit,
    # delete and command | edits: before deletes, protected paths (.git/, .env*, keys) and
    # commands outside the sandbox (edits are reviewed hunk by hunk anyway) | never
    approval: str = "edits"
    max_steps: int = 12  # model turns per task
    max_tokens: int = 512  # tokens per model turn
    followup_window_s: float = 120.0  # asking again this soon after a task marks it dissatisfying
    approval_timeout_s: float = 600.0  # an unanswered approval request is denied after this
    read_only_paths: list[str] = field(default_factory=list)  # folders agent commands may read
    # besides the system, the interpreters and the workspace (absolute, or ~/...)
    allow_unconfined: bool = False  # without bubblewrap: run commands unconfined, after approval

    def __post_init__(self) -> None:
        if self.approval not in APPROVAL_POLICIES:
            raise ValueError(f"agent.approval must be one of {', '.join(APPROVAL_POLICIES)}")
        if self.max_steps < 1 or self.max_tokens < 1:
            raise ValueError("agent.maxSteps and agent.maxTokens must be >= 1")
        if not self.approval_timeout_s > 0:
            raise ValueError("agent.approvalTimeoutS must be > 0")
        if not all(os.path.isabs(os.path.expanduser(p)) for p in self.read_only_paths):
            raise ValueError("agent.readOnlyPaths must be absolute paths (or start with ~/)")


@dataclass
class Settings:
    model: ModelSettings = field(default_factory=ModelSettings)
    completion: CompletionSettings = field(default_factory=CompletionSettings)
    next_edit: NextEditSettings = field(default_factory=NextEditSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    agent: AgentSettings = field(default_factory=AgentSettings)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def _coerce(value: Any, hint: Any) -> Any:
    """Return `value` if it fits the type hint (ints accepted for floats), else raise TypeError."""
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
    elif getattr(hint, "__origin__", None) is list:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif getattr(hint, "__origin__", None) is Literal:
        ok = value in get_args(hint)
    else:
        ok = False
    if not ok:
        raise TypeError(f"expected {getattr(hint, '__name__', hint)}, got {value!r}")
    return value


def _merge(obj: Any, data: Any, prefix: str, warnings: list[str], defaults: Any = None) -> Any:
    """`data` over `obj`; a `null` value puts that setting back to its value in `defaults` (the
    server's own settings: flags, file), the way a client says "unset"."""
    if not isinstance(data, dict):
        warnings.append(f"setting {prefix or 'flywheel'} must be an object; ignored")
        return obj
    hints = get_type_hints(type(obj))
    changes: dict[str, Any] = {}
    for key, value in data.items():
        name = _snake(str(key))
        path = f"{prefix}{key}"
        if name not in hints:
            warnings.append(f"unknown setting {path!r}; ignored")
            continue
        current = getattr(obj, name)
        default = getattr(defaults, name) if defaults is not None else current
        if value is None:
            changes[name] = default
            continue
        if dataclasses.is_dataclass(current):
            changes[name] = _merge(current, value, path + ".", warnings, default)
            continue
        try:
            changes[name] = _coerce(value, hints[name])
        except TypeError as exc:
            warnings.append(f"setting {path!r}: {exc}; kept {current!r}")
    try:
        return dataclasses.replace(obj, **changes)
    except ValueError as exc:
        warnings.append(f"{exc}; kept the previous {prefix.rstrip('.') or 'settings'}")
        return obj


def parse_settings(
    data: Any, base: Settings | None = None, defaults: Settings | None = None
) -> tuple[Settings, list[str]]:
    """Overlay a client's settings object on `base`; return the result and what was ignored.
    A `null` setting takes its value from `defaults` (default: `base`)."""
    warnings: list[str] = []
    if data is None:
        return base or Settings(), warnings
    return _merge(base or Settings(), data, "", warnings, defaults), warnings
