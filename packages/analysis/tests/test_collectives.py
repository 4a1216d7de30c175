"""Ring formulas (sympy) against the discrete-event simulator running the algorithms on real arrays."""

import numpy as np
import pytest
import sympy as sp
from analysis import collectives as coll
from analysis.ring_sim import simulate


def _expected(kind, inputs):
    if kind == "all_gather":
        return [np.concatenate(inputs)] * len(inputs)
    total = np.sum(inputs, axis=0)
    if kind == "reduce_scatter":
        return np.array_split(total, len(inputs))
    return [total] * len(inputs)


def _inputs(kind, n, length, rng):
    if kind == "all_gather":
        return [rng.standard_normal(length) for _ in range(n)]
    return [rng.standard_normal(n * length) for _ in range(n)]


@pytest.mark.parametrize("kind", coll.KINDS)
@pytest.mark.parametrize("n", range(2, 17))
def test_simulated_time_and_result_match_formula(kind, n):
    rng = np.random.default_rng(n)
    inputs = _inputs(kind, n, 7, rng)
    size = (n * 7) * 8  # S: gathered result, or each device's vector, in bytes
    bandwidth, latency = 3.0e4, 1e-4
    result = simulate(kind, inputs, bandwidth, latency)
    for got, want in zip(result.outputs, _expected(kind, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert result.seconds == pytest.approx(coll.collective_time(kind, size, n, bandwidth, latency), rel=1e-12)
    assert result.messages == n * int(coll.ring_rounds(kind).subs(coll.N, n))
    per_device = float(coll.bytes_sent_per_device(kind).subs({coll.S: size, coll.N: n}))
    assert result.bytes_sent == pytest.approx(n * per_device)


@pytest.mark.parametrize("kind", coll.KINDS)
@pytest.mark.parametrize("n,length", [(1, 5), (3, 1), (5, 97), (16, 130), (7, 17)])
def test_awkward_sizes_give_correct_results(kind, n, length):
    rng = np.random.default_rng(length)
    inputs = (
        [rng.standard_normal(length + i) for i in range(n)] if kind == "all_gather"
        else [rng.standard_normal(length) for _ in range(n)]
    )  # fmt: skip
    result = simulate(kind, inputs, 1e9)
    for got, want in zip(result.outputs, _expected(kind, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    if n == 1:
        assert result.seconds == 0.0


def test_derived_expressions():
    n, s, w = coll.N, coll.S, coll.W
    assert sp.simplify(coll.ring_time("all_gather") - (n - 1) / n * s / w) == 0
    assert sp.simplify(coll.ring_time("reduce_scatter") - (n - 1) / n * s / w) == 0
    assert sp.simplify(coll.ring_time("all_reduce") - 2 * coll.ring_time("all_gather")) == 0
    ratio = sp.simplify(coll.ring_time("alternate_all_reduce") / coll.ring_time("all_reduce"))
    assert ratio == n / 2


def test_bus_bandwidth_inverts_time():
    for kind in coll.KINDS:
        seconds = coll.collective_time(kind, 2**30, 4, 324e9)
        assert coll.bus_bandwidth(kind, 2**30, 4, seconds) == pytest.approx(324e9)


def test_bad_inputs():
    with pytest.raises(ValueError, match="kind"):
        coll.ring_time("broadcast")
    with pytest.raises(ValueError, match="world_size"):
        coll.collective_time("all_reduce", 10, 0, 1.0)
    with pytest.raises(ValueError, match="equal-shaped"):
        simulate("all_reduce", [np.ones(3), np.ones(4)], 1.0)
    with pytest.raises(ValueError, match="bandwidth"):
        simulate("all_gather", [np.ones(3)], 0.0)
