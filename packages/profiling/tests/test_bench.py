import sys
from types import SimpleNamespace

import harness.timing
import pandas as pd
import pytest
import torch
from harness.timing import time_steps
from profiling import bench, runner, workload
from profiling.options import MODES
from profiling.ranges import Ranges, range_overhead
from profiling.workload import resolve_config


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_each_mode_runs_and_reports(tiny, mode, dtype):
    row = runner.run_config(tiny, mode, dtype, warmup=1, steps=2, device="cpu")
    assert row["status"] == "ok"
    assert len(row["step_ms"]) == 2 and row["mean_ms"] > 0
    assert row["min_ms"] <= row["mean_ms"] <= row["max_ms"]
    expected = runner.step_flops(tiny, mode) / (row["mean_ms"] * 1e-3) / 1e12
    assert row["tflops"] == pytest.approx(expected)


def test_train_step_changes_parameters_and_drops_gradients(tiny):
    w = workload.Workload(tiny, "train", device="cpu")
    before = [p.detach().clone() for p in w.base_model.parameters()]
    w.step()
    assert all(p.grad is None for p in w.base_model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, w.base_model.parameters(), strict=True))


def test_forward_mode_builds_no_graph(tiny):
    w = workload.Workload(tiny, "forward", device="cpu")
    w.step()
    assert all(p.grad is None for p in w.base_model.parameters())


def test_cli_single_run_prints_table_progress_and_writes_it(capsys, tmp_path):
    df = bench.main(["--sizes", "tiny", "--contexts", "19", "--batch-size", "2", "--modes",
                     "forward-backward", "--warmup", "1", "--steps", "2", "--device", "cpu", "--checkpoint",
                     "block", "--out", str(tmp_path)])
    assert df.loc[0, "status"] == "ok" and df.loc[0, "context"] == 19 and df.loc[0, "checkpoint"] == "block"
    assert df.loc[0, "batch"] == 2
    out = capsys.readouterr()
    assert "forward-backward" in out.out
    assert "[1/1] cell: tiny ctx=19" in out.err and "warm-up step 1/1" in out.err and "step 2/2:" in out.err
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "bench.csv"), df, check_dtype=False)


def test_cli_sweeps_repeated_values_and_refuses_commas(capsys, tmp_path):
    config = bench.parse_args(["--sizes", "tiny", "small", "--contexts", "17", "97", "--dtypes", "fp32",
                               "bf16", "--compile", "both", "--device", "cpu"])
    assert config.sizes == ("tiny", "small") and config.contexts == (17, 97)
    assert config.dtypes == ("fp32", "bf16") and config.compiles == (False, True)
    with pytest.raises(SystemExit):
        bench.parse_args(["--contexts", "512,1024"])
    assert "--contexts 512 1024" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--checkpoint", "group:0"])
    assert "checkpoint strategy must be one of" in capsys.readouterr().err


def test_experiments_refuse_budgets_and_devices_that_cannot_work(capsys):
    from profiling import experiments

    for argv, message in ((["--budget-s", "-1"], "--budget-s: expected a positive finite number, got '-1'"),
                          (["--reserve-s", "nan"], "--reserve-s: expected a finite number >= 0, got 'nan'"),
                          (["--device", "tpu"], "--device: expected auto, cpu, cuda or cuda:N, got 'tpu'")):
        with pytest.raises(SystemExit):
            experiments.parse_args(argv)
        assert message in capsys.readouterr().err


def test_simulated_oom_is_reported_not_raised(tiny, monkeypatch):
    def boom(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(workload.Workload, "step", boom)
    row = runner.run_config(tiny, "train", warmup=0, steps=1, device="cpu")
    assert row["status"] == "OOM" and "mean_ms" not in row


def test_other_errors_propagate(tiny, monkeypatch):
    def broken(self):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(workload.Workload, "step", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        runner.run_config(tiny, "train", warmup=0, steps=1, device="cpu")


def test_sweep_marks_oom_and_implied_cells_and_writes_tables(tmp_path, tiny):
    calls = []

    def fake_run(config, mode, dtype, compile, **kwargs):
        calls.append((config.d_model, mode, dtype))
        if config.d_model == 96 and mode == "forward-backward":
            return {"context": config.context_length, "mode": mode, "dtype": dtype, "compile": compile,
                    "status": "OOM"}
        return {"context": config.context_length, "mode": mode, "dtype": dtype, "compile": compile,
                "status": "ok", "mean_ms": 1.0, "std_ms": 0.1, "tflops": 2.0, "step_ms": [1.0]}

    configs = [("a", tiny), ("b", tiny.with_(d_model=96))]
    df = runner.sweep(configs, MODES, ["fp32"], [False], tmp_path / "t", run=fake_run)
    status = dict(zip(zip(df["size"], df["mode"], strict=True), df["status"], strict=True))
    assert status[("a", "train")] == "ok"
    assert status[("b", "forward-backward")] == "OOM"
    assert status[("b", "train")] == "OOM (implied)"
    assert (96, "train", "fp32") not in calls
    written = pd.read_csv(tmp_path / "t.csv")
    assert list(written["status"]) == list(df["status"]) and "step_ms" not in written
    assert "OOM (implied)" in (tmp_path / "t.md").read_text()


def test_sweep_time_budget_skips(tmp_path, tiny):
    df = runner.sweep([("a", tiny)], MODES, ["fp32"], [False], tmp_path / "t", max_seconds=-1.0,
                     run=lambda *a, **k: pytest.fail("must not run"))
    assert set(df["status"]) == {"skipped (time budget)"}


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="context_length"):
        resolve_config("tiny", context_length=0)
    with pytest.raises(ValueError, match="steps"):
        time_steps(lambda: None, 0, 0, "cpu")
    with pytest.raises(ValueError, match="mode"):
        workload.Workload(resolve_config("tiny"), "sideways", device="cpu")
    with pytest.raises(ValueError, match="attention"):
        workload.attention_function("sparse", Ranges())


def test_range_overhead_sees_a_cost_that_only_ranges_pay(monkeypatch):
    now = [0.0]  # a clock that moves only with the steps: the result is exact whatever the machine's load
    monkeypatch.setattr(harness.timing, "timeit", SimpleNamespace(default_timer=lambda: now[0]))
    ranges = Ranges(enabled=False)
    seen = []

    def step():
        seen.append(ranges.enabled)
        now[0] += 0.004 if ranges.enabled else 0.002

    result = range_overhead(step, 2, 4, "cpu", ranges)
    assert not ranges.enabled  # the caller's setting is restored
    assert seen[:6] == [True] * 3 + [False] * 3 and seen[6:12] == [False] * 3 + [True] * 3  # ABBA, warm call
    assert result["steps_each"] == 8
    assert result["ranges_on_ms"] == pytest.approx(4) and result["ranges_off_ms"] == pytest.approx(2)
    assert result["overhead_pct"] == pytest.approx(100) and result["noise_pct"] == pytest.approx(0, abs=1e-9)


def test_flash_attention_slot_matches_naive(tiny):
    config = tiny.with_(context_length=13, num_layers=1)
    outs = []
    for attention in ("naive", "flash"):
        w = workload.Workload(config, "forward", attention=attention, device="cpu")
        with torch.no_grad():
            outs.append(w.model(w.inputs))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)


def test_missing_flashattn_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashattn", None)
    with pytest.raises(RuntimeError, match=r"flashattn\.flash_attention"):
        workload.attention_function("flash", Ranges())
