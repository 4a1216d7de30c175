import pandas as pd
import pytest
from profiling.memory_timeline import (
    BETWEEN,
    build_timeline,
    compact_trace,
    largest_allocations,
    phase_at,
    plot_timeline,
    trace_snapshot,
)

T0 = 1_800_000_000_000_000  # µs since the epoch, as the allocator reports


def _snapshot(scale=1):
    e = lambda action, size, dt, fn="model.py": {
        "action": action, "addr": 0, "size": size, "time_us": (T0 + dt) * scale,
        "frames": [{"filename": "/x/torch/nn/functional.py", "line": 1, "name": "linear"},
                   {"filename": f"/w/{fn}", "line": 7, "name": "forward"}]}
    trace = [e("alloc", 100, 1), e("alloc", 300, 2), e("segment_alloc", 10**9, 3),
             e("free_completed", 100, 4),
             e("alloc", 700, 12), e("free_requested", 700, 13), e("free_completed", 700, 14),
             {"action": "oom", "size": 10**12, "time_us": (T0 + 25) * scale, "device_free": 5}]
    return {"segments": [], "device_traces": [trace]}


PHASES = [("forward", T0, T0 + 5), ("backward", T0 + 10, T0 + 20)]


@pytest.mark.parametrize("scale", [1, 1000])
def test_timeline_values_phases_peak_oom(scale):
    tl = build_timeline(_snapshot(scale), 50, PHASES)
    assert tl.active_bytes == [150, 450, 350, 1050, 350, 350]
    assert tl.phase == ["forward", "forward", "forward", "backward", "backward", BETWEEN]
    assert tl.peak_index == 3 and tl.oom_at == 5


def test_phase_at_prefers_latest_started():
    assert phase_at(T0 + 3, [("forward", T0, T0 + 10), ("inner", T0 + 2, T0 + 4)]) == "inner"
    assert phase_at(T0 + 30, PHASES) == BETWEEN


def test_plot_writes_png(tmp_path):
    path = plot_timeline(build_timeline(_snapshot(), 0, PHASES), "synthetic", tmp_path / "t.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("peak_at", [0, 3, 5])
def test_peak_label_stays_inside_the_axes(tmp_path, monkeypatch, peak_at):
    from profiling import memory_timeline

    figures = []
    monkeypatch.setattr(memory_timeline, "save_figure", lambda fig, path: figures.append(fig) or path)
    active = [2**30 * (9 if i == peak_at else 1 + i % 3) for i in range(6)]
    timeline = memory_timeline.Timeline([T0 + 1000 * i for i in range(6)], active, ["forward"] * 6, None)
    plot_timeline(timeline, "a title of some length, as the benchmark writes it", tmp_path / "t.png")
    (ax,) = figures[0].axes
    figures[0].canvas.draw()
    renderer = figures[0].canvas.get_renderer()
    (label,) = [t for t in ax.texts if t.get_text().startswith("peak 9.00 GiB")]
    box, frame = label.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
    assert not box.overlaps(ax.title.get_window_extent(renderer))


def test_largest_allocations_name_source_outside_torch():
    df = largest_allocations(_snapshot(), PHASES, top=2)
    assert list(df["MiB"] * 2**20) == [700, 300]
    assert df.loc[0, "phase"] == "backward" and df.loc[0, "source"] == "model.py:7 (forward)"


def test_compact_trace_round_trip():
    trace = compact_trace(_snapshot())
    assert list(trace["action"]) == ["alloc", "alloc", "free_completed", "alloc", "free_completed", "oom"]
    again = build_timeline(trace_snapshot(trace), 50, PHASES)
    assert again.active_bytes == build_timeline(_snapshot(), 50, PHASES).active_bytes
    assert largest_allocations(trace_snapshot(trace), PHASES).loc[0, "source"] == "model.py:7 (forward)"


def test_empty_or_missing_trace_is_named():
    with pytest.raises(ValueError, match="no allocation events"):
        build_timeline({"device_traces": [[]]}, 0, [])
    with pytest.raises(ValueError, match="device 1"):
        build_timeline({"device_traces": [[]]}, 0, [], device=1)
    assert isinstance(largest_allocations({"device_traces": [[]]}, []), pd.DataFrame)
