"""Tool calls that always parse: decoding constrained by the chat format's call grammar.

A small model sometimes writes a call the parser must refuse: a `replace` with no `search`
before it, a tool or argument name that does not exist, a call closed before its required
arguments, a turn that ends inside a call. The harness answers such a turn with an error and
the step is lost. Here the engine masks, at each position, the tokens that would break the
grammar of agent/chat_format.py, so the model writes the most likely *valid* continuation:

    TURN  := TEXT (CALL TEXT)*
    CALL  := <tool_call> NAME "\\n" (<|arg|> KEY "\\n" VALUE)* </tool_call>
    NAME  := one of the request's tools
    KEY   := one of that tool's parameters, each once; `hunks` as `search` then `replace` pairs
    VALUE := any text without the format's markers

Only the structure is constrained: names, keys, markers. Values (code) are free, and so is the
text outside calls. Positions inside a name or key allow the tokens that keep the text a prefix
of a valid `NAME\\n` / `KEY\\n`; other positions only ban a few special tokens. The vLLM
backend's structured outputs (xgrammar) are the equivalent there; this module serves the local
backend.

    grammar = ToolGrammar.build(tokenizer, tools)   # once per tokenizer and tool set
    state = grammar.start()
    logits = state.constrain(logits)                # [..., vocab], before sampling
    state.advance(token_id)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch

from agent.chat_format import ARG, END, EOS, START, TOOL_CALL, TOOL_CALL_END

HUNKS = "hunks"  # the array argument written as search/replace pairs


@dataclass(frozen=True)
class _Tool:
    keys: frozenset[str]  # parameters written as `<|arg|>KEY` (hunks as search/replace)
    required: frozenset[str]  # keys the call cannot close without (hunks: one whole pair)


class ToolGrammar:
    """The call grammar of one tool set over one tokenizer's vocabulary."""

    def __init__(self, pieces: list[str], special: dict[str, int], tools: dict[str, _Tool]):
        self.pieces = pieces  # text of each token id ("" for special tokens)
        self.special = special  # marker -> token id
        self.tools = tools
        self.names = _lines(tools)
        self.vocab = len(pieces)
        self._prefix_masks: dict[tuple[frozenset[str], str], torch.Tensor] = {}

    @classmethod
    def build(
        cls, tokenizer, token_bytes: list[bytes], tools: list[dict[str, Any]]
    ) -> ToolGrammar | None:
        """The grammar for `tools` (OpenAI-shaped schemas) over the model's vocabulary
        (`token_bytes`: each id's bytes); None when the tokenizer lacks the format's markers
        (a checkpoint in another chat format) or there are no tools."""
        special = {m: tokenizer.convert_tokens_to_ids(m) for m in (TOOL_CALL, TOOL_CALL_END, ARG)}
        special.update({m: tokenizer.convert_tokens_to_ids(m) for m in (END, EOS, START)})
        known = all(  # an unknown marker maps to the unknown token, which is another string
            i is not None and tokenizer.convert_ids_to_tokens(i) == m for m, i in special.items()
        )
        if not tools or not known:
            return None
        specs = {}
        for tool in tools:
            fn = tool.get("function", tool)
            params = fn.get("parameters") or {}
            props = set(params.get("properties") or {})
            required = set(params.get("required") or []) & props
            specs[fn["name"]] = _Tool(frozenset(props), frozenset(required))
        return cls(_pieces(tokenizer, token_bytes), special, specs)

    def start(self) -> GrammarState:
        """The state at the start of an assistant turn (outside any call)."""
        return GrammarState(self)

    def prefix_mask(self, targets: frozenset[str], typed: str, spill: bool) -> torch.Tensor:
        """Token ids whose text extends `typed` toward one of `targets` ([vocab] bool). With
        `spill`, a token may also finish a target and run on: a key's closing newline often
        merges with the value's first characters ("\\n    ") into one token."""
        key = (targets, typed, spill)
        mask = self._prefix_masks.get(key)
        if mask is None:
            wanted = [t[len(typed) :] for t in targets if t.startswith(typed)]
            wanted = [rest for rest in wanted if rest]
            allowed = [
                i
                for i, piece in enumerate(self.pieces)
                if piece
                and any(
                    rest.startswith(piece) or (spill and piece.startswith(rest)) for rest in wanted
                )
            ]
            mask = torch.zeros(self.vocab, dtype=torch.bool)
            mask[allowed] = True
            self._prefix_masks[key] = mask
        return mask


@dataclass
class GrammarState:
    """Where one sample is in the grammar; `constrain` then `advance` at every position."""

    grammar: ToolGrammar
    mode: str = "text"  # text | name | args | key | value
    typed: str = ""  # the name or key written so far (modes name and key)
    tool: str = ""
    given: set[str] = field(default_factory=set)  # keys written in this call
    open_search: bool = False  # a `search` waits for its `replace`

    def copy(self) -> GrammarState:
        new = copy.copy(self)
        new.given = set(self.given)
        return new

    # -- what may come next ------------------------------------------------------------

    def _keys(self) -> set[str]:
        spec = self.grammar.tools[self.tool]
        if self.open_search:
            return {"replace"}
        keys = set(spec.keys - self.given - {HUNKS})
        if HUNKS in spec.keys:
            keys.add("search")
        return keys

    def _can_close(self) -> bool:
        """Every required key written (`hunks` counts once a whole search/replace pair is)."""
        return not self.open_search and not self.grammar.tools[self.tool].required - self.given

    def allowed(self) -> tuple[torch.Tensor | None, list[int]]:
        """(mask of allowed ids or None for all, ids banned on top)."""
        s = self.grammar.special
        if self.mode == "text":
            return None, [s[ARG], s[TOOL_CALL_END]]
        if self.mode == "name":
            return self.grammar.prefix_mask(self.grammar.names, self.typed, spill=False), []
        if self.mode == "key":
            return self.grammar.prefix_mask(_lines(self._keys()), self.typed, spill=True), []
        ids = []
        if self._keys():
            ids.append(s[ARG])
        if self._can_close():
            ids.append(s[TOOL_CALL_END])
        if self.mode == "args":  # right after `NAME\n`: a marker must follow
            mask = torch.zeros(self.grammar.vocab, dtype=torch.bool)
            mask[ids] = True
            return mask, []
        banned = [s[TOOL_CALL], s[END], s[EOS], s[START]]  # mode value
        banned += [i for i in (s[ARG], s[TOOL_CALL_END]) if i not in ids]
        return None, banned

    def constrain(self, logits: torch.Tensor) -> torch.Tensor:
        """A copy of `logits` ([..., vocab]) with the tokens the grammar forbids at -inf."""
        logits = logits.clone()
        self.adjust_(logits)
        return logits

    def adjust_(self, logits: torch.Tensor) -> None:
        """Set the tokens the grammar forbids to -inf in `logits` ([..., vocab]), in place."""
        mask, banned = self.allowed()
        if mask is not None and mask.any():  # none allowed (an unwritable tool set): leave free
            extra = logits.shape[-1] - mask.shape[0]  # the model's padded vocabulary rows
            if extra > 0:
                mask = torch.cat([mask, torch.zeros(extra, dtype=torch.bool)])
            logits.masked_fill_(~mask[: logits.shape[-1]].to(logits.device), float("-inf"))
        if banned:
            logits[..., banned] = float("-inf")

    # -- moving on -----------------------------------------------------------------------

    def advance(self, token: int) -> None:
        s = self.grammar.special
        piece = self.grammar.pieces[token] if 0 <= token < self.grammar.vocab else ""
        if self.mode == "text":
            if token == s[TOOL_CALL]:
                self.mode, self.typed = "name", ""
        elif self.mode == "name":
            self.typed += piece
            if self.typed.endswith("\n") and self.typed[:-1] in self.grammar.tools:
                self.tool, self.mode = self.typed[:-1], "args"
                self.given, self.open_search = set(), False
        elif self.mode == "key":
            self.typed += piece
            if "\n" in self.typed:  # the rest of the token, if any, starts the value
                key = self.typed.partition("\n")[0]
                self.mode = "value"
                if key == "search":
                    self.open_search = True
                elif key == "replace":
                    self.open_search = False
                    self.given.add(HUNKS)
                else:
                    self.given.add(key)
        elif token == s[ARG]:  # modes args and value
            self.mode, self.typed = "key", ""
        elif token == s[TOOL_CALL_END]:
            self.mode, self.tool = "text", ""


def _lines(names) -> frozenset[str]:
    return frozenset(f"{name}\n" for name in names)


def _pieces(tokenizer, token_bytes: list[bytes]) -> list[str]:
    """The text of every token id; "" for special tokens (they never spell a name)."""
    specials = set(tokenizer.all_special_ids) | set(
        getattr(tokenizer, "added_tokens_decoder", {}) or {}
    )
    return [
        "" if i in specials else raw.decode("utf-8", errors="replace")
        for i, raw in enumerate(token_bytes)
    ]
