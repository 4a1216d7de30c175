"""The timed training steps of ``python -m parallel_bench.fsdp``, run in every worker process: ours
(``parallel.FSDP``) and FSDP2 (``fully_shard``) on the same preset, CUDA events around each step, the gathers
of the last timed step against the moment they were needed, and one profiled step per implementation.
"""

from __future__ import annotations

import functools
import gc
import statistics
from pathlib import Path

import torch
from harness.timing import Marks
from harness.trace import activities, export_trace
from parallel.fsdp import FSDP

from parallel_bench.zero import GIB, random_batch, sdpa


class GatherTimer:
    """Times every gather the compute stream waits on against the moment it needed the unit (CUDA events)."""

    def __init__(self):
        self.log: list[tuple[int, str, torch.cuda.Event, torch.cuda.Event]] = []

    def __call__(self, index: int, phase: str, ready: torch.cuda.Event) -> None:
        needed = torch.cuda.Event(enable_timing=True)
        needed.record()
        self.log.append((index, phase, needed, ready))

    def slack(self) -> list[dict]:
        """``{unit, phase, late_ms}`` per gather logged: ``late_ms`` from the compute stream reaching the unit
        to the gather finishing (negative: finished early by that much; positive: compute stalled).
        Synchronizes."""
        torch.cuda.synchronize()
        return [{"unit": index, "phase": phase, "late_ms": needed.elapsed_time(ready)}
                for index, phase, needed, ready in self.log]


def _build(impl: str, config, device: torch.device):
    """``(model, optimizer, finish, timer)``: ``finish()`` completes gradient synchronization after backward;
    ``timer`` logs our gathers (None for FSDP2)."""
    from cs336_basics.model import TransformerBlock
    from cs336_basics.presets import build_model

    model = build_model(config, device="meta", attention_fn=sdpa)
    if impl == "ours":
        model = FSDP(model, compute_dtype=torch.bfloat16, unit_modules=(TransformerBlock,))
        timer = GatherTimer()
        model.register_gather_observer(timer)
        finish = model.finish_gradient_synchronization
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.layers:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        model.to_empty(device=device)
        with torch.no_grad():
            for p in model.parameters():  # values do not change the timing: gains 1, weights small
                local = p.to_local()
                if p.dim() == 1:
                    local.fill_(1.0)
                else:
                    local.normal_(0.0, 0.02)
        finish = _nothing  # FSDP2 waits for its reduce-scatters inside backward
        timer = None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    return model, optimizer, finish, timer


def _nothing() -> None:
    """FSDP2 needs no call after backward."""


def _step(model, optimizer, finish, x, y) -> None:
    from cs336_basics.nn_utils import cross_entropy

    with torch.profiler.record_function("forward"):
        loss = cross_entropy(model(x), y)
    with torch.profiler.record_function("backward"):
        loss.backward()
        finish()
    with torch.profiler.record_function("optimizer"):
        optimizer.step()
        optimizer.zero_grad()


def _profile(step, path: Path | None) -> None:
    """One profiled step (the model is warm already); rank 0 writes the gzipped Chrome trace."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities("cuda")) as prof:
        step()
        torch.cuda.synchronize()
    if path is not None:
        export_trace(prof, path)


def _run(impl: str, preset: str, batch: int, warmup: int, steps: int, out: Path) -> dict:
    from cs336_basics.presets import get_preset

    config = get_preset(preset)
    device = torch.device("cuda", torch.cuda.current_device())
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    model, optimizer, finish, timer = _build(impl, config, device)
    x, y = random_batch(config, batch, device)
    marks = Marks(device)
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        if timer is not None:
            timer.log.clear()  # keep the last step's gathers
        marks.mark()
        _step(model, optimizer, finish, x, y)
        marks.mark()
    torch.cuda.synchronize()
    timed = range(warmup, warmup + steps)
    result = dict(impl=impl, times=[marks.elapsed_ms(2 * i, 2 * i + 1) for i in timed],
                  peak=torch.cuda.max_memory_allocated() - base)
    if timer is not None:
        result["gathers"] = timer.slack()
    trace = out / f"fsdp-trace-{impl}.json.gz" if torch.distributed.get_rank() == 0 else None
    step = functools.partial(_step, model, optimizer, finish, x, y)
    _profile(step, trace)
    del step, model, optimizer, finish, timer
    gc.collect()
    torch.cuda.empty_cache()
    return result


def worker(
    rank: int, world_size: int, impls: tuple[str, ...], preset: str, batch: int, warmup: int, steps: int,
    out: Path,
) -> list:
    """One result per implementation of ``impls`` ("ours", "fsdp2"), run one after the other on this rank."""
    results = []
    for impl in impls:
        result = _run(impl, preset, batch, warmup, steps, out)
        if rank == 0:
            print(f"  {impl}: {statistics.median(result['times']):.1f} ms/step, peak "
                  f"{result['peak'] / GIB:.2f} GiB on rank 0", flush=True)
        results.append(result)
    return results
