"""flashattn.aot on the CPU: the kernels the launchers launch compile for sm_89 and sm_80 and fit; --help."""

import subprocess
import sys
import time

import pytest
from flashattn import aot


@pytest.mark.parametrize("sm", [89, 80])
def test_bf16_d128_causal_kernels_compile_and_fit(sm: int) -> None:
    rows = aot.build_table([aot.Case(sm, "bf16", 128, "causal")])
    assert {r["kernel"] for r in rows} == {"forward", "delta", "dkdv", "dq"}
    for row in rows:
        assert row["fits"] and not row["error"], row
        assert 0 < row["shared_bytes"] <= row["limit_bytes"]
        if row["kernel"] != "delta":  # the tile rule's estimate bounds what Triton allocates
            assert row["shared_bytes"] <= row["estimate_bytes"], row
        assert 0 < row["registers"] <= 255 and row["spill_bytes"] >= 0


def test_launches_follow_the_launchers() -> None:
    # Split dK / dV at head dim 256; packed documents compile the VARLEN kernels; nothing is compiled here.
    found = aot.launches(89, 256, "bf16", "varlen")
    assert [launch.kernel for launch in found] == ["forward", "delta", "dk", "dv", "dq"]
    assert all(launch.named()["VARLEN"] for launch in found)
    assert found[0].named()["HEAD_DIM"] == 256 and found[0].signature["CU_Q"] == "*i32"


def test_help_is_quick_and_imports_no_torch() -> None:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", "import sys, runpy; sys.argv = ['aot', '--help']; "
         "runpy.run_module('flashattn.aot', run_name='__main__')"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and "--targets" in done.stdout and "--jobs" in done.stdout
    assert time.perf_counter() - start < 30
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, flashattn.aot; print('torch' in sys.modules)"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert probe.stdout.strip() == "False"


@pytest.mark.parametrize(("argv", "message"), [
    (["--targets", "85"], "--targets: 85 is not one of 80, 86, 89, 90, 100, 120"),
    (["--targets", "75"], "--targets: 75 is not one of"),
    (["--csv", "/no/such/folder/rows.csv"], "--csv /no/such/folder/rows.csv: cannot write into /no/such"),
])
def test_bad_arguments_are_refused_before_any_compile(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        aot.main([*argv, "--head-dims", "16", "--dtypes", "fp16", "--masks", "causal"])
    assert done.value.code == 2 and message in capsys.readouterr().err
