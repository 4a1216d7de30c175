"""Recipes, their command-line overrides and the choice of default recipe."""

import json

import pytest
from leaderboard.cli import default_recipe_name, parse_args, resolve_recipe, write_json
from leaderboard.recipes import RECIPES, ablation_alternatives, ablation_steps, get_recipe

GIB = 2**30


def test_recipes_have_the_documented_shapes():
    eight_b = get_recipe("leaderboard-8b").model_config()
    assert (eight_b.vocab_size, eight_b.d_model, eight_b.num_layers, eight_b.num_heads, eight_b.d_ff) == (
        151_936,
        4096,
        34,
        32,
        11_008,
    )
    assert (eight_b.context_length, eight_b.batch_size) == (32_768, 2)
    large = get_recipe("large-8k").model_config()
    assert (large.d_model, large.num_layers, large.context_length, large.batch_size) == (1280, 36, 8192, 2)
    for recipe in RECIPES.values():
        recipe.validate(2)


def test_overrides_are_typed_and_checked():
    args = parse_args(
        [
            "--preset",
            "tiny",
            "--steps",
            "3",
            "--set",
            "checkpoint_blocks=1",
            "--set",
            "compile_regions=true",
            "--set",
            "attention=cudnn",
            "--set",
            "learning_rate=0.5",
        ]
    )
    recipe = resolve_recipe(args, gpus=0, gpu_memory_bytes=0)
    assert (recipe.steps, recipe.checkpoint_blocks, recipe.compile_regions, recipe.attention) == (
        3,
        1,
        True,
        "cudnn",
    )
    assert recipe.learning_rate == 0.5 and recipe.name == "tiny"
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        resolve_recipe(parse_args(["--set", "no_such_field=1"]), 0, 0)
    with pytest.raises(ValueError, match="true or false"):
        resolve_recipe(parse_args(["--set", "fused_loss=maybe"]), 0, 0)


def test_validate_names_the_field():
    tiny = get_recipe("tiny")
    with pytest.raises(ValueError, match="batch_size=3"):
        tiny.with_(batch_size=3).validate(2)
    with pytest.raises(ValueError, match="attention"):
        tiny.with_(attention="fastest").validate(1)
    with pytest.raises(ValueError, match="optimizer"):
        tiny.with_(optimizer="sgd").validate(1)
    with pytest.raises(ValueError, match="unknown recipe fields"):
        tiny.with_(depth=3)
    with pytest.raises(ValueError, match="unknown recipe"):
        get_recipe("huge")


def test_default_recipe_follows_the_hardware():
    assert default_recipe_name(0, 0) == "tiny"
    assert default_recipe_name(2, 0) == "leaderboard-8b"
    assert default_recipe_name(1, 140 * GIB) == "large-8k"  # 8B state (130 GB) + activations does not fit
    assert default_recipe_name(1, 400 * GIB) == "leaderboard-8b"
    assert default_recipe_name(1, 2 * GIB) == "tiny"


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    for option in ("--preset", "--steps", "--warmup", "--json", "--baseline", "--check", "--set", "--ranks"):
        assert option in text


def test_write_json_replaces_atomically(tmp_path):
    path = tmp_path / "sub" / "result.json"
    write_json(path, {"a": 1})
    write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["result.json"]


def test_relaunch_passes_arguments_outside_torchrun(monkeypatch):
    """torchrun's own parser never sees our options (``--ranks`` would be taken for its ``--nproc...``)."""
    import subprocess

    from leaderboard import cli

    seen = {}

    def fake_run(command, env):
        seen["command"], seen["argv"] = command, json.loads(env[cli.ARGV_ENV])
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(cli.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    assert cli.main(["--check", "--ranks", "2", "--set", "context_length=256"]) == 0
    assert seen["command"][-2:] == ["-m", "leaderboard.cli"] and "--nproc-per-node=2" in seen["command"]
    assert seen["argv"] == ["--check", "--ranks", "2", "--set", "context_length=256"]
    monkeypatch.setenv(cli.ARGV_ENV, json.dumps(["--preset", "tiny", "--steps", "7"]))
    assert cli.parse_args(json.loads(cli.os.environ[cli.ARGV_ENV])).steps == 7


@pytest.mark.parametrize("name", ["leaderboard-8b", "large-8k"])
def test_ablation_ends_with_the_recipe_itself(name):
    recipe = get_recipe(name)
    rows = ablation_steps(recipe, "cuda")
    assert rows[0][1] and not any(baseline for _, baseline, _ in rows[1:])
    assert recipe.with_(**rows[-1][2]) == recipe.with_(attention="auto", checkpoint_blocks=-1)
    for _, _, overrides in ablation_alternatives(recipe, "cuda"):
        assert recipe.with_(**overrides) != recipe.with_(**rows[-1][2])
