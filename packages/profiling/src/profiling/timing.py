"""Step timing: wall-clock time of each step, synchronized, and the cost of the timing itself.

Every measured step is followed by ``torch.cuda.synchronize()`` and timed with
``timeit.default_timer``, so a step's time includes all its GPU work and nothing queued after it.
Synchronizing stops the CPU from queueing the next step early; :func:`sync_overhead` measures what
that costs by timing the same steps back to back with a single synchronization at the end.
"""

from __future__ import annotations

import math
import statistics
import timeit
from collections.abc import Callable

import torch

from . import ranges


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _timed_step(step: Callable[[], None], device: torch.device | str) -> tuple[float, float]:
    """Seconds of one synchronized call of ``step``, and of that the wait in the synchronize."""
    start = timeit.default_timer()
    step()
    queued = timeit.default_timer()
    synchronize(device)
    end = timeit.default_timer()
    return end - start, end - queued


def time_steps(step: Callable[[], None], warmup: int, steps: int, device: torch.device | str) -> list[float]:
    """Run ``warmup`` untimed then ``steps`` timed calls of ``step``; seconds of each timed call."""
    if warmup < 0 or steps < 1:
        raise ValueError(f"need warmup >= 0 and steps >= 1, got warmup={warmup}, steps={steps}")
    for _ in range(warmup):
        step()
        synchronize(device)
    return [_timed_step(step, device)[0] for _ in range(steps)]


def summarize(times: list[float]) -> dict[str, float]:
    """Mean, standard deviation (sample), min and max in milliseconds."""
    ms = [t * 1e3 for t in times]
    return {
        "mean_ms": statistics.fmean(ms),
        "std_ms": statistics.stdev(ms) if len(ms) > 1 else 0.0,
        "min_ms": min(ms),
        "max_ms": max(ms),
    }


def _back_to_back(step: Callable[[], None], steps: int, device: torch.device | str) -> float:
    """Seconds per step of ``steps`` calls queued back to back, one sync at the end (after a warm call)."""
    step()
    synchronize(device)
    start = timeit.default_timer()
    for _ in range(steps):
        step()
    synchronize(device)
    return (timeit.default_timer() - start) / steps


def median_ci(xs: list[float], level: float = 0.95) -> tuple[float, float]:
    """Distribution-free confidence interval of the median of ``xs``: the order statistics x(j), x(n+1-j)
    with the largest j whose coverage, 1 - 2 P(Binomial(n, 1/2) < j), is at least ``level``.
    Below 6 samples no such j exists and the interval is (min, max)."""
    s, n = sorted(xs), len(xs)
    below = 0.0  # P(Binomial(n, 1/2) < j)
    j = 1
    while j <= n // 2:
        below += math.comb(n, j - 1) / 2**n
        if 2 * below > 1 - level:
            break
        j += 1
    j = max(j - 1, 1)
    return s[j - 1], s[n - j]


def _compare(a: list[float], b: list[float]) -> dict:
    """Compare per-round means ``a`` and ``b`` (seconds), where ``a[r]`` and ``b[r]`` ran in the same round.

    From the rounds' paired relative differences (%), so drift between rounds cancels: ``overhead_pct``
    (their mean), ``noise_pct`` (its standard error), ``median_pct`` and ``ci_low_pct`` / ``ci_high_pct``
    (the median's 95% interval, robust to a few slow rounds); ``per_round_ms``: the (a, b) pairs in ms.
    """
    excess = [100 * (x - y) / y for x, y in zip(a, b, strict=True)]
    low, high = median_ci(excess)
    return {"overhead_pct": statistics.fmean(excess),
            "noise_pct": statistics.stdev(excess) / len(excess) ** 0.5 if len(excess) > 1 else 0.0,
            "median_pct": statistics.median(excess), "ci_low_pct": low, "ci_high_pct": high,
            "per_round_ms": [(x * 1e3, y * 1e3) for x, y in zip(a, b, strict=True)]}  # fmt: skip


def _synced(step: Callable[[], None], steps: int, device: torch.device | str) -> tuple[float, float]:
    """Mean seconds per synchronized step and its mean wait in the synchronize (after a warm call)."""
    step()
    synchronize(device)
    timed = [_timed_step(step, device) for _ in range(steps)]
    return statistics.fmean(t for t, _ in timed), statistics.fmean(w for _, w in timed)


def sync_overhead(step: Callable[[], None], steps: int, rounds: int, device: torch.device | str) -> dict:
    """Per-step cost of timing each step separately (synchronize + timer) against steps queued back to back.

    ``rounds`` alternating rounds (ABBA) of ``steps`` steps each way, each round giving its mean step.
    Returns the medians over rounds (``per_step_synced_ms``, ``back_to_back_ms``) and the comparison of
    :func:`_compare` (synced against back to back). Also ``sync_wait_ms``, the median wait for the GPU
    after a step is queued, and ``bound_pct``, that wait as a share of a back-to-back step: back to back,
    a step still takes at least its queueing time, so the per-step sync cannot cost more than its wait
    (plus a timer call), whatever the noise.
    """
    synced: list[float] = []
    waits: list[float] = []
    queued: list[float] = []
    for r in range(rounds):
        for is_synced in (True, False) if r % 2 == 0 else (False, True):
            if is_synced:
                mean, wait = _synced(step, steps, device)
                synced.append(mean)
                waits.append(wait)
            else:
                queued.append(_back_to_back(step, steps, device))
    wait_ms = statistics.median(waits) * 1e3
    queued_ms = statistics.median(queued) * 1e3
    return {"per_step_synced_ms": statistics.median(synced) * 1e3, "back_to_back_ms": queued_ms,
            "sync_wait_ms": wait_ms, "bound_pct": 100 * wait_ms / queued_ms, "rounds": rounds,
            **_compare(synced, queued)}  # fmt: skip


def range_overhead(step: Callable[[], None], steps: int, rounds: int, device: torch.device | str) -> dict:
    """Step time with the NVTX ranges on and off, in ``rounds`` alternating rounds of ``steps`` steps.

    Rounds alternate on/off then off/on (ABBA), so slow drift (clocks, temperature) cancels; each round
    starts with one untimed step. Returns the median round mean of each (``ranges_on_ms``,
    ``ranges_off_ms``) and the comparison of :func:`_compare` (on against off): an overhead below about
    twice ``noise_pct``, or inside the median's interval around 0, is not resolved.
    """
    was_on = ranges.enabled()
    means: dict[bool, list[float]] = {True: [], False: []}
    try:
        for r in range(rounds):
            for flag in (True, False) if r % 2 == 0 else (False, True):
                ranges.set_enabled(flag)
                means[flag].append(_synced(step, steps, device)[0])
    finally:
        ranges.set_enabled(was_on)
    return {"ranges_on_ms": statistics.median(means[True]) * 1e3,
            "ranges_off_ms": statistics.median(means[False]) * 1e3, "steps_each": rounds * steps,
            **_compare(means[True], means[False])}  # fmt: skip
