"""Named ranges that Nsight Systems (NVTX) and ``torch.profiler`` (``record_function``) both see.

A range always pushes an NVTX range (the ``nvtx`` package, default domain, attributes cached per
name; about 0.3 µs per push + pop when no NVTX tool is attached). It also opens a ``record_function``
range, but only while a ``torch.profiler`` session is running, so leaving ranges on costs a few
microseconds per range otherwise.

Ranges used by this package: ``forward``, ``backward``, ``optimizer_step``, ``block[i]`` (one per
Transformer block, via forward hooks), and inside attention ``attention.scores``,
``attention.softmax``, ``attention.weighted_sum``. Under ``torch.compile`` the in-model ranges are
left out (they would break the graph); the step-level ones stay.

One :class:`Ranges` object per workload opens them; its ``enabled`` switches them all (to measure what
they cost), with no process-wide state. Limits: ranges inside the model cover the forward pass only;
backward kernels are attributed to the ``backward`` range as a whole.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator

import nvtx
import torch
from harness.timing import abba_rounds, compare_paired, synced_mean
from torch import Tensor, nn

_DOMAIN = nvtx.get_domain()  # the default domain; attributes are built once per range name (a cache)
_ATTRIBUTES: dict[str, object] = {}
PHASES = ("forward", "backward", "optimizer_step")


def _profiler_active() -> bool:
    return torch.autograd.profiler._is_profiler_enabled


class Ranges:
    """The named ranges of one workload; ``enabled`` switches every one of them on or off."""

    def __init__(self, enabled: bool = True):
        self.enabled = bool(enabled)
        self._phase_log: list[tuple[str, int, int]] | None = None

    def push(self, name: str) -> object | None:
        """Open range ``name``; returns a token for :meth:`pop` (None when the ranges are off)."""
        if not self.enabled:
            return None
        attributes = _ATTRIBUTES.get(name)
        if attributes is None:
            attributes = _ATTRIBUTES[name] = _DOMAIN.get_event_attributes(message=name)
        _DOMAIN.push_range(attributes)
        if _profiler_active():
            rf = torch.autograd.profiler.record_function(name)
            rf.__enter__()
            return rf
        return True

    @staticmethod
    def pop(token: object | None) -> None:
        """Close the range opened by :meth:`push` with this token."""
        if token is None:
            return
        if isinstance(token, torch.autograd.profiler.record_function):
            token.__exit__(None, None, None)
        _DOMAIN.pop_range()

    @contextlib.contextmanager
    def annotate(self, name: str) -> Iterator[None]:
        """Context manager form of :meth:`push` / :meth:`pop` (also logs phases, see :meth:`log_phases`)."""
        token = self.push(name)
        log = self._phase_log if name in PHASES else None
        start_us = time.time_ns() // 1000 if log is not None else 0
        try:
            yield
        finally:
            self.pop(token)
            if log is not None:
                log.append((name, start_us, time.time_ns() // 1000))

    @contextlib.contextmanager
    def log_phases(self) -> Iterator[list[tuple[str, int, int]]]:
        """Collect ``(phase, start_us, end_us)`` (Unix-epoch microseconds, CPU side) of every phase range
        entered inside the block; used to tell which phase a memory event belongs to."""
        previous, self._phase_log = self._phase_log, []
        try:
            yield self._phase_log
        finally:
            self._phase_log = previous

    def attention(self, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        """The reference naive attention, with one range per part: scores, softmax, weighted sum.

        Same math as ``cs336_basics.model.naive_attention`` on ``(..., seq, d)`` tensors; a value for the
        model's attention slot.
        """
        with self.annotate("attention.scores"):
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if is_causal:
                seq_q, seq_k = q.shape[-2], k.shape[-2]
                mask = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).tril(seq_k - seq_q)
                scores = scores.masked_fill(~mask, float("-inf"))
        with self.annotate("attention.softmax"):
            probs = torch.softmax(scores, dim=-1)
        with self.annotate("attention.weighted_sum"):
            return probs @ v

    def annotate_blocks(self, model: nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
        """Add a ``block[i]`` range around the forward of every block in ``model.layers``.

        Uses forward pre/post hooks (the model's code is unchanged); returns the hook handles.
        """
        if not hasattr(model, "layers"):
            raise ValueError("model must have a `layers` list of Transformer blocks")
        handles = []
        for i, block in enumerate(model.layers):
            tokens: list[object | None] = []

            def pre(_module, _args, name=f"block[{i}]", tokens=tokens):
                tokens.append(self.push(name))

            def post(_module, _args, _out, tokens=tokens):
                self.pop(tokens.pop())

            handles.append(block.register_forward_pre_hook(pre))
            handles.append(block.register_forward_hook(post))
        return handles


def range_overhead(
    step: Callable[[], None], steps: int, rounds: int, device: torch.device | str, ranges: Ranges
) -> dict:
    """Step time with ``ranges`` on and off, in ``rounds`` alternating rounds of ``steps`` steps.

    Rounds alternate on/off then off/on (ABBA, :func:`harness.timing.abba_rounds`), so slow drift
    (clocks, temperature) cancels; each round starts with one untimed step. Returns the median round
    mean of each (``ranges_on_ms``, ``ranges_off_ms``) and the comparison of
    :func:`harness.timing.compare_paired` (on against off): an overhead below about twice
    ``noise_pct``, or inside the median's interval around 0, is not resolved. ``ranges.enabled`` is
    restored afterwards.
    """
    was_on = ranges.enabled

    def measure(flag: bool) -> float:
        ranges.enabled = flag
        return synced_mean(step, steps, device)[0]

    try:
        on, off = abba_rounds(measure, rounds)
    finally:
        ranges.enabled = was_on
    return {"ranges_on_ms": statistics.median(on) * 1e3, "ranges_off_ms": statistics.median(off) * 1e3,
            "steps_each": rounds * steps, **compare_paired(on, off)}  # fmt: skip
