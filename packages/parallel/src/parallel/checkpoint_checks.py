"""What ``load_sharded`` compares before it reads a tensor: the keys, shapes and dtypes of the model's
tensors, and the optimizer's class, param groups (which parameters, which hyper-parameter keys). Every
refusal is a ``CheckpointError`` naming the key, the expected and the found value.

Missing keys (in the model, not in the checkpoint) and unexpected ones (the other way round), and differing
hyper-parameter keys, are refused unless ``strict=False``, as ``nn.Module.load_state_dict`` does; shapes,
dtypes, the optimizer's class, the number of groups and a parameter in another group are refused always.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from parallel.checkpoint_errors import CheckpointError
from parallel.ddp import _DataParallel
from parallel.fsdp import FSDP
from parallel.fsdp_state import persistent_buffers
from parallel.zero import ShardedOptimizer

__all__ = ["check_dtype", "check_model", "check_optimizer", "describe_optimizer", "inner_optimizer",
           "model_shapes"]


def _listed(keys: list[str], most: int = 8) -> str:
    shown = ", ".join(repr(k) for k in keys[:most])
    return f"[{shown}{f', ... ({len(keys)} in all)' if len(keys) > most else ''}]"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def model_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """``{"model/<name>": shape}`` of every parameter (a tied one under its first name) and persistent buffer,
    whole (unsharded), the same on every rank."""
    if isinstance(model, FSDP):
        named, module = model._param_names, model.module
    else:
        module = model.module if isinstance(model, _DataParallel) else model
        named = list(module.named_parameters())
    shapes, seen = {}, set()
    for name, p in named:
        if p not in seen:
            seen.add(p)
            shapes[f"model/{name}"] = tuple(p.shape)
    for name, b in persistent_buffers(module):
        shapes[f"model/{name}"] = tuple(b.shape)
    return shapes


def _optimizer_keys(stored: dict[str, Any], names: set[str]) -> list[str]:
    """Optimizer-state keys of the checkpoint that belong to no parameter in ``names``."""
    return [k for k in stored if k.startswith("optim/") and k != "optim/param_groups"
            and k[len("optim/"):].rsplit("/", 1)[0] not in names]


def check_model(stored: dict[str, Any], saved_shapes: dict[str, list[int]] | None,
                shapes: dict[str, tuple[int, ...]], strict: bool) -> set[str]:
    """Compare the checkpoint's keys (DCP metadata ``stored``, manifest ``saved_shapes`` or None) with the
    model's ``shapes``; return the model's keys the checkpoint lacks (allowed only when not ``strict``)."""
    names = {k[len("model/"):] for k in shapes}
    missing = [k for k in shapes if k not in stored]
    unexpected = [k for k in stored if k.startswith("model/") and k not in shapes]
    unexpected += _optimizer_keys(stored, names)
    if strict and (missing or unexpected):
        parts = [f"missing keys {_listed(missing)} (in the model, not in the checkpoint)"] if missing else []
        if unexpected:
            parts.append(f"unexpected keys {_listed(unexpected)} (in the checkpoint, not in the model)")
        raise CheckpointError(f"checkpoint does not match the model: {'; '.join(parts)}; strict=False loads "
                              f"the keys both have")
    for key, shape in shapes.items():
        if key not in stored:
            continue
        md = stored[key]
        if not isinstance(md, TensorStorageMetadata):
            raise CheckpointError(f"checkpoint's {key!r} is not a tensor, the model's is of shape {shape}")
        if md.size.numel() != math.prod(shape):
            raise CheckpointError(f"checkpoint's {key!r} has {md.size.numel()} elements, the model's "
                                  f"{math.prod(shape)} (shape {shape})")
        if saved_shapes is not None and key in saved_shapes and tuple(saved_shapes[key]) != shape:
            raise CheckpointError(f"checkpoint's {key!r} has shape {tuple(saved_shapes[key])}, the model's "
                                  f"{shape}")
    return set(missing)


def check_dtype(stored: dict[str, Any], key: str, destination: Tensor) -> None:
    """Refuse loading the checkpoint's ``key`` into ``destination`` of another dtype (no silent cast)."""
    found = stored[key].properties.dtype
    if found != destination.dtype:
        raise CheckpointError(f"checkpoint's {key!r} is {_dtype_name(found)}, the model's "
                              f"{_dtype_name(destination.dtype)}; convert the model to load it")


def inner_optimizer(optimizer: Any) -> tuple[torch.optim.Optimizer, list[dict]]:
    """``(the optimizer holding this rank's state, the groups whose hyper-parameters are saved)``."""
    if isinstance(optimizer, ShardedOptimizer):
        return optimizer.local_optimizer, optimizer.param_groups
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}")
    return optimizer, optimizer.param_groups


def hyperparameters(optimizer: Any) -> list[dict]:
    """Every group's hyper-parameters (no ``params``); a ``ShardedOptimizer``'s include its wrapped
    optimizer's defaults."""
    inner, groups = inner_optimizer(optimizer)
    if not isinstance(optimizer, ShardedOptimizer):
        return [{k: v for k, v in g.items() if k != "params"} for g in groups]
    return [{k: v for k, v in {**local, **g}.items() if k != "params"}
            for g, local in zip(groups, inner.param_groups, strict=True)]


def _qualified(optimizer: Any) -> str:
    cls = type(inner_optimizer(optimizer)[0])
    return f"{cls.__module__}.{cls.__qualname__}"


def describe_optimizer(optimizer: Any, group_names: list[list[str]]) -> dict:
    """The manifest's record of ``optimizer``: class, and per group its hyper-parameter keys and the
    parameter names in ``group_names`` (gathered over ranks)."""
    return {"class": _qualified(optimizer),
            "groups": [{"hyperparameters": sorted(h), "params": sorted(n)}
                       for h, n in zip(hyperparameters(optimizer), group_names, strict=True)]}


def check_optimizer(saved: dict | None, saved_groups: list[dict], optimizer: Any,
                    group_names: list[list[str]], strict: bool) -> None:
    """Compare the manifest's record ``saved`` (None for a checkpoint without one), the checkpoint's
    hyper-parameters ``saved_groups`` and this rank's ``group_names`` with ``optimizer``."""
    if saved is not None and saved["class"] != _qualified(optimizer):
        raise CheckpointError(f"checkpoint's optimizer is {saved['class']}, this one {_qualified(optimizer)}")
    current = hyperparameters(optimizer)
    if len(saved_groups) != len(current):
        raise CheckpointError(f"optimizer has {len(current)} param_groups, the checkpoint's "
                              f"{len(saved_groups)}")
    for i, (here, there) in enumerate(zip(current, saved_groups, strict=True)):
        missing, unexpected = sorted(set(here) - set(there)), sorted(set(there) - set(here))
        if strict and (missing or unexpected):
            raise CheckpointError(
                f"optimizer param_groups[{i}]: hyper-parameters {missing} are not in the checkpoint, the "
                f"checkpoint's {unexpected} not in this optimizer; strict=False loads the keys both have")
    if saved is None:
        return
    group_of = {name: i for i, g in enumerate(saved["groups"]) for name in g["params"]}
    for i, names in enumerate(group_names):
        for name in names:
            if group_of.get(name, i) != i:
                raise CheckpointError(f"parameter {name!r} is in param_groups[{i}] of this optimizer, in "
                                      f"param_groups[{group_of[name]}] of the checkpoint's")
