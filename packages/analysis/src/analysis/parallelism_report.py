"""The parallelism sections of the analysis report (``python -m analysis.report``): ring collectives and
their simulator check, the FFN layer's parallelism costs and bounds, the tensor-parallel backward checked
against autograd, and how many H200s each strategy can use. Each function returns Markdown; the model
configurations come from the caller (``models``: preset name -> config, as in
:mod:`analysis.accounting_report`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import sympy as sp
import torch
from torch.utils.flop_counter import FlopCounterMode

from . import collectives as coll
from .collectives import W
from .ffn_parallel import (
    N_DP,
    N_FSDP,
    N_TP,
    PASSES,
    STRATEGIES,
    B,
    C,
    D,
    F,
    max_devices,
    max_devices_2d,
    whole_grid,
)
from .markdown import latex, math_cell, md_table
from .ring_sim import simulate
from .tp_check import max_errors, tp_shard_backward, tp_shard_forward

NVLINK_PER_DIRECTION = 450e9
"""Nominal NVLink bandwidth of one H200, per direction, bytes/s."""


def collectives_section(max_n: int) -> str:
    lines = ["## Ring collectives", ""]
    lines.append(
        "Model: N devices in a ring, each sending to the next over its own link of W bytes/s, in lock-step "
        "rounds; a round in which each device sends m bytes costs m / W. For each algorithm we state what a "
        "device holds after k rounds, solve for the number of rounds, and sum the round costs "
        "(`analysis.collectives`)."
    )
    lines.append("")
    rows = []
    for kind in coll.KINDS:
        phases = coll.PHASES[kind]
        rows.append(
            [
                kind.replace("_", " "),
                "; then ".join(p.explanation for p in phases),
                math_cell(phases[0].message_bytes),
                math_cell(coll.ring_rounds(kind)),
                math_cell(coll.ring_time(kind)),
            ]
        )
    lines.append(md_table(["collective", "steps", "bytes per round", "rounds", "time"], rows))
    alt, ring = coll.ring_time("alternate_all_reduce"), coll.ring_time("all_reduce")
    lines += [
        "",
        f"**Alternate ring all-reduce.** Its time is ${latex(alt)}$, against ${latex(ring)}$ for "
        f"reduce-scatter + all-gather: the ratio is ${latex(sp.simplify(alt / ring))}$. It is slower for "
        f"N > 2 because every round sends a whole vector of S bytes, so each device sends (N - 1) S "
        f"bytes, while the standard ring sends only pieces of S/N and each device sends 2 (N - 1) S / N "
        f"bytes in total, the minimum for all-reduce on a ring. Both agree at N = 2.",
        "",
        f"**Simulator check** (`analysis.ring_sim`): each algorithm run on random float64 arrays for N = "
        f"2 ... {max_n}, W = 1 GB/s, S = 8 000 N bytes (1 000 N elements) per input vector (all-gather: 1 "
        f"000 elements per piece). The event simulator computes each message from what the device holds, "
        f"so a wrong schedule gives a wrong sum. Time is the simulated makespan.",
        "",
    ]
    lines.append(md_table(*simulation_table(max_n)))
    return "\n".join(lines)


def simulation_table(max_n: int, piece: int = 1000, bandwidth: float = 1e9) -> tuple[list[str], list[list]]:
    """One row per N: simulated / formula time per algorithm and the largest result error."""
    rng = np.random.default_rng(0)
    rows = []
    for n in range(2, max_n + 1):
        vectors = [rng.standard_normal(n * piece) for _ in range(n)]
        total = np.sum(vectors, axis=0)
        row: list = [n]
        worst_error = 0.0
        for kind in coll.KINDS:
            inputs = [v[:piece] for v in vectors] if kind == "all_gather" else vectors
            result = simulate(kind, inputs, bandwidth)
            if kind == "all_gather":
                expected = [np.concatenate(inputs)] * n
            elif kind == "reduce_scatter":
                expected = np.array_split(total, n)
            else:
                expected = [total] * n
            worst_error = max(
                worst_error, *(np.abs(o - e).max() for o, e in zip(result.outputs, expected, strict=True))
            )
            formula = coll.collective_time(kind, n * piece * 8, n, bandwidth)
            row.append(f"{result.seconds * 1e3:.3f} / {formula * 1e3:.3f}")
        row.append(f"{worst_error:.1e}")
        rows.append(row)
    headers = ["N", *(f"{k.replace('_', ' ')} ms (sim / formula)" for k in coll.KINDS), "max abs error"]
    return headers, rows


def _ops_latex(ops) -> str:
    return ";\\quad ".join(op.equation for op in ops)


def strategy_section() -> str:
    lines = [
        "## Parallelism costs of the FFN layer",
        "",
        "Setting (as the question states it): $X$ is $(B, D)$ with B the tokens of the global batch, "
        "$W_1, W_2$ are $(D, D_{FF})$, $W_3$ is $(D_{FF}, D)$, fp16 (2 bytes), a matmul $(a,b)(b,c)$ costs "
        "$2abc$ FLOPs, "
        "a device does C FLOP/s and sends W bytes/s. `analysis.ffn_parallel` writes each strategy as the "
        "list of matmuls and collectives one device runs; FLOPs are summed from the matmuls, "
        "communication time from the ring formulas above. A pass stops scaling when its communication "
        "time exceeds its compute time (the largest N is where they are equal; communication assumed to "
        "overlap with compute). The large-N form replaces the ring factor (N - 1) / N by 1.",
        "",
    ]
    axes = {"dp": [N_DP], "fsdp": [N_FSDP], "tp": [N_TP], "fsdp_tp": [N_FSDP, N_TP]}
    for key in ("single", "dp", "fsdp", "tp"):
        strategy = STRATEGIES[key]()
        lines += [f"### {strategy.name}", ""]
        for pass_ in PASSES:
            lines.append(f"- {pass_}: $" + _ops_latex(strategy.ops(pass_)) + "$")
        rows = []
        for pass_ in PASSES:
            row = [pass_, math_cell(strategy.flops(pass_))]
            row.append(math_cell(strategy.comm_time(pass_)) if strategy.axes else "0")
            for axis in axes.get(key, []):
                exact = max_devices(strategy, pass_, axis)
                approx = max_devices(strategy, pass_, axis, large_n=True)
                row.append(math_cell(sp.Le(axis, exact)) if exact != sp.oo else "no limit")
                row.append(math_cell(sp.Le(axis, approx)) if approx != sp.oo else "no limit")
            rows.append(row)
        headers = ["pass", "FLOPs per device", "communication time"]
        if axes.get(key):
            headers += ["bound (exact)", "bound (large N)"]
        lines += ["", md_table(headers, rows), ""]
    lines.append(strategy_prose())
    lines.append(two_d_section())
    return "\n".join(lines)


def strategy_prose() -> str:
    fsdp_bounds = {p: max_devices(STRATEGIES["fsdp"](), p, N_FSDP) for p in PASSES}
    same = sp.simplify(fsdp_bounds["forward"] - fsdp_bounds["backward"]) == 0
    return "\n".join(
        [
            "**Reading the bounds.** Data parallelism moves $2 \\cdot 3 D D_{FF}$ bytes of gradients per "
            "step whatever N is, while each device's compute shrinks as B / N: it stays compute-bound "
            "while every device gets more than $C / W$ tokens per step (more precisely $B / (N - 1) \\ge "
            "C / W$). FSDP moves the weights in both passes (all-gather forward; all-gather and "
            "reduce-scatter backward) in the same proportion to the FLOPs, so its forward and backward "
            "bounds are "
            + (
                f"the same, $N_{{FSDP}} \\le {latex(fsdp_bounds['forward'])}$, as for DP. "
                if same
                else "different. "
            )
            + "Tensor parallelism moves "
            "activations instead ($(B, D)$ all-reduced once per pass) while its FLOPs per device fall as "
            "1 / N_TP; its bound depends on $D_{FF} W / C$ only, not on the batch: the backward, with twice "
            "the FLOPs and the same single all-reduce, tolerates twice the degree.",
            "",
        ]
    )


def two_d_section() -> str:
    strategy = STRATEGIES["fsdp_tp"]()
    lines = [
        "### FSDP x TP",
        "",
        f"- forward: ${_ops_latex(strategy.ops('forward'))}$",
        f"- backward: ${_ops_latex(strategy.ops('backward'))}$",
        "",
        f"Forward FLOPs per device: ${latex(strategy.flops('forward'))}$. Forward communication when the two "
        f"axes overlap (separate links): ${latex(strategy.comm_time('forward'))}$; when they share each "
        f"device's link: ${latex(strategy.comm_time('forward', overlap=False))}$.",
        "",
    ]
    rows = []
    for overlap in (True, False):
        for large_n in (False, True):
            best = max_devices_2d("forward", overlap=overlap, large_n=large_n)
            rows.append(
                [
                    "overlapping" if overlap else "shared network",
                    "large N" if large_n else "exact",
                    math_cell(best["N_FSDP"]),
                    math_cell(best["N_TP"]),
                    math_cell(best["N"]),
                ]
            )
    lines.append(md_table(["axes", "form", "N_FSDP", "N_TP", "largest N = N_FSDP N_TP"], rows))
    lines += [
        "",
        "With overlapping axes each axis has its own bound and the best split takes both at their maximum. "
        "When the axes share the link the constraint $T_{FSDP} + T_{TP} \\le T_{compute}$ is linear in "
        "$(N_{FSDP}, N_{TP})$ after multiplying by $N_{FSDP} N_{TP}$, and the product is largest where both "
        "terms use half of the budget: each degree is half its overlapping value and N is four times smaller "
        "(large N).",
        "",
    ]
    return "\n".join(lines)


def tp_check_section() -> str:
    lines = [
        "## Tensor-parallel backward, checked",
        "",
        "With $W_1, W_2$ split by columns and $W_3$ by rows over $N_{TP}$ shards (block $i$), shard i holds "
        "the full $X$ and $\\mathrm{d}Y$ (Y was all-reduced in forward) and computes",
        "",
        "$$\\mathrm{d}Z_i = \\mathrm{d}Y\\, W_{3,i}^\\top,\\quad \\mathrm{d}W_{3,i} = Z_i^\\top "
        "\\mathrm{d}Y,\\quad \\mathrm{d}X_{2,i} = \\mathrm{d}Z_i \\odot f(X_{1,i}),\\quad "
        "\\mathrm{d}X_{1,i} = \\mathrm{d}Z_i \\odot X_{2,i} \\odot f'(X_{1,i}),$$",
        "$$\\mathrm{d}W_{1,i} = X^\\top \\mathrm{d}X_{1,i},\\quad \\mathrm{d}W_{2,i} = X^\\top "
        "\\mathrm{d}X_{2,i},\\quad \\mathrm{d}X = \\textstyle\\sum_i (\\mathrm{d}X_{1,i} W_{1,i}^\\top + "
        "\\mathrm{d}X_{2,i} W_{2,i}^\\top)\\ \\text{(all-reduce)}.$$",
        "",
        "The weight gradients need no communication: each shard owns its blocks. `analysis.tp_check` runs "
        "these equations shard by shard on real float64 tensors ($f$ = SiLU, shards from "
        "`torch.tensor_split`, so uneven) and compares with autograd on the unsharded layer; FLOPs of "
        "each shard are counted by `torch.utils.flop_counter` and compared with the TP matmul list "
        "($6BDD_{FF}/N$ forward, $12BDD_{FF}/N$ backward, evaluated at each shard's width).",
        "",
    ]
    rows = []
    strategy = STRATEGIES["tp"]()
    for batch, d_model, d_ff, shards in ((1, 5, 7, 3), (17, 13, 97, 4), (130, 31, 97, 7), (64, 48, 96, 1)):
        errors = max_errors(batch, d_model, d_ff, shards)
        counted, predicted = _shard_flops(batch, d_model, d_ff, shards, strategy)
        rows.append(
            [f"{batch} x {d_model} x {d_ff}", shards, f"{max(errors.values()):.1e}", counted, predicted]
        )
    headers = ["B x D x D_FF", "N_TP", "max abs error (y, dx, dW1-3)", "FLOPs counted", "FLOPs from list"]
    lines.append(md_table(headers, rows))
    return "\n".join(lines) + "\n"


def _shard_flops(batch: int, d_model: int, d_ff: int, shards: int, strategy) -> tuple[int, int]:
    """Total shard FLOPs counted by torch, and the same from the TP matmul list at each shard's width."""
    gen = torch.Generator().manual_seed(1)
    x, dy = torch.randn(batch, d_model, generator=gen), torch.randn(batch, d_model, generator=gen)
    counted, predicted = 0, 0
    for width in (len(block) for block in torch.arange(d_ff).tensor_split(shards)):
        w1, w2 = torch.randn(d_model, width), torch.randn(d_model, width)
        w3 = torch.randn(width, d_model)
        with FlopCounterMode(display=False) as counter:
            _, saved = tp_shard_forward(x, w1, w2, w3)
            tp_shard_backward(x, w1, w2, w3, saved, dy)
        counted += counter.get_total_flops()
        values = {B: batch, D: d_model, F: width * shards, N_TP: shards}
        predicted += int(sum(strategy.flops(p).subs(values) for p in PASSES))
    return counted, predicted


GRID_LABELS = ("FSDP x TP forward, overlapping", "FSDP x TP forward, shared link")
"""The two-axis rows of the H200 table, whose GPU counts are whole grids (``whole_grid``)."""


def h200_section(
    matmul_flops: float, bandwidth: float, source: str, c_note: str, models: Mapping[str, Any]
) -> str:
    """The bounds for ``models["leaderboard-8b"]`` and ``models["xl"]`` at their default batch;
    ``c_note``: the sentences after ``C = ... TFLOP/s`` saying where C comes from."""
    values = {C: matmul_flops, W: bandwidth}
    lines = [
        "## How many H200s make sense",
        "",
        f"C = {matmul_flops / 1e12:.0f} TFLOP/s {c_note} W = {bandwidth / 1e9:.0f} GB/s, from {source}. "
        f"The ring model's W is exactly the bus bandwidth nccl-tests report. (NVLink's nominal "
        f"{NVLINK_PER_DIRECTION / 1e9:.0f} GB/s per direction would give W/C larger by "
        f"{NVLINK_PER_DIRECTION / bandwidth:.2f}x.) C / W = {matmul_flops / bandwidth:.0f} FLOPs per "
        f"byte: a device must do that much work for every byte it sends.",
        "",
        "GPUs: the largest whole number of devices. For the 2-D grid that is the best product of whole "
        "degrees: both at their floors when the axes overlap, and the best pair within the shared-link "
        "budget $2B(N_{TP} - 1) + 3D_{FF}(N_{FSDP} - 1) \\le 3 B D_{FF} W / C$ when they share it, not the "
        "floor of the continuous product.",
        "",
    ]
    rows, limits, grids, bounds = [], {}, {}, h200_bounds()
    for name in ("leaderboard-8b", "xl"):
        shape = models[name]
        tokens = shape.batch_size * shape.context_length
        model = {B: tokens, D: shape.d_model, F: shape.d_ff, **values}
        for label, bound in bounds.items():
            limits[name, label] = value = float(bound.subs(model))
            gpus = str(math.floor(value))
            if label in GRID_LABELS:
                overlap = label == GRID_LABELS[0]
                grids[name, label] = n_fsdp, n_tp = whole_grid(model, "forward", overlap)
                note = ""
                if not overlap and max_devices_2d("forward", False)["N_FSDP"].subs(model) < 1:
                    note = "; the continuous optimum has N_FSDP < 1"
                gpus = f"{n_fsdp * n_tp} ({n_fsdp} x {n_tp}{note})"
            rows.append([name, f"{tokens:,}", shape.d_model, shape.d_ff, label, f"{value:.2f}", gpus])
    lines.append(md_table(["model", "B (tokens)", "D", "D_FF", "strategy", "largest N", "GPUs"], rows))
    lines += ["", h200_prose(matmul_flops / bandwidth, limits, grids, models["leaderboard-8b"]), ""]
    return "\n".join(lines)


def h200_bounds() -> dict[str, sp.Expr]:
    """The bounds evaluated for our GPUs, by label."""
    return {
        "DP (backward)": max_devices(STRATEGIES["dp"](), "backward", N_DP),
        "FSDP (forward = backward)": max_devices(STRATEGIES["fsdp"](), "forward", N_FSDP),
        "TP forward": max_devices(STRATEGIES["tp"](), "forward", N_TP),
        "TP backward": max_devices(STRATEGIES["tp"](), "backward", N_TP),
        GRID_LABELS[0]: max_devices_2d("forward", True)["N"],
        GRID_LABELS[1]: max_devices_2d("forward", False)["N"],
    }


def _gpus(value: float) -> str:
    return f"{value:.1f}, i.e. {math.floor(value)} GPU{'s' if math.floor(value) != 1 else ''}"


_FRACTIONS = {2: "a half", 3: "a third", 4: "a quarter", 5: "a fifth"}


def h200_prose(
    flops_per_byte: float,
    limits: dict[tuple[str, str], float],
    grids: dict[tuple[str, str], tuple[int, int]],
    big_model,
) -> str:
    big, xl = "leaderboard-8b", "xl"
    big_tokens = big_model.batch_size * big_model.context_length
    dp_big, dp_xl = limits[big, "DP (backward)"], limits[xl, "DP (backward)"]
    tp_fwd, tp_bwd = limits[big, "TP forward"], limits[big, "TP backward"]
    machine = 4
    fits = [name for name, key in (("DP", "DP (backward)"), ("FSDP", "FSDP (forward = backward)"),
                                   ("TP", "TP forward")) if limits[big, key] >= machine]  # fmt: skip
    xl_note = (
        "so even 2 GPUs leave the gradient all-reduce of the FFN longer than its backward (a larger batch "
        "per GPU fixes that)"
        if dp_xl < 2
        else f"so up to {math.floor(dp_xl)} GPUs pay off"
    )
    separate, shared = grids[big, GRID_LABELS[0]], grids[big, GRID_LABELS[1]]
    ratio = separate[0] * separate[1] / (shared[0] * shared[1])
    share = _FRACTIONS.get(round(ratio), f"1/{ratio:.1f}")
    return (
        f"**Answer.** DP and FSDP need about C / W = {flops_per_byte:.0f} tokens per GPU per step to hide "
        f"their communication (B / (N - 1) >= C / W). With the leaderboard step "
        f"({big_tokens:,} tokens) that allows {_gpus(dp_big)}; "
        f"with xl's default batch (4 x 512 tokens) it allows {dp_xl:.2f}, {xl_note}. TP does not depend on "
        f"the batch: with D_FF = {big_model.d_ff:,} the forward allows {_gpus(tp_fwd)} and the "
        f"backward {tp_bwd:.1f}, so TP belongs inside one NVLink domain (W across nodes is several times "
        f"smaller). The 2-D grid multiplies the two whole degrees when the axes use separate links "
        f"({separate[0]} x {separate[1]} = {separate[0] * separate[1]} GPUs for the 8B step) and reaches "
        f"about {share} of it when they share one ({shared[0] * shared[1]} = {shared[0]} x {shared[1]}; a "
        f"quarter in the large-N limit). On our machines of up to {machine} GPUs the "
        f"8B model can use all of them with {', '.join(fits) or 'none of the three'}. These limits are for "
        f"the FFN alone, in fp16, with communication hidden behind compute: attention adds compute (raising "
        f"the DP and FSDP limits slightly) and real overlap is imperfect."
    )
