import os

import torch
from harness.trace import activities, export_trace, load_trace, phase
from torch.profiler import ProfilerActivity, profile


def test_activities():
    assert activities("cpu") == [ProfilerActivity.CPU]
    assert activities("cuda:0") == [ProfilerActivity.CPU, ProfilerActivity.CUDA]


def test_export_gzipped_trace_and_load_it_back(tmp_path):
    x = torch.randn(17, 97)
    for name in ("step.json.gz", "step.json"):
        with profile(activities=activities("cpu")) as prof, phase("forward"):
            (x @ x.T).sum()
        path = export_trace(prof, tmp_path / name)
        if name.endswith(".gz"):
            assert path.read_bytes()[:2] == b"\x1f\x8b"  # gzip magic: torch compressed it
        events = load_trace(path)
        assert any(e.get("name") == "forward" for e in events)
        assert any(e.get("name") == "aten::mm" for e in events)
    assert sorted(os.listdir(tmp_path)) == ["step.json", "step.json.gz"]
