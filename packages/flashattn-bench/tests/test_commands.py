"""The commands answer ``--help`` without importing torch, and the GPU-only ones refuse a machine without a
GPU at once with a clear message (each check runs the commands in one fresh interpreter)."""

import json
import os
import subprocess
import sys

import pytest
import torch

GPU_COMMANDS = ["bench", "pytorch_attention", "tune", "sm90", "host_time"]
COMMANDS = [*GPU_COMMANDS, "compile_report"]  # compile_report compiles for sm90 on any machine
PROBE = """
import contextlib, io, json, runpy, sys
import flashattn_bench
result = {"import flashattn_bench loads torch": "torch" in sys.modules}
mode, commands = sys.argv[1], sys.argv[2:]
for command in commands:
    sys.argv = [command, *([] if mode == "run" else ["--help"])]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            runpy.run_module("flashattn_bench." + command, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code
    result[command] = {"exit": str(code), "torch": "torch" in sys.modules}
print(json.dumps(result))
"""


def _probe(mode: str, commands: list[str]) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", PROBE, mode, *commands], capture_output=True, text=True,
                          env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_import_and_help_do_not_load_torch():
    result = _probe("help", COMMANDS)
    assert result.pop("import flashattn_bench loads torch") is False
    assert result == {c: {"exit": "0", "torch": False} for c in COMMANDS}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_commands_refuse_without_a_gpu():
    result = _probe("run", GPU_COMMANDS)
    for command in GPU_COMMANDS:
        assert "needs an NVIDIA GPU" in result[command]["exit"], (command, result[command])
