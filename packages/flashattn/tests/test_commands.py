"""The commands answer ``--help`` without importing torch, and the GPU-only ones refuse a machine without a
GPU at once with a clear message (each check runs the commands in one fresh interpreter)."""

import pytest
import torch
from harness.command_probe import probe_commands

COMMANDS = ["precompile"]


def test_import_and_help_do_not_load_torch():
    result = probe_commands("flashattn", COMMANDS)
    assert result["import loads torch"] is False
    assert {c: (r["exit"], r["torch"]) for c, r in result["commands"].items()} == {
        c: ("0", False) for c in COMMANDS
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_commands_refuse_without_a_gpu():
    result = probe_commands("flashattn", COMMANDS, run=True)
    for command, outcome in result["commands"].items():
        assert "needs an NVIDIA GPU" in outcome["exit"], (command, outcome)
