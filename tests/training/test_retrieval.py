"""The long-context stage's synthetic retrieval rows (training/retrieval.py)."""

from __future__ import annotations

import re

import numpy as np
import torch

from training.retrieval import add_retrieval_rows, retrieval_row


def test_a_retrieval_row_keeps_its_length_and_ends_with_the_answers_to_the_facts_inside(tokenizer):
    code = tokenizer.encode("def f(x):\n    return x + 1\n" * 80, add_special_tokens=False)
    window = torch.tensor(code[:400])
    for seed in range(20):
        row = retrieval_row(tokenizer, window, np.random.default_rng(seed))
        assert row.shape == window.shape and row.dtype == window.dtype
        text = tokenizer.decode(row.tolist())
        numbers = re.findall(r"\b(\d{4,6})\b", text)
        stated = numbers[: len(numbers) // 2]  # each fact once inside, once answered at the end
        asked = numbers[len(numbers) // 2 :]
        assert sorted(asked) == sorted(stated) and stated
        end = text[text.rindex("return x + 1") :]  # after the code: the questions
        assert all(a in end for a in asked) and "return x + 1" in text[: len(text) // 2]


def test_rows_become_retrieval_rows_at_the_given_rate(tokenizer):
    code = tokenizer.encode("import os\nprint(os.sep)\n" * 200, add_special_tokens=False)
    windows = torch.tensor(code[:300]).repeat(40, 1)
    assert torch.equal(add_retrieval_rows(tokenizer, windows, np.random.default_rng(0), 0), windows)
    mixed = add_retrieval_rows(tokenizer, windows, np.random.default_rng(0), 0.5)
    changed = sum(not torch.equal(a, b) for a, b in zip(mixed, windows, strict=True))
    assert 10 <= changed <= 30
