"""The Triton kernels on the CPU through TRITON_INTERPRET=1, against a float64 reference (see
interpret_cases.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
TOLERANCE = {"float32": 1e-5, "float16": 3e-3}


@pytest.fixture(scope="module")
def interpreted_errors() -> dict[str, dict[str, float]]:
    src = HERE.parent / "src"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, str(HERE / "interpret_cases.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def test_interpreted_kernels_match_float64(interpreted_errors):
    assert interpreted_errors.pop("only_lse_new") == 1.0, (
        "forward must save L (..., seq_q) as its one new tensor"
    )
    assert len(interpreted_errors) >= 8
    failures = []
    for name, errors in interpreted_errors.items():
        bound = TOLERANCE[errors.pop("dtype")]
        failures += [
            f"{name}: {t} relative error {e:.2e} >= {bound:.0e}" for t, e in errors.items() if not e < bound
        ]
    assert not failures, "\n".join(failures)
