"""Every recipe file loads; bad recipes and overrides fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.recipe import RecipeError, load_recipe, parse_overrides

RECIPES = sorted(
    p
    for p in (Path(__file__).parents[2] / "training" / "recipes").glob("*.toml")
    # RLRecipes (training/rl/recipe.py, tab.toml among them) are loaded in test_rl_grpo.py and below
    if 'stage = "rl"' not in p.read_text()
)


def test_the_tab_recipe_is_an_rl_recipe_that_says_how_to_launch_it():
    from training.rl import load_rl_recipe

    path = RECIPES[0].parent / "tab.toml"
    recipe = load_rl_recipe(path)
    assert recipe.env == "tab" and recipe.rewards == {"tab@2": 1.0}
    assert "flywheel train tab" in path.read_text().split("\nname")[0]


def test_there_is_a_recipe_per_stage():
    assert {load_recipe(p).stage for p in RECIPES} == {
        "pretrain",
        "long_context",
        "sft",
        "mtp",
        "repo",
    }


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_loads_and_says_how_to_launch(path):
    recipe = load_recipe(path)
    assert recipe.name and recipe.out
    assert f"flywheel train {recipe.stage}" in path.read_text().split("\nname")[0]


@pytest.mark.parametrize("path", sorted(RECIPES[0].parent.glob("ds_*.json")), ids=lambda p: p.name)
def test_deepspeed_configs_are_deepspeeds_own_json(path):
    from training.trainer import deepspeed_config

    config = json.loads(path.read_text())
    assert config["zero_optimization"]["stage"] in (2, 3)
    filled = deepspeed_config(load_recipe(RECIPES[0], {"deepspeed": str(path), "batch_size": 3}))
    assert filled["train_micro_batch_size_per_gpu"] == 3


def test_overrides_and_errors(tmp_path):
    assert parse_overrides(["steps=10", "lr=1e-3", "out=runs/x", 'sft_data=["a", "b"]']) == {
        "steps": 10,
        "lr": 0.001,
        "out": "runs/x",
        "sft_data": ["a", "b"],
    }
    recipe = load_recipe(RECIPES[0], {"steps": 7, "lr": 1})
    assert recipe.steps == 7 and recipe.lr == 1.0
    with pytest.raises(RecipeError, match="unknown key"):
        load_recipe(RECIPES[0], {"stpes": 7})
    with pytest.raises(RecipeError, match="must be int"):
        load_recipe(RECIPES[0], {"steps": "many"})
    with pytest.raises(RecipeError, match=r"lora_targets \['qproj'\] are not layers"):
        load_recipe(RECIPES[0], {"lora_targets": ["q_proj", "qproj"]})
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nstage = "sft"\nout = "o"\n')
    with pytest.raises(RecipeError, match="set `init`"):
        load_recipe(bad)
    bad.write_text("name = ")
    with pytest.raises(RecipeError, match="not valid TOML"):
        load_recipe(bad)


CYCLE_RECIPES = sorted((RECIPES[0].parent / "cycle").rglob("*.toml"))


@pytest.mark.parametrize("path", CYCLE_RECIPES, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_cycle_recipes_load_and_cover_its_stages(path):
    """The cycle's stages are recipe files like every other stage."""
    from training.cycle import STAGES
    from training.rl import load_rl_recipe

    rl = 'stage = "rl"' in path.read_text()
    recipe = load_rl_recipe(path) if rl else load_recipe(path)
    # completion RL is an RL recipe in the tab environment: the cycle's `tab` stage
    stage = "tab" if rl and recipe.env == "tab" else recipe.stage
    assert stage in STAGES and path.stem == stage
    assert "flywheel cycle" in path.read_text().split("\nname")[0]
