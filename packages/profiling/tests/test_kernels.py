from types import SimpleNamespace

import pytest
from profiling.kernel_attribution import (
    attribute_kernels,
    is_matmul,
    profile_config,
    range_family,
    summarize_ranges,
)
from torch.autograd import DeviceType


def _event(name, start, end, device_type=DeviceType.CPU, id=0, annotation=False, kernels=()):
    return SimpleNamespace(name=name, time_range=SimpleNamespace(start=start, end=end), cpu_children=[],
                           self_cpu_time_total=0.0, device_type=device_type, id=id,
                           is_user_annotation=annotation, kernels=list(kernels))


def _launch(op, start, kernel, duration_us, correlation, count=1):
    """An operator starting at ``start`` that launches ``count`` kernels; each kernel runs later on the GPU
    and is paired with its ``cudaLaunchKernel`` call by the correlation id. The operator also lists its
    kernels (twice), as the profiler may: those lists must be ignored."""
    events = [_event(op, start, start + 1, kernels=[SimpleNamespace(name=kernel, duration=duration_us)] * 2)]
    for i in range(count):
        cid = correlation + i
        events.append(_event("cudaLaunchKernel", start + 0.1, start + 0.2, id=cid))
        events.append(_event(kernel, start + 500, start + 500 + duration_us, DeviceType.CUDA, id=cid))
    return events


def test_kernels_go_to_every_enclosing_range_per_step():
    steps = 2
    events = []
    for s in range(steps):
        t, c = 1000 * s, 100 * s
        events += [
            _event("forward", t, t + 100),
            _event("block[0]", t + 10, t + 50),
            _event("attention.softmax", t + 20, t + 30),
            # the same range as drawn on the GPU timeline: late, and must not capture later launches
            _event("attention.softmax", t + 35, t + 65, DeviceType.CUDA, annotation=True),
            *_launch("aten::softmax", t + 21, "softmax_kernel", 4.0, c + 1),
            *_launch("aten::mm", t + 40, "sm90_xmma_gemm_f32", 10.0, c + 2),
            *_launch("aten::mm", t + 60, "nvjet_tst_128x64", 6.0, c + 3),
            _event("backward", t + 200, t + 400),
            *_launch("aten::mm", t + 250, "sm90_xmma_gemm_f32", 20.0, c + 4, count=2),
            *_launch("aten::copy_", t + 500, "copy_kernel", 1.0, c + 6),
            # a GPU activity whose launch call is missing from the profile: counted, outside every range
            _event("Memset (Device)", t + 30, t + 32, DeviceType.CUDA, id=c + 50),
        ]
    df = attribute_kernels(events, steps)
    get = {(r.range, r.kernel): r for r in df.itertuples()}
    assert get[("forward", "sm90_xmma_gemm_f32")].ms_per_step == pytest.approx(0.010)
    assert get[("forward", "softmax_kernel")].calls_per_step == 1
    assert get[("block", "sm90_xmma_gemm_f32")].calls_per_step == 1
    assert ("block", "nvjet_tst_128x64") not in get
    assert set(df.loc[df["range"] == "attention.softmax", "kernel"]) == {"softmax_kernel"}
    assert get[("backward", "sm90_xmma_gemm_f32")].calls_per_step == 2
    assert get[("(outside ranges)", "copy_kernel")].ms_per_step == pytest.approx(0.001)
    assert get[("(outside ranges)", "Memset (Device)")].calls_per_step == 1
    summary = summarize_ranges(df).set_index("range")
    assert summary.loc["forward", "gpu_ms_per_step"] == pytest.approx(0.020)
    assert summary.loc["forward", "top_kernel"] == "sm90_xmma_gemm_f32"
    assert summary.loc["forward", "matmul_share_pct"] == pytest.approx(80.0)
    assert summary.loc["forward", "top_share_pct"] == pytest.approx(50.0)


def test_names():
    assert range_family("block[17]") == "block" and range_family("forward") == "forward"
    assert is_matmul("sm90_xmma_gemm_bf16bf16_bf16f32") and is_matmul("nvjet_hsh_256x128")
    assert not is_matmul("void at::native::vectorized_elementwise_kernel<4, softmax>")


def test_cpu_profile_has_every_range(tiny):
    kernels, summary = profile_config("tiny", 19, "train", "fp32", steps=1, warmup=1, device="cpu")
    assert {"forward", "backward", "optimizer_step", "block", "attention.scores", "attention.softmax",
            "attention.weighted_sum"} <= set(summary["range"])
    assert (summary["python_timer_step_ms"] > 0).all()
    assert kernels.groupby("range")["share_pct"].sum().round(6).eq(100).all()
