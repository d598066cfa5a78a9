"""`--model`: one definition (`agent.model.add_model_argument`), whose help names exactly the
forms the resolver takes, and which keeps each command's default."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent.base import BASES
from agent.engine.request import EngineError
from agent.model import (
    DEFAULT_MODEL,
    REGISTRY_MODEL,
    STARTER_DIR,
    add_model_argument,
    model_forms,
    resolve_model,
)

ROOT = Path(__file__).resolve().parent.parent


def _parser(**kwargs) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flywheel x")
    add_model_argument(p, **kwargs)
    return p


def test_help_names_every_form_the_resolver_takes():
    forms = model_forms(servers=True)
    for name in (DEFAULT_MODEL, *BASES, REGISTRY_MODEL, f"{REGISTRY_MODEL}:REF"):
        assert f"'{name}'" in forms, name
    assert "checkpoint or adapter folder" in forms
    assert "URL of an OpenAI-compatible server" in forms
    assert "URL" not in model_forms(servers=False)
    help_text = _parser().format_help()
    assert "base-1.5b" in " ".join(help_text.split())  # argparse wraps; the words stay


def test_each_named_form_resolves_to_what_it_names(monkeypatch, tmp_path):
    """The names in the help are names to the resolver, not paths: a base converts (here a stub),
    "default" is the shipped starter, a registry reference reads the registry."""
    converted = []
    monkeypatch.setattr("agent.base.ensure_base", lambda flag: converted.append(flag) or tmp_path)
    for flag in BASES:
        assert resolve_model(flag) == tmp_path
    assert converted == list(BASES)
    try:
        assert resolve_model(DEFAULT_MODEL) == STARTER_DIR
    except EngineError as exc:  # an install without the starter says so, never a missing path
        assert "make starter" in str(exc)
    monkeypatch.setenv("FLYWHEEL_REGISTRY", str(tmp_path / "registry"))
    with pytest.raises(EngineError, match=f"--model {REGISTRY_MODEL}:v1"):
        resolve_model(f"{REGISTRY_MODEL}:v1")
    assert resolve_model("~/ckpt") == Path.home() / "ckpt"


def test_each_command_keeps_its_default():
    assert _parser().parse_args([]).model == DEFAULT_MODEL
    assert _parser(default="base").parse_args([]).model == "base"
    p = _parser(default=None, default_help="a random-weight 10m model")
    assert p.parse_args([]).model is None
    assert "(default: a random-weight 10m model)" in " ".join(p.format_help().split())
    assert _parser().parse_args(["--model", "http://127.0.0.1:8000/v1"]).model.startswith("http")


def test_a_repeated_model_is_a_list_and_a_required_one_is_required(capsys):
    p = _parser(repeat=True, servers=False)
    assert p.parse_args([]).model is None  # the command fills in its own list
    assert p.parse_args(["--model", "default", "--model", "base"]).model == ["default", "base"]
    with pytest.raises(SystemExit):
        _parser(required=True).parse_args([])
    assert "--model" in capsys.readouterr().err


def test_model_has_one_definition():
    """Every command line defines --model through add_model_argument, so its help and its forms
    cannot drift apart again."""
    defined = re.compile(r"add_argument\(\s*['\"]--model['\"]")
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("agent", "lsp", "training", "telemetry", "benchmarks")
        for path in (ROOT / package).rglob("*.py")
        if path != ROOT / "agent" / "model.py" and defined.search(path.read_text())
    ]
    assert offenders == []


def test_defining_the_flag_does_not_import_torch():
    code = "import sys, lsp.cli; lsp.cli.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
