"""The sm90 ablation's table on the CPU: forward+backward sums for whole implementations only, and each
row's ratios to cuDNN and to the portable kernels of its own (length, causal, pass)."""

import argparse

import pytest
from flashattn_bench.sm90 import BACKWARD_STEPS, REFERENCES, _with_ratios, parse_args


def test_ratios_and_sums():
    args = argparse.Namespace(batch=1, heads=2, head_dim=64)
    ms = {"sdpa-cudnn": 2.0, "sdpa-flash": 3.0, "portable": 4.0, "sm90": 1.6, "gluon-default": 1.0}
    rows = [{"seq": 256, "causal": True, "pass": p, "step": step, "ms": t * (2.5 if p == "bwd" else 1),
             "tflops": 0.0, "err_vs_cudnn": 0.0} for step, t in ms.items() for p in ("fwd", "bwd")
            if not (step == "gluon-default" and p == "bwd")]  # fmt: skip
    table = _with_ratios(rows, args).set_index(["step", "pass"])
    assert set(table.xs("fwd+bwd", level="pass").index) == set(REFERENCES)
    assert table.loc[("sm90", "fwd+bwd"), "ms"] == pytest.approx(1.6 * 3.5)
    assert table.loc[("sm90", "fwd+bwd"), "vs_sdpa-cudnn"] == pytest.approx(2.0 / 1.6)
    assert table.loc[("gluon-default", "fwd"), "vs_portable"] == pytest.approx(4.0)


def test_arguments_name_only_existing_steps():
    args = parse_args([])
    assert args.gluon_bwd_steps == list(BACKWARD_STEPS) and "default" in args.gluon_steps
    with pytest.raises(SystemExit):
        parse_args(["--gluon-steps", "pingpong"])
