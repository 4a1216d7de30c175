"""Training on a token file: ``train.py --data TOKENS [--valid TOKENS] [--save DIR [--resume]]``.

Token files are flat arrays of uint16 token ids (``token_file``; ``python -m leaderboard.tokens`` makes
byte-level ones). Each step every rank draws its own ``batch_size / ranks`` windows with
``cs336_basics.get_batch`` from numpy's global RNG, seeded per rank (different data on each rank); the
learning rate follows ``cs336_basics.get_lr_cosine_schedule`` (``learning_rate`` to ``min_learning_rate``
over ``steps``, after ``lr_warmup_steps``); gradients are clipped to ``max_grad_norm`` (global norm over all
shards). Every ``training.eval_every`` steps (and after the last) the loss is measured on fixed, evenly spaced
windows of the held-out file (``eval_batches`` global batches, split over the ranks).

A step whose training loss (mean over ranks) or gradient norm is not finite is never applied: with
``training.on_nonfinite="stop"`` (the default) the run ends there, naming the step, and the report exits
with status 1; with ``"skip"`` the gradients are dropped and the row is marked skipped, until
``SKIPPED_IN_A_ROW`` steps in a row were skipped: that is divergence, not a bad batch, and ends the run as
"stop" does. A non-finite evaluation loss ends the run too. Losses are kept as they are (``nan`` in the
CSV); a step that was not evaluated has no evaluation loss (``None``, blank in the CSV).

Checkpoints ``DIR/step-NNNNNN`` (``train_state``) hold the weights, the optimizer state, every rank's RNG
states, the loss history and the recipe, so ``--resume`` continues with the same data and, on a CPU, the
same losses bit for bit as a run that was never interrupted (same number of ranks).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from cs336_basics import get_batch, get_lr_cosine_schedule
from harness.results import atomic_write_text
from harness.timing import synchronize
from parallel.heartbeat import beat

from .build import build_trainer
from .ranks import max_over_ranks, mean_over_ranks
from .recipe import Recipe
from .token_file import TokenFile, check_tokens
from .train_state import (
    RECIPE_RECORD,
    NonFiniteError,
    check_resumable,
    checkpoint_name,
    data_record,
    data_seed,
    latest_checkpoint,
    resume_training_state,
    save_training_state,
)
from .trainer import Trainer

SKIPPED_IN_A_ROW = 3  # with on_nonfinite="skip": this many skipped steps in a row end the run (divergence)


def check_writable(option: str, folder: Path) -> None:
    """ValueError naming ``option`` unless a file can be created in ``folder`` (created if missing)."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{option} {folder}: is a file, expected a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ValueError(f"{option} {folder}: cannot write there ({error.strerror})") from None


@dataclass(frozen=True)
class TrainingRun:
    data: Path
    valid: Path | None
    save: Path | None
    resume: bool
    out: Path  # losses.csv / .md and loss.png

    @classmethod
    def checked(
        cls,
        data: Path,
        valid: Path | None,
        save: Path | None,
        resume: bool,
        out: Path,
        recipe: Recipe,
        baseline: bool = False,
    ) -> TrainingRun:
        """The run, after checking its files against ``recipe`` (ValueError naming the option)."""
        if resume and save is None:
            raise ValueError("--resume needs --save DIR (the folder of the checkpoints)")
        if save is not None and (baseline or recipe.parallelism.sharding != "ours"):
            trainer = "the --baseline trainer" if baseline else f"sharding={recipe.parallelism.sharding!r}"
            raise ValueError(
                f"--save: sharded checkpoints (parallel.checkpoint) need our sharding (sharding=ours), "
                f"which {trainer} does not have"
            )
        context, vocab = recipe.model.context_length, recipe.model_config().vocab_size
        check_tokens(data, "--data", vocab, context)
        if valid is not None:
            check_tokens(valid, "--valid", vocab, context)
        latest = latest_checkpoint(save)
        if resume:
            if latest is None:
                raise ValueError(f"--resume: no checkpoint step-NNNNNN in --save {save}")
            if latest[0] >= recipe.training.steps:
                steps = recipe.training.steps
                raise ValueError(f"--resume: {latest[1]} is at step {latest[0]}, not before the run's last "
                                 f"step (training.steps={steps}); pass a larger --steps to train on")
            record = save / RECIPE_RECORD
            if record.is_file():
                check_resumable(json.loads(record.read_text()), recipe, f"--save {save}")
        elif latest is not None:
            raise ValueError(
                f"--save {save} already holds {latest[1].name}; add --resume or choose another folder"
            )
        for option, folder in (("--out", out), ("--save", save)):
            if folder is not None:
                check_writable(option, folder)
        return cls(data, valid, save, resume, out)


@torch.no_grad()
def evaluate(
    trainer: Trainer, tokens: TokenFile, recipe: Recipe, rank: int, world_size: int, device
) -> float:
    """Mean loss over ``eval_batches`` global batches of evenly spaced windows of ``tokens``."""
    context, batch = recipe.model.context_length, recipe.training.batch_size
    batches = recipe.training.eval_batches
    starts = np.linspace(0, len(tokens) - context - 1, batches * batch).astype(np.int64)
    mine = starts.reshape(batches, world_size, batch // world_size)[:, rank]
    total = torch.zeros((), dtype=torch.float64, device=device)
    for rows in mine:
        windows = torch.from_numpy(np.stack([tokens[s : s + context + 1].astype(np.int64) for s in rows]))
        windows = windows.to(device)
        total += trainer.evaluate(windows[:, :-1], windows[:, 1:]).double()
    return mean_over_ranks(total / batches)


def _step_row(trainer: Trainer, recipe: Recipe, step: int, batch, device) -> dict:
    """One training step at the schedule's learning rate; a step whose loss or gradient norm is not finite
    drops its gradients instead of updating the weights (``skipped``)."""
    settings, steps = recipe.optimizer, recipe.training.steps
    began = time.perf_counter()
    lr = get_lr_cosine_schedule(
        step, settings.learning_rate, settings.min_learning_rate, settings.lr_warmup_steps, steps
    )
    for group in trainer.optimizer.param_groups:
        group["lr"] = lr
    loss, norm, applied = trainer.training_step(*batch, settings.max_grad_norm)
    synchronize(device)
    seconds = max_over_ranks(time.perf_counter() - began, device)
    return {"step": step, "lr": lr, "train_loss": loss, "grad_norm": norm, "eval_loss": None,
            "skipped": not applied, "seconds": seconds}  # fmt: skip


def _skipped_in_a_row(history: list[dict]) -> int:
    """How many of the last rows were skipped, counting back to the last applied step."""
    count = 0
    for row in reversed(history):
        if not row["skipped"]:
            break
        count += 1
    return count


def _line(row: dict, steps: int) -> str:
    evaluated = "" if row["eval_loss"] is None else f"  eval loss {row['eval_loss']:.4f}"
    skipped = "  not applied: not finite" if row["skipped"] else ""
    return (
        f"step {row['step']:>5}/{steps}: loss {row['train_loss']:.4f}  grad norm {row['grad_norm']:.3f}  "
        f"lr {row['lr']:.3g}  {row['seconds']:.3f} s{evaluated}{skipped}"
    )


def train(
    rank: int,
    world_size: int,
    device: torch.device,
    recipe: Recipe,
    run: TrainingRun,
    baseline: bool,
    launch_time: float,
    time_budget: float | None = None,
    log=print,
) -> dict:
    """Train ``recipe`` (validated for ``world_size``) on ``run.data``; every rank returns the loss history,
    what was saved, and ``failure`` (why a non-finite value ended the run, or None)."""
    say = log if rank == 0 else (lambda *_: None)
    steps, per_rank = recipe.training.steps, recipe.training.batch_size // world_size
    data = TokenFile(run.data, "--data")
    valid = TokenFile(run.valid, "--valid") if run.valid is not None else None
    beat("build")
    trainer = build_trainer(recipe, recipe.model_config(), device, per_rank, baseline)
    say(f"built the {trainer.name} trainer of {recipe.name} on {world_size} rank(s): {trainer.info}")
    np.random.seed(data_seed(recipe.training.seed, rank))
    torch.manual_seed(data_seed(recipe.training.seed, rank))
    start, history, saved, stopped, failure = 0, [], [], False, None
    if run.resume:
        start, history = resume_training_state(run.save, trainer, recipe, rank, data_record(run.data))
    if run.save is not None and rank == 0:
        atomic_write_text(run.save / RECIPE_RECORD, json.dumps(recipe.as_dict(), indent=2) + "\n")

    def evaluated(row: dict) -> None:
        beat(f"evaluate after step {row['step']}")
        row["eval_loss"] = evaluate(trainer, valid, recipe, rank, world_size, device)

    def check_evaluated(row: dict) -> None:
        if row["eval_loss"] is not None and not math.isfinite(row["eval_loss"]):
            raise NonFiniteError(f"step {row['step']}: the evaluation loss is {row['eval_loss']}")

    def save(step: int) -> None:
        path = save_training_state(run.save, trainer, recipe, step, history, data_record(run.data))
        saved.append(str(path))

    try:
        for step in range(start + 1, steps + 1):
            late = time_budget is not None and time.time() - launch_time > time_budget
            if max_over_ranks(float(late), device):
                stopped = True
                break
            beat(f"compile (step {step})" if step == start + 1 else f"step {step}")
            batch = get_batch(data, per_rank, recipe.model.context_length, device)
            row = _step_row(trainer, recipe, step, batch, device)
            history.append(row)
            if row["skipped"] and recipe.training.on_nonfinite == "stop":
                say(_line(row, steps))
                raise NonFiniteError(
                    f"step {step}: training loss {row['train_loss']}, gradient norm {row['grad_norm']}; not "
                    f"applied (the weights are those after step {step - 1}; learning_rate="
                    f"{recipe.optimizer.learning_rate:g}); set on_nonfinite=skip to skip such steps instead"
                )
            if _skipped_in_a_row(history) >= SKIPPED_IN_A_ROW:
                say(_line(row, steps))
                first = step - SKIPPED_IN_A_ROW + 1
                raise NonFiniteError(
                    f"steps {first}-{step}: {SKIPPED_IN_A_ROW} steps in a row had a non-finite training loss "
                    f"or gradient norm and were skipped (on_nonfinite=skip): the run diverged; the weights "
                    f"are those after step {first - 1} (learning_rate={recipe.optimizer.learning_rate:g})"
                )
            if valid is not None and (step % recipe.training.eval_every == 0 or step == steps):
                evaluated(row)
            say(_line(row, steps))
            check_evaluated(row)
            every = recipe.checkpoint.save_every
            if run.save is not None and (step == steps or (every and step % every == 0)):
                save(step)
        if stopped and history and history[-1]["step"] > start:
            last = history[-1]
            say(f"time budget of {time_budget:g} s reached after step {last['step']}")
            if valid is not None and last["eval_loss"] is None:
                evaluated(last)
                say(f"evaluation loss after step {last['step']}: {last['eval_loss']:.4f}")
                check_evaluated(last)
            if run.save is not None and not (saved and saved[-1].endswith(checkpoint_name(last["step"]))):
                save(last["step"])
    except NonFiniteError as error:
        failure = str(error)
    finally:
        data.close()
        if valid is not None:
            valid.close()
    return {
        "history": history,
        "first_step": start + 1,
        "stopped_by_time_budget": stopped,
        "failure": failure,
        "checkpoints": saved,
        "world_size": world_size,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "trainer": trainer.name,
        "info": trainer.info,
        "data": str(run.data),
        "valid": str(run.valid) if run.valid is not None else None,
    }
