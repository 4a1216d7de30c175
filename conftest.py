"""Shared pytest setup: tests marked ``gpu`` are skipped cleanly where CUDA is absent; the header names the
versions and thread count, which decide rounding, so a failure on another machine can be told apart."""

import numpy as np
import pytest
import torch


def pytest_report_header(config):
    import triton

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    return (
        f"torch {torch.__version__}, triton {triton.__version__}, numpy {np.__version__}; "
        f"torch threads: {torch.get_num_threads()}; {device}"
    )


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
