import math
import random
import sys

import pandas as pd
import pytest
import torch
from profiling import bench, ranges, timing, workload
from profiling.timing import median_ci, range_overhead, sync_overhead, time_steps
from profiling.workload import MODES, resolve_config


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_each_mode_runs_and_reports(tiny, mode, dtype):
    row = bench.run_config(tiny, mode, dtype, warmup=1, steps=2, device="cpu")
    assert row["status"] == "ok"
    assert len(row["step_ms"]) == 2 and row["mean_ms"] > 0
    assert row["min_ms"] <= row["mean_ms"] <= row["max_ms"]
    expected = bench.step_flops(tiny, mode) / (row["mean_ms"] * 1e-3) / 1e12
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


def test_cli_single_run_prints_table(capsys):
    df = bench.run_cli(["--preset", "tiny", "--context", "19", "--batch", "2", "--mode", "forward-backward",
                     "--warmup", "0", "--steps", "2", "--device", "cpu", "--checkpoint", "block"])
    assert df.loc[0, "status"] == "ok" and df.loc[0, "context"] == 19 and df.loc[0, "checkpoint"] == "block"
    assert "forward-backward" in capsys.readouterr().out


def test_simulated_oom_is_reported_not_raised(tiny, monkeypatch):
    def boom(self):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(workload.Workload, "step", boom)
    row = bench.run_config(tiny, "train", warmup=0, steps=1, device="cpu")
    assert row["status"] == "OOM" and "mean_ms" not in row


def test_other_errors_propagate(tiny, monkeypatch):
    def broken(self):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(workload.Workload, "step", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        bench.run_config(tiny, "train", warmup=0, steps=1, device="cpu")


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
    df = bench.sweep(configs, MODES, ["fp32"], [False], tmp_path / "t", run=fake_run)
    status = dict(zip(zip(df["size"], df["mode"], strict=True), df["status"], strict=True))
    assert status[("a", "train")] == "ok"
    assert status[("b", "forward-backward")] == "OOM"
    assert status[("b", "train")] == "OOM (implied)"
    assert (96, "train", "fp32") not in calls
    written = pd.read_csv(tmp_path / "t.csv")
    assert list(written["status"]) == list(df["status"]) and "step_ms" not in written
    assert "OOM (implied)" in (tmp_path / "t.md").read_text()


def test_sweep_time_budget_skips(tmp_path, tiny):
    df = bench.sweep([("a", tiny)], MODES, ["fp32"], [False], tmp_path / "t", max_seconds=-1.0,
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
        workload.attention_function("sparse")


class SimulatedClock:
    """Time that passes only in ``sleep``, by the requested amount +-3% (seeded), so timing tests give the
    same answer on an idle machine and on a busy one, where a real 2 ms sleep can take several more."""

    def __init__(self) -> None:
        self.now, self.rng = 0.0, random.Random(0)

    def read(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds * self.rng.uniform(0.97, 1.03)


@pytest.fixture
def clock(monkeypatch) -> SimulatedClock:
    clock = SimulatedClock()
    monkeypatch.setattr(timing.timeit, "default_timer", clock.read)
    return clock


def test_sync_overhead_sees_a_cost_that_only_per_step_syncs_pay(monkeypatch, clock):
    monkeypatch.setattr(timing, "synchronize", lambda device: clock.sleep(0.002))
    result = sync_overhead(lambda: clock.sleep(0.002), 4, 6, "cpu")
    # synced: 2 ms step + 2 ms sync; back to back: 2 ms step + 2 ms sync / 4 steps = 2.5 ms
    assert 3.5 < result["per_step_synced_ms"] < 5 and 2.2 < result["back_to_back_ms"] < 3.5
    assert 30 < result["overhead_pct"] < 90
    assert result["noise_pct"] < result["overhead_pct"] / 2
    # the wait after queueing is the 2 ms sync, which bounds the 1.5 ms the sync costs per step
    assert 1.8 < result["sync_wait_ms"] < 3 and result["overhead_pct"] < result["bound_pct"]


def test_median_interval_covers_the_median_as_often_as_it_claims():
    rng = random.Random(0)
    for n in (6, 37, 64):
        covered = sum(low <= 0 <= high for low, high in
                      (median_ci([rng.expovariate(1) - math.log(2) for _ in range(n)]) for _ in range(2000)))
        assert 0.945 <= covered / 2000 <= 0.995  # exact coverage of the chosen order statistics: 0.953-0.969
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few samples for 95%: the whole range
    assert median_ci(list(range(100))) == (39, 60)


def test_range_overhead_sees_a_cost_that_only_ranges_pay(monkeypatch, clock):
    monkeypatch.setattr(ranges, "_enabled", False)  # restored after the test whatever happens
    result = range_overhead(lambda: clock.sleep(0.004 if ranges.enabled() else 0.002), 2, 4, "cpu")
    assert not ranges.enabled()  # the caller's setting is restored
    assert result["steps_each"] == 8
    assert 50 < result["overhead_pct"] < 150  # 4 ms against 2 ms, give or take the sleep's jitter
    assert result["noise_pct"] < result["overhead_pct"] / 2


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
        workload.attention_function("flash")
