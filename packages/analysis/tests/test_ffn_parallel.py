"""FFN parallelism: FLOPs against torch's FLOP counter, communication against the ring simulator, bounds."""

import numpy as np
import pytest
import sympy as sp
import torch
from analysis import ffn_parallel as fp
from analysis.collectives import W
from analysis.ring_sim import simulate
from torch.utils.flop_counter import FlopCounterMode

SIZES = {fp.B: 84, fp.D: 13, fp.F: 105}
DEGREES = {fp.N_DP: 3, fp.N_FSDP: 4, fp.N_TP: 7}


def _autograd_ffn_flops(tokens, d_model, width):
    """Forward and backward FLOPs of the FFN by torch's own counter on real autograd."""
    x = torch.randn(tokens, d_model, requires_grad=True)
    w1, w2 = torch.randn(d_model, width, requires_grad=True), torch.randn(d_model, width, requires_grad=True)
    w3 = torch.randn(width, d_model, requires_grad=True)
    with FlopCounterMode(display=False) as forward:
        y = (torch.nn.functional.silu(x @ w1) * (x @ w2)) @ w3
    with FlopCounterMode(display=False) as backward:
        y.sum().backward()
    return forward.get_total_flops(), backward.get_total_flops()


def _flops(strategy, pass_):
    return int(strategy.flops(pass_).subs({**SIZES, **DEGREES}))


@pytest.mark.parametrize("key", list(fp.STRATEGIES))
def test_flops_equal_autograd_per_device(key):
    strategy = fp.STRATEGIES[key]()
    tokens, width = SIZES[fp.B], SIZES[fp.F]
    if key in ("dp", "fsdp", "fsdp_tp"):
        tokens //= DEGREES[fp.N_DP if key == "dp" else fp.N_FSDP]
    if key in ("tp", "fsdp_tp"):
        width //= DEGREES[fp.N_TP]
    forward, backward = _autograd_ffn_flops(tokens, SIZES[fp.D], width)
    assert (_flops(strategy, "forward"), _flops(strategy, "backward")) == (forward, backward)


@pytest.mark.parametrize("key", list(fp.STRATEGIES))
def test_flops_equal_brute_force_over_the_matmul_list(key):
    strategy = fp.STRATEGIES[key]()
    values = {**SIZES, **DEGREES}
    devices = int(np.prod([values[a] for a in strategy.axes])) if strategy.axes else 1
    for pass_ in fp.PASSES:
        with FlopCounterMode(display=False) as counter:
            for m in strategy.matmuls(pass_):
                a, b, c = (int(e.subs(values)) for e in (m.rows, m.inner, m.cols))
                torch.randn(a, b) @ torch.randn(b, c)
        assert counter.get_total_flops() == _flops(strategy, pass_)
        # work is conserved: the devices together do what one device would
        assert devices * _flops(strategy, pass_) == _flops(fp.single_device(), pass_)


def _simulated_seconds(collectives, values, bandwidth):
    total = 0.0
    for c in collectives:
        n = int(c.group.subs(values))
        elements = int(c.size_bytes.subs(values)) // 2  # fp16
        if c.kind == "all_gather":
            inputs = [np.ones(elements // n, dtype=np.float16) for _ in range(n)]
        else:
            inputs = [np.ones(elements, dtype=np.float16) for _ in range(n)]
        total += simulate(c.kind, inputs, bandwidth).seconds
    return total


@pytest.mark.parametrize("key", ["dp", "fsdp", "tp", "fsdp_tp"])
@pytest.mark.parametrize("pass_", fp.PASSES)
def test_communication_time_equals_simulated_collectives(key, pass_):
    strategy = fp.STRATEGIES[key]()
    values = {**SIZES, fp.B: 84 * 4, **DEGREES}  # sizes divisible by every group: equal ring pieces
    values[fp.F] = 7 * 4 * 3
    bandwidth = 1.5e6
    formula = strategy.comm_time(pass_, overlap=False).subs({**values, W: bandwidth})
    simulated = _simulated_seconds(strategy.collectives(pass_), values, bandwidth)
    assert simulated == pytest.approx(float(formula), rel=1e-12)
    per_axis = [
        _simulated_seconds([c for c in strategy.collectives(pass_) if c.group == a], values, bandwidth)
        for a in strategy.axes
    ]
    overlapped = strategy.comm_time(pass_, overlap=True).subs({**values, W: bandwidth})
    assert max(per_axis) == pytest.approx(float(overlapped), rel=1e-12)


NUMBERS = [
    {fp.B: 65536, fp.D: 4096, fp.F: 11008, fp.C: 795e12, W: 324e9},
    {fp.B: 2048, fp.D: 2560, fp.F: 10240, fp.C: 795e12, W: 324e9},
    {fp.B: 977, fp.D: 131, fp.F: 517, fp.C: 1.3e9, W: 7.7e6},
]


def _ratio(strategy, pass_, axis, n, numbers):
    comm = strategy.axis_comm_time(pass_, axis).subs({**numbers, axis: n})
    return float(comm / strategy.compute_time(pass_).subs({**numbers, axis: n}))


@pytest.mark.parametrize("numbers", NUMBERS)
@pytest.mark.parametrize("key,axis", [("dp", fp.N_DP), ("fsdp", fp.N_FSDP), ("tp", fp.N_TP)])
def test_single_axis_bounds_separate_compute_and_communication_bound(numbers, key, axis):
    strategy = fp.STRATEGIES[key]()
    for pass_ in fp.PASSES:
        bound = fp.max_devices(strategy, pass_, axis)
        if bound == sp.oo:
            assert key == "dp" and pass_ == "forward"
            continue
        n_max = float(bound.subs(numbers))
        assert _ratio(strategy, pass_, axis, n_max, numbers) == pytest.approx(1.0)
        assert _ratio(strategy, pass_, axis, n_max * 1.01, numbers) > 1.0
        if n_max > 1.01:
            assert _ratio(strategy, pass_, axis, n_max / 1.01, numbers) < 1.0
        approx = float(fp.max_devices(strategy, pass_, axis, large_n=True).subs(numbers))
        assert approx == pytest.approx(n_max - 1)


@pytest.mark.parametrize("numbers", NUMBERS)
def test_two_d_optimum_beats_a_grid_search(numbers):
    strategy = fp.fsdp_tp()
    shared = fp.max_devices_2d("forward", overlap=False)
    best_f, best_t = (float(shared[k].subs(numbers)) for k in ("N_FSDP", "N_TP"))
    excess = strategy.comm_time("forward", overlap=False) - strategy.compute_time("forward")
    assert float(excess.subs({**numbers, fp.N_FSDP: best_f, fp.N_TP: best_t})) == pytest.approx(0.0, abs=1e-9)
    # along the constraint, N_TP as a function of N_FSDP: no grid point gives a larger product
    tp_of = sp.lambdify(fp.N_FSDP, sp.solve(excess.subs(numbers), fp.N_TP)[0])
    grid = np.linspace(best_f * 0.5, best_f * 1.5, 201)
    assert max(g * tp_of(g) for g in grid) <= best_f * best_t * (1 + 1e-12)
    overlap = fp.max_devices_2d("forward", overlap=True)
    assert float(overlap["N"].subs(numbers)) >= best_f * best_t
    large = fp.max_devices_2d("forward", overlap=False, large_n=True)
    assert sp.simplify(fp.max_devices_2d("forward", overlap=True, large_n=True)["N"] / large["N"]) == 4


@pytest.mark.parametrize("numbers", NUMBERS)
def test_whole_grid_is_the_best_pair_of_whole_degrees(numbers):
    # Brute force over every pair of whole degrees up to past the single-axis bounds: the exact times of
    # each pair decide, separately per axis (overlapping) or summed (shared link).
    strategy = fp.fsdp_tp()
    compute = strategy.compute_time("forward")
    per_axis = {a: strategy.axis_comm_time("forward", a) - compute for a in (fp.N_FSDP, fp.N_TP)}
    shared = strategy.comm_time("forward", overlap=False) - compute
    limit = {a: int(float(fp.max_devices(strategy, "forward", a).subs(numbers))) + 3 for a in per_axis}
    fits = {
        True: lambda f, t: all(
            float(e.subs({**numbers, fp.N_FSDP: f, fp.N_TP: t})) <= 0 for e in per_axis.values()
        ),
        False: lambda f, t: float(shared.subs({**numbers, fp.N_FSDP: f, fp.N_TP: t})) <= 0,
    }
    for overlap, fit in fits.items():
        pairs = [(f, t) for f in range(1, limit[fp.N_FSDP]) for t in range(1, limit[fp.N_TP]) if fit(f, t)]
        best = max(f * t for f, t in pairs)
        n_fsdp, n_tp = fp.whole_grid(numbers, "forward", overlap)
        assert fit(n_fsdp, n_tp) and n_fsdp * n_tp == best


def test_bad_arguments():
    with pytest.raises(ValueError, match="pass_"):
        fp.data_parallel().flops("sideways")
    with pytest.raises(ValueError, match="axis"):
        fp.max_devices(fp.data_parallel(), "backward", fp.N_TP)
