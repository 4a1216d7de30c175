"""The DDP benchmark on CPU processes (tiny preset): its tables, figure and traced step."""

import pandas as pd
import pytest
from harness.trace import load_trace


def test_benchmark_runs_every_variant_on_cpu_processes(tmp_path):
    pytest.importorskip("cs336_basics")
    pytest.importorskip("analysis.accounting")
    from parallel_bench import ddp

    df = ddp.main(
        [
            "--preset",
            "tiny",
            "--backend",
            "gloo",
            "--warmup",
            "1",
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--variants",
            "local",
            "naive",
            "flat",
            "ddp",
            "bucketed",
            "torch",
            "--sweep-mb",
            "0.01",
            "--out",
            str(tmp_path),
        ]
    )
    runs = pd.read_csv(tmp_path / "ddp.csv")
    assert len(runs) == 12 and set(runs["precision"]) == {"fp32", "bf16"}
    assert (runs["step_ms"] > 0).all() and (runs["step_min_ms"] <= runs["step_max_ms"]).all()
    assert (runs.loc[runs["variant"] == "torch", "vs_torch"] == 1.0).all()
    assert (runs.loc[runs["variant"] == "local", "comm_overhead_ms"] == 0.0).all()
    sweep = pd.read_csv(tmp_path / "ddp-sweep.csv")
    assert sorted(sweep.loc[sweep["variant"] == "bucketed", "bucket_mb"]) == [0.01, 25.0]
    assert (tmp_path / "figures" / "ddp-bucket-sweep.png").exists()
    assert len(df) == 13
    # The traced step was recorded (phases and operators), not cleared by a profiler schedule.
    events = load_trace(tmp_path / "ddp-trace-ddp-fp32.json.gz")
    names = {e.get("name") for e in events}
    assert {"forward", "backward", "finish_gradient_synchronization", "optimizer"} <= names
    assert any(e.get("cat") == "cpu_op" for e in events)
