"""Discrete-event simulation of ring collectives on real numpy arrays.

``N`` devices in a ring; device ``i`` owns one outgoing link to ``i + 1`` of bandwidth ``W`` bytes/s.
A message of ``m`` bytes occupies the sender's link for ``m / W`` seconds (messages on one link queue in
order) and arrives ``latency`` seconds after its last byte leaves. A device sends the message of round
``t + 1`` as soon as it has received (and reduced) the message of round ``t``: it computes its payload from
what it actually holds, so a wrong schedule gives a wrong result, not only a wrong time. Reductions take no
time.

Each algorithm is a small class with ``rounds``, ``payload(i, t)``, ``receive(j, t, message)`` and
``outputs()``; :func:`simulate` drives them with an event queue and reports the simulated makespan.
Arrays may have any length: pieces are split with ``numpy.array_split`` (then unequal message sizes make the
time differ slightly from the equal-piece formula).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class RingAlgorithm(Protocol):
    """A ring algorithm as :func:`simulate` drives it: ``rounds`` messages per device, in order."""

    rounds: int

    def payload(self, device: int, step: int) -> np.ndarray: ...

    def receive(self, device: int, step: int, message: np.ndarray) -> None: ...

    def outputs(self) -> list[np.ndarray]: ...


class RingAllGather:
    """Device ``i`` starts with piece ``i``; everyone ends with the concatenation of all pieces."""

    def __init__(self, pieces: list[np.ndarray]):
        self.n = len(pieces)
        self.rounds = self.n - 1
        self.held = [{i: pieces[i].copy()} for i in range(self.n)]

    def payload(self, device, step):
        return self.held[device][(device - step + 1) % self.n]

    def receive(self, device, step, message):
        self.held[device][(device - step) % self.n] = message

    def outputs(self):
        return [np.concatenate([held[j] for j in range(self.n)]) for held in self.held]


class RingReduceScatter:
    """Every device holds a vector; device ``i`` ends with piece ``i`` (``array_split``) of their sum."""

    def __init__(self, vectors: list[np.ndarray]):
        self.n = len(vectors)
        self.rounds = self.n - 1
        self.own = [np.array_split(v, self.n) for v in vectors]
        self.partial: list[dict[int, np.ndarray]] = [{} for _ in range(self.n)]

    def payload(self, device, step):
        piece = (device - step) % self.n
        return self.own[device][piece] if step == 1 else self.partial[device][piece]

    def receive(self, device, step, message):
        piece = (device - step - 1) % self.n
        self.partial[device][piece] = message + self.own[device][piece]

    def outputs_of(self, device: int) -> np.ndarray:
        return self.partial[device][device] if self.n > 1 else self.own[device][device]

    def outputs(self):
        return [self.outputs_of(i) for i in range(self.n)]


class RingAllReduce:
    """Reduce-scatter, then all-gather of the reduced pieces: ``2 (N - 1)`` rounds."""

    def __init__(self, vectors: list[np.ndarray]):
        self.n = len(vectors)
        self.rounds = 2 * (self.n - 1)
        self.scatter = RingReduceScatter(vectors)
        self.gathered: list[dict[int, np.ndarray] | None] = [None] * self.n

    def _held(self, device: int) -> dict[int, np.ndarray]:
        # a device enters the gather phase once its own scatter phase is over: it then holds reduced piece i
        if self.gathered[device] is None:
            self.gathered[device] = {device: self.scatter.outputs_of(device)}
        return self.gathered[device]

    def payload(self, device, step):
        if step <= self.n - 1:
            return self.scatter.payload(device, step)
        return self._held(device)[(device - (step - self.n + 1) + 1) % self.n]

    def receive(self, device, step, message):
        if step <= self.n - 1:
            self.scatter.receive(device, step, message)
        else:
            self._held(device)[(device - (step - self.n + 1)) % self.n] = message

    def outputs(self):
        return [np.concatenate([self._held(i)[j] for j in range(self.n)]) for i in range(self.n)]


class AlternateRingAllReduce:
    """The question's variant: in round ``t`` device ``i`` forwards all of ``x_{i-t+1}``, adds ``x_{i-t}``."""

    def __init__(self, vectors: list[np.ndarray]):
        self.n = len(vectors)
        self.rounds = self.n - 1
        self.forward = [v.copy() for v in vectors]
        self.total = [v.copy() for v in vectors]

    def payload(self, device, step):
        return self.forward[device]

    def receive(self, device, step, message):
        self.forward[device] = message
        self.total[device] = self.total[device] + message

    def outputs(self):
        return self.total


ALGORITHMS: dict[str, type[RingAlgorithm]] = {
    "all_gather": RingAllGather,
    "reduce_scatter": RingReduceScatter,
    "all_reduce": RingAllReduce,
    "alternate_all_reduce": AlternateRingAllReduce,
}


@dataclass(frozen=True)
class SimulationResult:
    outputs: list[np.ndarray]
    seconds: float
    messages: int
    bytes_sent: int


def simulate(kind: str, inputs: list[np.ndarray], bandwidth: float, latency: float = 0.0) -> SimulationResult:
    """Run the ring algorithm ``kind`` on ``inputs`` (one array per device) and time it.

    ``inputs``: for all-gather the pieces (any lengths), otherwise equal-length 1-D vectors.
    ``bandwidth`` in bytes/s, ``latency`` in seconds. Returns each device's output and the makespan.
    """
    if kind not in ALGORITHMS:
        raise ValueError(f"kind must be one of {', '.join(ALGORITHMS)}, got {kind!r}")
    if not inputs:
        raise ValueError("inputs must hold one array per device, got none")
    if bandwidth <= 0 or latency < 0:
        raise ValueError(f"need bandwidth > 0 and latency >= 0, got {bandwidth} and {latency}")
    if kind != "all_gather" and len({np.shape(x) for x in inputs}) != 1:
        raise ValueError(f"{kind} needs equal-shaped inputs, got shapes {[np.shape(x) for x in inputs]}")
    algorithm: RingAlgorithm = ALGORITHMS[kind]([np.asarray(x) for x in inputs])
    n = len(inputs)
    link_free = [0.0] * n
    events: list[tuple[float, int, str, int, int]] = []  # (time, tie-break, kind, device, round)
    inbox: dict[tuple[int, int], np.ndarray] = {}
    order = 0
    if algorithm.rounds > 0:
        for device in range(n):
            events.append((0.0, device, "send", device, 1))
        heapq.heapify(events)
        order = n
    finish, messages, bytes_sent = 0.0, 0, 0
    while events:
        now, _, what, device, step = heapq.heappop(events)
        if what == "send":
            message = np.array(algorithm.payload(device, step), copy=True)
            start = max(now, link_free[device])
            link_free[device] = start + message.nbytes / bandwidth
            receiver = (device + 1) % n
            inbox[(receiver, step)] = message
            heapq.heappush(events, (link_free[device] + latency, order, "arrive", receiver, step))
            order += 1
            messages += 1
            bytes_sent += message.nbytes
        else:
            algorithm.receive(device, step, inbox.pop((device, step)))
            finish = max(finish, now)
            if step < algorithm.rounds:
                heapq.heappush(events, (now, order, "send", device, step + 1))
                order += 1
    return SimulationResult(algorithm.outputs(), finish, messages, bytes_sent)
