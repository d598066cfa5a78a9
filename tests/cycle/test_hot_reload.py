"""Hot reload: a running `flywheel serve --model registry` switches to each promoted
version before its next request, rolls back the same way, and never serves an unverified one."""

from __future__ import annotations

import threading

import httpx

from agent.engine import EngineConfig, Request, SamplingParams, open_engine
from agent.registry import RegistryWatcher
from tests.flywheel_server import running_server

PROMPT = "def add(a, b):"
BODY = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 0, "return_token_ids": True}


def direct_ids(folder) -> list[int]:
    engine = open_engine(EngineConfig(model=str(folder)))
    try:
        params = SamplingParams(max_tokens=8, temperature=1.0, seed=0)
        return engine.generate(Request(prompt=PROMPT, params=params)).completions[0].token_ids
    finally:
        engine.close()


def served(url: str) -> tuple[str, list[int], str]:
    """(/v1/models version, the completion's token ids, its system_fingerprint)."""
    version = httpx.get(url + "/v1/models", timeout=60).json()["data"][0]["version"]
    answer = httpx.post(url + "/v1/completions", json=BODY, timeout=60).json()
    return version, answer["choices"][0]["token_ids"], answer["system_fingerprint"]


def test_serve_follows_promotion_and_rollback(registry, tiny_checkpoint, perturbed_checkpoint):
    v1, v2 = registry.add(tiny_checkpoint), registry.add(perturbed_checkpoint)
    registry.promote(v1, forced=True)
    expected = {v: direct_ids(registry.verify(v)) for v in (v1, v2)}
    assert expected[v1] != expected[v2]
    # A long poll interval: only the check before each request can make these pass.
    flags = ("--registry", str(registry.root), "--reload-interval", "600")
    with running_server("registry", *flags) as url:
        assert served(url) == (v1, expected[v1], v1)
        registry.promote(v2, forced=True)
        assert served(url) == (v2, expected[v2], v2)  # the very next request
        registry.rollback()
        assert served(url) == (v1, expected[v1], v1)

        # Promoted, then edited by hand before the server looked: refused, v1 stays.
        v3 = registry.add(perturbed_checkpoint)
        registry.promote(v3, forced=True)
        weights = registry.folder(v3) / "model.safetensors"
        weights.chmod(0o644)
        weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
        assert served(url)[0] == v1
        assert httpx.get(url + "/health", timeout=10).json()["model_version"] == v1


def test_serve_follows_the_completion_lane(registry, tiny_checkpoint, perturbed_checkpoint):
    """`--lane completion`: the promoted version until a completion version is promoted, then
    that one; a rollback of the lane goes back to the promoted version."""
    v1, v2 = registry.add(tiny_checkpoint), registry.add(perturbed_checkpoint)
    registry.promote(v1, forced=True)
    expected = {v: direct_ids(registry.verify(v)) for v in (v1, v2)}
    flags = ("--registry", str(registry.root), "--lane", "completion", "--reload-interval", "600")
    with running_server("registry", *flags) as url:
        assert served(url) == (v1, expected[v1], v1)
        registry.promote(v2, forced=True, lane="completion")
        assert served(url) == (v2, expected[v2], v2)
        assert registry.promoted() == v1  # the agent lane did not move
        registry.rollback(lane="completion")
        assert served(url) == (v1, expected[v1], v1)


def test_a_promotion_during_a_reload_lands_right_after_it(
    registry, tiny_checkpoint, perturbed_checkpoint
):
    v1, v2, v3 = (registry.add(c) for c in (tiny_checkpoint, perturbed_checkpoint, tiny_checkpoint))
    registry.promote(v1, forced=True)
    engine = open_engine(EngineConfig(model=str(registry.verify(v1))))
    loading, promoted_meanwhile = threading.Event(), threading.Event()
    loads: list[str] = []

    def swap(folder: str) -> str:  # the engine's own swap, held open until v3 is promoted
        loads.append(folder)
        loading.set()
        assert promoted_meanwhile.wait(60)
        return engine.swap(folder)

    watcher = RegistryWatcher(registry, swap, v1, interval_s=600)
    registry.promote(v2, forced=True)
    reload = threading.Thread(target=watcher.check)
    reload.start()
    assert loading.wait(60)
    registry.promote(v3, forced=True)  # while v2 is loading
    promoted_meanwhile.set()
    reload.join(60)
    assert watcher.version == engine.model_version == v3
    assert [f.rsplit("/", 1)[-1] for f in loads] == [v2, v3]
    engine.close()


def test_the_language_server_serves_completions_from_the_completion_lane(
    registry, tiny_checkpoint, perturbed_checkpoint, tmp_path
):
    """`flywheel lsp --model registry` over stdio: a version promoted into the completion lane
    answers the inline completions while the agent's version stays; rolled back, the promoted
    version answers them again."""
    import asyncio

    from benchmarks.cycle_follow import Editor

    v1, v2 = registry.add(tiny_checkpoint), registry.add(perturbed_checkpoint)
    registry.promote(v1, forced=True)
    folder = tmp_path / "ws"
    folder.mkdir()

    async def go() -> None:
        editor = Editor(registry.root, folder, tmp_path / "editor.db", max_tokens=4)
        await editor.start()
        try:
            assert (await editor.complete())["model_version"] == v1
            since = len(editor.statuses)
            registry.promote(v2, forced=True, lane="completion")
            await editor.wait_for(v2, since, timeout=120)
            assert (await editor.complete())["model_version"] == v2
            state = await editor.client.workspace_execute_command_async(
                editor.types.ExecuteCommandParams(command="flywheel.status", arguments=[])
            )
            assert (state["modelVersion"], state["completionModelVersion"]) == (v1, v2)
            since = len(editor.statuses)
            registry.rollback(lane="completion")
            await editor.wait_for(v1, since, timeout=120)
            assert (await editor.complete())["model_version"] == v1
        finally:
            await editor.stop()

    asyncio.run(go())
