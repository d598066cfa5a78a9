"""Constrained tool calls: every valid call stays possible, broken ones become impossible."""

from __future__ import annotations

import torch

from agent.chat_format import ARG, END, TOOL_CALL, TOOL_CALL_END, parse_assistant, render_chat
from agent.engine import EngineConfig, Request, SamplingParams, SpeculativeConfig, open_engine
from agent.engine.local.model_runner import LoadedModel
from agent.engine.local.tool_grammar import ToolGrammar
from agent.harness.prompts import tool_schemas

TOOLS = tool_schemas()


def _grammar(checkpoint) -> tuple[ToolGrammar, LoadedModel]:
    model = LoadedModel.load(str(checkpoint))
    grammar = ToolGrammar.build(model.tokenizer, model.token_bytes, TOOLS)
    assert grammar is not None
    return grammar, model


def _assistant_ids(tokenizer, calls: list[dict], content: str = "") -> list[int]:
    """The token ids of one assistant turn as the chat template renders it."""
    message = {"role": "assistant", "content": content, "tool_calls": calls}
    before = render_chat(tokenizer, [{"role": "user", "content": "x"}], TOOLS, True)
    text = render_chat(tokenizer, [{"role": "user", "content": "x"}, message], TOOLS)
    assert text.startswith(before)
    return tokenizer.encode(text[len(before) :], add_special_tokens=False)


def _fn(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_every_valid_call_is_allowed_token_by_token(tiny_checkpoint):
    grammar, model = _grammar(tiny_checkpoint)
    turns = [
        [_fn("list_files")],
        [_fn("read_file", path="calc.py", start_line=3, end_line=9)],
        [
            _fn(
                "edit_file",
                path="calc.py",
                hunks=[
                    {"search": "    return a - b\n", "replace": "    return a + b\n"},
                    {"search": "X = 1", "replace": "X = 2"},
                ],
            ),
            _fn("run_tests"),
        ],
        [_fn("search", pattern=r"\bfoo\b")],
    ]
    for calls in turns:
        state = grammar.start()
        for token in _assistant_ids(model.tokenizer, calls, "Let me look."):
            logits = torch.zeros(model.vocab_size)
            assert state.constrain(logits)[token] == 0, (calls, token)
            state.advance(token)
        assert state.mode == "text"


def _allowed_after(grammar, model, text: str) -> torch.Tensor:
    state = grammar.start()
    for token in model.tokenizer.encode(text, add_special_tokens=False):
        state.advance(token)
    return state.constrain(torch.zeros(model.vocab_size)) == 0


def test_broken_structure_is_masked(tiny_checkpoint):
    grammar, model = _grammar(tiny_checkpoint)
    ids = model.tokenizer.convert_tokens_to_ids
    # outside a call: no argument marker or call end
    allowed = _allowed_after(grammar, model, "Let me look.")
    assert not allowed[ids(ARG)] and not allowed[ids(TOOL_CALL_END)] and allowed[ids(END)]
    # a search waits for its replace: no call end, no turn end; the next key is `replace`
    head = f"{TOOL_CALL}edit_file\n{ARG}path\na.py\n{ARG}search\nx = 1\n"
    allowed = _allowed_after(grammar, model, head)
    assert not allowed[ids(TOOL_CALL_END)] and not allowed[ids(END)] and allowed[ids(ARG)]
    allowed = _allowed_after(grammar, model, head + ARG)
    first = model.tokenizer.encode("replace", add_special_tokens=False)[0]
    wrong = model.tokenizer.encode("search", add_special_tokens=False)[0]
    assert allowed[first] and not allowed[wrong]
    # no unknown tool names; a required argument (read_file's path) before the call closes
    allowed = _allowed_after(grammar, model, TOOL_CALL)
    assert not allowed[model.tokenizer.encode("x", add_special_tokens=False)[0]]
    allowed = _allowed_after(grammar, model, f"{TOOL_CALL}read_file\n")
    assert allowed[ids(ARG)] and not allowed[ids(TOOL_CALL_END)]


def _marker_loving(engine, tokenizer, bias: float = 30.0):
    """Make the engine's model favour the call markers at every position (a hostile model)."""
    model = engine._model
    markers = tokenizer.convert_tokens_to_ids([TOOL_CALL, TOOL_CALL_END, ARG])
    forward_parts = model.forward_parts

    def biased(parts):
        results = []
        for logits, hidden in forward_parts(parts):
            logits = logits.clone()
            logits[..., markers] += bias
            results.append((logits, hidden))
        return results

    model.forward_parts = biased


def _turn(engine, constrain: bool) -> tuple[list, list[str]]:
    request = Request(
        messages=[{"role": "user", "content": "fix calc.py"}],
        tools=TOOLS,
        params=SamplingParams(max_tokens=120, temperature=0),
        constrain_tool_calls=constrain,
    )
    completion = engine.generate(request).completions[0]
    _, calls, errors = parse_assistant(completion.text, TOOLS)
    return calls, errors


def test_a_model_that_writes_broken_calls_writes_valid_ones_when_constrained(tiny_checkpoint):
    for spec in ("none", "ngram"):
        engine = open_engine(
            EngineConfig(model=str(tiny_checkpoint), speculative=SpeculativeConfig(spec))
        )
        _marker_loving(engine, engine._model.tokenizer)
        _, errors = _turn(engine, constrain=False)
        assert errors  # markers in the wrong places: the parser refuses the turn
        calls, errors = _turn(engine, constrain=True)
        assert calls, spec
        # the only possible error left: the output's token budget ran out inside a call
        assert all(e.startswith(f"tool call not closed with {TOOL_CALL_END}") for e in errors)
        names = {t["function"]["name"] for t in TOOLS}
        assert {c.name for c in calls} <= names
        engine.close()
