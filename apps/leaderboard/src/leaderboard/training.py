"""Training on a token file: ``train.py --data TOKENS [--valid TOKENS] [--save DIR [--resume]]``.

Token files are flat arrays of uint16 token ids (``numpy.memmap``; ``python -m leaderboard.tokens`` makes
byte-level ones). Each step every rank draws its own ``batch_size / ranks`` windows with
``cs336_basics.get_batch`` from numpy's global RNG, seeded per rank (different data on each rank); the
learning rate follows ``cs336_basics.get_lr_cosine_schedule`` (``learning_rate`` to ``min_learning_rate``
over ``steps``, after ``lr_warmup_steps``); gradients are clipped to ``max_grad_norm`` (global norm over all
shards). Every ``eval_every`` steps (and after the last) the loss is measured on fixed, evenly spaced
windows of the held-out file (``eval_batches`` global batches, split over the ranks).

Checkpoints ``DIR/step-NNNNNN`` go through ``parallel.checkpoint.save_sharded`` (each rank writes its
shards and optimizer state); besides the step they hold every rank's numpy and torch RNG states and the
loss history, so ``--resume`` continues with the same data and, on a CPU, the same losses bit for bit as
a run that was never interrupted (same number of ranks).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from .recipes import Recipe

_CHECKPOINT = re.compile(r"step-(\d{6})")


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def latest_checkpoint(folder: Path | None) -> tuple[int, Path] | None:
    """``(step, path)`` of the newest checkpoint ``step-NNNNNN`` in ``folder``, or None."""
    if folder is None or not folder.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _CHECKPOINT.fullmatch(p.name))]
    return max(found) if found else None


def check_tokens(path: Path, option: str, vocab_size: int, context_length: int) -> None:
    """ValueError naming ``option`` unless ``path`` holds more than ``context_length + 1`` uint16 ids below
    ``vocab_size``."""
    if not path.is_file():
        raise ValueError(f"{option} {path}: no such file")
    size = path.stat().st_size
    if size % 2:
        raise ValueError(f"{option} {path}: {size} bytes is not a whole number of uint16 token ids")
    if size // 2 <= context_length + 1:
        raise ValueError(
            f"{option} {path}: {size // 2} tokens, need more than context_length + 1 = {context_length + 1}"
        )
    largest = int(np.memmap(path, dtype=np.uint16, mode="r").max())
    if largest >= vocab_size:
        raise ValueError(
            f"{option} {path}: token id {largest} is outside the model's vocabulary of {vocab_size}"
        )


@dataclass(frozen=True)
class TrainingRun:
    data: Path
    valid: Path | None
    save: Path | None
    resume: bool
    out: Path  # losses.csv / .md and loss.png

    @classmethod
    def checked(
        cls, data: Path, valid: Path | None, save: Path | None, resume: bool, out: Path, recipe: Recipe
    ) -> TrainingRun:
        """The run, after checking its files against ``recipe`` (ValueError naming the option)."""
        cfg = recipe.model_config()
        check_tokens(data, "--data", cfg.vocab_size, cfg.context_length)
        if valid is not None:
            check_tokens(valid, "--valid", cfg.vocab_size, cfg.context_length)
        if save is not None and recipe.sharding != "ours":
            raise ValueError(
                "--save: sharded checkpoints (parallel.checkpoint) need sharding=ours, "
                f"got {recipe.sharding!r}"
            )
        latest = latest_checkpoint(save)
        if resume:
            if latest is None:
                raise ValueError(f"--resume: no checkpoint step-NNNNNN in --save {save}")
            if latest[0] >= recipe.steps:
                raise ValueError(
                    f"--resume: {latest[1]} is at step {latest[0]}, not before --steps {recipe.steps}"
                )
        elif latest is not None:
            raise ValueError(
                f"--save {save} already holds {latest[1].name}; add --resume or choose another folder"
            )
        for option, folder in (("--out", out), ("--save", save)):
            if folder is not None:
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                except OSError as error:
                    raise ValueError(f"{option} {folder}: cannot create it ({error})") from None
        return cls(data, valid, save, resume, out)


def _data_seed(seed: int, rank: int) -> int:
    return (seed * 1_000_003 + 7919 * rank + 1) % 2**32


@torch.no_grad()
def evaluate(trainer, tokens: np.ndarray, recipe: Recipe, rank: int, world_size: int, device) -> float:
    """Mean loss over ``eval_batches`` global batches of evenly spaced windows of ``tokens``."""
    from .worker import mean_over_ranks

    context, per_rank = recipe.context_length, recipe.batch_size // world_size
    starts = np.linspace(0, len(tokens) - context - 1, recipe.eval_batches * recipe.batch_size).astype(
        np.int64
    )
    mine = starts.reshape(recipe.eval_batches, world_size, per_rank)[:, rank]
    total = torch.zeros((), dtype=torch.float64, device=device)
    for rows in mine:
        windows = torch.from_numpy(np.stack([tokens[s : s + context + 1].astype(np.int64) for s in rows]))
        windows = windows.to(device)
        total += trainer.root(windows[:, :-1], windows[:, 1:]).double()
    return mean_over_ranks(total / recipe.eval_batches)


def _save(run: TrainingRun, trainer, recipe: Recipe, step: int, history: list[dict], world_size: int) -> Path:
    from parallel.checkpoint import save_sharded

    rng_states = [None] * world_size
    dist.all_gather_object(rng_states, (np.random.get_state(), torch.get_rng_state()))
    path = run.save / checkpoint_name(step)
    extra = {"step": step, "history": history, "rng_states": rng_states, "recipe": recipe.as_dict()}
    save_sharded(path, trainer.root, trainer.optimizer, extra=extra)
    return path


def _resume(run: TrainingRun, trainer, rank: int, world_size: int) -> tuple[int, list[dict], Path]:
    from parallel.checkpoint import load_sharded

    _, path = latest_checkpoint(run.save)
    extra = load_sharded(path, trainer.root, trainer.optimizer)
    if len(extra["rng_states"]) == world_size:  # same ranks: continue each rank's data stream exactly
        numpy_state, torch_state = extra["rng_states"][rank]
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
    else:  # another number of ranks: fresh streams, seeded by the step
        np.random.seed(_data_seed(extra["step"], rank))
    return extra["step"], list(extra["history"]), path


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
    """Train ``recipe`` on ``run.data``; every rank returns the loss history and what was saved."""
    from cs336_basics import get_batch, get_lr_cosine_schedule
    from harness.timing import synchronize

    from .worker import build_trainer, max_over_ranks, mean_over_ranks

    recipe.validate(world_size)
    say = log if rank == 0 else (lambda *_: None)
    per_rank = recipe.batch_size // world_size
    data = np.memmap(run.data, dtype=np.uint16, mode="r")
    valid = np.memmap(run.valid, dtype=np.uint16, mode="r") if run.valid is not None else None
    trainer = build_trainer(recipe, baseline, device, per_rank)
    say(f"built the {trainer.name} trainer of {recipe.name} on {world_size} rank(s): {trainer.info}")
    np.random.seed(_data_seed(recipe.seed, rank))
    torch.manual_seed(_data_seed(recipe.seed, rank))
    start, history, saved = 0, [], []
    if run.resume:
        start, history, path = _resume(run, trainer, rank, world_size)
        say(f"resumed from {path} after step {start}")
    stopped = False
    for step in range(start + 1, recipe.steps + 1):
        late = time_budget is not None and time.time() - launch_time > time_budget
        if max_over_ranks(float(late), device):
            stopped = True
            break
        began = time.perf_counter()
        lr = get_lr_cosine_schedule(
            step, recipe.learning_rate, recipe.min_learning_rate, recipe.lr_warmup_steps, recipe.steps
        )
        for group in trainer.optimizer.param_groups:
            group["lr"] = lr
        tokens, targets = get_batch(data, per_rank, recipe.context_length, device)
        loss = trainer.forward_backward(tokens, targets)
        norm = trainer.clip_grad_norm(recipe.max_grad_norm)
        trainer.optimizer_step()
        synchronize(device)
        row = {
            "step": step,
            "lr": lr,
            "train_loss": mean_over_ranks(loss),
            "grad_norm": float(norm),
            "eval_loss": math.nan,
            "seconds": max_over_ranks(time.perf_counter() - began, device),
        }
        if valid is not None and (step % recipe.eval_every == 0 or step == recipe.steps):
            row["eval_loss"] = evaluate(trainer, valid, recipe, rank, world_size, device)
        history.append(row)
        evaluated = "" if math.isnan(row["eval_loss"]) else f"  eval loss {row['eval_loss']:.4f}"
        say(
            f"step {step:>5}/{recipe.steps}: loss {row['train_loss']:.4f}  grad norm {row['grad_norm']:.3f}  "
            f"lr {lr:.3g}  {row['seconds']:.3f} s{evaluated}"
        )
        if run.save is not None and (
            step == recipe.steps or (recipe.save_every and step % recipe.save_every == 0)
        ):
            saved.append(str(_save(run, trainer, recipe, step, history, world_size)))
    if stopped and history and history[-1]["step"] > start:
        say(f"time budget of {time_budget:g} s reached after step {history[-1]['step']}")
        if valid is not None and math.isnan(history[-1]["eval_loss"]):
            history[-1]["eval_loss"] = evaluate(trainer, valid, recipe, rank, world_size, device)
        if run.save is not None and not (saved and saved[-1].endswith(checkpoint_name(history[-1]["step"]))):
            saved.append(str(_save(run, trainer, recipe, history[-1]["step"], history, world_size)))
    return {
        "history": history,
        "first_step": start + 1,
        "stopped_by_time_budget": stopped,
        "checkpoints": saved,
        "world_size": world_size,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "trainer": trainer.name,
        "info": trainer.info,
        "data": str(run.data),
        "valid": str(run.valid) if run.valid is not None else None,
    }
