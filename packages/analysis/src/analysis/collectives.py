"""Cost of ring collectives, derived with sympy from a model of their steps.

Model: ``N`` devices in a ring; device ``i`` sends only to ``i + 1`` over a link of bandwidth ``W`` bytes/s
(its outgoing bandwidth) and each message also pays a latency ``alpha`` (0 in the project's setting). A ring
algorithm runs in lock-step rounds: in every round each device sends one message, so a round costs
``alpha + m / W`` for a message of ``m`` bytes and the total time is the sum over the rounds.

Each algorithm is described by what a device holds after ``k`` rounds (``coverage``) and by the size of the
message it sends (``message_bytes``). The number of rounds is *solved* from ``coverage(k) = N`` and the time
is the *sum* of the round costs; nothing here is typed in as the answer. ``S`` is the size of the result on
each device for all-gather, and of each device's input for reduce-scatter and all-reduce.

Limits: one ring, full-duplex links, no contention with other traffic, no compute time for the reductions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import sympy as sp

N, S, W, alpha = sp.symbols("N S W alpha", positive=True)
k, t = sp.symbols("k t", integer=True, positive=True)

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "alternate_all_reduce")


@dataclass(frozen=True)
class RingPhase:
    """One phase of a ring algorithm.

    ``coverage``: number of the ``N`` pieces of the result a device holds (all-gather), or number of devices
    whose contributions a travelling partial sum holds (reductions), after ``k`` rounds.
    ``message_bytes``: bytes one device sends in round ``t``.
    """

    name: str
    coverage: sp.Expr
    message_bytes: sp.Expr
    explanation: str

    def rounds(self) -> sp.Expr:
        """Rounds until the phase is complete: the ``k`` solving ``coverage(k) = N``."""
        (solution,) = sp.solve(sp.Eq(self.coverage, N), k)
        return sp.simplify(solution)

    def time(self) -> sp.Expr:
        """``sum_{t=1}^{rounds} (alpha + message_bytes(t) / W)``."""
        return sp.simplify(sp.summation(alpha + self.message_bytes / W, (t, 1, self.rounds())))


ALL_GATHER_PHASE = RingPhase(
    "all-gather",
    coverage=1 + k,
    message_bytes=S / N,
    explanation=(
        "each device starts with its own piece of S/N bytes and in every round forwards the piece it "
        "received in the previous round, so it gains one new piece per round"
    ),
)

REDUCE_SCATTER_PHASE = RingPhase(
    "reduce-scatter",
    coverage=1 + k,
    message_bytes=S / N,
    explanation=(
        "the partial sum of one piece (S/N bytes) travels around the ring; each receiver adds its own "
        "contribution, so after k rounds it holds k + 1 contributions"
    ),
)

ALTERNATE_PHASE = RingPhase(
    "alternate all-reduce",
    coverage=1 + k,
    message_bytes=S,
    explanation=(
        "each device forwards a whole input vector x_j (S bytes) per round and adds what it receives to its "
        "running sum y, which gains one input per round"
    ),
)

PHASES: dict[str, tuple[RingPhase, ...]] = {
    "all_gather": (ALL_GATHER_PHASE,),
    "reduce_scatter": (REDUCE_SCATTER_PHASE,),
    "all_reduce": (REDUCE_SCATTER_PHASE, ALL_GATHER_PHASE),
    "alternate_all_reduce": (ALTERNATE_PHASE,),
}


def _check_kind(kind: str) -> None:
    if kind not in PHASES:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")


@cache
def ring_rounds(kind: str) -> sp.Expr:
    """Number of rounds of the ring algorithm ``kind`` as an expression in ``N``."""
    _check_kind(kind)
    return sp.simplify(sum(phase.rounds() for phase in PHASES[kind]))


@cache
def ring_time(kind: str, with_latency: bool = False) -> sp.Expr:
    """Time of the ring algorithm ``kind`` in ``S, N, W`` (and ``alpha`` if ``with_latency``)."""
    _check_kind(kind)
    total = sp.simplify(sum(phase.time() for phase in PHASES[kind]))
    return total if with_latency else sp.simplify(total.subs(alpha, 0))


def bytes_sent_per_device(kind: str) -> sp.Expr:
    """Bytes each device sends in total: the time at ``alpha = 0`` times ``W``."""
    return sp.simplify(ring_time(kind) * W)


def collective_time(
    kind: str, size_bytes: float, world_size: int, bandwidth: float, latency: float = 0.0
) -> float:
    """Seconds of ring ``kind`` on ``size_bytes`` over ``world_size`` devices (numeric :func:`ring_time`)."""
    _check_kind(kind)
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if size_bytes < 0 or bandwidth <= 0 or latency < 0:
        raise ValueError(
            f"need size_bytes >= 0, bandwidth > 0, latency >= 0; got {size_bytes}, {bandwidth}, {latency}"
        )
    expr = ring_time(kind, with_latency=True)
    return float(expr.subs({S: size_bytes, N: world_size, W: bandwidth, alpha: latency}))


def bus_bandwidth(kind: str, size_bytes: float, world_size: int, seconds: float) -> float:
    """The ``W`` (bytes/s) explaining a measured time: bytes sent per device / seconds (nccl-tests' busbw).

    All-reduce: ``2 (N - 1) / N * S / t``; all-gather and reduce-scatter: ``(N - 1) / N * S / t``.
    """
    _check_kind(kind)
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    sent = bytes_sent_per_device(kind).subs({S: size_bytes, N: world_size})
    return float(sent) / seconds
