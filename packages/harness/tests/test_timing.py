import itertools
import math
import random
import statistics
import time
from types import SimpleNamespace

import pytest
from harness import timing
from harness.timing import (
    Marks,
    abba_rounds,
    compare_paired,
    do_bench,
    median_ci,
    summarize,
    sync_overhead,
    time_steps,
)


def test_time_steps_runs_warmup_then_timed_steps():
    calls = []
    times = time_steps(lambda: calls.append(1), warmup=2, steps=17, device="cpu")
    assert len(calls) == 19 and len(times) == 17 and all(t >= 0 for t in times)
    with pytest.raises(ValueError, match="steps >= 1"):
        time_steps(lambda: None, warmup=0, steps=0, device="cpu")
    with pytest.raises(ValueError, match="warmup >= 0"):
        time_steps(lambda: None, warmup=-1, steps=1, device="cpu")


def test_summarize_against_statistics():
    times = [0.001, 0.004, 0.002, 0.0097]
    s = summarize(times)
    assert s["mean_ms"] == pytest.approx(statistics.mean(times) * 1e3)
    assert s["std_ms"] == pytest.approx(statistics.stdev(times) * 1e3)
    assert (s["min_ms"], s["max_ms"]) == pytest.approx((1.0, 9.7))
    assert summarize([0.5])["std_ms"] == 0.0


def _coverage(n: int, j: int) -> float:
    """Exact coverage of (x(j), x(n+1-j)) for the median: P(j <= #below median <= n - j)."""
    return sum(math.comb(n, k) for k in range(j, n - j + 1)) / 2**n


@pytest.mark.parametrize("n", [1, 2, 5, 6, 17, 40, 97])
def test_median_ci_is_the_tightest_interval_with_95_percent_coverage(n):
    xs = [float((7 * i) % n) + 0.1 * i for i in range(n)]
    low, high = median_ci(xs)
    s = sorted(xs)
    valid = [j for j in range(1, n // 2 + 1) if _coverage(n, j) >= 0.95]
    j = max(valid) if valid else 1
    assert (low, high) == (s[j - 1], s[n - j])


def test_compare_paired_known_differences():
    a, b = [1.1, 2.2, 3.3], [1.0, 2.0, 3.0]
    c = compare_paired(a, b)
    assert c["overhead_pct"] == pytest.approx(10.0) and c["median_pct"] == pytest.approx(10.0)
    assert c["noise_pct"] == pytest.approx(0.0, abs=1e-9)
    flat = [ms for pair in c["per_round_ms"] for ms in pair]
    assert flat == pytest.approx([1100.0, 1000.0, 2200.0, 2000.0, 3300.0, 3000.0])
    with pytest.raises(ValueError):
        compare_paired([1.0], [1.0, 2.0])


def test_abba_rounds_alternates_order():
    order = []
    counter = itertools.count()
    a, b = abba_rounds(lambda flag: order.append(flag) or next(counter), rounds=3)
    assert order == [True, False, False, True, True, False]
    assert (a, b) == ([0, 3, 4], [1, 2, 5])
    with pytest.raises(ValueError, match="rounds"):
        abba_rounds(lambda flag: 0.0, rounds=0)


def test_marks_on_cpu_measure_host_time():

    marks = Marks("cpu")
    marks.mark()
    time.sleep(0.02)
    marks.mark()
    assert 15 <= marks.elapsed_ms(0, 1) < 2000 and marks.elapsed_ms(0, 0) == 0


def test_do_bench_on_cpu_is_a_median_of_real_calls():

    calls = []
    ms = do_bench(lambda: calls.append(time.sleep(0.002)), device="cpu", rep_ms=30)
    assert 1.5 <= ms < 1000 and len(calls) >= 3


def test_sync_overhead_on_cpu_reports_its_fields():
    result = sync_overhead(lambda: sum(range(200)), steps=5, rounds=4, device="cpu")
    assert result["rounds"] == 4 and len(result["per_round_ms"]) == 4
    for key in ("per_step_synced_ms", "back_to_back_ms", "sync_wait_ms", "bound_pct", "overhead_pct"):
        assert math.isfinite(result[key])
    assert result["ci_low_pct"] <= result["median_pct"] <= result["ci_high_pct"]


def test_time_steps_reports_progress_after_each_call():
    lines = []
    time_steps(lambda: None, warmup=2, steps=3, device="cpu", progress=lines.append)
    assert lines[:2] == ["warm-up step 1/2", "warm-up step 2/2"] and len(lines) == 5
    assert lines[-1].startswith("step 3/3: ") and lines[-1].endswith(" ms")


class FakeClock:
    """A clock that moves only when told: timing results become exact, whatever the machine's load."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1e3


def test_sync_overhead_sees_a_cost_that_only_per_step_syncs_pay(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(timing, "timeit", SimpleNamespace(default_timer=clock))
    monkeypatch.setattr(timing, "synchronize", lambda device: clock.advance(2))
    result = sync_overhead(lambda: clock.advance(2), 4, 6, "cpu")
    # synced: 2 ms step + 2 ms sync; back to back: 2 ms step + 2 ms sync / 4 steps = 2.5 ms
    assert result["per_step_synced_ms"] == pytest.approx(4)
    assert result["back_to_back_ms"] == pytest.approx(2.5)
    assert result["overhead_pct"] == pytest.approx(60) and result["noise_pct"] == pytest.approx(0, abs=1e-9)
    # the wait after queueing is the 2 ms sync, which bounds the 1.5 ms the sync costs per step
    assert result["sync_wait_ms"] == pytest.approx(2) and result["bound_pct"] == pytest.approx(80)


def test_median_interval_covers_the_median_as_often_as_it_claims():
    rng = random.Random(0)
    for n in (6, 37, 64):
        covered = sum(low <= 0 <= high for low, high in
                      (median_ci([rng.expovariate(1) - math.log(2) for _ in range(n)]) for _ in range(2000)))
        assert 0.945 <= covered / 2000 <= 0.995  # exact coverage of the chosen order statistics: 0.953-0.969
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few samples for 95%: the whole range
    assert median_ci(list(range(100))) == (39, 60)
