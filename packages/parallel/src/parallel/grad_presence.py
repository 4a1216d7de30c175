"""Ranks agreeing on which parameters got a gradient, before gradients are averaged.

Collectives are matched by order: if rank 0 all-reduces the gradient of a parameter that rank 1 never
produced (a branch taken on rank 0 only), the ranks pair different tensors and hang, abort or silently
average the wrong ones. So every wrapper, once per synchronized step and before it waits for (or issues) its
remaining gradient collectives, all-gathers one small record per rank: which of its parameters received a
gradient since the last synchronization, how many gradient collectives it has already launched, and how
many trainable parameters the wrapped module gained after wrapping (never broadcast, never averaged). When
the records differ, every rank raises the same error naming the parameters and the ranks.

The records travel in a gloo group of their own (``check_group()``), never in the group that carries the
gradients: a rank that launched more gradient collectives during backward than another cannot then pair
its record with the other rank's gradient, and under NCCL the check needs no device synchronization. One
all-gather of ``4 * (parameters + 2)`` bytes per rank and step.

A parameter that gets no gradient on any rank is fine (as with torch DDP's ``find_unused_parameters``):
no rank reduces it, and its ``.grad`` stays as it was.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["Disagreement", "GradPresence", "agree_on_presence", "check_group"]

_SHOWN = 4  # parameters named in one message; the rest are counted
_CHECK_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # default group -> its gloo twin


def check_group() -> dist.ProcessGroup:
    """A gloo group over the default group's ranks, for small host-side checks (collective on the first
    call for each default group; later calls return the same group)."""
    world = dist.group.WORLD
    group = _CHECK_GROUPS.get(world)
    if group is None:
        group = _CHECK_GROUPS[world] = dist.new_group(backend="gloo")
    return group


@dataclass(frozen=True)
class Disagreement:
    """Why the ranks' records differ, and the most gradient collectives any rank has already launched."""

    message: str
    most_launched: int


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _listed(items: list[str]) -> str:
    more = f"; and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return "; ".join(items[:_SHOWN]) + more


def agree_on_presence(who: str, name_of: Callable[[int], str], got: Sequence[bool], launched: int = 0,
                      added: Sequence[str] = ()) -> Disagreement | None:
    """All-gather this rank's record (collective over ``check_group()``: call on every rank) and return None
    when every rank has the same ``got`` and none has ``added`` parameters, else the ``Disagreement``.

    ``name_of(i)`` names the parameter whose presence is ``got[i]`` (called only to report a disagreement);
    ``launched``: gradient collectives this rank already issued this step; ``added``: names of the trainable
    parameters the module gained after wrapping.
    """
    world_size = dist.get_world_size()
    if world_size == 1:  # nothing to disagree with; an added parameter needs neither broadcast nor average
        return None
    record = torch.tensor([launched, len(added), *got], dtype=torch.int32)
    rows = torch.empty(world_size * record.numel(), dtype=torch.int32)
    group = check_group()
    dist.all_gather_into_tensor(rows, record, group=group)
    rows = rows.view(world_size, -1)
    presence = rows[:, 2:]
    differing = (presence != presence[0]).any(0).nonzero().flatten().tolist()
    if not differing and not rows[:, 1].any():
        return None
    problems = []
    for i in differing:
        with_grad = presence[:, i].nonzero().flatten().tolist()
        without = [r for r in range(world_size) if r not in with_grad]
        problems.append(f"{name_of(i)} got one on {_ranks(with_grad)}, not on {_ranks(without)}")
    message = ""
    if problems:
        message = (f"{who}: ranks disagree on which parameters got a gradient since the last synchronization "
                   f"(every rank must produce the same ones; a parameter unused on every rank is fine): "
                   f"{_listed(problems)}")
    if rows[:, 1].any():
        per_rank: list[list[str] | None] = [None] * world_size
        dist.all_gather_object(per_rank, list(added), group=group)
        holders: dict[str, list[int]] = {}
        for rank, rank_added in enumerate(per_rank):
            for name in rank_added:
                holders.setdefault(name, []).append(rank)
        listed = _listed([f"{name!r} on {_ranks(ranks)}" for name, ranks in holders.items()])
        message += (". Also: " if message else f"{who}: ") + (
            f"trainable parameters were added to the module after wrapping (they would be neither broadcast "
            f"nor averaged): {listed}; add them before wrapping, or wrap the module again")
    return Disagreement(message, int(rows[:, 0].max()))


class GradPresence:
    """Which of a wrapper's ``params`` received a gradient since the last synchronization, and which trainable
    parameters ``module`` gained after wrapping; names are ``prefix`` + the name in ``module``."""

    def __init__(self, who: str, module: nn.Module, params: Sequence[Tensor], prefix: str = ""):
        self.who, self.prefix = who, prefix
        self._module = module
        self._params = list(params)
        self._index = {id(p): i for i, p in enumerate(self._params)}  # ids: hashing a tensor calls Python
        first_name = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            first_name.setdefault(p, prefix + name)
        self._names = [first_name.get(p, f"{prefix}<parameter {i}>") for i, p in enumerate(self._params)]
        self._known = [*self._params, *(p for p in module.parameters() if p.requires_grad)]  # kept alive ...
        self._known_ids = {id(p) for p in self._known}  # ... so that their ids stay theirs
        self._marks = bytearray(len(self._params))
        if dist.get_world_size() > 1:
            check_group()  # created now, when every rank is constructing the wrapper

    def mark(self, param: Tensor) -> None:
        """Record that ``param`` received a gradient (call from its post-accumulate-grad hook)."""
        self._marks[self._index[id(param)]] = 1

    def reset(self) -> None:
        self._marks = bytearray(len(self._params))

    def added_parameters(self) -> list[str]:
        """Names of the trainable parameters of the module that were not there (or frozen) at wrapping."""
        # A walk over the modules' own dicts: module.parameters() builds every name and costs ~3x more.
        added, stack = [], [self._module]
        while stack:
            module = stack.pop()
            stack.extend(child for child in module._modules.values() if child is not None)
            added += [p for p in module._parameters.values()
                      if p is not None and id(p) not in self._known_ids and p.requires_grad]
        if not added:
            return []
        names = {p: self.prefix + n for n, p in self._module.named_parameters()}
        return list(dict.fromkeys(names[p] for p in added))  # a tied parameter once

    def agree(self, launched: int = 0) -> tuple[list[Tensor], Disagreement | None]:
        """The parameters that got a gradient (a gradient set to None since counts as none), and whether the
        ranks disagree (collective: see ``agree_on_presence``). Clears the marks for the next step."""
        got = [bool(m) and p.grad is not None for m, p in zip(self._marks, self._params, strict=True)]
        self.reset()
        added = self.added_parameters()
        disagreement = agree_on_presence(self.who, lambda i: repr(self._names[i]), got, launched, added)
        return [p for p, g in zip(self._params, got, strict=True) if g], disagreement
