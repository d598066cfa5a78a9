"""The simulated user, the shared scoring of suggestion outcomes, and completion RL (`train tab`)."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch

from telemetry import PrivacyPolicy, Recorder
from telemetry.acceptance import Outcome, outcomes_from_db, score, signals
from telemetry.rewards import compute_reward
from training.line_completion import Cursor
from training.repo_files import RepoFile
from training.simulated_user import UserConfig, judge, requests

LINE = Cursor("a.py", "def f(x):\n    ", "\n", "return price * (1 + rate)")


@pytest.mark.parametrize(
    "suggestion, shown, chars",
    [
        ("return price * (1 + rate)", True, 25),  # the whole line
        ("return price * (1 + rate)   ", True, 25),  # trailing blanks ignored
        ("return price", True, 12),  # a correct start of >= 8 characters
        ("return", True, 0),  # a correct start, too short: rejected
        ("return price * 2", True, 0),  # wrong
        ("", False, 0),  # declined
    ],
)
def test_the_user_accepts_the_authors_line_or_a_long_enough_start(suggestion, shown, chars):
    o = judge(LINE, suggestion, UserConfig(min_prefix_chars=8))
    assert (o.shown, o.accepted_chars) == (shown, chars)
    assert o.accepted == (chars > 0) and o.rejected == (shown and chars == 0)


def test_requests_are_line_starts_and_word_boundaries_chosen_the_same_every_time():
    text = "import os\n\n\ndef total(items, rate):\n    # sum them\n    return sum(items) * rate\n"
    files = [RepoFile("a.py", text), RepoFile("b.py", text.replace("total", "mean"))]
    config = UserConfig(max_requests=7, min_rest_chars=4)
    got = requests(files, config)
    assert [(c.path, len(c.prefix)) for c in got] == [
        (c.path, len(c.prefix)) for c in requests(files, config)
    ]
    assert len(got) == 7 and {c.path for c in got} == {"a.py", "b.py"}
    for c in got:
        assert c.prefix[-1:] in ("", "\n", " ", "(", ".", "=", ",")  # a boundary
        assert not c.expected.lstrip().startswith("#") and len(c.expected.strip()) >= 4
        assert (c.prefix + c.expected + c.suffix) == dict((f.path, f.text) for f in files)[c.path]


def test_tab_reward_pays_acceptance_charges_rejection_and_ignores_silence():
    assert compute_reward("tab@1", {"shown": False}) == 0.0
    assert compute_reward("tab@1", {"shown": True, "accepted": True, "accepted_share": 1.0}) == 1.0
    assert compute_reward("tab@1", {"shown": True, "accepted": False}) == -0.25
    kept = {"shown": True, "accepted": False, "survival": {300: 0.8}}
    assert compute_reward("tab@1", kept) == 0.8  # typed anyway and still there at 5 minutes
    assert compute_reward("tab@1", {}) is None
    # tab@2: an output the editor cannot show at the cursor is not silence
    assert compute_reward("tab@2", {"shown": False, "unfit": True}) == -0.25
    assert compute_reward("tab@2", {"shown": False}) == 0.0
    # a cursor where every shown sample is rejected: silence is above the mean, so it is pushed up
    from training.rl.grpo import group_advantages

    rewards = [
        compute_reward("tab@1", signals(judge(LINE, s, UserConfig())))
        for s in ("x = 1", "y = 2", "", "z = 3")
    ]
    advantages = group_advantages(rewards)
    assert advantages[2] > 0 and all(a < 0 for i, a in enumerate(advantages) if i != 2)


def _log(
    rec: Recorder, sid: str, output: str, events: list[tuple[str, int | None]], kept=None, uri=None
):
    sug = rec.record(
        "suggestion",
        session_id=sid,
        kind="inline",
        document_uri=uri,
        context={"prefix": "def price(x):\n    ", "suffix": "\n", "path": "shop/price.py"},
        output=output,
    )
    for event, chars in events:
        rec.record(
            "suggestion_event", session_id=sid, suggestion_id=sug, event=event, accepted_chars=chars
        )
    if kept is not None:
        rec.record(
            "survival",
            session_id=sid,
            suggestion_id=sug,
            after_s=300,
            accepted_chars=10,
            surviving_chars=int(10 * kept),
        )
    return sug


def logged_db(path: Path, workspace: Path | None = None) -> Path:
    """Six inline suggestions (three to learn from), made in `workspace`'s shop/price.py (no
    document URI without it); appended when `path` exists."""
    uri = (workspace / "shop" / "price.py").as_uri() if workspace else None
    rec = Recorder(path, PrivacyPolicy(consent="code"))
    sid = rec.record("session_start", editor="nvim")
    log = functools.partial(_log, rec, sid, uri=uri)
    log("return x * 2", [("shown", None), ("accepted", None)], kept=1.0)
    log("return None", [("superseded", None)])  # typed over: rejected
    log("return x + 1 if x else 0", [("shown", None), ("partially_accepted", 6)])
    log("", [])  # declined: the model proposed nothing
    log("return 0", [("cancelled", None)])  # never on screen: not scored
    log("return -1", [("withheld", None)])  # under the threshold: a quiet request
    rec.close()
    return path


def test_logged_suggestions_are_learnt_in_the_workspace_they_were_made_in(tmp_path):
    from training.tab_rl import logged_outcomes

    db = tmp_path / "t.db"
    for folder in ("shop", "shop2", "shop/vendored"):  # a sibling sharing a prefix is outside
        logged_db(db, tmp_path / folder)
    logged_db(db)  # no document URI: in no workspace
    assert len(logged_outcomes(str(db))) == 12
    mine = logged_outcomes(str(db), workspace=str(tmp_path / "shop"))
    assert len(mine) == 6  # its own and its subfolder's
    uris = {o.extra["document_uri"] for o, _ in mine}
    assert uris == {
        (tmp_path / "shop" / "shop" / "price.py").as_uri(),
        (tmp_path / "shop" / "vendored" / "shop" / "price.py").as_uri(),
    }


def test_real_and_simulated_outcomes_are_scored_by_the_same_code(tmp_path):
    from telemetry import open_db

    db = open_db(logged_db(tmp_path / "t.db"))
    real = outcomes_from_db(db.conn)
    db.conn.close()
    simulated = [
        Outcome("a:1", "return x * 2", True, 12),
        Outcome("a:2", "return None", True, 0),
        Outcome("a:3", "return x + 1 if x else 0", True, 6),
        Outcome("a:4", "", False),
        Outcome("a:5", "", False, extra={"withheld": "return -1"}),
    ]
    assert [(o.output, o.shown, o.accepted_chars) for o in real] == [
        (o.output, o.shown, o.accepted_chars) for o in simulated
    ]
    assert real[-1].extra["withheld"] == "return -1"
    assert (
        score(real)
        == score(simulated)
        == {
            "requests": 5,
            "shown": 3,
            "accepted": 2,
            "accept_rate": 2 / 3,
            "shown_per_request": 0.6,
            "accepted_chars_per_request": 18 / 5,
        }
    )
    assert real[0].kept == 1.0 and compute_reward("tab@1", signals(real[1])) == -0.25


def _tab_recipe(tmp_path, model, **extra):
    from training.rl import load_rl_recipe

    root = Path(__file__).parents[2]
    return load_rl_recipe(
        root / "training" / "recipes" / "tab.toml",
        {
            "init": str(model),
            "out": str(tmp_path / "tab"),
            "steps": 6,
            "lr": 3e-3,
            "max_tokens": 8,
            "group_size": 2,
            "tasks_per_step": 3,
            **extra,
        },
    )


def _logprob(model, tokenizer, prompt_ids, output_ids) -> float:
    from agent.model import load_checkpoint

    trunk = load_checkpoint(model).trunk.eval()
    ids = torch.tensor([prompt_ids + output_ids])
    with torch.no_grad():
        logp = trunk(input_ids=ids[:, :-1]).logits[0].log_softmax(-1)
    picked = logp[len(prompt_ids) - 1 :].gather(-1, ids[0, len(prompt_ids) :, None])
    return float(picked.sum())


def test_train_tab_from_telemetry_raises_accepted_and_lowers_rejected_suggestions(
    tmp_path, tiny_checkpoint
):
    from agent.registry import Registry
    from training.tab_rl import logged_samples, train_tab

    db = logged_db(tmp_path / "t.db")
    # A small step size: six Adam updates at 3e-3 overshoot on a random model, and where they land
    # then depends on which logged samples each batch drew.
    recipe = _tab_recipe(tmp_path, tiny_checkpoint, lr=3e-4)
    from agent.model import load_checkpoint

    tokenizer = load_checkpoint(tiny_checkpoint).tokenizer
    samples = logged_samples(str(db), tokenizer, UserConfig(seq_len=128, max_new_tokens=8))
    accepted = next(s for s in samples if s[2].output == "return x * 2")
    rejected = next(s for s in samples if s[2].output == "return None")
    summary = train_tab(
        recipe,
        telemetry_db=str(db),
        user=UserConfig(seq_len=128, max_new_tokens=8),
        registry_root=tmp_path / "registry",
        log=lambda line: None,
    )
    assert summary["updates"] >= 1 and summary["source"] == "telemetry"
    model = summary["model"]
    up = _logprob(model, tokenizer, accepted[0], accepted[1]) - _logprob(
        tiny_checkpoint, tokenizer, accepted[0], accepted[1]
    )
    down = _logprob(model, tokenizer, rejected[0], rejected[1]) - _logprob(
        tiny_checkpoint, tokenizer, rejected[0], rejected[1]
    )
    # What was accepted gains, and gains on what was rejected
    assert up > 0 and up > down, (up, down)
    (version,) = Registry(tmp_path / "registry").versions()
    assert version["reward"] == "tab@2 x 1" and version["id"] == summary["version"]
    lines = (tmp_path / "tab" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 6 and all(math.isfinite(json.loads(x).get("loss", 0.0)) for x in lines)


def test_train_tab_without_a_learning_signal_writes_and_registers_nothing(
    tmp_path, tiny_checkpoint, tokenizer
):
    """A random tiny model is rejected at every cursor of the simulated user: no group varies."""
    from agent.registry import Registry
    from tests.training.test_repo import make_workspace
    from training.repo_files import RepoConfig, read_repo
    from training.repo_pretrain import write_repo_data
    from training.tab_rl import train_tab

    write_repo_data(
        read_repo(RepoConfig(root=str(make_workspace(tmp_path / "ws")))), tmp_path / "data"
    )
    lines = []
    summary = train_tab(
        _tab_recipe(tmp_path, tiny_checkpoint, steps=1),
        data=str(tmp_path / "data"),
        user=UserConfig(seq_len=128, max_new_tokens=8),
        registry_root=tmp_path / "registry",
        log=lines.append,
    )
    rewarded = summary["outcomes"]
    assert sum(rewarded.values()) == 6 and summary["updates"] == 0 and summary["model"] is None
    assert lines[-1].startswith("no update was made") and not (tmp_path / "tab" / "model").exists()
    assert not Registry(tmp_path / "registry").exists()


def test_train_tab_fits_the_trained_models_threshold_and_the_evaluation_applies_it(
    tmp_path, tiny_checkpoint
):
    """Logged outcomes train; the simulated user's train files fit the threshold. A random tiny
    model is rejected at every train cursor there, so only its most confident suggestion is worth
    showing, and the held-out evaluation withholds the rest."""
    from agent.confidence import KEY
    from tests.training.test_repo import make_workspace
    from training.repo_eval import RepoEvalConfig, evaluate_repo
    from training.repo_files import RepoConfig, read_repo
    from training.repo_pretrain import write_repo_data
    from training.tab_rl import train_tab

    write_repo_data(
        read_repo(RepoConfig(root=str(make_workspace(tmp_path / "ws")))), tmp_path / "data"
    )
    summary = train_tab(
        _tab_recipe(tmp_path, tiny_checkpoint, steps=1, lr=3e-4, show_fit=8),
        data=str(tmp_path / "data"),
        telemetry_db=str(logged_db(tmp_path / "t.db")),
        user=UserConfig(seq_len=128, max_new_tokens=8),
        log=lambda line: None,
    )
    assert summary["updates"] == 1 and summary["show_threshold"] is not None
    meta = json.loads((Path(summary["model"]) / "flywheel.json").read_text())
    assert meta[KEY] == summary["show_threshold"]

    config = RepoEvalConfig(seq_len=128, max_lines=0, requests=8, max_new_tokens=8)
    rows = evaluate_repo(summary["model"], tmp_path / "data", config)["requests"]
    withheld = [r for r in rows if "withheld" in r]
    assert withheld and all(not r["shown"] and r["confidence"] < meta[KEY] for r in withheld)
    assert all(r["confidence"] >= meta[KEY] for r in rows if r["shown"])


def test_train_tab_refuses_missing_sources_in_one_line(tmp_path, tiny_checkpoint, capsys):
    from telemetry import open_db
    from training import cli

    open_db(str(tmp_path / "empty.db")).conn.close()  # a database, without a suggestion
    for source, said in (
        ([], "give --data"),
        (["--telemetry-db", str(tmp_path / "none.db")], "no telemetry database at"),
        (["--telemetry-db", str(tmp_path / "empty.db")], "holds no inline suggestion"),
    ):
        argv = ["tab", "--model", str(tiny_checkpoint), *source, "--out", str(tmp_path / "t")]
        code = cli.main(argv)
        err = capsys.readouterr().err
        assert code == 1 and err.count("\n") == 1 and said in err, (source, err)


def test_train_tab_from_a_registry_version_records_it_as_the_parent(
    tmp_path, tiny_checkpoint, capsys
):
    from agent.registry import Registry
    from training import cli

    registry = Registry(tmp_path / "registry")
    v1 = registry.add(tiny_checkpoint)
    db = logged_db(tmp_path / "t.db")
    sets = ["steps=2", "lr=3e-3", "max_tokens=8", "group_size=2", "tasks_per_step=3"]
    argv = [
        "tab",
        "--telemetry-db",
        str(db),
        "--registry",
        str(registry.root),
        "--out",
        str(tmp_path / "tab"),
        "--seq-len",
        "128",
        *[a for s in sets for a in ("--set", s)],
    ]
    assert cli.main([*argv, "--model", "registry:v1"]) == 0
    v2 = registry.versions()[-1]
    assert v2["parent"] == v1 and v2["stage"] == "tab"
    assert f"registered as {v2['id']}" in capsys.readouterr().out
    assert cli.main([*argv, "--model", "registry:v7"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("flywheel train tab: --model registry:v7:")


def test_samples_that_share_the_prompt_pass_equal_separate_completions(tiny_checkpoint):
    from agent.model import load_checkpoint
    from training.line_completion import complete, complete_many

    ckpt = load_checkpoint(tiny_checkpoint)
    trunk, tok = ckpt.trunk.eval(), ckpt.tokenizer
    ids = tok("def price(x):\n    return", add_special_tokens=False)["input_ids"]
    shared = complete_many(trunk, tok, ids, 3, 12, 1.0, torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(0)
    alone = [complete(trunk, tok, ids, 12, 1.0, generator) for _ in range(3)]
    assert [(c.ids, c.text) for c in shared] == [(c.ids, c.text) for c in alone]
    for a, b in zip(shared, alone, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert len({tuple(c.ids) for c in shared}) > 1  # sampled: they differ from each other


class Scripted(torch.nn.Module):
    """A model that writes `tokens` one after another, whatever it is given."""

    def __init__(self, tokens: list[int], vocab: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.tokens, self.vocab = tokens, vocab

    def forward(self, input_ids, cache=None, use_cache=True):
        from types import SimpleNamespace

        step = cache["step"] if cache else 0
        logits = torch.zeros(1, input_ids.shape[1], self.vocab)
        logits[0, -1, self.tokens[min(step, len(self.tokens) - 1)]] = 1.0
        return SimpleNamespace(logits=logits, past_key_values={"step": step + 1})


@pytest.mark.parametrize(
    "prefix, written, suggestion",
    [
        ("def f(x):\n    ", "\n    return x\n", "return x"),  # the healed break, then the line
        ("def f(x):\n    ", "\n    return x", "return x"),  # ended by <|endoftext|>
        ("def f(x):\n    ", "  # more\n", ""),  # does not continue the cursor's line: nothing
        ("def f(x):\n    ", "\nreturn x\n", ""),  # another indentation than the cursor's
        ("def f(x):\n", "\nreturn x\n", "return x"),  # a cursor at column 0
        ("y = f(", "x)\n    z", "x)"),  # mid-line: nothing was healed
    ],
)
def test_a_completion_starts_with_the_healed_text_or_is_not_shown(
    tokenizer, prefix, written, suggestion
):
    from agent.chat_format import EOS
    from training.line_completion import complete, cursor_at

    cursor = cursor_at(RepoFile("a.py", prefix + "pass\n"), len(prefix))
    tokens = tokenizer(written, add_special_tokens=False)["input_ids"]
    tokens.append(tokenizer.convert_tokens_to_ids(EOS))
    done = complete(
        Scripted(tokens, len(tokenizer)), tokenizer, [1, 2, 3], 12, healed=cursor.healed
    )
    assert done.text == suggestion and done.fits == written.startswith(cursor.healed)
    assert judge(cursor, done.text, UserConfig()).shown == bool(suggestion)
