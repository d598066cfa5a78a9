"""benchmarks/typing_latency.py: the places it types at, and a short run through a real server on
a tiny model."""

from __future__ import annotations

import argparse
import asyncio

from benchmarks import typing_latency as bench


def test_the_typed_file_is_a_held_out_module_with_places_that_rebuild_it():
    module, text = bench.typing_text(5250)
    assert len(text) <= 5250 and text.endswith("\n")
    places = bench.passes(text)
    assert len(places) >= 6 and len({head for head, _, _ in places}) == len(places)
    for head, typed, tail in places:
        assert head + typed + tail == text and typed.lstrip().startswith(("def ", "class "))
    from training.data import is_heldout

    assert is_heldout(module, 0.1, 0), "held out of the starter's code split (seed 0)"


def test_a_short_typing_run_through_the_server(tiny_checkpoint):
    args = argparse.Namespace(
        model=str(tiny_checkpoint), minutes=0.15, file_tokens=1500, during_agent=False,
        first_after_idle=0, seed=0, json=None,
    )  # fmt: skip
    report = asyncio.run(bench._run(args))
    assert report["requests"] > 0 and report["waited_on"] > 0
    assert report["answered"] == report["waited_on"]  # every request the user waited on came back
    assert report["rss_mb"] and report["places"] >= 6
