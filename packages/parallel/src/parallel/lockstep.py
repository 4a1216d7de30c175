"""Ranks agreeing on each collective before any of them issues it.

FSDP issues its gathers, reduce-scatters and all-reduces from module and gradient hooks, in the order the
model runs; a module run on some ranks only (a branch), or a gradient produced on some ranks only, would
make the ranks pair different collectives and hang, abort, or silently mix up weights of the same size.
``Lockstep.agree(code, describe)`` before each such collective all-reduces a 16-byte code naming it (kind and
unit) over the gloo group of ``parallel.grad_presence.check_group()``; when the codes differ, every rank
raises the same ``RuntimeError`` saying what each rank was about to do, before any mismatched collective.
As torch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` checks collectives, but naming parameters instead of shapes.
Cost: one host-side round trip per collective (no device synchronization).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from parallel.grad_presence import check_group

__all__ = ["Lockstep"]


class Lockstep:
    """Check, before each collective, that every rank is about to issue the same one (collective itself)."""

    def __init__(self, who: str):
        self.who = who
        self._world_size = dist.get_world_size()
        self._group = check_group() if self._world_size > 1 else None

    def agree(self, code: int, describe: Callable[[], str]) -> None:
        """Return once every rank has passed the same ``code`` (a nonnegative int naming the collective);
        otherwise raise ``RuntimeError`` on every rank listing ``describe()`` of each rank."""
        if self._group is None:
            return
        extremes = torch.tensor([code, -code], dtype=torch.int64)
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=self._group)
        if extremes[0] == -extremes[1]:  # the largest code equals the smallest
            return
        intents: list[str | None] = [None] * self._world_size
        dist.all_gather_object(intents, describe(), group=self._group)
        by_intent: dict[str, list[int]] = {}
        for rank, intent in enumerate(intents):
            by_intent.setdefault(intent, []).append(rank)
        listed = "; ".join(f"{'rank' if len(r) == 1 else 'ranks'} {', '.join(map(str, r))} would {intent}"
                           for intent, r in by_intent.items())
        raise RuntimeError(
            f"{self.who}: ranks are about to issue different collectives (every rank must run the same "
            f"sharded modules and produce the same gradients in each step): {listed}")
