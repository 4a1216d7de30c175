"""Ranks agreeing on the collectives they issue, so that a module or a gradient used on some ranks only raises
on every rank (naming it) instead of pairing different collectives, which hangs, aborts or silently mixes up
weights of the same size.

A rank that is about to issue a collective names it by a code (kind and unit); an *exchange* all-reduces
that code and a digest of the codes issued since the end of the previous step (32 bytes, over the gloo group
of ``parallel.grad_presence.check_group()``, no device synchronization). When they differ on some rank,
every rank raises the same ``RuntimeError`` saying what each rank was about to do, before any mismatched
collective. As torch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` checks collectives, but naming parameters.

Modes (``mode``; FSDP's ``check_lockstep``):

* ``"always"``: an exchange before every collective and at the end of every step. One host round trip per
  collective.
* ``"on_change"`` (the default of FSDP): work is cut into *passes* (a root forward and everything up to the
  next one: its backward and the end of the step), told apart by kind (FSDP: with or without gradients,
  with or without gradient synchronization). The first pass of each kind exchanges before every collective;
  its sequence of codes then becomes the verified *plan* of its kind. A later pass compares each code, on
  the host, with its kind's plan and exchanges from its first difference to its end (then its sequence
  becomes the plan). Every step still ends with one exchange, whose digest covers every collective of the
  step. So the first step, and any change that all ranks make together (a branch taken by every rank, an
  evaluation pass, gradient accumulation) are checked collective by collective; a steady step costs one
  exchange. Limit: a rank that alone leaves the plan cannot be told by the others (only an exchange per
  collective would tell them), so the ranks may pair different collectives: if those complete (same sizes),
  the digest at the end of the step raises on every rank; otherwise they hang or the backend fails. Run
  with ``"always"`` to name the first differing collective.
* ``"never"``: no exchange.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
import torch.distributed as dist

from parallel.grad_presence import check_group

__all__ = ["MODES", "Lockstep"]

MODES = ("on_change", "always", "never")
_DIGEST_MODULUS = (1 << 61) - 1  # a prime: digests stay nonnegative int64 values


class Lockstep:
    """Check that every rank issues the same collectives (see the module docstring for ``mode``)."""

    def __init__(self, who: str, mode: str = "always"):
        if mode not in MODES:
            raise ValueError(f"check_lockstep must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
        self.who, self.mode = who, mode
        self._world_size = dist.get_world_size()
        self._group = check_group() if self._world_size > 1 and mode != "never" else None
        self._plans: dict[Hashable, tuple[int, ...]] = {}  # pass kind -> its verified sequence of codes
        self._kind: Hashable = None
        self._codes: list[int] = []  # this pass's codes
        self._plan: tuple[int, ...] | None = None
        self._exchanging = True  # this pass exchanges before each collective
        self._broken = False  # this pass met a difference: it never becomes a plan
        self._digest, self._count = 0, 0  # of the codes since the end of the previous step

    def begin_pass(self, kind: Hashable) -> None:
        """A pass of ``kind`` starts; the previous pass, if it exchanged without a difference, becomes the
        plan of its kind."""
        if self._exchanging and self._codes and not self._broken:
            self._plans[self._kind] = tuple(self._codes)
        self._kind, self._codes, self._broken = kind, [], False
        self._plan = self._plans.get(kind)
        self._exchanging = self.mode == "always" or self._plan is None

    def agree(self, code: int, describe: Callable[[], str]) -> None:
        """Return once every rank is about to issue the collective ``code`` (a nonnegative int) after the same
        earlier ones; otherwise raise ``RuntimeError`` on every rank listing ``describe()`` of each rank."""
        if self._group is None:
            return
        if not self._exchanging:
            position = len(self._codes)
            self._exchanging = position >= len(self._plan) or self._plan[position] != code
        if self._exchanging:
            self._exchange(code, describe)
        self._codes.append(code)
        self._digest = (self._digest * 1_000_003 + code + 1) % _DIGEST_MODULUS
        self._count += 1

    def agree_on_step_end(self, code: int, describe: Callable[[], str]) -> None:
        """One exchange (every mode but "never") comparing ``code`` and every collective of the step."""
        try:
            if self._group is not None:
                self._exchange(code, describe)
        finally:
            self._digest, self._count = 0, 0

    def _exchange(self, code: int, describe: Callable[[], str]) -> None:
        mine = torch.tensor([code, self._digest], dtype=torch.int64)
        extremes = torch.cat([mine, -mine])
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=self._group)
        if torch.equal(extremes[:2], -extremes[2:]):  # the largest values equal the smallest
            return
        codes_differ = bool(extremes[0] != -extremes[2])
        intent = describe() if codes_differ else (
            f"{describe()} after {self._count} collectives in this step (digest {self._digest:#x})")
        intents: list[str | None] = [None] * self._world_size
        dist.all_gather_object(intents, intent, group=self._group)
        self._forget()
        by_intent: dict[str, list[int]] = {}
        for rank, text in enumerate(intents):
            by_intent.setdefault(text, []).append(rank)
        listed = "; ".join(f"{'rank' if len(r) == 1 else 'ranks'} {', '.join(map(str, r))} would {text}"
                           for text, r in by_intent.items())
        earlier = "" if codes_differ else " (and issued different ones earlier in this step, unchecked)"
        raise RuntimeError(
            f"{self.who}: ranks are about to issue different collectives{earlier} (every rank must run the "
            f"same sharded modules and produce the same gradients in each step): {listed}")

    def _forget(self) -> None:
        """After a difference nothing is verified: every pass exchanges until one of its kind agrees again."""
        self._plans.clear()
        self._exchanging = self._broken = True
        self._digest, self._count = 0, 0
