"""Bandwidth of all-reduce, all-gather and reduce-scatter on float32 tensors, NCCL on GPUs or gloo on CPUs.

    python -m parallel.bench_collectives --world-sizes 2 4 --sizes-mib 1 10 100 1024

For each process count one group of workers is started (one GPU each with NCCL). Every rank runs each
(collective, size): ``--warmup`` untimed calls, then ``--iters`` timed calls, each after a barrier so that the
ranks start together, timed with CUDA events on GPUs and ``time.perf_counter`` on CPUs. The times of all ranks
are gathered; an iteration takes as long as its slowest rank, and the table reports the median and the
10th / 90th percentiles over iterations, the algorithm bandwidth ``S / t`` and the bus bandwidth (bytes each
rank sends over one link per second, nccl-tests' definition, from ``analysis.collectives.bus_bandwidth``).
``S`` is the all-reduced tensor, the gathered output, or the scattered input.

Rows are merged into ``--csv`` (replacing rows of the same backend, process count, collective and size), the
Markdown table of this run is printed, and one PNG per backend (bus bandwidth against size, one line per
process count, one panel per collective) is drawn from the whole CSV into ``--figure-dir``.

Limits: one node; sizes in MiB of float32 (1 MiB = 2**20 bytes); bandwidth in GB/s (10**9 bytes/s).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist

from parallel.launch import spawn
from parallel.report import environment, markdown_table, save_figure, write_csv

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
KEY = ["backend", "processes", "collective", "size_mib"]


def _buffers(collective: str, numel: int, world_size: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Input and output of one call; ``numel`` float32 elements is ``S`` (rounded to whole shards)."""
    shard = numel // world_size
    if collective == "all_reduce":
        return (torch.randn(numel, device=device),)
    if collective == "all_gather":
        return torch.empty(shard * world_size, device=device), torch.randn(shard, device=device)
    return torch.empty(shard, device=device), torch.randn(shard * world_size, device=device)


def _call(collective: str, buffers: tuple[torch.Tensor, ...]) -> None:
    if collective == "all_reduce":
        dist.all_reduce(buffers[0])
    elif collective == "all_gather":
        dist.all_gather_into_tensor(buffers[0], buffers[1])
    else:
        dist.reduce_scatter_tensor(buffers[0], buffers[1])


def _time_calls(collective: str, buffers: tuple[torch.Tensor, ...], warmup: int, iters: int) -> list[float]:
    """Seconds of each of ``iters`` calls on this rank, each started right after a barrier."""
    on_gpu = buffers[0].is_cuda
    for _ in range(warmup):
        _call(collective, buffers)
    seconds = []
    events = []
    for _ in range(iters):
        dist.barrier()
        if on_gpu:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            _call(collective, buffers)
            end.record()
            events.append((start, end))
        else:
            t0 = time.perf_counter()
            _call(collective, buffers)
            seconds.append(time.perf_counter() - t0)
    if on_gpu:
        torch.cuda.synchronize()
        seconds = [start.elapsed_time(end) / 1e3 for start, end in events]
    return seconds


def _worker(
    rank: int, world_size: int, sizes_mib: list[float], collectives: list[str], warmup: int, iters: int
) -> list[dict]:
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    rows = []
    for collective in collectives:
        for size_mib in sizes_mib:
            numel = int(size_mib * 2**20) // 4
            buffers = _buffers(collective, numel, world_size, device)
            local = torch.tensor(_time_calls(collective, buffers, warmup, iters), dtype=torch.float64)
            gathered = [torch.empty_like(local) for _ in range(world_size)]
            dist.all_gather_object(gathered, local)
            slowest = torch.stack(gathered).amax(dim=0).tolist()
            del buffers
            if rank == 0:
                size_bytes = (numel // world_size) * world_size * 4
                q = statistics.quantiles(slowest, n=10)
                rows.append(
                    dict(
                        collective=collective,
                        size_mib=size_mib,
                        size_bytes=size_bytes,
                        median_ms=statistics.median(slowest) * 1e3,
                        p10_ms=q[0] * 1e3,
                        p90_ms=q[-1] * 1e3,
                    )
                )
                median = rows[-1]["median_ms"]
                print(f"  {world_size} procs {collective:>14} {size_mib:>7g} MiB {median:.3f} ms", flush=True)
    return rows


def bandwidth_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``algbw_GBps`` and ``busbw_GBps`` to rows holding collective, size_bytes, processes, median_ms."""
    from analysis.collectives import bus_bandwidth

    df = df.copy()
    seconds = df["median_ms"] / 1e3
    df["algbw_GBps"] = df["size_bytes"] / seconds / 1e9
    df["busbw_GBps"] = [
        bus_bandwidth(row.collective, row.size_bytes, int(row.processes), row.median_ms / 1e3) / 1e9
        for row in df.itertuples()
    ]
    return df


def run(
    world_sizes: list[int],
    sizes_mib: list[float],
    collectives: list[str],
    backend: str,
    warmup: int,
    iters: int,
    timeout: float,
) -> pd.DataFrame:
    """Benchmark every (process count, collective, size); one row each, with bandwidths."""
    env = environment()
    frames = []
    for world_size in world_sizes:
        print(f"{backend}: {world_size} processes", flush=True)
        rows = spawn(
            _worker, world_size, sizes_mib, collectives, warmup, iters, backend=backend, timeout=timeout
        )[0]
        frame = pd.DataFrame(rows)
        frame.insert(0, "processes", world_size)
        frames.append(frame)
    df = pd.concat(frames, ignore_index=True)
    df.insert(0, "backend", backend)
    df["device"] = env["device"]
    df["torch"] = env["torch"]
    df["date"] = env["date"]
    df["iters"] = iters
    return bandwidth_columns(df)


def merge_rows(old: pd.DataFrame | None, new: pd.DataFrame) -> pd.DataFrame:
    """``new`` plus the rows of ``old`` whose (backend, processes, collective, size) ``new`` does not hold."""
    if old is None or old.empty:
        return new.reset_index(drop=True)
    keys = set(map(tuple, new[KEY].itertuples(index=False)))
    kept = old[[tuple(k) not in keys for k in old[KEY].itertuples(index=False)]]
    merged = pd.concat([kept, new], ignore_index=True)
    return merged.sort_values(KEY, kind="stable").reset_index(drop=True)


def plot_backend(df: pd.DataFrame, backend: str, path: Path) -> Path:
    """Bus bandwidth against size, one line per process count, one panel per collective."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = df[df["backend"] == backend]
    collectives = [c for c in COLLECTIVES if c in set(rows["collective"])]
    fig, axes = plt.subplots(
        1, len(collectives), figsize=(4.6 * len(collectives), 3.8), sharey=True, squeeze=False
    )
    for ax, collective in zip(axes[0], collectives, strict=True):
        for processes, group in rows[rows["collective"] == collective].groupby("processes"):
            group = group.sort_values("size_bytes")
            ax.plot(
                group["size_bytes"] / 2**20, group["busbw_GBps"], marker="o", label=f"{processes} processes"
            )
        ax.set_xscale("log")
        ax.set_title(collective.replace("_", "-"))
        ax.set_xlabel("size (MiB of float32)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("bus bandwidth (GB/s)")
    axes[0][-1].legend()
    fig.suptitle(f"{backend} collectives on {rows['device'].iloc[0]}", y=1.03)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--world-sizes",
        type=int,
        nargs="+",
        default=[2, 4],
        help="process counts to run, one group of workers each",
    )
    parser.add_argument(
        "--sizes-mib", type=float, nargs="+", default=[1, 10, 100, 1024], help="float32 tensor sizes S in MiB"
    )
    parser.add_argument(
        "--collectives", nargs="+", choices=COLLECTIVES, default=list(COLLECTIVES), help="collectives to time"
    )
    parser.add_argument(
        "--backend",
        choices=["auto", "nccl", "gloo"],
        default="auto",
        help="nccl (one GPU per process) or gloo (CPU tensors); auto: nccl when CUDA exists",
    )
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls before timing each case")
    parser.add_argument("--iters", type=int, default=30, help="timed calls per case (at least 20)")
    parser.add_argument(
        "--csv",
        type=Path,
        default=Path("docs/collectives.csv"),
        help="CSV to merge this run's rows into (created if missing)",
    )
    parser.add_argument(
        "--figure-dir", type=Path, default=Path("docs/figures"), help="folder for collectives-<backend>.png"
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds before the workers are killed")
    args = parser.parse_args(argv)
    if args.iters < 20:
        parser.error(f"--iters must be at least 20, got {args.iters}")
    if args.warmup < 1:
        parser.error(f"--warmup must be at least 1, got {args.warmup}")
    if min(args.world_sizes) < 2:
        parser.error(f"--world-sizes must all be >= 2, got {args.world_sizes}")
    if min(args.sizes_mib) <= 0:
        parser.error(f"--sizes-mib must be positive, got {args.sizes_mib}")
    backend = args.backend if args.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl" and max(args.world_sizes) > torch.cuda.device_count():
        parser.error(
            f"--world-sizes {max(args.world_sizes)} needs that many GPUs, found {torch.cuda.device_count()}"
        )

    df = run(
        args.world_sizes, args.sizes_mib, args.collectives, backend, args.warmup, args.iters, args.timeout
    )
    old = pd.read_csv(args.csv) if args.csv.exists() else None
    merged = merge_rows(old, df)
    write_csv(merged, args.csv)
    for name in merged["backend"].unique():
        plot_backend(merged, name, args.figure_dir / f"collectives-{name}.png")
    columns = [
        "processes",
        "collective",
        "size_mib",
        "median_ms",
        "p10_ms",
        "p90_ms",
        "algbw_GBps",
        "busbw_GBps",
    ]
    print(f"\n{backend} on {df['device'].iloc[0]}, torch {df['torch'].iloc[0]}, {args.iters} calls each")
    print(markdown_table(df[columns]))
    print(f"wrote {args.csv} and {args.figure_dir}/collectives-*.png")
    return df


if __name__ == "__main__":
    main()
