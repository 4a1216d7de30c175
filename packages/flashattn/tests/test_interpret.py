"""The Triton kernels under TRITON_INTERPRET=1 as a user runs them: no test-only shim, unsupported dtypes
refused by name."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from flashattn.interpret import interpreter_reason
from harness.testing import assert_relative_error

# A user's script: the interpreter switched on, flashattn imported, one call per dtype; nothing else patched.
USER_SCRIPT = textwrap.dedent("""
    import json, os
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from flashattn import FlashAttention2Triton, reference

    gen = torch.Generator().manual_seed(19)
    q, k, v = (torch.randn(2, 19, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    result = {"o_ref": reference(q, k, v, is_causal=True)[0].tolist()}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        try:
            o = FlashAttention2Triton.apply(q.to(dtype), k.to(dtype), v.to(dtype), True)
            result[name] = o.double().tolist()
        except Exception as error:
            result[name] = f"{type(error).__name__}: {error}"
    print(json.dumps(result))
""")


@pytest.fixture(scope="module")
def user_run() -> dict:
    done = subprocess.run(
        [sys.executable, "-c", USER_SCRIPT],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("dtype, bound", [("float32", 1e-5), ("float16", 3e-3)])
def test_interpreter_runs_the_kernels_without_any_shim(user_run, dtype, bound):
    got = user_run[dtype]
    assert not isinstance(got, str), got
    assert_relative_error(
        torch.tensor(got), torch.tensor(user_run["o_ref"]), bound=bound, floor=0.1, name="o"
    )


def test_interpreter_refuses_bfloat16_by_name(user_run):
    message = user_run["bfloat16"]
    assert message.startswith("ValueError:") and "q has dtype torch.bfloat16" in message, message
    assert "TRITON_INTERPRET=1" in message and "float16, float32" in message


def test_interpreter_reason_names_the_dtype():
    assert interpreter_reason(torch.zeros(2, 3, 16, dtype=torch.float16)) is None
    reason = interpreter_reason(torch.zeros(2, 3, 16, dtype=torch.float64))
    assert "torch.float64, which Triton's interpreter" in reason and "float16, float32" in reason
