import torch
from cs336_basics import build_model, naive_attention
from profiling.ranges import Ranges
from torch.profiler import ProfilerActivity, profile


def test_annotated_attention_equals_reference():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 8, dtype=torch.float64) for _ in range(3))
    ranges = Ranges()
    for causal in (False, True):
        got = ranges.attention(q, k, v, causal)
        torch.testing.assert_close(got, naive_attention(q, k, v, causal))
    q1 = torch.randn(1, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(ranges.attention(q1, k[0, :1], v[0, :1], True),
                               naive_attention(q1, k[0, :1], v[0, :1], True))


def _profiled_names(model, x, ranges):
    with profile(activities=[ProfilerActivity.CPU]) as prof, ranges.annotate("forward"):
        model(x)
    return {e.name for e in prof.events()}


def test_block_and_attention_ranges_reach_the_profiler(tiny):
    ranges, other = Ranges(), Ranges()
    model = build_model(tiny, attention_fn=ranges.attention)
    handles = ranges.annotate_blocks(model)
    x = torch.randint(0, tiny.vocab_size, (2, 11))
    names = _profiled_names(model, x, ranges)
    assert {"forward", "block[0]", "block[2]", "attention.scores", "attention.softmax",
            "attention.weighted_sum"} <= names
    other.enabled = False  # another workload's switch leaves these ranges alone
    assert {"forward", "block[0]", "attention.softmax"} <= _profiled_names(model, x, ranges)
    ranges.enabled = False
    assert not {"forward", "block[0]", "attention.softmax"} & _profiled_names(model, x, ranges)
    ranges.enabled = True
    for h in handles:
        h.remove()
    assert "block[0]" not in _profiled_names(model, x, ranges)


def test_log_phases_records_phase_intervals_only():
    ranges = Ranges()
    with ranges.log_phases() as log:
        with ranges.annotate("forward"), ranges.annotate("attention.softmax"):
            pass
        with ranges.annotate("backward"):
            pass
    assert [name for name, _, _ in log] == ["forward", "backward"]
    assert all(start <= end for _, start, end in log)
