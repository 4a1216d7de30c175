"""GPU checks: the optimized step against the reference on a small CUDA recipe, through the real command."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sharding", ["ours", "fsdp2"])
def test_check_passes_on_cuda(sharding):
    """``--check`` on the tiny model at context 256 on up to 2 GPUs (torchrun), sharded by parallel.FSDP
    or torch FSDP2; regions left uncompiled to keep the test short (the CPU check covers them)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    command = [
        sys.executable,
        "-m",
        "leaderboard.cli",
        "--check",
        "--preset",
        "tiny",
        "--set",
        "context_length=256",
        "--set",
        "compile_regions=false",
        "--set",
        f"sharding={sharding}",
        "--ranks",
        str(min(2, torch.cuda.device_count())),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=580)
    print(done.stdout[-6000:], done.stderr[-6000:])
    assert done.returncode == 0
    assert "check passed" in done.stdout
