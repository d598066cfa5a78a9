"""Dashboard panels without a browser: the model registry as a source (agent/registry.py), and
clear sentences instead of blanks when a source is missing or broken."""

from __future__ import annotations

from pathlib import Path

from training.dashboard import data


def test_model_versions_come_from_the_registry_with_benchmark_and_gate(tmp_path):
    from agent.registry import Registry

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"weights")
    reg = Registry(tmp_path / "registry")
    v1 = reg.add(ckpt)
    reg.attach_benchmark(
        v1,
        {
            "benchmark": "agent",
            "task_set": "t1",
            "summary": {"pass@1": {"mean": 0.4, "ci95": [0.2, 0.6]}},
        },
    )
    reg.record_gate(v1, {"accepted": True, "reasons": ["no promoted version yet"]})
    reg.promote(v1, forced=True)
    panel = data.models_panel(None, reg.root)
    assert panel.empty is None and panel.note.startswith("from the model registry")
    [row] = panel.rows
    assert row["version"] == v1 and row["status"] == "promoted"
    assert row["benchmark"] == "agent: pass@1 0.400 [0.200, 0.600]"
    assert row["gate"] == "accepted: no promoted version yet"
    assert panel.series["y"] == [0.4]
    assert "serving completions" not in panel.stats
    (ckpt / "model.safetensors").write_bytes(b"other weights")
    v2 = reg.add(ckpt)
    reg.promote(v2, forced=True, lane="completion")
    panel = data.models_panel(None, reg.root)
    assert [r["status"] for r in panel.rows] == ["promoted", "completions"]
    assert panel.stats["serving completions"] == v2


def test_a_damaged_registry_or_old_schema_is_a_sentence_not_a_crash(tmp_path):
    (tmp_path / "registry").mkdir()
    (tmp_path / "registry" / "index.json").write_text("{not json")
    panel = data.models_panel(None, tmp_path / "registry")
    assert "cannot be read" in panel.empty and "damaged" in panel.empty
    import sqlite3

    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)
    conn.execute("CREATE TABLE sessions (id TEXT, started_at REAL, editor TEXT)")
    conn.execute("INSERT INTO sessions VALUES ('s', 1.0, 'nvim')")
    conn.commit()
    conn.close()
    panels, empty = data.collect(old, Path(tmp_path / "none"))
    assert empty is None and panels[0].empty is None  # sessions still show
    assert "upgrade its schema" in panels[1].empty  # no suggestions table in this file


def test_each_repository_gets_its_perplexity_and_accept_rate_curve_over_versions(tmp_path):
    from agent.registry import Registry
    from training.dashboard.charts import render

    reg = Registry(tmp_path / "registry")
    for i, (repo, ppl, rate) in enumerate(
        [("shop", 9.0, 0.10), ("shop", 6.5, 0.25), ("blog", 4.0, 0.40)]
    ):
        ckpt = tmp_path / f"ckpt{i}"
        ckpt.mkdir()
        (ckpt / "config.json").write_text("{}")
        (ckpt / "model.safetensors").write_bytes(b"weights %d" % i)
        vid = reg.add(ckpt)
        reg.attach_benchmark(
            vid,
            {
                "benchmark": "repo_heldout",
                "repo": repo,
                "task_set": f"t-{repo}",
                "summary": {
                    "ppl": {"mean": ppl},
                    "accept_rate": {"mean": rate},
                    "exact": {"mean": 0.1, "ci95": [0.0, 0.2]},
                },
            },
        )
    panel = data.repo_panel(reg.root)
    assert panel.empty is None and panel.stats["repositories"] == "2"
    assert panel.series["panels"]["shop: held-out ppl"] == {"ppl": (["v1", "v2"], [9.0, 6.5])}
    assert panel.series["panels"]["shop: accept rate"] == {
        "accept rate": (["v1", "v2"], [0.1, 0.25])
    }
    assert panel.series["panels"]["blog: accept rate"] == {"accept rate": (["v3"], [0.4])}
    assert [r["accept rate"] for r in panel.rows] == ["0.400", "0.100", "0.250"]
    assert render(panel.series).startswith("<svg")
    assert "flywheel train repo" in data.repo_panel(tmp_path / "empty").empty
    assert "--registry" in data.repo_panel(None).empty
