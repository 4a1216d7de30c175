"""Training on a token file: ``train.py --data TOKENS [--valid TOKENS] [--save DIR [--resume]]``.

Token files are flat arrays of uint16 token ids (``token_file``; ``python -m leaderboard.tokens`` makes
byte-level ones). Each step every rank draws its own ``batch_size / ranks`` windows with
``cs336_basics.get_batch`` from numpy's global RNG, seeded per rank (different data on each rank); the
learning rate follows ``cs336_basics.get_lr_cosine_schedule`` (``learning_rate`` to ``min_learning_rate``
over ``steps``, after ``lr_warmup_steps``); gradients are clipped to ``max_grad_norm`` (global norm over all
shards). Every ``eval_every`` steps (and after the last) the loss is measured on fixed, evenly spaced
windows of the held-out file (``eval_batches`` global batches, split over the ranks).

A step whose training loss (mean over ranks) or gradient norm is not finite is never applied: with
``on_nonfinite="stop"`` (the default) the run ends there, naming the step, and the report exits with status
1; with ``"skip"`` the gradients are dropped and the row is marked skipped. A non-finite evaluation loss ends
the run too. Losses are kept as they are (``nan`` in the CSV); a step that was not evaluated has no
evaluation loss (``None``, blank in the CSV).

Checkpoints ``DIR/step-NNNNNN`` go through ``parallel.checkpoint.save_sharded`` (each rank writes its
shards and optimizer state); besides the step they hold every rank's numpy and torch RNG states, the
loss history and the recipe, so ``--resume`` continues with the same data and, on a CPU, the same losses bit
for bit as a run that was never interrupted (same number of ranks). A checkpoint is written only when every
parameter is finite. ``DIR/recipe.json`` records the recipe of the run that last wrote there, so that a
``--resume`` that changes a field of ``recipes.RESUME_FIXED_FIELDS`` is refused before any process starts;
the ranks compare the checkpoint's own recipe again once it is loaded.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from harness.results import atomic_write_text
from parallel.heartbeat import beat

from .recipes import Recipe, check_resumable
from .token_file import TokenFile, check_tokens

RECIPE_RECORD = "recipe.json"

_CHECKPOINT = re.compile(r"step-(\d{6})")


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def latest_checkpoint(folder: Path | None) -> tuple[int, Path] | None:
    """``(step, path)`` of the newest checkpoint ``step-NNNNNN`` in ``folder``, or None."""
    if folder is None or not folder.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _CHECKPOINT.fullmatch(p.name))]
    return max(found) if found else None


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


class NonFiniteError(RuntimeError):
    """A loss, gradient norm or parameter that is not finite ended the run (every rank raises it alike)."""


def _nonfinite_parameter(root: torch.nn.Module) -> str | None:
    """``"name (rank r)"`` of a parameter holding a non-finite value on some rank, or None (collective)."""
    mine = next((name for name, p in root.named_parameters() if not bool(torch.isfinite(p).all())), None)
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, mine)
    return next((f"{name} (rank {rank})" for rank, name in enumerate(found) if name is not None), None)


def _save(run: TrainingRun, trainer, recipe: Recipe, step: int, history: list[dict], world_size: int) -> Path:
    from parallel.checkpoint import save_sharded

    beat(f"save step {step}")
    path = run.save / checkpoint_name(step)
    bad = _nonfinite_parameter(trainer.root)
    if bad is not None:
        raise NonFiniteError(f"step {step}: parameter {bad} holds non-finite values; {path} not written")
    rng_states = [None] * world_size
    dist.all_gather_object(rng_states, (np.random.get_state(), torch.get_rng_state()))
    extra = {"step": step, "history": history, "rng_states": rng_states, "recipe": recipe.as_dict()}
    save_sharded(path, trainer.root, trainer.optimizer, extra=extra)
    return path


def _resume(run: TrainingRun, trainer, recipe: Recipe, rank: int, world_size: int) -> tuple[int, list[dict]]:
    from parallel.checkpoint import load_sharded

    _, path = latest_checkpoint(run.save)
    beat(f"resume from {path.name}")
    extra = load_sharded(path, trainer.root, trainer.optimizer)
    changed = check_resumable(extra.get("recipe", {}), recipe, str(path))
    if len(extra["rng_states"]) == world_size:  # same ranks: continue each rank's data stream exactly
        numpy_state, torch_state = extra["rng_states"][rank]
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
    else:  # another number of ranks: fresh streams, seeded by the step
        np.random.seed(_data_seed(extra["step"], rank))
    if rank == 0:
        print(f"resumed from {path} after step {extra['step']}" + (
            f"; changed since: {', '.join(changed)}" if changed else ""))  # fmt: skip
    return extra["step"], list(extra["history"])


def _step_row(trainer, recipe: Recipe, step: int, batch, device) -> dict:
    """One training step; a step whose loss or gradient norm is not finite drops its gradients instead of
    updating the weights (``skipped``)."""
    from cs336_basics import get_lr_cosine_schedule
    from harness.timing import synchronize

    from .worker import max_over_ranks, mean_over_ranks

    began = time.perf_counter()
    lr = get_lr_cosine_schedule(
        step, recipe.learning_rate, recipe.min_learning_rate, recipe.lr_warmup_steps, recipe.steps
    )
    for group in trainer.optimizer.param_groups:
        group["lr"] = lr
    loss = mean_over_ranks(trainer.forward_backward(*batch))
    norm = float(trainer.clip_grad_norm(recipe.max_grad_norm))
    finite = math.isfinite(loss) and math.isfinite(norm)  # the same on every rank: both are global
    if finite:
        trainer.optimizer_step()
    else:
        trainer.optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    seconds = max_over_ranks(time.perf_counter() - began, device)
    return {"step": step, "lr": lr, "train_loss": loss, "grad_norm": norm, "eval_loss": None,
            "skipped": not finite, "seconds": seconds}  # fmt: skip


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
    """Train ``recipe`` on ``run.data``; every rank returns the loss history, what was saved, and
    ``failure`` (why a non-finite value ended the run, or None)."""
    from cs336_basics import get_batch

    from .worker import build_trainer, max_over_ranks

    recipe.validate(world_size)
    say = log if rank == 0 else (lambda *_: None)
    per_rank = recipe.batch_size // world_size
    data = TokenFile(run.data, "--data")
    valid = TokenFile(run.valid, "--valid") if run.valid is not None else None
    beat("build")
    trainer = build_trainer(recipe, baseline, device, per_rank)
    say(f"built the {trainer.name} trainer of {recipe.name} on {world_size} rank(s): {trainer.info}")
    np.random.seed(_data_seed(recipe.seed, rank))
    torch.manual_seed(_data_seed(recipe.seed, rank))
    start, history, saved, stopped, failure = 0, [], [], False, None
    if run.resume:
        start, history = _resume(run, trainer, recipe, rank, world_size)
    if run.save is not None and rank == 0:
        atomic_write_text(run.save / RECIPE_RECORD, json.dumps(recipe.as_dict(), indent=2) + "\n")

    def evaluated(row: dict) -> None:
        beat(f"evaluate after step {row['step']}")
        row["eval_loss"] = evaluate(trainer, valid, recipe, rank, world_size, device)

    def check_evaluated(row: dict) -> None:
        if row["eval_loss"] is not None and not math.isfinite(row["eval_loss"]):
            raise NonFiniteError(f"step {row['step']}: the evaluation loss is {row['eval_loss']}")

    try:
        for step in range(start + 1, recipe.steps + 1):
            late = time_budget is not None and time.time() - launch_time > time_budget
            if max_over_ranks(float(late), device):
                stopped = True
                break
            beat(f"compile (step {step})" if step == start + 1 else f"step {step}")
            batch = get_batch(data, per_rank, recipe.context_length, device)
            row = _step_row(trainer, recipe, step, batch, device)
            history.append(row)
            if row["skipped"] and recipe.on_nonfinite == "stop":
                say(_line(row, recipe.steps))
                raise NonFiniteError(
                    f"step {step}: training loss {row['train_loss']}, gradient norm {row['grad_norm']}; not "
                    f"applied (the weights are those after step {step - 1}; learning_rate="
                    f"{recipe.learning_rate:g}); set on_nonfinite=skip to skip such steps instead"
                )
            if valid is not None and (step % recipe.eval_every == 0 or step == recipe.steps):
                evaluated(row)
            say(_line(row, recipe.steps))
            check_evaluated(row)
            if run.save is not None and (
                step == recipe.steps or (recipe.save_every and step % recipe.save_every == 0)
            ):
                saved.append(str(_save(run, trainer, recipe, step, history, world_size)))
        if stopped and history and history[-1]["step"] > start:
            last = history[-1]
            say(f"time budget of {time_budget:g} s reached after step {last['step']}")
            if valid is not None and last["eval_loss"] is None:
                evaluated(last)
                say(f"evaluation loss after step {last['step']}: {last['eval_loss']:.4f}")
                check_evaluated(last)
            if run.save is not None and not (saved and saved[-1].endswith(checkpoint_name(last["step"]))):
                saved.append(str(_save(run, trainer, recipe, last["step"], history, world_size)))
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
