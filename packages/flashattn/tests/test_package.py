"""flashattn as a library: its wheel needs torch and triton only, importing and calling it loads no
benchmark dependency, and it ships no laboratory (every source file one job, under ~400 lines)."""

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

SRC = Path(__file__).parents[1] / "src" / "flashattn"


def test_wheel_requires_torch_and_triton_only():
    requirements = [Requirement(r) for r in metadata.requires("flashattn") or []]
    assert {r.name for r in requirements if not r.marker or "extra" not in str(r.marker)} == {
        "torch",
        "triton",
    }
    info = metadata.metadata("flashattn")
    assert info["License-Expression"] == "MIT" and info["Version"] == __import__("flashattn").__version__
    assert "flash_attention" in (info.get_payload() or "")  # the readme is the long description


def test_a_call_loads_no_benchmark_dependency():
    probe = """
import json, sys, torch
from flashattn import flash_attention
q = torch.randn(1, 2, 9, 16, requires_grad=True)
flash_attention(q, q, q, True).sum().backward()
print(json.dumps(sorted(m for m in ("pandas", "matplotlib", "tabulate", "flashattn_bench", "harness")
                        if m in sys.modules)))
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_source_files_are_small():
    sizes = {p.relative_to(SRC).as_posix(): len(p.read_text().splitlines()) for p in SRC.rglob("*.py")}
    assert not {name: n for name, n in sizes.items() if n > 420}, sizes
