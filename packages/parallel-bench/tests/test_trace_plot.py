"""The trace reader and timeline figure: overlap of communication with compute, each GPU event coloured by
what it is, phase labels that never overlap."""

import gzip
import json

import harness.results
import matplotlib.colors as mcolors
import pytest
from harness.trace import load_trace
from parallel_bench import trace_plot


def _event(name, stream, start_us, dur_us, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "ts": start_us, "dur": dur_us, "args": {"stream": stream}}


def _write_trace(path, events):
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


# One stream runs compute, a NCCL all-reduce (as NaiveDDP does) and a copy; a second stream runs NCCL only.
# Two "forward" ranges overlap (one per stream); eight 50 µs ranges crowd one spot.
EVENTS = [
    _event("sm90_xmma_gemm", 7, 0, 4000),
    _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 7, 5000, 3000),
    _event("Memcpy DtoD (Device -> Device)", 7, 8500, 500, cat="gpu_memcpy"),
    _event("elementwise_kernel", 7, 9000, 2000),
    _event("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 21, 1000, 6000),
    _event("nccl:all_reduce", 7, 5000, 3000, cat="gpu_user_annotation"),
    _event("forward", 7, 0, 4000, cat="gpu_user_annotation"),
    _event("forward", 21, 500, 3600, cat="gpu_user_annotation"),
    *(_event(f"step part {i}", 7, 9000 + 50 * i, 50, cat="gpu_user_annotation") for i in range(8)),
]


def test_each_event_is_classed_by_what_it_is_not_by_its_stream(tmp_path):
    df = trace_plot.gpu_intervals(load_trace(_write_trace(tmp_path / "t.json.gz", EVENTS)))
    kinds = dict(zip(df["name"], df["kind"], strict=False))
    assert kinds["ncclDevKernel_AllReduce_Sum_f32_RING_LL"] == "communication"
    assert kinds["sm90_xmma_gemm"] == kinds["elementwise_kernel"] == "compute"
    assert kinds["Memcpy DtoD (Device -> Device)"] == "memcpy"
    assert "nccl:all_reduce" not in kinds  # the process group's range duplicates its kernel
    s = trace_plot.summary(df)
    assert s["compute_ms"] == pytest.approx(6.0)  # the copy is not compute
    assert s["communication_ms"] == pytest.approx(7.0)  # 1-8 ms, merged over both streams
    assert s["overlap"] == pytest.approx(3 / 7)  # under the gemm from 1 to 4 ms


def _capture_figure(monkeypatch):
    figures = []

    def keep(fig, path, dpi=110):
        fig.canvas.draw()
        figures.append(fig)
        return path

    monkeypatch.setattr(harness.results, "save_figure", keep)  # trace_plot imports it where used
    return figures


def test_figure_colours_kernels_by_kind_and_hatches_communication(tmp_path, monkeypatch):
    figures = _capture_figure(monkeypatch)
    trace_plot.plot_timelines({"a": _write_trace(tmp_path / "t.json.gz", EVENTS)}, tmp_path / "f.png")
    (ax,) = figures[0].axes
    bars = {}  # (lane centre, start ms) -> (colour, hatch)
    for collection in ax.collections:
        color = mcolors.to_hex(collection.get_facecolor()[0])
        for path in collection.get_paths():
            box = path.get_extents()
            bars[(round((box.y0 + box.y1) / 2), round(box.x0, 3))] = (color, collection.get_hatch())
    compute, comm, copy = (trace_plot._COLORS[k].lower() for k in ("compute", "communication", "memcpy"))
    labels = [t.get_text() for t in ax.get_yticklabels()]
    lane = {
        "stream 7": labels.index("stream 7\n(compute, NCCL, memcpy)"),
        "stream 21": labels.index("stream 21\n(NCCL)"),
    }
    assert bars[(lane["stream 7"], 0.0)] == (compute, None)
    assert bars[(lane["stream 7"], 5.0)] == (comm, "////")  # NCCL on the compute stream: communication
    assert bars[(lane["stream 7"], 8.5)] == (copy, None)
    assert bars[(lane["stream 7"], 9.0)] == (compute, None)
    assert bars[(lane["stream 21"], 1.0)] == (comm, "////")
    assert len(bars) == 5


def test_phase_labels_do_not_overlap_and_same_name_ranges_are_merged(tmp_path, monkeypatch):
    figures = _capture_figure(monkeypatch)
    trace_plot.plot_timelines({"a": _write_trace(tmp_path / "t.json.gz", EVENTS)}, tmp_path / "f.png")
    (ax,) = figures[0].axes
    renderer = figures[0].canvas.get_renderer()
    texts = [t for t in ax.texts if t.get_visible()]
    names = [t.get_text() for t in texts]
    assert names.count("forward") == 1
    assert sum(n.startswith("step part") for n in names) == 3  # one per row, the rest left out
    boxes = [t.get_window_extent(renderer) for t in texts]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (a, b)
    top = ax.get_window_extent(renderer).y1
    assert all(box.y1 <= top for box in boxes)  # inside the axes, clear of the title


def test_place_labels_staggers_then_leaves_out():
    # Ranges in ms with the width of their label: the first label fits its range (centred); the next two
    # are wider than their ranges (start-aligned) and collide, so they stagger; the fourth finds no row.
    spots = trace_plot.place_labels([(0, 10, 4), (10, 11, 5), (11, 12, 5), (12, 13, 5)], rows=3, gap=0.5)
    assert spots == [(5.0, 0, "center"), (10, 0, "left"), (11, 1, "left"), (12, 2, "left")]
    spots = trace_plot.place_labels([(10, 11, 5), (11, 12, 5), (12, 13, 5)], rows=2)
    assert spots == [(10, 0, "left"), (11, 1, "left"), None]
    assert trace_plot.place_labels([(90, 91, 20)], right=100) == [(100, 0, "right")]


def test_command_draws_the_figure_and_refuses_bad_traces(tmp_path, capsys):
    trace = _write_trace(tmp_path / "t.json.gz", EVENTS)
    summaries = trace_plot.main([f"one={trace}", "--out", str(tmp_path / "f.png"), "--title", "t"])
    assert summaries["one"]["communication_ms"] == pytest.approx(7.0)
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    for bad in (str(trace), f"x={tmp_path / 'missing.json.gz'}"):
        with pytest.raises(SystemExit):
            trace_plot.main([bad, "--out", str(tmp_path / "g.png")])
        assert "LABEL=PATH" in capsys.readouterr().err


def test_overlap_is_the_share_of_communication_time_under_compute(tmp_path):
    # Compute busy 1000-11000 and 13000-20000 µs; NCCL 6000-16000 and 15000-17000 (overlapping each other):
    # communication busy 6000-17000 = 11 ms, of which 6000-11000 and 13000-17000 (9 ms) under compute.
    events = [
        _event("ampere_sgemm_128x64", 7, 1000, 4000),
        _event("elementwise_kernel", 7, 5000, 6000),
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 21, 6000, 10000),
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 21, 15000, 2000),
        _event("sm90_xmma_gemm", 7, 13000, 7000),
        _event("backward", 0, 4000, 16000, cat="gpu_user_annotation"),
        _event("forward", 0, 500, 3000, cat="user_annotation"),
        _event("ProfilerStep#1", 0, 0, 30000, cat="gpu_user_annotation"),
        {"ph": "i", "name": "instant", "ts": 1},
    ]
    df = trace_plot.gpu_intervals(load_trace(_write_trace(tmp_path / "t.json.gz", events)))
    assert set(df.loc[df["kind"] == "phase", "name"]) == {"backward", "forward"}
    assert df.loc[df["kind"] != "phase", "start_ms"].min() == 0.0
    s = trace_plot.summary(df)
    assert s["communication_ms"] == pytest.approx(11.0)
    assert s["compute_ms"] == pytest.approx(17.0)
    assert s["overlap"] == pytest.approx(9 / 11)
    summaries = trace_plot.plot_timelines({"a": tmp_path / "t.json.gz"}, tmp_path / "fig.png", title="t")
    assert summaries["a"]["overlap"] == pytest.approx(9 / 11)
    assert (tmp_path / "fig.png").stat().st_size > 0


def test_trace_without_kernels_is_refused(tmp_path):
    path = _write_trace(tmp_path / "cpu.json.gz", [_event("aten::mm", 1, 0, 5, cat="cpu_op")])
    with pytest.raises(ValueError, match="no GPU kernels"):
        trace_plot.gpu_intervals(load_trace(path))
