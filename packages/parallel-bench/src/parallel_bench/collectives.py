"""Bandwidth of all-reduce, all-gather and reduce-scatter on float32 tensors, NCCL on GPUs or gloo on CPUs.

    python -m parallel_bench.collectives --world-sizes 2 4 --sizes-mib 1 10 100 1024 --out docs

For each process count one group of workers is started (one GPU each with NCCL), and every rank times
each (collective, size) (``parallel_bench.collectives_calls``). The table reports the median and the
10th / 90th percentiles over calls of the slowest rank's time, the algorithm bandwidth ``S / t`` and the
bus bandwidth (bytes each rank sends over one link per second, nccl-tests' definition, from
``analysis.collectives.bus_bandwidth``). ``S`` is the all-reduced tensor, the gathered output, or the
scattered input.

Rows are merged into ``<out>/collectives.csv`` (replacing rows of the same backend, process count,
collective and size; ``--out`` defaults to ``results``, so the tracked ``docs/collectives.csv`` changes only
with ``--out docs``), the Markdown table of this run is printed, and one PNG per backend of this run (bus
bandwidth against size, one line per process count, one panel per collective) is drawn from the whole CSV
into ``<out>/figures/collectives-<backend>.png``.

Limits: one node; sizes in MiB of float32 (1 MiB = 2**20 bytes); bandwidth in GB/s (10**9 bytes/s).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness import cli

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
KEY = ["backend", "processes", "collective", "size_mib"]
COLUMNS = ["processes", "collective", "size_mib", "median_ms", "p10_ms", "p90_ms", "algbw_GBps", "busbw_GBps"]


@dataclass(frozen=True)
class CollectivesConfig:
    world_sizes: tuple[int, ...] = (2, 4)
    sizes_mib: tuple[float, ...] = (1, 10, 100, 1024)
    collectives: tuple[str, ...] = COLLECTIVES
    backend: str = "gloo"
    warmup: int = 5
    steps: int = 30  # timed calls per case (the table's ``iters``)
    out: str = "results"
    timeout: float = 600


def bandwidth_columns(df):
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


def measure(config: CollectivesConfig):
    """Every (process count, collective, size): one row each, with bandwidths and the environment."""
    import pandas as pd
    from harness.environment import environment
    from parallel.launch import spawn

    from parallel_bench.collectives_calls import worker

    env = environment()
    frames = []
    for world_size in config.world_sizes:
        print(f"{config.backend}: {world_size} processes", flush=True)
        rows = spawn(
            worker,
            world_size,
            list(config.sizes_mib),
            list(config.collectives),
            config.warmup,
            config.steps,
            backend=config.backend,
            timeout=config.timeout,
        )[0]
        frames.append(pd.DataFrame(rows).assign(processes=world_size))
    df = pd.concat(frames, ignore_index=True)
    df = df[["processes", *(c for c in df.columns if c != "processes")]]
    df.insert(0, "backend", config.backend)
    df = df.assign(device=env["device"], torch=env["torch"], date=env["date"], iters=config.steps)
    return bandwidth_columns(df)


def merge_rows(old, new):
    """``new`` plus the rows of ``old`` whose (backend, processes, collective, size) ``new`` does not hold."""
    import pandas as pd

    if old is None or old.empty:
        return new.reset_index(drop=True)
    keys = set(map(tuple, new[KEY].itertuples(index=False)))
    kept = old[[tuple(k) not in keys for k in old[KEY].itertuples(index=False)]]
    merged = pd.concat([kept, new], ignore_index=True)
    return merged.sort_values(KEY, kind="stable").reset_index(drop=True)


def plot_backend(df, backend: str, path: Path) -> Path:
    """Bus bandwidth against size, one line per process count, one panel per collective."""
    from harness.results import new_figure, save_figure

    rows = df[df["backend"] == backend]
    collectives = [c for c in COLLECTIVES if c in set(rows["collective"])]
    fig, axes = new_figure(
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
    return save_figure(fig, path, dpi=130)


def report(df, config: CollectivesConfig) -> None:
    """Merge ``df`` into ``<out>/collectives.csv``, redraw this backend's figure from it, print the run."""
    import pandas as pd
    from harness.results import to_markdown, write_table

    out = Path(config.out)
    csv = out / "collectives.csv"
    merged = merge_rows(pd.read_csv(csv) if csv.exists() else None, df)
    write_table(merged, out / "collectives", formats=("csv",))
    figure = plot_backend(merged, config.backend, out / "figures" / f"collectives-{config.backend}.png")
    env = f"{df['device'].iloc[0]}, torch {df['torch'].iloc[0]}"
    print(f"\n{config.backend} on {env}, {config.steps} calls each")
    print(to_markdown(df[COLUMNS], ".3g"))
    print(f"wrote {csv} and {figure}")


def parse_args(argv: list[str] | None = None) -> CollectivesConfig:
    p = cli.command_parser("python -m parallel_bench.collectives", __doc__)
    cli.add_list(
        p, "--world-sizes", cli.positive_int, [2, 4], "process counts to run, one group of workers each"
    )
    cli.add_list(p, "--sizes-mib", cli.positive_float, [1, 10, 100, 1024], "float32 tensor sizes S in MiB")
    cli.add_list(p, "--collectives", str, COLLECTIVES, "collectives to time", choices=COLLECTIVES)
    p.add_argument("--warmup", type=cli.positive_int, default=5, help="untimed calls before timing each case")
    p.add_argument("--steps", type=cli.positive_int, default=30, help="timed calls per case (at least 20)")
    cli.add_out(
        p, "results", "folder of collectives.csv (merged into) and figures/ (docs: the tracked results)"
    )
    cli.add_launch(p, timeout=600)
    args = p.parse_args(argv)
    if args.steps < 20:
        p.error(f"--steps must be at least 20 (for the 10th / 90th percentiles), got {args.steps}")
    if min(args.world_sizes) < 2:
        p.error(f"--world-sizes must all be >= 2, got {args.world_sizes}")
    try:
        backend = cli.resolve_backend(args.backend, max(args.world_sizes))
    except ValueError as err:
        p.error(f"--world-sizes: {err}")
    return CollectivesConfig(
        tuple(args.world_sizes),
        tuple(args.sizes_mib),
        tuple(args.collectives),
        backend,
        args.warmup,
        args.steps,
        args.out,
        args.timeout,
    )


def main(argv: list[str] | None = None):
    config = parse_args(argv)
    df = measure(config)
    report(df, config)
    return df


if __name__ == "__main__":
    main()
