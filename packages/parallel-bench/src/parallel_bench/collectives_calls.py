"""The timed collective calls of ``python -m parallel_bench.collectives``, run in every worker process.

Every rank runs each (collective, size): ``warmup`` untimed calls, then ``steps`` timed calls, each after a
barrier so that the ranks start together, timed by marks on the stream (CUDA events on GPUs, the host
clock on CPUs; :class:`harness.timing.Marks`). The times of all ranks are gathered; an iteration takes
as long as its slowest rank.
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
from harness.timing import Marks, synchronize


def buffers(collective: str, numel: int, world_size: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Input and output of one call; ``numel`` float32 elements is ``S`` (rounded to whole shards)."""
    shard = numel // world_size
    if collective == "all_reduce":
        return (torch.randn(numel, device=device),)
    if collective == "all_gather":
        return torch.empty(shard * world_size, device=device), torch.randn(shard, device=device)
    return torch.empty(shard, device=device), torch.randn(shard * world_size, device=device)


def call(collective: str, tensors: tuple[torch.Tensor, ...]) -> None:
    """One call of ``collective`` on the ``tensors`` of :func:`buffers`."""
    if collective == "all_reduce":
        dist.all_reduce(tensors[0])
    elif collective == "all_gather":
        dist.all_gather_into_tensor(tensors[0], tensors[1])
    else:
        dist.reduce_scatter_tensor(tensors[0], tensors[1])


def time_calls(collective: str, tensors: tuple[torch.Tensor, ...], warmup: int, steps: int) -> list[float]:
    """Seconds of each of ``steps`` calls on this rank, each started right after a barrier."""
    device = tensors[0].device
    for _ in range(warmup):
        call(collective, tensors)
    marks = Marks(device)
    for _ in range(steps):
        dist.barrier()
        synchronize(device)
        marks.mark()
        call(collective, tensors)
        marks.mark()
    synchronize(device)
    return [marks.elapsed_ms(2 * i, 2 * i + 1) / 1e3 for i in range(steps)]


def worker(
    rank: int, world_size: int, sizes_mib: list[float], collectives: list[str], warmup: int, steps: int
) -> list[dict]:
    """Rows (collective, size, median and 10th / 90th percentile ms of the slowest rank) on rank 0."""
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    rows = []
    for collective in collectives:
        for size_mib in sizes_mib:
            numel = int(size_mib * 2**20) // 4
            tensors = buffers(collective, numel, world_size, device)
            local = torch.tensor(time_calls(collective, tensors, warmup, steps), dtype=torch.float64)
            gathered = [torch.empty_like(local) for _ in range(world_size)]
            dist.all_gather_object(gathered, local)
            slowest = torch.stack(gathered).amax(dim=0).tolist()
            del tensors
            if rank == 0:
                q = statistics.quantiles(slowest, n=10)
                rows.append(
                    dict(
                        collective=collective,
                        size_mib=size_mib,
                        size_bytes=(numel // world_size) * world_size * 4,
                        median_ms=statistics.median(slowest) * 1e3,
                        p10_ms=q[0] * 1e3,
                        p90_ms=q[-1] * 1e3,
                    )
                )
                median = rows[-1]["median_ms"]
                print(f"  {world_size} procs {collective:>14} {size_mib:>7g} MiB {median:.3f} ms", flush=True)
    return rows
