"""Tokenizer and chat format: byte round-trips, special tokens, the chat template, tool-call parsing."""

from __future__ import annotations

import json
import random

import pytest

from agent.chat_format import (
    END,
    FIM_MIDDLE,
    FIM_PREFIX,
    FIM_SUFFIX,
    SPECIAL_TOKENS,
    assistant_spans,
    parse_assistant,
    render_chat,
    render_fim,
    tool_calls_to_openai,
)
from agent.harness.prompts import tool_schemas
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


EDIT = {
    "path": "a.py",
    "hunks": [{"search": '    s = "\\"quoted\\""\n', "replace": "    return a + b\n"}],
}


def conversation() -> list[dict]:
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Fix a.py."},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "edit_file", "arguments": json.dumps(EDIT)},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {
                        "name": "read_file",
                        "arguments": {"path": "a.py", "start_line": 3},
                    },
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.py: 1 of 1 hunks applied"},
        {"role": "assistant", "content": "Done."},
    ]


def test_chat_template_renders_every_role_and_raw_tool_calls(tokenizer):
    text = render_chat(tokenizer, conversation(), tool_schemas())
    assert text.startswith("<|im_start|>system\nBe brief.\n# Tools\n- list_files(path?): ")
    assert "- edit_file(path, search, replace): " in text
    assert "<|im_start|>user\nFix a.py.<|im_end|>\n" in text
    assert (
        "<|im_start|>assistant\nLooking.\n<tool_call>edit_file\n<|arg|>path\na.py\n"
        '<|arg|>search\n    s = "\\"quoted\\""\n\n<|arg|>replace\n    return a + b\n\n'
        "</tool_call>\n<tool_call>read_file\n<|arg|>path\na.py\n<|arg|>start_line\n3\n"
        "</tool_call><|im_end|>\n" in text
    ), text
    assert "<|im_start|>tool\na.py: 1 of 1 hunks applied<|im_end|>\n" in text
    # What the model writes back parses into the same calls, code unescaped, types restored.
    body = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    content, calls, errors = parse_assistant(body, tool_schemas())
    assert (content, errors) == ("Looking.", [])
    assert [(c.name, c.arguments) for c in calls] == [
        ("edit_file", EDIT),
        ("read_file", {"path": "a.py", "start_line": 3}),
    ]


def test_training_and_inference_render_the_same_bytes(tokenizer):
    """Every assistant turn, rendered for training, is the inference prompt plus what the model
    writes: the generation prompt and the turn must meet byte for byte."""
    messages = conversation()
    full = render_chat(tokenizer, messages, tool_schemas())
    spans = assistant_spans(full)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(spans) == len(turns) == 2
    for (start, end), index in zip(spans, turns, strict=True):
        prompt = render_chat(tokenizer, messages[:index], tool_schemas(), True)
        assert full[:start] == prompt
        assert full[end - len(END) : end] == END
    ids = tokenizer.encode(full, add_special_tokens=False)
    prompt = render_chat(tokenizer, messages[:2], tool_schemas(), True)
    assert ids[: len(tokenizer.encode(prompt, add_special_tokens=False))] == tokenizer.encode(
        prompt, add_special_tokens=False
    )


def test_tools_without_system_message_get_a_system_turn(tokenizer):
    tools = [{"name": "ls", "description": "List.", "parameters": {"properties": {"p": {}}}}]
    text = render_chat(tokenizer, [{"role": "user", "content": "hi"}], tools)
    assert text == (
        "<|im_start|>system\n# Tools\n- ls(p?): List.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    )


@pytest.mark.parametrize(
    "text, error",
    [
        ("<tool_call>\n<|arg|>path\na</tool_call>", "name on its own line"),
        ("<tool_call>two words\n</tool_call>", "name on its own line"),
        ("<tool_call>ls\n<|arg|>p\n1\n<|arg|>p\n2\n</tool_call>", "given twice"),
        ("<tool_call>edit_file\n<|arg|>search\nx\n</tool_call>", "no `replace`"),
        ("<tool_call>edit_file\n<|arg|>replace\nx\n</tool_call>", "follows its own"),
        ("<tool_call>ls\n<|arg|>path\n.", "not closed"),
    ],
)
def test_malformed_tool_calls_become_errors(text, error):
    content, calls, errors = parse_assistant("before " + text)
    assert calls == [] and len(errors) == 1 and error in errors[0]
    assert content == "before"


def test_several_calls_and_typed_arguments():
    text = (
        "<tool_call>run_command\n<|arg|>command\nls -la\n<|arg|>timeout_s\n2.5\n</tool_call>"
        "mid<tool_call>list_files\n</tool_call><|im_end|>"
    )
    content, calls, errors = parse_assistant(text, tool_schemas())
    assert [c.name for c in calls] == ["run_command", "list_files"]
    assert calls[0].arguments == {"command": "ls -la", "timeout_s": 2.5}
    assert content == "mid" and not errors
    wire = tool_calls_to_openai(calls)
    assert json.loads(wire[0]["function"]["arguments"]) == calls[0].arguments
    # Without schemas, or when a value does not convert, the text stays text.
    assert parse_assistant(text)[1][0].arguments["timeout_s"] == "2.5"
    bad = "<tool_call>read_file\n<|arg|>path\na\n<|arg|>start_line\nten\n</tool_call>"
    assert parse_assistant(bad, tool_schemas())[1][0].arguments["start_line"] == "ten"


def test_empty_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no readable source files"):
        train_tokenizer(iter_source_texts(tmp_path), vocab_size=512)
