"""A training run's sharded checkpoints: their names, what they hold, and what ``--resume`` may change.

``DIR/step-NNNNNN`` is written by ``Trainer.save`` (each rank its shards and optimizer state) with the step,
every rank's numpy and torch RNG states, the loss history and the recipe, and only when every parameter is
finite. ``DIR/recipe.json`` records the recipe of the run that last wrote there, so that a ``--resume`` that
changes a field of ``RESUME_FIXED_FIELDS`` is refused before any process starts; the ranks compare the
checkpoint's own recipe again once it is loaded. Recipes recorded by the flat recipe of old (plain field
names) are compared through their aliases.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from parallel.heartbeat import beat

from .recipe import ALIASES, Recipe
from .trainer import Trainer

RECIPE_RECORD = "recipe.json"

_CHECKPOINT = re.compile(r"step-(\d{6})")

# What ``--resume`` refuses to change: the fields that shape the model (preset, proxy_ranks, context_length),
# the data stream (context_length, batch_size) or the optimizer state and the schedule that built it.
RESUME_FIXED_FIELDS = (
    "model.preset", "parallelism.proxy_ranks", "model.context_length", "training.batch_size",
    "parallelism.sharding", "optimizer.implementation", "optimizer.learning_rate",
    "optimizer.min_learning_rate", "optimizer.lr_warmup_steps", "optimizer.weight_decay",
)  # fmt: skip


class ResumeMismatch(ValueError):
    """``--resume`` with a recipe whose fixed fields differ from the checkpoint's."""


class NonFiniteError(RuntimeError):
    """A loss, gradient norm or parameter that is not finite ended the run (every rank raises it alike)."""


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def latest_checkpoint(folder: Path | None) -> tuple[int, Path] | None:
    """``(step, path)`` of the newest checkpoint ``step-NNNNNN`` in ``folder``, or None."""
    if folder is None or not folder.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _CHECKPOINT.fullmatch(p.name))]
    return max(found) if found else None


def _dotted(recorded: dict) -> dict:
    """A recorded recipe keyed ``"section.field"``: nested (``Recipe.as_dict``) or flat (plain names)."""
    out = {}
    for key, value in recorded.items():
        if isinstance(value, dict):
            out |= {f"{key}.{name}": v for name, v in value.items()}
        else:
            out[ALIASES.get(key, key)] = value
    return out


def resume_changes(saved: dict, current: Recipe) -> tuple[list[str], list[str]]:
    """``(refused, others)``: ``"field saved -> current"`` for each field of ``saved`` (a recorded recipe)
    that differs from ``current``, split by ``RESUME_FIXED_FIELDS``."""
    before, now = _dotted(saved), current.flat()
    changed = [path for path in now if path in before and before[path] != now[path]]
    text = {path: f"{path} {before[path]!r} -> {now[path]!r}" for path in changed}
    return ([text[p] for p in changed if p in RESUME_FIXED_FIELDS],
            [text[p] for p in changed if p not in RESUME_FIXED_FIELDS])  # fmt: skip


def check_resumable(saved: dict, current: Recipe, checkpoint: str) -> list[str]:
    """ResumeMismatch naming the fixed fields that differ from those ``checkpoint`` was trained with; else
    the other fields that changed."""
    refused, others = resume_changes(saved, current)
    if refused:
        raise ResumeMismatch(
            f"--resume: fields that shape the model, the data or the optimizer state differ from those "
            f"{checkpoint} was trained with (saved -> now): {', '.join(refused)}; they cannot change on "
            f"resume (drop those --set, or start a new --save folder)"
        )
    return others


def data_seed(seed: int, rank: int) -> int:
    """The seed of one rank's data stream."""
    return (seed * 1_000_003 + 7919 * rank + 1) % 2**32


def _nonfinite_parameter(root: torch.nn.Module) -> str | None:
    """``"name (rank r)"`` of a parameter holding a non-finite value on some rank, or None (collective)."""
    mine = next((name for name, p in root.named_parameters() if not bool(torch.isfinite(p).all())), None)
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, mine)
    return next((f"{name} (rank {rank})" for rank, name in enumerate(found) if name is not None), None)


def data_record(data: Path) -> dict:
    """What a checkpoint records of the token file it was trained on: its absolute path and size in bytes."""
    return {"path": str(data.resolve()), "bytes": data.stat().st_size}


def save_training_state(
    folder: Path, trainer: Trainer, recipe: Recipe, step: int, history: list[dict], data: dict
) -> Path:
    """Write ``folder/step-NNNNNN`` (collective), recording ``data`` (:func:`data_record`); NonFiniteError,
    writing nothing, if a weight is not finite."""
    beat(f"save step {step}")
    path = folder / checkpoint_name(step)
    bad = _nonfinite_parameter(trainer.root)
    if bad is not None:
        raise NonFiniteError(f"step {step}: parameter {bad} holds non-finite values; {path} not written")
    rng_states = [None] * dist.get_world_size()
    dist.all_gather_object(rng_states, (np.random.get_state(), torch.get_rng_state()))
    extra = {"step": step, "history": history, "rng_states": rng_states, "recipe": recipe.as_dict(),
             "data": data}  # fmt: skip
    trainer.save(path, extra)
    return path


def resume_training_state(
    folder: Path, trainer: Trainer, recipe: Recipe, rank: int, data: dict
) -> tuple[int, list[dict]]:
    """Load the latest checkpoint of ``folder`` into ``trainer`` and this rank's RNG streams; ``(step,
    history)``. ResumeMismatch if its recipe differs in a fixed field; a token file other than the one it
    recorded (``data``, :func:`data_record`) is listed with the fields that changed."""
    _, path = latest_checkpoint(folder)
    beat(f"resume from {path.name}")
    extra = trainer.load(path)
    changed = check_resumable(extra.get("recipe", {}), recipe, str(path))
    saved_data = extra.get("data")  # absent in checkpoints written before it was recorded
    if saved_data is not None and saved_data != data:
        changed.append(f"--data {saved_data['path']} ({saved_data['bytes']} bytes) -> {data['path']} "
                       f"({data['bytes']} bytes)")
    if len(extra["rng_states"]) == dist.get_world_size():  # same ranks: continue each rank's stream exactly
        numpy_state, torch_state = extra["rng_states"][rank]
        np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
    else:  # another number of ranks: fresh streams, seeded by the step
        np.random.seed(data_seed(extra["step"], rank))
    if rank == 0:
        print(f"resumed from {path} after step {extra['step']}" + (
            f"; changed since: {', '.join(changed)}" if changed else ""))  # fmt: skip
    return extra["step"], list(extra["history"])
