"""Recipes, their command-line overrides and the choice of default recipe."""

import json

import pytest
from harness.results import write_json
from leaderboard import cli, launching
from leaderboard.ablation import ablation_alternatives, ablation_steps
from leaderboard.cli import parse_args
from leaderboard.job import resolve_recipe
from leaderboard.recipes import RECIPES, default_recipe_name, get_recipe

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
    for name in RECIPES:
        recipe = get_recipe(name)
        recipe.validate(1 if recipe.parallelism.proxy_ranks > 1 else 2)  # a proxy runs on one GPU


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
            "optimizer.learning_rate=0.5",
        ]
    )
    recipe = resolve_recipe(args, gpus=0, gpu_memory_bytes=0)
    assert (recipe.training.steps, recipe.activation_checkpoint.blocks) == (3, 1)
    assert (recipe.model.compile_regions, recipe.model.attention) == (True, "cudnn")
    assert recipe.optimizer.learning_rate == 0.5 and recipe.name == "tiny"
    with pytest.raises(ValueError, match="unknown recipe field 'no_such_field'"):
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
    with pytest.raises(ValueError, match="unknown recipe field"):
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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ranks", "0"], "argument --ranks: expected a positive integer, got '0'"),
        (["--steps", "0"], "argument --steps: expected a positive integer, got '0'"),
        (["--warmup", "-1"], "argument --warmup: expected an integer >= 0, got '-1'"),
        (["--time-budget", "60"], "--time-budget needs --ablation or --data"),
        (["--row-steps", "2"], "--row-steps needs --ablation"),
        (["--check", "--ablation"], "argument --ablation: not allowed with argument --check"),
        (["--data", "x.bin", "--check"], "argument --check: not allowed with argument --data"),
        (["--resume"], "--resume needs --data"),
        (["--check", "--baseline"], "--baseline cannot be combined with --check"),
        (["--ablation", "--baseline"], "--baseline cannot be combined with --ablation"),
    ],
)
def test_option_errors_name_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "steps=abc"], "--set steps: expected int, got 'abc'"),
        (["--set", "learning_rate=fast"], "--set learning_rate: expected float, got 'fast'"),
        (["--set", "batch_size=3"], "batch_size=3 must be a positive multiple of the number of ranks (2)"),
        (["--set", "attention=fastest"], "attention must be one of"),
        (["--set", "max_grad_norm=-1"], "max_grad_norm must be a finite number >= 0, got -1.0"),
        (["--set", "max_grad_norm=0"], "max_grad_norm must be > 0, got 0.0"),
        (["--data", "no/such/tokens.bin"], "--data no/such/tokens.bin: no such file"),
        (["--data", "/dev/null"], "--data /dev/null: not a regular file (a pipe or device)"),
        (["--data", "x.bin", "--resume"], "--resume needs --save DIR"),
        (["--set", "model.depth=3"], "unknown recipe field 'model.depth'"),
    ],
)
def test_recipe_errors_come_before_any_process_starts(argv, message, monkeypatch, capsys):
    def no_launch(job):
        raise AssertionError("launched despite a bad argument")

    monkeypatch.setattr(launching, "launch", no_launch)
    assert cli.main(["--preset", "tiny", "--ranks", "2", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("name", ["leaderboard-8b", "large-8k"])
def test_ablation_ends_with_the_recipe_itself(name):
    recipe = get_recipe(name)
    rows = ablation_steps(recipe, "cuda")
    assert rows[0].baseline and not any(row.baseline for row in rows[1:])
    assert rows[-1].recipe == recipe.with_(attention="auto", checkpoint_blocks=-1)
    for row in ablation_alternatives(recipe, "cuda"):
        assert row.recipe != rows[-1].recipe
