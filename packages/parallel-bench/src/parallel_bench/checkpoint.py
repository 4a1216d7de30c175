"""Sharded save and load of a ``cs336_basics`` preset with AdamW state: bandwidth to disk and memory held.

    python -m parallel_bench.checkpoint --preset xl --dir /tmp/ckpt --out results

One process per GPU (NCCL; gloo with ``--device cpu``) builds the preset on the meta device and shards it with
``parallel.FSDP`` (one unit per TransformerBlock, fp32), makes AdamW's state with one step on zero gradients,
then times ``parallel.save_sharded`` (model and optimizer, ``--threads`` writer threads per rank, files synced
to disk) and ``parallel.load_sharded`` into a freshly built model and optimizer, and checks that every shard
and state tensor came back bit for bit. Bandwidth: bytes of the checkpoint folder over the wall time of the
call. Memory while saving: the rise of ``torch.cuda.max_memory_allocated`` and of the process's resident set
(sampled every 5 ms) above their values before the call, each against the fp32 bytes of the largest unit (the
target is no more than one unit). Before loading, the page cache is dropped where the process may do so
(root), so that the load reads the disk; the table says whether it was.

Writes ``checkpoint.csv`` and ``checkpoint.md`` into ``--out``.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from harness import cli

GIB = 2**30


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakRss:
    """Highest resident set size seen by a sampling thread while the block runs."""

    def __enter__(self):
        self.peak, self._stop = _rss_bytes(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_bytes())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _build(preset: str, device):
    import torch
    from cs336_basics.model import TransformerBlock
    from cs336_basics.presets import build_model, get_preset
    from parallel.fsdp import FSDP

    net = build_model(get_preset(preset), device="meta")
    model = FSDP(net, unit_modules=(TransformerBlock,), device=device)
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused, foreach=None if fused else False)
    return model, optimizer


def _checksums(model, optimizer) -> list[float]:
    tensors = [p.detach() for p in model.parameters()]
    tensors += [v for s in optimizer.state.values() for v in s.values() if v.dim() > 0]
    return [float(t.double().sum()) for t in tensors]


def _drop_page_cache() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _worker(rank: int, world_size: int, preset: str, folder: Path, threads: int, drop_cache: bool) -> dict:
    import torch
    import torch.distributed as dist
    from parallel.checkpoint import load_sharded, save_sharded

    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model, optimizer = _build(preset, device)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    expected = _checksums(model, optimizer)
    unit_bytes = max(p.numel() for p in model.flat_shards()) * world_size * 4
    state_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
    state_bytes += sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values())
    if rank == 0:
        print(f"{preset}: {state_bytes / GIB:.2f} GiB of shards and AdamW state on rank 0; saving",
              flush=True)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    gpu_before = torch.cuda.memory_allocated() if cuda else 0
    dist.barrier()
    with _PeakRss() as rss:
        rss_before = _rss_bytes()
        start = time.perf_counter()
        save_sharded(folder, model, optimizer, extra={"step": 1}, threads=threads)
        save_s = time.perf_counter() - start
    gpu_rise = torch.cuda.max_memory_allocated() - gpu_before if cuda else 0
    files = sum(f.stat().st_size for f in folder.iterdir())
    if rank == 0:  # printed now, so that a run stopped while loading still reports the save
        rss_rise = (rss.peak - rss_before) / 2**20
        print(f"  saved {files / GIB:.2f} GiB in {save_s:.1f} s ({files / save_s / 1e9:.2f} GB/s); while "
              f"saving GPU memory rose {gpu_rise / 2**20:.0f} MiB, the resident set {rss_rise:.0f} MiB (one "
              f"unit: {unit_bytes / 2**20:.0f} MiB); loading", flush=True)
    del model, optimizer
    if cuda:
        torch.cuda.empty_cache()
    dropped = _drop_page_cache() if drop_cache and rank == 0 else False
    model, optimizer = _build(preset, device)
    dist.barrier()
    start = time.perf_counter()
    extra = load_sharded(folder, model, optimizer)
    sync()
    load_s = time.perf_counter() - start
    return dict(rank=rank, preset=preset, world_size=world_size, device=str(device), threads=threads,
                checkpoint_GiB=files / GIB, rank_state_GiB=state_bytes / GIB, save_s=save_s,
                save_GBps=files / save_s / 1e9, load_s=load_s, load_GBps=files / load_s / 1e9,
                page_cache_dropped=dropped, unit_MiB=unit_bytes / 2**20,
                gpu_rise_while_saving_MiB=gpu_rise / 2**20,
                rss_rise_while_saving_MiB=(rss.peak - rss_before) / 2**20,
                bitwise_equal=_checksums(model, optimizer) == expected and extra == {"step": 1})


def main(argv: list[str] | None = None):
    p = cli.command_parser("python -m parallel_bench.checkpoint", __doc__)
    p.add_argument("--preset", default="xl", help="cs336_basics preset")
    p.add_argument("--world-size", type=cli.positive_int, default=1, help="processes (one GPU each)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo, for a dry run")
    p.add_argument("--threads", type=cli.positive_int, default=4, help="writer threads per rank")
    p.add_argument("--dir", type=Path, default=Path("/tmp/parallel-checkpoint"),
                   help="checkpoint folder (removed at the end)")  # fmt: skip
    cli.add_out(p, "results", "folder for the table")
    p.add_argument("--drop-page-cache", action="store_true",
                   help="empty the machine's page cache before loading (root)")  # fmt: skip
    p.add_argument("--timeout", type=cli.positive_float, default=500,
                   help="seconds before the workers are killed")  # fmt: skip
    args = p.parse_args(argv)

    import pandas as pd
    import torch
    from harness.results import to_markdown
    from parallel.launch import spawn

    from parallel_bench.results import write_results

    if args.device == "cuda" and torch.cuda.device_count() < args.world_size:
        raise SystemExit(f"needs {args.world_size} CUDA GPUs, found {torch.cuda.device_count()}")
    backend = "nccl" if args.device == "cuda" else "gloo"
    try:
        rows = spawn(_worker, args.world_size, args.preset, args.dir, args.threads, args.drop_page_cache,
                     backend=backend, timeout=args.timeout)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    df = pd.DataFrame(rows)
    write_results(df, Path(args.out) / "checkpoint")
    print(to_markdown(df))
    return df


if __name__ == "__main__":
    main()
