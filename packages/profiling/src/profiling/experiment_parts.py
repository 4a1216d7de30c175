"""The parts of ``python -m profiling.experiments``, each writing its tables under the run's folder.

Every part takes the :class:`Run` (folder, device, scale); a dry run replaces every size by the ``tiny``
preset and divides every context by 16, to check the script on a CPU.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from analysis.accounting import best_checkpoint_group_size, checkpointed_activation_bytes
from cs336_basics import ModelConfig
from cs336_basics.presets import STANDARD_SIZES
from harness.results import atomic_path, write_table
from harness.timing import sync_overhead

from .kernel_attribution import profile_config, short_names
from .memory_timeline import profile_memory
from .mixed_precision import accumulation_table, autocast_dtypes
from .options import MODES
from .ranges import range_overhead
from .runner import run_config, sweep
from .saved_tensors import block_report
from .workload import Workload, free_device_memory, resolve_config


@dataclass(frozen=True)
class Run:
    """Where a run writes (``out``), on which ``device``, and whether it is a ``dry_run`` (tiny sizes)."""

    out: Path
    device: str
    dry_run: bool = False

    def size(self, name: str) -> str:
        """The preset to use for ``name`` (``tiny`` in a dry run)."""
        return "tiny" if self.dry_run else name

    def ctx(self, context: int) -> int:
        """The context to use (a sixteenth in a dry run)."""
        return max(8, context // 16) if self.dry_run else context

    def cfg(self, name: str, context: int = 512) -> ModelConfig:
        return resolve_config(self.size(name), context_length=self.ctx(context))


def warmup_study(run: Run) -> None:
    """Per-step times of 15 steps from a cold start; mean/std of the 10-step windows at offsets 0/1/2/5."""
    rows, steps = [], []
    for dtype in ("fp32", "bf16"):
        row = run_config(run.cfg("small"), "train", dtype, warmup=0, steps=15, device=run.device)
        for i, ms in enumerate(row["step_ms"]):
            steps.append({"dtype": dtype, "step": i, "ms": ms})
        for w in (0, 1, 2, 5):
            window = pd.Series(row["step_ms"][w : w + 10])
            rows.append(
                {
                    "size": "small",
                    "mode": "train",
                    "dtype": dtype,
                    "warmup": w,
                    "mean_ms": window.mean(),
                    "std_ms": window.std(),
                    "max_ms": window.max(),
                }
            )
    write_table(pd.DataFrame(rows), run.out / "warmup")
    write_table(pd.DataFrame(steps), run.out / "warmup-steps")


def precision_and_saved(run: Run) -> None:
    """The mixed-precision tables, and what one xl block saves for backward in fp32 and bf16."""
    autocast = pd.concat([autocast_dtypes("fp16", run.device), autocast_dtypes("bf16", run.device)])
    write_table(accumulation_table(), run.out / "precision-accumulation", floatfmt=".8g")
    write_table(autocast, run.out / "precision-autocast")
    rows, tables = [], []
    config = run.cfg("xl")
    for dtype in ("fp32", "bf16"):
        report = block_report(config, dtype, run.device)
        table = report.pop("table")
        table.insert(0, "dtype", dtype)
        tables.append(table)
        rows.append(
            {
                "size": "xl",
                "context": config.context_length,
                "batch": config.batch_size,
                "dtype": dtype,
                **report,
            }
        )
    write_table(pd.concat(tables), run.out / "saved-xl-block")
    write_table(pd.DataFrame(rows), run.out / "saved-xl-summary")


def overheads(run: Run, rounds: int) -> None:
    """Cost of the NVTX ranges and of per-step timing on a small full step at context 512, fp32 and bf16.

    Each is measured in ``rounds`` alternating rounds of 10 steps each way; the rounds' step means go
    to ``overheads-rounds``.
    """
    rows, per_round = [], []
    for dtype in ("fp32", "bf16"):
        workload = Workload(run.cfg("small"), "train", dtype, device=run.device)
        try:
            for _ in range(3):
                workload.step()
            results = {
                "NVTX + record_function ranges on vs off": range_overhead(
                    workload.step, steps=10, rounds=rounds, device=run.device
                ),
                "synchronize + timer per step vs back-to-back": sync_overhead(
                    workload.step, steps=10, rounds=rounds, device=run.device
                ),
            }
        finally:
            workload.close()
            free_device_memory()
        for what, result in results.items():
            per_round += [
                {"dtype": dtype, "what": what, "round": r, "with_ms": a, "without_ms": b}
                for r, (a, b) in enumerate(result.pop("per_round_ms"))
            ]
            rows.append({"dtype": dtype, "what": what, **result})
    write_table(pd.DataFrame(rows), run.out / "overheads")
    write_table(pd.DataFrame(per_round), run.out / "overheads-rounds")


def main_table(run: Run, big_steps: tuple[int, int], huge_steps: tuple[int, int], max_seconds: float) -> None:
    """Every size x mode x (fp32, bf16) at context 512, eager; fewer steps for xl and 10B."""
    steps = {"xl": big_steps, "10B": huge_steps}
    configs = [(name, run.cfg(name)) for name in STANDARD_SIZES]
    sweep(
        configs,
        MODES,
        ("fp32", "bf16"),
        (False,),
        run.out / "bench-eager",
        max_seconds=max_seconds,
        steps_for=lambda name: steps.get(name, (5, 10)),
        device=run.device,
    )


def memory_timelines(run: Run) -> None:
    """Memory timelines of xl at contexts 128 and 2048, forward and full step, fp32 and bf16."""
    rows = []
    for context in (128, 2048):
        for dtype in ("fp32", "bf16"):
            for mode in ("forward", "train"):
                stem = f"memory-xl-{context}-{mode}-{dtype}"
                keep = context == 128 and mode == "train" and dtype == "bf16"
                rows.append(
                    profile_memory(
                        run.size("xl"),
                        run.ctx(context),
                        mode,
                        dtype,
                        2,
                        run.out,
                        stem,
                        run.device,
                        keep_pickle=keep,
                    )
                )
                print(rows[-1], flush=True)
                write_table(pd.DataFrame(rows), run.out / "memory-xl-peaks")


def kernel_tables(run: Run) -> None:
    """Kernel tables of small and medium at three contexts, forward and full step, fp32."""
    kernels, summaries = [], []
    for name in ("small", "medium"):
        for context in (256, 1024, 2048):
            for mode in ("forward", "train"):
                k, s = profile_config(run.size(name), run.ctx(context), mode, "fp32", 3, 2, run.device)
                k["size"] = s["size"] = name
                kernels.append(k)
                summaries.append(s)
                free_device_memory()
                write_table(short_names(pd.concat(kernels), 120), run.out / "kernels")
                write_table(short_names(pd.concat(summaries), 120), run.out / "kernels-summary")


def checkpoint_peaks(run: Run, context: int = 2048) -> None:
    """Peak memory of one forward+backward of xl under each strategy (fp32: single level; bf16: all)."""
    config = run.cfg("xl", context)
    seq = config.context_length
    best, _ = best_checkpoint_group_size(config.num_layers, config=config, batch=config.batch_size, seq=seq)
    groups = sorted({k for k in (best - 1, best, best + 1, best + 2) if 1 <= k <= config.num_layers})
    plan = [("fp32", "none")] + [("fp32", f"group:{k}") for k in groups]
    plan += [("bf16", s) for s in ["none", *(f"group:{k}" for k in groups), "sqrt", "bisect", "optimal"]]
    rows = []
    for dtype, strategy in plan:
        row = run_config(
            config, "forward-backward", dtype, checkpoint=strategy, warmup=0, steps=1, device=run.device
        )
        name, _, k = strategy.partition(":")
        if name == "group" and dtype == "fp32":
            row["predicted_activation_gib"] = (
                checkpointed_activation_bytes(config, config.batch_size, seq, int(k)) / 2**30
            )
        row.pop("step_ms", None)
        rows.append({"size": "xl", "best_k_predicted": best, **row})
        print(rows[-1], flush=True)
        write_table(pd.DataFrame(rows), run.out / "checkpoint-xl")


def compiled_table(run: Run, max_seconds: float) -> None:
    """``torch.compile`` of small and medium, forward and full step, bf16 then fp32."""
    configs = [(name, run.cfg(name)) for name in ("small", "medium")]
    sweep(
        configs,
        ("forward", "train"),
        ("bf16", "fp32"),
        (True,),
        run.out / "bench-compiled",
        max_seconds=max_seconds,
        warmup=3,
        steps=10,
        device=run.device,
    )


def pack(out: Path, archive: Path) -> None:
    """Pack folder ``out`` into the gzipped tar ``archive`` (through a temporary name)."""
    with atomic_path(archive) as tmp, tarfile.open(tmp, "w:gz") as tar:
        tar.add(out, arcname=out.name)
