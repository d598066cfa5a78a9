"""The model's confidence threshold (agent/confidence.py): fitted to outcomes, read from the model
folder, and applied by the language server's inline completions with the real engine."""

from __future__ import annotations

import asyncio
import json
import math
import shutil

import pytest

from agent.confidence import KEY, confidence, fit_threshold, threshold, worth_showing
from lsp.completion import Ask, CompletionService
from lsp.model_host import ModelHost
from lsp.settings import CompletionSettings, ModelSettings

ACCEPTED, REJECTED = 1.0, -0.25  # tab@2's rewards of a shown suggestion; not shown earns 0


def test_the_fitted_threshold_withholds_what_earned_less_shown_than_not():
    # confident ones accepted, unsure ones rejected: show from the least confident accepted one
    scored = [(-0.1, ACCEPTED, 0), (-0.5, ACCEPTED, 0), (-1.5, REJECTED, 0), (-2.0, REJECTED, 0)]
    assert fit_threshold(scored) == -0.5
    # every one earns more shown: no threshold (the model shows everything, as before)
    assert fit_threshold([(-3.0, ACCEPTED, 0), (-0.1, REJECTED / 10, -1)]) is None
    # one accepted suggestion among rejections below it pays for showing them: 1 - 2 * 0.25 > 0
    assert fit_threshold([(-1.0, REJECTED, 0), (-2.0, ACCEPTED, 0), (-3.0, REJECTED, 0)]) == -2.0
    # ties withhold the fewest: the lowest of equally good thresholds
    assert fit_threshold([(-1.0, ACCEPTED, 0), (-2.0, 0.0, 0), (-3.0, REJECTED, 0)]) == -2.0
    assert fit_threshold([]) is None
    assert fit_threshold([(-math.inf, REJECTED, 0)]) is None  # no token: nothing to rank


def test_confidence_is_the_mean_log_probability_and_no_threshold_shows_everything():
    assert confidence([-1.0, -3.0]) == -2.0 and confidence([]) == -math.inf
    assert worth_showing([-1.0, -3.0], -2.0) and not worth_showing([-1.0, -3.0], -1.9)
    assert worth_showing([-9.0], None) and worth_showing(None, -0.1)  # nothing to judge by


@pytest.mark.parametrize(
    "meta, expected",
    [
        ({KEY: -1.25}, -1.25),
        ({KEY: 2}, 2.0),
        ({}, None),
        ({KEY: "high"}, None),
        ({KEY: True}, None),
        ({KEY: None}, None),
        ("not json", None),
        (["a list"], None),
    ],
)
def test_a_model_folders_threshold_is_read_or_ignored(tmp_path, meta, expected):
    text = meta if isinstance(meta, str) else json.dumps(meta)
    (tmp_path / "flywheel.json").write_text(text)
    assert threshold(tmp_path) == expected
    assert threshold(tmp_path / "missing") is None and threshold(None) is None


def _complete(folder, rows: list) -> str | None:
    """One inline completion through the real ModelHost and engine on `folder`."""
    host = ModelHost(on_status=lambda status: None, on_error=rows.append)

    def record(what: str, /, **fields) -> str:
        rows.append((what, fields))
        return "id"

    text = "def area(width, height):\n    total = width * "
    service = CompletionService(host, record)

    async def go():
        try:
            ask = Ask(
                uri="file:///w/shop/app.py",
                version=1,
                text=text,
                offset=len(text),
                language="python",
                neighbours=[],
                settings=CompletionSettings(debounce_ms=0, max_tokens=6, temperature=1.0, seed=0),
                model=ModelSettings(name=str(folder), speculative="none", dtype="float32"),
            )
            return await service.complete(ask, "invoked")
        finally:
            host.close()

    suggestion = asyncio.run(go())
    return None if suggestion is None else suggestion.text


def test_the_server_withholds_a_suggestion_under_the_models_threshold(tmp_path, tiny_checkpoint):
    folder = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, folder)
    meta = folder / "flywheel.json"
    base = json.loads(meta.read_text()) if meta.exists() else {}

    shown_rows: list = []
    meta.write_text(json.dumps({**base, KEY: -1e9}))  # below any confidence: shown
    text = _complete(folder, shown_rows)
    assert text, shown_rows
    assert ("suggestion_event", {"suggestion_id": "id", "event": "withheld"}) not in shown_rows

    quiet_rows: list = []
    meta.write_text(json.dumps({**base, KEY: 0.0}))  # above any mean log-probability
    assert _complete(folder, quiet_rows) is None
    events = [f.get("event") for what, f in quiet_rows if what == "suggestion_event"]
    assert events == ["withheld"]
    written = [f["output"] for what, f in quiet_rows if what == "suggestion"]
    assert written == [text]  # the same seeded answer, recorded, not offered


def test_a_model_served_over_http_brings_its_threshold_to_the_language_server(
    tmp_path, tiny_checkpoint
):
    """`flywheel serve` reports the threshold in /v1/models; the language server, given the
    server's URL as its model, withholds by it as it would with the folder."""
    import httpx

    from tests.flywheel_server import running_server

    folder = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, folder)
    meta = folder / "flywheel.json"
    base = json.loads(meta.read_text()) if meta.exists() else {}
    meta.write_text(json.dumps({**base, KEY: 0.0}))  # above any mean log-probability
    with running_server(folder) as url:
        (card,) = httpx.get(f"{url}/v1/models").json()["data"]
        assert card[KEY] == 0.0
        rows: list = []
        assert _complete(f"{url}/v1", rows) is None, rows
    events = [f.get("event") for what, f in rows if what == "suggestion_event"]
    assert events == ["withheld"]
    (written,) = [f["output"] for what, f in rows if what == "suggestion"]
    assert written  # recorded, not offered
