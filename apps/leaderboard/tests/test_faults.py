"""The fault suite of ``train.py``: bad arguments, a stalled rank, a shared ``--save`` folder, a diverging
run, a changed recipe on ``--resume``, and files that change under a run. Each refusal names the argument,
field, file, step or rank and what was expected; nothing here may hang (stall timeouts of seconds)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import torch
from leaderboard import cli, launching, tokens, training  # training: imported before the ranks fork
from leaderboard.save_lock import LOCK_NAME, save_lock
from leaderboard.token_file import TokenFile

SMALL = ["--preset", "tiny", "--set", "context_length=33", "--set", "batch_size=2"]


def _no_launch(job):
    raise AssertionError("launched despite a bad argument")


# ------------------------------------------------------------------ item 7: errors before any process starts
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--set", "max_grad_norm=inf"], "--set max_grad_norm: expected a finite number, got 'inf'"),
        (["--set", "weight_decay=nan"], "--set weight_decay: expected a finite number, got 'nan'"),
        (["--set", "learning_rate=-0.5"], "learning_rate must be a finite number >= 0, got -0.5"),
        (["--set", "preset=foo"], "preset must be one of tiny, small"),
        (["--set", "checkpoint_ffn=-5"], "activation_checkpoint.ffn must be >= 0, got -5"),
        (["--set", "checkpoint_blocks=-2"], "activation_checkpoint.blocks must be >= -1, got -2"),
        (["--set", "save_every=-1"], "checkpoint.save_every must be >= 0, got -1"),
        (["--set", "on_nonfinite=ignore"], "training.on_nonfinite must be one of stop, skip, got 'ignore'"),
        pytest.param(["--set", "attention=cudnn"], "model.attention=cudnn needs a CUDA GPU, and this machine "
                     "has none", marks=NO_GPU),
        pytest.param(["--set", "optimizer=triton"], "optimizer.implementation=triton needs a CUDA GPU",
                     marks=NO_GPU),
    ],
)
def test_recipe_errors_come_before_any_process_starts(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(launching, "launch", _no_launch)
    assert cli.main(["--preset", "tiny", "--ranks", "2", *argv]) == 2
    assert message in capsys.readouterr().err


def test_file_and_folder_errors_come_before_any_process_starts(tmp_path, token_files, monkeypatch, capsys):
    monkeypatch.setattr(launching, "launch", _no_launch)
    train = str(token_files[0])
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [
        (["--data", str(tmp_path)], f"--data {tmp_path}: is a folder, expected a token file"),
        (["--data", train, "--out", str(a_file)], f"--out {a_file}: is a file, expected a folder"),
        (["--data", train, "--save", str(a_file)], f"--save {a_file}: is a file, expected a folder"),
        (["--json", str(a_file / "r.json")], f"--json {a_file}: is a file, expected a folder"),
    ]
    if not os.access("/sys", os.W_OK):  # a read-only file system: --save exists, nothing can be written
        cases.append((["--data", train, "--save", "/sys"], "--save /sys: cannot write there"))
    for argv, message in cases:
        assert cli.main([*SMALL, "--ranks", "1", *argv]) == 2, argv
        assert message in capsys.readouterr().err


def test_baseline_with_save_is_refused_before_launch(tmp_path, token_files, monkeypatch, capsys):
    monkeypatch.setattr(launching, "launch", _no_launch)
    argv = [*SMALL, "--ranks", "1", "--baseline", "--data", str(token_files[0]), "--save", str(tmp_path)]
    assert cli.main(argv) == 2
    assert "which the --baseline trainer does not have" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_a_time_budget_that_leaves_no_step_says_so(tmp_path, token_files, capsys):
    argv = [*SMALL, "--ranks", "1", "--data", str(token_files[0]), "--out", str(tmp_path / "out")]
    assert cli.main([*argv, "--time-budget", "0.001"]) == 1
    assert "--time-budget 0.001 s ran out before step 1 could start" in capsys.readouterr().err
    assert not (tmp_path / "out" / "losses.csv").exists()


# ------------------------------------------------------------------------ item 1: a stall names the rank
def _rank_one_stops(rank, world_size, job):
    import torch
    import torch.distributed as dist
    from parallel.heartbeat import beat

    for step in range(1, 1000):
        beat(f"step {step}")
        if rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGSTOP)
        dist.all_reduce(torch.ones(1))


@pytest.mark.timeout(90)
def test_a_stopped_rank_is_named_with_its_last_phase(monkeypatch, capsys):
    monkeypatch.setattr(launching, "run_job", _rank_one_stops)
    started = time.monotonic()
    assert cli.main(["--preset", "tiny", "--ranks", "2", "--stall-timeout", "5"]) == 1
    assert time.monotonic() - started < 45
    err = capsys.readouterr().err
    assert "no rank of 2 reported progress for 5 s" in err
    assert "rank 1 on" in err and "stopped answering" in err and "last phase 'step 3'" in err


@pytest.mark.timeout(300)
def test_training_longer_than_the_stall_timeout_finishes(tmp_path, token_files):
    """2 ranks train for several times the stall timeout: heartbeats of every step keep the run alive."""
    steps = 240  # ~0.04 s a step on an idle 2-core machine: about three stall timeouts at least
    argv = [*SMALL, "--ranks", "2", "--data", str(token_files[0]), "--steps", str(steps),
            "--stall-timeout", "3"]
    started = time.monotonic()
    assert cli.main([*argv, "--out", str(tmp_path)]) == 0
    assert time.monotonic() - started > 3
    assert len(pd.read_csv(tmp_path / "losses.csv")) == steps


# ------------------------------------------------------------------- item 2: one run per --save folder
def test_a_second_run_into_a_held_save_folder_is_refused(tmp_path, token_files, capsys):
    argv = [*SMALL, "--ranks", "1", "--data", str(token_files[0]), "--save", str(tmp_path / "ckpt")]
    with save_lock(tmp_path / "ckpt", "train.py (the first run)"):
        assert cli.main(argv) == 2
    err = capsys.readouterr().err
    holder = f"pid {os.getpid()} on host {socket.gethostname()!r}"
    assert f"--save {tmp_path / 'ckpt'} is in use by {holder}" in err
    assert "train.py (the first run)" in err
    assert not (tmp_path / "ckpt" / LOCK_NAME).exists()  # released by the holder


def _write_lock(folder, **holder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_NAME).write_text(json.dumps({"started": 0, "command": "train.py ...", **holder}))


def test_a_lock_left_by_a_process_that_is_gone_is_taken_over(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _write_lock(tmp_path, host=socket.gethostname(), pid=gone.pid)
    said = []
    with save_lock(tmp_path, "train.py (new)", say=said.append):
        holder = json.loads((tmp_path / LOCK_NAME).read_text())
        assert (holder["pid"], holder["host"], holder["command"]) == (os.getpid(), socket.gethostname(),
                                                                      "train.py (new)")
    assert f"left by pid {gone.pid} on host" in said[0] and "that process is gone" in said[0]


def test_a_lock_from_another_host_needs_force(tmp_path):
    _write_lock(tmp_path, host="elsewhere-7", pid=4242)
    refused = pytest.raises(ValueError, match=r"locked by pid 4242 on host 'elsewhere-7'.*pass --force")
    with refused, save_lock(tmp_path, "train.py"):
        pass
    said = []
    with save_lock(tmp_path, "train.py", force=True, say=said.append):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert "elsewhere-7" in said[0]


# -------------------------------------------------------------- item 3: a run that goes non-finite stops
@pytest.mark.timeout(120)
def test_a_diverging_run_stops_naming_the_step_and_keeps_nan_in_the_csv(tmp_path, token_files, capsys):
    argv = [*SMALL, "--ranks", "1", "--data", str(token_files[0]), "--steps", "8", "--out", str(tmp_path)]
    argv += ["--set", "learning_rate=1e6", "--save", str(tmp_path / "ckpt"), "--set", "save_every=1"]
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    last = pd.read_csv(tmp_path / "losses.csv").iloc[-1]
    step = int(last["step"])
    assert f"train.py: error: step {step}: training loss nan" in captured.err
    assert "loss nan" in captured.out
    assert step < 8 and np.isnan(last["train_loss"]) and last["skipped"]
    assert "nan" in (tmp_path / "losses.csv").read_text().splitlines()[-1].split(",")
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == [
        f"step-{s:06d}" for s in range(1, step)
    ]  # every step before the non-finite one saved, that one not


def _poisoned(nan_at_step: int, inf_weight_at_step: int):
    """``build_trainer`` whose loss is NaN at one step and whose weights turn infinite after another."""
    real = training.build_trainer

    def build(*args, **kwargs):
        import torch

        trainer = real(*args, **kwargs)
        forward_backward, optimizer_step, count = trainer.forward_backward, trainer.optimizer_step, [0]

        def poisoned_forward_backward(tokens, targets):
            count[0] += 1
            loss = forward_backward(tokens, targets)
            return loss * float("nan") if count[0] == nan_at_step else loss

        def poisoned_optimizer_step():
            optimizer_step()
            if count[0] == inf_weight_at_step:
                with torch.no_grad():
                    next(trainer.root.parameters()).view(-1)[0] = float("inf")

        trainer.forward_backward, trainer.optimizer_step = poisoned_forward_backward, poisoned_optimizer_step
        return trainer

    return build


@pytest.mark.timeout(120)
def test_skip_mode_skips_the_step_and_a_nonfinite_checkpoint_is_never_written(
    tmp_path, token_files, monkeypatch, capsys
):
    monkeypatch.setattr(training, "build_trainer", _poisoned(nan_at_step=2, inf_weight_at_step=6))
    argv = [*SMALL, "--ranks", "1", "--data", str(token_files[0]), "--steps", "6", "--out", str(tmp_path)]
    argv += ["--set", "on_nonfinite=skip", "--save", str(tmp_path / "ckpt"), "--set", "save_every=3"]
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    history = pd.read_csv(tmp_path / "losses.csv")
    assert list(history["skipped"]) == [False, True, False, False, False, False]
    assert np.isnan(history["train_loss"][1]) and np.isfinite(history["train_loss"][2:]).all()
    assert "step     2/6: loss nan" in captured.out and "1 step(s) not applied" in captured.out
    assert "train.py: error: step 6: parameter" in captured.err and "holds non-finite values" in captured.err
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-000003"]


@pytest.mark.timeout(120)
def test_skip_mode_stops_a_diverged_run_after_three_skipped_steps_in_a_row(tmp_path, token_files, capsys):
    argv = [*SMALL, "--ranks", "1", "--data", str(token_files[0]), "--steps", "30", "--out", str(tmp_path)]
    argv += ["--set", "learning_rate=1e6", "--set", "on_nonfinite=skip", "--set", "save_every=1"]
    assert cli.main([*argv, "--save", str(tmp_path / "ckpt")]) == 1
    history = pd.read_csv(tmp_path / "losses.csv")
    last = int(history["step"].iloc[-1])
    assert last < 30 and list(history["skipped"].iloc[-3:]) == [True, True, True]
    err = capsys.readouterr().err
    assert f"steps {last - 2}-{last}: 3 steps in a row had a non-finite training loss" in err
    assert not (tmp_path / "ckpt" / f"step-{last:06d}").exists()


# ------------------------------------------------------------------ item 3/5/7: --resume and its recipe
@pytest.mark.timeout(300)
def test_resume_refuses_fields_that_shape_the_run_and_reports_its_own_steps(tmp_path, token_files, capsys):
    train, valid = token_files
    base = [*SMALL, "--ranks", "1", "--data", str(train), "--save", str(tmp_path / "ckpt")]
    base += ["--set", "learning_rate=0.01", "--set", "eval_every=2"]
    assert cli.main([*base, "--valid", str(valid), "--steps", "4", "--out", str(tmp_path / "a")]) == 0
    capsys.readouterr()

    for change, named in (("context_length=17", "context_length 33 -> 17"),
                          ("learning_rate=0.02", "learning_rate 0.01 -> 0.02")):  # fmt: skip
        assert cli.main([*base, "--resume", "--steps", "6", "--set", change]) == 2
        err = capsys.readouterr().err
        assert "--resume: fields that shape the model, the data or the optimizer state differ" in err
        assert named in err

    resumed = [*base, "--resume", "--steps", "6", "--set", "eval_every=3", "--out", str(tmp_path / "b")]
    assert cli.main(resumed) == 0
    out = capsys.readouterr().out
    assert "changed since: training.steps 4 -> 6, training.eval_every 2 -> 3" in out
    history = pd.read_csv(tmp_path / "b" / "losses.csv")
    loss5, loss6 = history["train_loss"][4], history["train_loss"][5]
    assert f"trained steps 5-6: training loss {loss5:.4f} -> {loss6:.4f}; median step" in out  # no eval

    on_other_data = [str(valid) if arg == str(train) else arg for arg in base]
    assert cli.main([*on_other_data, "--resume", "--steps", "7", "--out", str(tmp_path / "c")]) == 0
    moved = f"--data {train.resolve()} ({train.stat().st_size} bytes) -> {valid.resolve()} ("
    assert moved in capsys.readouterr().out

    (tmp_path / "ckpt" / "recipe.json").unlink()  # a folder without the record: the ranks compare
    assert cli.main([*base, "--resume", "--steps", "8", "--set", "learning_rate=0.02"]) == 1
    assert "learning_rate 0.01 -> 0.02" in capsys.readouterr().err


# ----------------------------------------------------------------------------- item 8: the small ones
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-bytes", "0"], "--max-bytes must be >= 1 (leave it out for no limit), got 0"),
        (["--max-bytes", "-5"], "--max-bytes must be >= 1 (leave it out for no limit), got -5"),
    ],
)
def test_token_maker_refuses_bad_options(tmp_path, argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        tokens.main(["--out", str(tmp_path), *argv])
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_token_maker_refuses_an_out_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SystemExit):
        tokens.main(["--out", str(tmp_path / "f")])
    assert f"--out {tmp_path / 'f'} is a file, expected a folder" in capsys.readouterr().err


def test_a_token_file_cut_short_during_a_run_is_named(tmp_path):
    from cs336_basics import get_batch

    path = tmp_path / "train.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    with TokenFile(path, "--data") as data:
        inputs, targets = get_batch(data, 3, 17)
        assert ((targets - inputs) == 1).all()
        np.testing.assert_array_equal(data[990:1000], np.arange(990, 1000))
        os.truncate(path, 600)
        with pytest.raises(RuntimeError, match=rf"--data {path}: the file shrank from 2000 to 600 bytes"):
            data[500:600]
