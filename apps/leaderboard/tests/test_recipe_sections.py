"""The recipes in sections are the same runs as the flat recipes they replaced: every registered recipe and
every ablation row resolves to the settings that the flat ``Recipe`` gave (frozen in
``data/recipes_before_sections.json``, written by the flat code; field names there are the flat ones, now
the aliases)."""

import json
from pathlib import Path

import pytest
from leaderboard.ablation import ablation_alternatives, ablation_steps
from leaderboard.recipe import ALIASES, FIELDS, parse_override
from leaderboard.recipes import RECIPES, get_recipe

FROZEN = json.loads((Path(__file__).parent / "data" / "recipes_before_sections.json").read_text())


def _as_flat(recipe) -> dict:
    """The recipe keyed by the flat names of old."""
    by_path = recipe.flat()
    return {"name": by_path["name"]} | {alias: by_path[path] for alias, path in ALIASES.items()}


def test_every_field_has_one_alias_and_the_aliases_are_the_old_names():
    assert sorted(ALIASES.values()) == sorted(FIELDS)
    assert set(ALIASES) | {"name"} == set(FROZEN["recipes"]["tiny"])


def _changes(flat: dict, before: dict) -> dict:
    return {k: v for k, v in flat.items() if v != before[k]}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_registered_recipes_resolve_as_before(name):
    assert _as_flat(get_recipe(name)) == FROZEN["recipes"][name]


@pytest.mark.parametrize("key", sorted(FROZEN["ablation"]))
def test_ablation_rows_resolve_as_before(key):
    name, device = key.split("/")
    recipe = get_recipe(name)
    before = FROZEN["recipes"][name]
    rows = ablation_steps(recipe, device) + ablation_alternatives(recipe, device)
    got = [
        {"label": row.label, "baseline": row.baseline, "changes": _changes(_as_flat(row.recipe), before)}
        for row in rows
    ]
    assert got == FROZEN["ablation"][key]


def test_dotted_paths_and_aliases_set_the_same_field():
    tiny = get_recipe("tiny")
    assert tiny.with_(checkpoint_blocks=1) == tiny.with_(**{"activation_checkpoint.blocks": 1})
    assert parse_override("optimizer=torch") == parse_override("optimizer.implementation=torch")
    assert parse_override("model.context_length=33") == ("model.context_length", 33)
    with pytest.raises(ValueError, match="unknown recipe field 'depth'"):
        tiny.with_(depth=3)
