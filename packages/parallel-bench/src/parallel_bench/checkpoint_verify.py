"""What verifying a sharded checkpoint costs: ``load_sharded`` with and without checking every item's
checksum, in one process, on a CPU checkpoint of a few GB.

    python -m parallel_bench.checkpoint_verify --preset medium --out results

Builds a ``cs336_basics`` preset (fp32) and AdamW over it, makes the optimizer's state with one step on zero
gradients, saves both with ``parallel.save_sharded`` (timed: it reads its files back to checksum them), then,
after one untimed load, loads them ``--repeats`` times each with ``verify=False`` and ``verify=True``,
alternating, into the same model and optimizer, and reports the median of each and the median of the
differences of each verified load and the unverified load just before it: what verification costs, given as a
fraction of the unverified load's median (target: under 10%). CPU seconds of the process (all threads: torch's
copies use its intra-op threads) are reported beside wall time; so is the machine's load average. Also times
``verify_sharded`` (one checksum pass over every file, nothing deserialized), and the manifest's checksum
(sum64, ``parallel.checkpoint_digest``) and zlib's CRC-32 alone on the checkpoint's bytes in memory. The files
are in the page cache (just written or read), the case where checking costs most relative to reading; with
``--cold`` the cache is dropped before each load (root only), so the loads read the disk.

Writes ``checkpoint_verify.csv``, ``.json`` and ``.md`` into ``--out``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
import zlib
from pathlib import Path

from harness import cli


def _drop_page_cache() -> None:
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir())


def main(argv: list[str] | None = None) -> None:
    p = cli.command_parser("python -m parallel_bench.checkpoint_verify", __doc__)
    p.add_argument("--preset", default="medium", help="cs336_basics preset (medium: 423M parameters)")
    p.add_argument("--dir", type=Path, default=Path("/tmp/checkpoint_verify"),
                   help="where the checkpoint is written (removed at the end)")  # fmt: skip
    p.add_argument("--repeats", type=cli.positive_int, default=3, help="loads of each kind, alternating")
    p.add_argument("--threads", type=cli.positive_int, default=4, help="writer threads of save_sharded")
    p.add_argument("--cold", action="store_true", help="drop the page cache before each load (root)")
    cli.add_out(p, "results", "folder of the result files")
    args = p.parse_args(argv)
    out = Path(args.out)

    import pandas as pd
    import torch
    from cs336_basics.presets import build_model, get_preset
    from parallel import load_sharded, save_sharded, verify_sharded
    from parallel.checkpoint_digest import sum64

    from parallel_bench.results import write_results

    torch.manual_seed(0)
    model = build_model(get_preset(args.preset), device="cpu")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    model.zero_grad(set_to_none=True)
    path = args.dir / "ckpt"
    shutil.rmtree(args.dir, ignore_errors=True)
    began = time.perf_counter()
    save_sharded(path, model, optimizer, threads=args.threads)
    save_seconds = time.perf_counter() - began
    size = _folder_bytes(path)
    print(f"saved {size / 1e9:.2f} GB in {save_seconds:.2f} s")

    load_sharded(path, model, optimizer, verify=False)  # warm-up: first touches of the load's memory
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}  # seconds of CPU of every thread of the process
    for repeat in range(args.repeats):
        for verify in (False, True):
            if args.cold:
                _drop_page_cache()
            began, began_cpu = time.perf_counter(), time.process_time()
            load_sharded(path, model, optimizer, verify=verify)
            times[verify].append(time.perf_counter() - began)
            cpu[verify].append(time.process_time() - began_cpu)
            print(f"load {repeat + 1}/{args.repeats} verify={verify}: {times[verify][-1]:.3f} s")
    if args.cold:
        _drop_page_cache()
    began = time.perf_counter()
    verify_sharded(path)
    verify_only = time.perf_counter() - began
    blobs = [bytearray(f.read_bytes()) for f in path.iterdir()]
    began = time.perf_counter()
    for blob in blobs:
        zlib.crc32(blob)
    crc_only = time.perf_counter() - began
    began = time.perf_counter()
    for blob in blobs:
        sum64(blob)
    sum64_only = time.perf_counter() - began
    del blobs
    shutil.rmtree(args.dir, ignore_errors=True)

    plain, checked = statistics.median(times[False]), statistics.median(times[True])
    added = statistics.median(b - a for a, b in zip(times[False], times[True], strict=True))
    row = {
        "preset": args.preset, "parameters": sum(p.numel() for p in model.parameters()),
        "checkpoint_GB": size / 1e9, "page_cache": "dropped" if args.cold else "warm",
        "save_s": save_seconds, "load_s": plain, "load_verified_s": checked,
        "verification_s": added, "verification_fraction": added / plain,
        "load_min_s": min(times[False]), "load_verified_min_s": min(times[True]),
        "load_cpu_s": statistics.median(cpu[False]), "load_verified_cpu_s": statistics.median(cpu[True]),
        "load_runs_s": " ".join(f"{t:.3f}" for t in times[False]),
        "load_verified_runs_s": " ".join(f"{t:.3f}" for t in times[True]),
        "cpu_count": os.cpu_count(), "load_average_1min": os.getloadavg()[0],
        "verify_sharded_s": verify_only, "crc32_in_memory_s": crc_only,
        "crc32_GB_per_s": size / 1e9 / crc_only, "sum64_in_memory_s": sum64_only,
        "sum64_GB_per_s": size / 1e9 / sum64_only, "torch_threads": torch.get_num_threads(),
    }
    df = pd.DataFrame([row])
    out.mkdir(parents=True, exist_ok=True)
    for written in write_results(df, out / "checkpoint_verify"):
        print(f"wrote {written}")
    print(f"verification: {added:+.3f} s (median of {args.repeats} pairs) on a {plain:.3f} s load "
          f"({100 * added / plain:+.1f}%)")


if __name__ == "__main__":
    main()
