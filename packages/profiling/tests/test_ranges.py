import torch
from cs336_basics import build_model, naive_attention
from profiling import ranges
from torch.profiler import ProfilerActivity, profile


def test_annotated_attention_equals_reference():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 8, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        got = ranges.annotated_attention(q, k, v, causal)
        torch.testing.assert_close(got, naive_attention(q, k, v, causal))
    q1 = torch.randn(1, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(ranges.annotated_attention(q1, k[0, :1], v[0, :1], True),
                               naive_attention(q1, k[0, :1], v[0, :1], True))


def _profiled_names(model, x):
    with profile(activities=[ProfilerActivity.CPU]) as prof, ranges.annotate("forward"):
        model(x)
    return {e.name for e in prof.events()}


def test_block_and_attention_ranges_reach_the_profiler(tiny):
    model = build_model(tiny, attention_fn=ranges.annotated_attention)
    handles = ranges.annotate_blocks(model)
    x = torch.randint(0, tiny.vocab_size, (2, 11))
    names = _profiled_names(model, x)
    assert {"forward", "block[0]", "block[2]", "attention.scores", "attention.softmax",
            "attention.weighted_sum"} <= names
    ranges.set_enabled(False)
    try:
        assert not {"forward", "block[0]", "attention.softmax"} & _profiled_names(model, x)
    finally:
        ranges.set_enabled(True)
    for h in handles:
        h.remove()
    assert "block[0]" not in _profiled_names(model, x)


def test_log_phases_records_phase_intervals_only():
    with ranges.log_phases() as log:
        with ranges.annotate("forward"), ranges.annotate("attention.softmax"):
            pass
        with ranges.annotate("backward"):
            pass
    assert [name for name, _, _ in log] == ["forward", "backward"]
    assert all(start <= end for _, start, end in log)
