"""The exact run behind docs/profiling.md's 2026-12-01 tables (run E), one process on one H200.

It calls the project's commands in order (``profiling.kernels``, ``profiling.bench``, and
``flashattn.benchutil.matmul_tflops``) so that torch and CUDA start once. Written to ``$OUT/r``.
"""

import os
import time
import traceback
from datetime import UTC, datetime

import pandas as pd
import torch
from flashattn.benchutil import matmul_tflops
from profiling import bench, kernels, ranges

out = os.environ["OUT"] + "/r"
start = time.time()
ranges.set_enabled(True)


def elapsed() -> float:
    return time.time() - start


def part(name, run, *args) -> None:
    t0 = time.time()
    try:
        run(*args)
    except Exception:
        traceback.print_exc()
    torch.cuda.empty_cache()
    print(f"== {name}: {time.time() - t0:.1f} s (total {elapsed():.1f} s)", flush=True)


def matmul_rate() -> None:
    rates = [matmul_tflops() for _ in range(5)]
    table = pd.DataFrame({"repeat": range(5), "tflops": rates})
    table = table.assign(
        n=8192,
        dtype="bf16",
        method="triton.testing.do_bench median",
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        utc=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    table.to_csv(out + "/matmul-rate.csv", index=False)
    print(rates, flush=True)


part("matmul", matmul_rate)
for size, context, dtype in [("small", 4096, "fp32"), ("small", 4096, "bf16"), ("medium", 2048, "bf16")]:
    part(
        f"kernels {size} {context} {dtype}",
        kernels.main,
        [
            "--sizes",
            size,
            "--contexts",
            str(context),
            "--modes",
            "forward,train",
            "--dtype",
            dtype,
            "--out",
            out,
            "--name",
            f"kernels-{size}-{context}-{dtype}",
        ],
    )
sweep = ["--sweep", "--contexts", "512", "--warmup", "5", "--steps", "10", "--out", out]
part(
    "bench xl",
    bench.main,
    [
        *sweep,
        "--sizes",
        "xl",
        "--modes",
        "forward,forward-backward,train",
        "--dtypes",
        "fp32,bf16",
        "--name",
        "bench-xl",
    ],
)
part(
    "bench 10B bf16",
    bench.main,
    [
        *sweep,
        "--sizes",
        "10B",
        "--modes",
        "forward,forward-backward",
        "--dtypes",
        "bf16",
        "--name",
        "bench-10B-bf16",
    ],
)
for mode, latest_start_s in [("forward", 100), ("forward-backward", 80)]:
    if elapsed() < latest_start_s:  # the device budget: a cell started later would outrun it
        part(
            f"bench 10B fp32 {mode}",
            bench.main,
            [
                *sweep,
                "--sizes",
                "10B",
                "--modes",
                mode,
                "--dtypes",
                "fp32",
                "--name",
                f"bench-10B-fp32-{mode}",
            ],
        )
    else:
        print(f"== bench 10B fp32 {mode}: skipped at {elapsed():.1f} s (device budget)", flush=True)
