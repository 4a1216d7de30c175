"""The Triton kernels' grouped-query attention, head dims, windows and packed documents on the CPU through
TRITON_INTERPRET=1, against the independent float64 oracle (cases in interpret_features.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
BOUND = {"float32": 1e-5, "float16": 3e-3}  # ||ours - gold|| / max(||gold||, 1)


@pytest.fixture(scope="module")
def results() -> dict:
    path = os.pathsep.join([str(HERE.parent / "src"), str(HERE), os.environ.get("PYTHONPATH", "")])
    command = [sys.executable, str(HERE / "interpret_features.py")]
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=500)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def test_features_match_float64(results):
    failures = []
    for name, errors in results.items():
        if name == "inf_key_nan_rows":
            continue
        bound = BOUND[errors.pop("dtype")]
        if errors.pop("bitwise_repeat", 1.0) != 1.0:
            failures.append(f"{name}: two runs differ")
        failures += [f"{name}: {t} error {e:.2e} >= {bound:.0e}" for t, e in errors.items() if not e < bound]
    assert len(results) == 15 and not failures, "\n".join(failures)


def test_inf_in_keys_gives_the_reference_nan_rows(results):
    for causal, (want, got, differ) in results["inf_key_nan_rows"].items():
        assert want > 0 and differ == 0, f"{causal}: reference {want} NaN rows, ours {got}, {differ} differ"
