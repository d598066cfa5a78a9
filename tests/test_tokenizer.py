"""Tokenizer and chat format: byte round-trips, special tokens, the chat template, tool-call parsing."""

from __future__ import annotations

import random

import pytest

from agent.chat_format import (
    FIM_MIDDLE,
    FIM_PREFIX,
    FIM_SUFFIX,
    SPECIAL_TOKENS,
    parse_assistant,
    render_fim,
    tool_calls_to_openai,
)
from agent.tokenizer import decode_bytes, encode_bytes, iter_source_texts, train_tokenizer


def test_any_byte_sequence_round_trips(tokenizer):
    rng = random.Random(0)
    samples = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 80))) for _ in range(300)]
    samples += [b"\xff\xfe\x00", b"\xed\xa0\x80", "naïve 日本語 😀".encode(), b"\r\n\t\x00\x7f"]
    for data in samples:
        assert decode_bytes(tokenizer, encode_bytes(tokenizer, data)) == data


def test_text_round_trips_through_plain_encode(tokenizer):
    for text in ["def f(x):\n\treturn x  # é", "  leading spaces", "emoji 😀 and CJK 漢字\r\n", ""]:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_tokens_are_single_ids(tokenizer):
    for token in SPECIAL_TOKENS:
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1, token
        assert tokenizer.convert_ids_to_tokens(ids[0]) == token
    fim = tokenizer.encode(render_fim("a = ", "\nb = 2"))
    names = tokenizer.convert_ids_to_tokens(fim)
    assert names[0] == FIM_PREFIX and FIM_SUFFIX in names and names[-1] == FIM_MIDDLE


def test_chat_template_renders_every_role_and_tool_calls(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "List files."},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "ls", "arguments": '{"path": "."}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    ]
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
    text = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|system|>Be brief.\n# Tools\n")
    assert "<|user|>List files.<|end|>\n" in text
    assert (
        '<|assistant|>Looking.<|tool_call|>{"name": "ls", "arguments": {"path": "."}}<|/tool_call|><|end|>\n'
        in text
    )
    assert "<|tool|>a.py<|end|>\n" in text
    assert text.endswith("<|assistant|>")
    # What the model writes back parses into the same call.
    content, calls, errors = parse_assistant(text.split("<|assistant|>")[1].split("<|end|>")[0])
    assert (content, [c.name for c in calls], calls[0].arguments, errors) == (
        "Looking.",
        ["ls"],
        {"path": "."},
        [],
    )


def test_tools_without_system_message_get_a_system_turn(tokenizer):
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=[{"name": "ls"}], tokenize=False
    )
    assert text == '<|system|># Tools\n{"name": "ls"}<|end|>\n<|user|>hi<|end|>\n'


@pytest.mark.parametrize(
    "text, error",
    [
        ("<|tool_call|>{not json}<|/tool_call|>", "not valid JSON"),
        ('<|tool_call|>{"arguments": {}}<|/tool_call|>', "needs"),
        ('<|tool_call|>{"name": "ls", "arguments": [1]}<|/tool_call|>', "must be a JSON object"),
        ('<|tool_call|>{"name": "ls", "arguments": {}}', "not closed"),
    ],
)
def test_malformed_tool_calls_become_errors(text, error):
    content, calls, errors = parse_assistant("before " + text)
    assert calls == [] and len(errors) == 1 and error in errors[0]
    assert content == "before"


def test_several_calls_and_string_arguments():
    text = (
        '<|tool_call|>{"name": "a", "arguments": "{\\"x\\": 1}"}<|/tool_call|>'
        'mid<|tool_call|>{"name": "b", "arguments": {}}<|/tool_call|><|end|>'
    )
    content, calls, errors = parse_assistant(text)
    assert [c.name for c in calls] == ["a", "b"] and calls[0].arguments == {"x": 1}
    assert content == "mid" and not errors
    wire = tool_calls_to_openai(calls)
    assert wire[0]["function"] == {"name": "a", "arguments": '{"x": 1}'}


def test_empty_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no readable source files"):
        train_tokenizer(iter_source_texts(tmp_path), vocab_size=512)
