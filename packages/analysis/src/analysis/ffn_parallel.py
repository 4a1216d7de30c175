"""Parallelism costs of one FFN layer, counted from its list of matmuls and collectives per strategy.

Layer (as the question states it): ``X1 = X W1``, ``X2 = X W2``, ``Z = f(X1) * X2``, ``Y = Z W3`` with
``X`` of shape ``(B, D)`` (``B`` tokens of the global batch), ``W1, W2`` of shape ``(D, F)`` and ``W3`` of
shape ``(F, D)`` (``F`` is ``D_FF``). Weights, activations and gradients are fp16 (2 bytes); an
``(a, b) @ (b, c)`` matmul costs ``2abc``; a device does ``C`` FLOP/s and sends ``W`` bytes/s; non-matmul
work is ignored. Collective times come from :mod:`analysis.collectives` (ring algorithms).

Every strategy lists, **per device**, the matmuls and collectives of its forward and of its backward pass
(backward: ``dZ = dY W3^T``, ``dW3 = Z^T dY``, ``dX1 = dZ * X2 * f'(X1)``, ``dX2 = dZ * f(X1)``,
``dW1 = X^T dX1``, ``dW2 = X^T dX2``, ``dX = dX1 W1^T + dX2 W2^T``). FLOPs are the sum over the matmuls, the
communication time the sum over the collectives of each parallel axis; a pass is communication-bound when that
time exceeds its compute time (communication assumed to overlap compute). Bounds on the device counts are
solved with sympy from ``communication = compute``, exactly and with the large-``N`` ring cost
(``(N - 1) / N -> 1``). For two axes, their collectives either run at the same time on separate links
(``overlap=True``: the slower axis counts) or share each device's link (their times add).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import sympy as sp

from .collectives import N as RING_N
from .collectives import S as RING_S
from .collectives import ring_time

B, D, F, C = sp.symbols("B D F C", positive=True)
N_DP, N_FSDP, N_TP = sp.symbols("N_DP N_FSDP N_TP", positive=True)
DTYPE_BYTES = 2
PASSES = ("forward", "backward")


@dataclass(frozen=True)
class Matmul:
    """``(rows, inner) @ (inner, cols)`` on one device; ``equation`` is its LaTeX."""

    equation: str
    rows: sp.Expr
    inner: sp.Expr
    cols: sp.Expr

    def flops(self) -> sp.Expr:
        return 2 * self.rows * self.inner * self.cols


@dataclass(frozen=True)
class Collective:
    """A ring collective ``kind`` of ``size_bytes`` (its :mod:`analysis.collectives` ``S``) over ``group``."""

    equation: str
    kind: str
    size_bytes: sp.Expr
    group: sp.Symbol

    def time(self, large_n: bool = False) -> sp.Expr:
        return _collective_time(self.kind, self.size_bytes, self.group, large_n)


@cache
def _collective_time(kind: str, size_bytes: sp.Expr, group: sp.Symbol, large_n: bool) -> sp.Expr:
    exact = ring_time(kind).subs({RING_S: size_bytes, RING_N: group})
    return sp.limit(exact, group, sp.oo) if large_n else sp.simplify(exact)


Op = Matmul | Collective


@dataclass(frozen=True)
class Strategy:
    name: str
    axes: tuple[sp.Symbol, ...]
    forward: tuple[Op, ...]
    backward: tuple[Op, ...]

    def ops(self, pass_: str) -> tuple[Op, ...]:
        if pass_ not in PASSES:
            raise ValueError(f"pass_ must be 'forward' or 'backward', got {pass_!r}")
        return self.forward if pass_ == "forward" else self.backward

    def matmuls(self, pass_: str) -> list[Matmul]:
        return [op for op in self.ops(pass_) if isinstance(op, Matmul)]

    def collectives(self, pass_: str) -> list[Collective]:
        return [op for op in self.ops(pass_) if isinstance(op, Collective)]

    def flops(self, pass_: str) -> sp.Expr:
        """FLOPs per device: the sum of ``2abc`` over the pass's matmuls."""
        return sp.factor(sum((m.flops() for m in self.matmuls(pass_)), sp.Integer(0)))

    def compute_time(self, pass_: str) -> sp.Expr:
        return self.flops(pass_) / C

    def axis_comm_time(self, pass_: str, axis: sp.Symbol, large_n: bool = False) -> sp.Expr:
        """Seconds of the collectives over ``axis`` in one pass."""
        times = [c.time(large_n) for c in self.collectives(pass_) if c.group == axis]
        return sp.factor(sp.simplify(sum(times, sp.Integer(0))))

    def comm_time(self, pass_: str, large_n: bool = False, overlap: bool = True) -> sp.Expr:
        """Communication seconds of a pass: the slowest axis if axes overlap, else their sum."""
        per_axis = [self.axis_comm_time(pass_, axis, large_n) for axis in self.axes]
        if not per_axis:
            return sp.Integer(0)
        return sp.Max(*per_axis) if overlap else sp.factor(sum(per_axis, sp.Integer(0)))


def ffn_ops(tokens: sp.Expr, width: sp.Expr) -> tuple[list[Matmul], list[Matmul]]:
    """Forward and backward matmuls of a device holding ``tokens`` rows of X, ``width`` columns of W1, W2."""
    forward = [
        Matmul(r"X_1 = X W_1", tokens, D, width),
        Matmul(r"X_2 = X W_2", tokens, D, width),
        Matmul(r"Y = Z W_3", tokens, width, D),
    ]
    backward = [
        Matmul(r"\mathrm{d}Z = \mathrm{d}Y\, W_3^\top", tokens, D, width),
        Matmul(r"\mathrm{d}W_3 = Z^\top \mathrm{d}Y", width, tokens, D),
        Matmul(r"\mathrm{d}W_1 = X^\top \mathrm{d}X_1", D, tokens, width),
        Matmul(r"\mathrm{d}W_2 = X^\top \mathrm{d}X_2", D, tokens, width),
        Matmul(r"\mathrm{d}X \mathrel{+}= \mathrm{d}X_1 W_1^\top", tokens, width, D),
        Matmul(r"\mathrm{d}X \mathrel{+}= \mathrm{d}X_2 W_2^\top", tokens, width, D),
    ]
    return forward, backward


def _weights(kind: str, size: sp.Expr, group: sp.Symbol, what: str) -> list[Collective]:
    return [Collective(rf"\text{{{what}}}({name})", kind, size, group) for name in ("W_1", "W_2", "W_3")]


def single_device() -> Strategy:
    forward, backward = ffn_ops(B, F)
    return Strategy("single device", (), tuple(forward), tuple(backward))


def data_parallel() -> Strategy:
    """Batch split over ``N_DP``; gradients all-reduced after backward."""
    forward, backward = ffn_ops(B / N_DP, F)
    grads = _weights("all_reduce", DTYPE_BYTES * D * F, N_DP, "all-reduce d")
    return Strategy("DP", (N_DP,), tuple(forward), tuple(backward + grads))


def fsdp() -> Strategy:
    """Batch and weights split over ``N_FSDP``: gather weights before each pass, reduce-scatter gradients."""
    forward, backward = ffn_ops(B / N_FSDP, F)
    gather = _weights("all_gather", DTYPE_BYTES * D * F, N_FSDP, "all-gather ")
    scatter = _weights("reduce_scatter", DTYPE_BYTES * D * F, N_FSDP, "reduce-scatter d")
    return Strategy("FSDP", (N_FSDP,), tuple(gather + forward), tuple(gather + backward + scatter))


def _tp_all_reduce(name: str, tokens: sp.Expr) -> Collective:
    return Collective(
        rf"{name} = \textstyle\sum_i {name}^{{(i)}}\ \text{{(all-reduce)}}",
        "all_reduce",
        DTYPE_BYTES * tokens * D,
        N_TP,
    )


def tensor_parallel() -> Strategy:
    """W1, W2 column shards ``(D, F/N_TP)``, W3 row shards ``(F/N_TP, D)``; all-reduce Y, then dX."""
    forward, backward = ffn_ops(B, F / N_TP)
    return Strategy(
        "TP",
        (N_TP,),
        tuple([*forward, _tp_all_reduce("Y", B)]),
        tuple([*backward, _tp_all_reduce(r"\mathrm{d}X", B)]),
    )


def fsdp_tp() -> Strategy:
    """``N_FSDP x N_TP`` grid: TP shards of the weights further sharded (and the batch split) over FSDP."""
    tokens = B / N_FSDP
    forward, backward = ffn_ops(tokens, F / N_TP)
    shard_bytes = DTYPE_BYTES * D * F / N_TP
    gather = _weights("all_gather", shard_bytes, N_FSDP, "all-gather ")
    scatter = _weights("reduce_scatter", shard_bytes, N_FSDP, "reduce-scatter d")
    return Strategy(
        "FSDP x TP",
        (N_FSDP, N_TP),
        tuple([*gather, *forward, _tp_all_reduce("Y", tokens)]),
        tuple([*gather, *backward, _tp_all_reduce(r"\mathrm{d}X", tokens), *scatter]),
    )


STRATEGIES = {
    "single": single_device,
    "dp": data_parallel,
    "fsdp": fsdp,
    "tp": tensor_parallel,
    "fsdp_tp": fsdp_tp,
}


def _positive_root(equation: sp.Expr, symbol: sp.Symbol) -> sp.Expr:
    roots = [sp.simplify(r) for r in sp.solve(equation, symbol)]
    positive = [r for r in roots if r.is_positive is not False]
    if len(positive) != 1:
        raise ValueError(f"expected one positive solution for {symbol}, got {roots}")
    return positive[0]


def max_devices(strategy: Strategy, pass_: str, axis: sp.Symbol, large_n: bool = False) -> sp.Expr:
    """Largest size of ``axis`` before the ``axis`` collectives of ``pass_`` outlast its compute.

    ``oo`` when the pass has no collective over ``axis`` (e.g. the DP forward).
    """
    if axis not in strategy.axes:
        raise ValueError(f"axis {axis} is not an axis of {strategy.name} (axes {strategy.axes})")
    comm = strategy.axis_comm_time(pass_, axis, large_n)
    if comm == 0:
        return sp.oo
    equation = comm - strategy.compute_time(pass_)
    return sp.expand(_positive_root(sp.together(equation), axis))


def max_devices_2d(pass_: str = "forward", overlap: bool = True, large_n: bool = False) -> dict[str, sp.Expr]:
    """Best ``N_FSDP``, ``N_TP``, ``N = N_FSDP N_TP`` of FSDP x TP before ``pass_`` is communication-bound.

    ``overlap``: each axis must hide behind compute on its own; otherwise the two axes' times add and the
    product ``N_FSDP N_TP`` is maximized along ``communication = compute`` (a Lagrange condition).
    """
    strategy = fsdp_tp()
    if overlap:
        n_fsdp = max_devices(strategy, pass_, N_FSDP, large_n)
        n_tp = max_devices(strategy, pass_, N_TP, large_n)
    else:
        budget = strategy.comm_time(pass_, large_n, overlap=False) - strategy.compute_time(pass_)
        tp_of_fsdp = _positive_root(sp.together(budget), N_TP)
        n_fsdp = _positive_root(sp.together(sp.diff(N_FSDP * tp_of_fsdp, N_FSDP)), N_FSDP)
        n_tp = sp.simplify(tp_of_fsdp.subs(N_FSDP, n_fsdp))
    return {"N_FSDP": n_fsdp, "N_TP": n_tp, "N": sp.factor(sp.simplify(n_fsdp * n_tp))}


def whole_grid(
    values: dict[sp.Symbol, float], pass_: str = "forward", overlap: bool = True
) -> tuple[int, int]:
    """Whole degrees ``(N_FSDP, N_TP)`` of FSDP x TP with the largest product that keeps ``pass_`` hidden
    behind compute, at the numbers ``values`` (``B, D, F, C, W``).

    With overlapping axes each degree is the floor of its own bound; with a shared link the pair is searched
    (the budget is increasing in both degrees), which is not the floor of the continuous optimum.
    """
    strategy, axes = fsdp_tp(), (N_FSDP, N_TP)
    if overlap:
        n_fsdp, n_tp = (max(1, int(sp.floor(max_devices(strategy, pass_, a).subs(values)))) for a in axes)
        return n_fsdp, n_tp
    excess = strategy.comm_time(pass_, False, overlap=False) - strategy.compute_time(pass_)
    excess = sp.lambdify((N_FSDP, N_TP), excess.subs(values))
    best, n_fsdp = (1, 1), 1
    while excess(n_fsdp, 1) <= 0:
        n_tp = 1
        while excess(n_fsdp, n_tp + 1) <= 0:
            n_tp += 1
        if n_fsdp * n_tp > best[0] * best[1]:
            best = (n_fsdp, n_tp)
        n_fsdp += 1
    return best
