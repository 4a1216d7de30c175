"""Timing: synchronized steps, marks on the GPU stream, ``triton.testing.do_bench``, paired ABBA rounds.

- :func:`time_steps`: each step followed by ``torch.cuda.synchronize()`` and timed with
  ``timeit.default_timer``, so a step's time holds all its GPU work and nothing queued after it;
- :class:`Marks`: CUDA events recorded on the current stream (host clock on a CPU), read after one
  synchronize, for the parts of a step or for calls that must not be synchronized one by one;
- :func:`do_bench`: the median of ``triton.testing.do_bench`` on CUDA (it flushes the L2 cache between
  calls), a host-clock median elsewhere;
- :func:`abba_rounds` and :func:`compare_paired`: two variants measured in alternating rounds
  (A B, B A, ...) so slow drift (clocks, temperature) cancels, compared by the rounds' paired
  differences; :func:`sync_overhead` uses them to measure what per-step synchronization costs.
"""

from __future__ import annotations

import math
import statistics
import timeit
from collections.abc import Callable

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait for the work queued on ``device`` (nothing to wait for on a CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed_step(step: Callable[[], None], device: torch.device | str) -> tuple[float, float]:
    """Seconds of one synchronized call of ``step``, and of that the wait in the synchronize."""
    start = timeit.default_timer()
    step()
    queued = timeit.default_timer()
    synchronize(device)
    end = timeit.default_timer()
    return end - start, end - queued


def time_steps(
    step: Callable[[], None],
    warmup: int,
    steps: int,
    device: torch.device | str,
    progress: Callable[[str], None] | None = None,
) -> list[float]:
    """Run ``warmup`` untimed then ``steps`` timed calls of ``step``; seconds of each timed call.

    ``progress``, when given, gets a short line after every call (outside the timed region).
    """
    if warmup < 0 or steps < 1:
        raise ValueError(f"need warmup >= 0 and steps >= 1, got warmup={warmup}, steps={steps}")
    for i in range(warmup):
        step()
        synchronize(device)
        if progress is not None:
            progress(f"warm-up step {i + 1}/{warmup}")
    times = []
    for i in range(steps):
        times.append(timed_step(step, device)[0])
        if progress is not None:
            progress(f"step {i + 1}/{steps}: {times[-1] * 1e3:.1f} ms")
    return times


def summarize(times: list[float]) -> dict[str, float]:
    """Mean, standard deviation (sample), min and max of ``times`` (seconds), in milliseconds."""
    ms = [t * 1e3 for t in times]
    return {
        "mean_ms": statistics.fmean(ms),
        "std_ms": statistics.stdev(ms) if len(ms) > 1 else 0.0,
        "min_ms": min(ms),
        "max_ms": max(ms),
    }


class Marks:
    """Time marks on ``device``'s current stream (CUDA events) or the host clock on a CPU.

    ``mark()`` records one; after a synchronize, ``elapsed_ms(i, j)`` is the time from mark ``i`` to
    mark ``j``. On a GPU the marks time what the stream ran, without stopping the host in between.
    """

    def __init__(self, device: torch.device | str):
        self.cuda = torch.device(device).type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(timeit.default_timer())

    def elapsed_ms(self, i: int, j: int) -> float:
        if self.cuda:
            return self.marks[i].elapsed_time(self.marks[j])
        return (self.marks[j] - self.marks[i]) * 1e3


def do_bench(
    fn: Callable[[], object],
    device: torch.device | str = "cuda",
    warmup_ms: float = 25,
    rep_ms: float = 100,
    grad_to_none: list[torch.Tensor] | None = None,
) -> float:
    """Median milliseconds of ``fn``: ``triton.testing.do_bench`` on CUDA (L2 flushed between calls);
    on other devices the median of synchronized host-clock calls over about ``rep_ms``."""
    if torch.device(device).type == "cuda":
        from triton.testing import do_bench as triton_do_bench

        return triton_do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grad_to_none,
                               return_mode="median")  # fmt: skip
    first = time_steps(fn, 1, 1, device)[0]
    calls = max(1, min(1000, int(rep_ms / 1e3 / max(first, 1e-9))))
    return statistics.median(time_steps(fn, 0, calls, device)) * 1e3


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


def compare_paired(a: list[float], b: list[float]) -> dict:
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


def abba_rounds(measure: Callable[[bool], float], rounds: int) -> tuple[list[float], list[float]]:
    """``rounds`` rounds of ``measure(True)`` (A) and ``measure(False)`` (B), in the order A B, B A, A B, ...;
    the A values and the B values, one per round, for :func:`compare_paired`."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    values: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for flag in (True, False) if r % 2 == 0 else (False, True):
            values[flag].append(measure(flag))
    return values[True], values[False]


def synced_mean(step: Callable[[], None], steps: int, device: torch.device | str) -> tuple[float, float]:
    """Mean seconds per synchronized step and its mean wait in the synchronize (after a warm call)."""
    step()
    synchronize(device)
    timed = [timed_step(step, device) for _ in range(steps)]
    return statistics.fmean(t for t, _ in timed), statistics.fmean(w for _, w in timed)


def back_to_back(step: Callable[[], None], steps: int, device: torch.device | str) -> float:
    """Seconds per step of ``steps`` calls queued back to back, one sync at the end (after a warm call)."""
    step()
    synchronize(device)
    start = timeit.default_timer()
    for _ in range(steps):
        step()
    synchronize(device)
    return (timeit.default_timer() - start) / steps


def sync_overhead(step: Callable[[], None], steps: int, rounds: int, device: torch.device | str) -> dict:
    """Per-step cost of timing each step separately (synchronize + timer) against steps queued back to back.

    ``rounds`` alternating rounds (ABBA) of ``steps`` steps each way, each round giving its mean step.
    Returns the medians over rounds (``per_step_synced_ms``, ``back_to_back_ms``) and the comparison of
    :func:`compare_paired` (synced against back to back). Also ``sync_wait_ms``, the median wait for the
    GPU after a step is queued, and ``bound_pct``, that wait as a share of a back-to-back step: back to
    back, a step still takes at least its queueing time, so the per-step sync cannot cost more than its
    wait (plus a timer call), whatever the noise.
    """
    waits: list[float] = []

    def measure(synced: bool) -> float:
        if not synced:
            return back_to_back(step, steps, device)
        mean, wait = synced_mean(step, steps, device)
        waits.append(wait)
        return mean

    synced, queued = abba_rounds(measure, rounds)
    wait_ms = statistics.median(waits) * 1e3
    queued_ms = statistics.median(queued) * 1e3
    return {"per_step_synced_ms": statistics.median(synced) * 1e3, "back_to_back_ms": queued_ms,
            "sync_wait_ms": wait_ms, "bound_pct": 100 * wait_ms / queued_ms, "rounds": rounds,
            **compare_paired(synced, queued)}  # fmt: skip
