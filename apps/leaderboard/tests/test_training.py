"""Training on token files: file checks, the byte-level token maker, and short runs of ``tiny`` on the CPU
(one rank in this process, through ``train.py``'s own entry point)."""

import math
import shutil

import numpy as np
import pandas as pd
import pytest
from cs336_basics import get_lr_cosine_schedule
from leaderboard import cli
from leaderboard.recipes import get_recipe
from leaderboard.token_file import check_tokens
from leaderboard.tokens import write_tokens
from leaderboard.training import TrainingRun

SMALL = ["--preset", "tiny", "--set", "context_length=33", "--set", "batch_size=2"]


def test_token_files_hold_the_sources_bytes(tmp_path):
    (tmp_path / "b.py").write_text("b = 2\n")
    (tmp_path / "a.py").write_text("a = 'é'\n")
    (tmp_path / "c.py").write_text("c\n")
    description = write_tokens(tmp_path / "out", tmp_path, valid_fraction=0.34)
    train = np.fromfile(tmp_path / "out" / "train.bin", dtype=np.uint16)
    valid = np.fromfile(tmp_path / "out" / "valid.bin", dtype=np.uint16)
    assert bytes(train.astype(np.uint8)) == "a = 'é'\nb = 2\n".encode()
    assert bytes(valid.astype(np.uint8)) == b"c\n"
    assert description["train"]["files"] == 2 and description["valid"]["tokens"] == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (np.arange(41, dtype=np.uint16).tobytes() + b"x", "not a whole number of uint16 token ids"),
        (np.arange(30, dtype=np.uint16).tobytes(), "30 tokens, need more than context_length"),
        (np.full(64, 503, dtype=np.uint16).tobytes(), "token id 503 is outside the model's vocabulary"),
    ],
    ids=["odd-size", "too-short", "outside-vocabulary"],
)
def test_bad_token_files_are_refused_by_name(tmp_path, content, message):
    path = tmp_path / "tokens.bin"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        check_tokens(path, "--valid", 503, 32)


def test_resume_needs_an_earlier_checkpoint(tmp_path, token_files):
    recipe = get_recipe("tiny").with_(context_length=33, steps=4)
    with pytest.raises(ValueError, match="--resume: no checkpoint step-NNNNNN"):
        TrainingRun.checked(token_files[0], None, tmp_path / "ckpt", True, tmp_path / "out", recipe)
    (tmp_path / "ckpt" / "step-000004").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"is at step 4, not before the run's last step \(training.steps=4"):
        TrainingRun.checked(token_files[0], None, tmp_path / "ckpt", True, tmp_path / "out", recipe)
    with pytest.raises(ValueError, match="already holds step-000004; add --resume"):
        TrainingRun.checked(token_files[0], None, tmp_path / "ckpt", False, tmp_path / "out", recipe)
    with pytest.raises(
        ValueError,
        match=r"--save: sharded checkpoints \(parallel.checkpoint\) need our sharding \(sharding=ours\), "
        r"which sharding='fsdp2' does not have",
    ):
        TrainingRun.checked(
            token_files[0], None, tmp_path / "new", False, tmp_path / "out", recipe.with_(sharding="fsdp2")
        )


@pytest.mark.timeout(300)
def test_training_follows_the_schedule_and_learns(tmp_path, token_files, capsys):
    train, valid = token_files
    steps = 12
    argv = [*SMALL, "--data", str(train), "--valid", str(valid), "--steps", str(steps)]
    argv += ["--out", str(tmp_path)]
    argv += ["--set", "learning_rate=0.01", "--set", "lr_warmup_steps=2", "--set", "eval_every=5"]
    argv += ["--set", "min_learning_rate=0.001", "--ranks", "1"]
    assert cli.main(argv) == 0
    history = pd.read_csv(tmp_path / "losses.csv")
    assert list(history["step"]) == list(range(1, steps + 1))
    want_lr = [get_lr_cosine_schedule(s, 0.01, 0.001, 2, steps) for s in range(1, steps + 1)]
    np.testing.assert_allclose(history["lr"], want_lr, rtol=1e-12)
    evaluated = history.dropna(subset=["eval_loss"])
    assert list(evaluated["step"]) == [5, 10, 12]
    assert evaluated["eval_loss"].iloc[-1] < evaluated["eval_loss"].iloc[0] - 0.3
    assert history["train_loss"].iloc[-3:].mean() < history["train_loss"].iloc[:3].mean() - 0.3
    assert math.log(503) - 0.1 < history["train_loss"].iloc[0] < math.log(503) + 0.5
    assert (tmp_path / "losses.png").stat().st_size > 1000
    assert "evaluation loss" in capsys.readouterr().out


def _history(folder):
    return pd.read_csv(folder / "losses.csv")[["step", "lr", "train_loss", "grad_norm", "eval_loss"]]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("ranks", [1, 2])
def test_resume_continues_bit_for_bit(tmp_path, token_files, ranks):
    """A run of 6 steps saves at steps 3 and 6; resumed from step 3 (as a run stopped there would be), the
    last 3 steps repeat the same losses, gradient norms and evaluation losses exactly."""
    pytest.importorskip("parallel.checkpoint")
    train, valid = token_files
    argv = [
        *SMALL,
        "--set",
        "sharding=ours",
        "--data",
        str(train),
        "--valid",
        str(valid),
        "--steps",
        "6",
    ]
    argv += [
        "--set",
        "learning_rate=0.01",
        "--set",
        "eval_every=2",
        "--set",
        "save_every=3",
        "--ranks",
        str(ranks),
    ]
    argv += ["--save", str(tmp_path / "ckpt")]
    assert cli.main([*argv, "--out", str(tmp_path / "whole")]) == 0
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-000003", "step-000006"]
    shutil.rmtree(tmp_path / "ckpt" / "step-000006")
    assert cli.main([*argv, "--resume", "--out", str(tmp_path / "resumed")]) == 0
    assert (tmp_path / "ckpt" / "step-000006").is_dir()
    whole, resumed = _history(tmp_path / "whole"), _history(tmp_path / "resumed")
    assert whole["train_loss"].iloc[3] != whole["train_loss"].iloc[2]  # the steps differ from each other
    pd.testing.assert_frame_equal(resumed, whole, check_exact=True)
