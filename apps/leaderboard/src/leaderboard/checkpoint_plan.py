"""Activation memory only where it pays: per block, keep, offload or recompute.

Each Transformer block is in one of four tiers:
- kept: its activations stay on the device for backward;
- ``offload``: its saved activations go to pinned host memory during forward and come back one offloaded
  block ahead of its backward (``offload.ActivationOffload``);
- ``ffn``: only its SwiGLU is recomputed (the SwiGLU's three ``(tokens, d_ff)`` tensors are the largest
  thing a block saves, and its matmuls are the cheaper part of a block's forward);
- ``block``: the whole block is recomputed; it keeps only its input.

``measured_plan`` measures, on a separate unsharded block built like the model's, the bytes a kept and an
``ffn`` block save beyond their input and the forward time of a block and of its SwiGLU, and times pinned
D2H and H2D copies. ``plan_checkpointing`` then picks the tier counts
with the least time added to the step (recomputed forwards, plus the part of each offload transfer that
the compute around it cannot hide) whose peak fits the memory that can still be allocated. Fully
recomputed blocks come first; offloaded blocks are spread evenly over the rest, so each transfer has the
blocks up to the next offloaded one to hide under; ``ffn`` blocks fill the remaining places first, kept
blocks last (backward rebuilds the ``ffn`` blocks after the kept blocks' activations are gone).

Offload rule: a group of ``S`` bytes (what a kept block saves, its input included) leaves during the
forward of the ``g`` blocks up to the next offloaded block and returns during their backward, so it adds
``max(0, S / d2h - g * t_block) + max(0, S / h2d - g' * 2 * t_block)`` seconds (``g'`` blocks between the
fetch's trigger and the use; backward is taken as twice the forward). Offloading a block is chosen when
that is less than recomputing it, within the host memory left for pinned buffers.

Limits: the memory model is the peak at the start of backward (fp32 AdamW moments, the inputs of the
blocks not offloaded, the saved activations, two groups of offloaded activations in flight, a headroom
for gathered weights, gradient buffers and loss chunks) and at the end (gradients plus one rebuilt
block); allocator fragmentation is left to the headroom. ``repeat`` > 1 plans blocks that each stand for
``repeat`` blocks of the full model (the single-GPU proxy, ``proxy.RankProxy``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from torch import nn

from .offload import ActivationOffload
from .sharding import recomputed


def offload_positions(layers: int, block: int, offload: int) -> list[int]:
    """Indices of the offloaded blocks: spread evenly over the blocks after the ``block`` recomputed ones."""
    return [block + j * (layers - block) // offload for j in range(offload)]


@dataclass(frozen=True)
class CheckpointPlan:
    block: int  # the first ``block`` blocks recompute everything
    ffn: int  # then ``ffn`` blocks recompute their SwiGLU
    kept: int  # and ``kept`` keep their activations on the device
    offload: int = 0  # and ``offload`` (spread among the ffn and kept ones) move them to host memory

    def tiers(self) -> list[str]:
        """The tier of every block, in forward order."""
        layers = self.block + self.ffn + self.kept + self.offload
        tiers = ["block"] * self.block + [""] * (layers - self.block)
        for i in offload_positions(layers, self.block, self.offload):
            tiers[i] = "offload"
        rest = [i for i, tier in enumerate(tiers) if not tier]
        for n, i in enumerate(rest):
            tiers[i] = "ffn" if n < self.ffn else "kept"
        return tiers

    def apply(self, layers: nn.ModuleList) -> ActivationOffload | None:
        """Put the planned blocks (or their SwiGLUs) in checkpoint wrappers and hook the offloaded blocks;
        returns the offloader (None without offloaded blocks)."""
        tiers = self.tiers()
        if len(tiers) != len(layers):
            raise ValueError(f"the plan has {len(tiers)} blocks, the model {len(layers)}")
        for i, tier in enumerate(tiers):
            if tier == "block":
                layers[i] = recomputed(layers[i])
            elif tier == "ffn":
                layers[i].ffn = recomputed(layers[i].ffn)
        offloaded = [i for i, tier in enumerate(tiers) if tier == "offload"]
        return ActivationOffload(layers, offloaded) if offloaded else None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class BlockCosts:
    """Measured on one block: bytes saved for backward (the input; beyond it when kept and when only the
    SwiGLU is recomputed) and forward seconds of the whole block and of its SwiGLU."""

    input_bytes: int
    kept_bytes: int
    ffn_bytes: int
    block_seconds: float
    ffn_seconds: float


@dataclass(frozen=True)
class HostLink:
    """Pinned-memory copy rates (bytes/s) and the host bytes that pinned buffers may take."""

    d2h_bytes_per_s: float
    h2d_bytes_per_s: float
    host_bytes: int


@dataclass(frozen=True)
class MemoryBudget:
    """``available_bytes``: what can still be allocated once the fp32 parameter shards exist;
    ``shard_bytes``: those shards (AdamW adds two moments of that size, backward the gradients)."""

    available_bytes: int
    shard_bytes: int
    headroom_bytes: int


def device_saved_bytes(plan: CheckpointPlan, costs: BlockCosts) -> int:
    """Bytes the planned blocks hold on the device at the start of backward (inputs included)."""
    layers = plan.block + plan.ffn + plan.kept + plan.offload
    return (
        (layers - plan.offload) * costs.input_bytes
        + plan.kept * costs.kept_bytes
        + plan.ffn * costs.ffn_bytes
    )


def offload_exposed_seconds(
    layers: int, block: int, offload: int, costs: BlockCosts, link: HostLink
) -> float:
    """Seconds of offload transfers that the compute around them cannot hide (the rule above)."""
    if offload == 0:
        return 0.0
    group = costs.kept_bytes + costs.input_bytes
    out, back = group / link.d2h_bytes_per_s, group / link.h2d_bytes_per_s
    positions = offload_positions(layers, block, offload)
    exposed = 0.0
    for j, p in enumerate(positions):
        after = positions[j + 1] if j + 1 < offload else layers
        trigger = positions[j + 1] if j + 1 < offload else layers - 1
        exposed += max(0.0, out - (after - p) * costs.block_seconds)
        exposed += max(0.0, back - (trigger - p) * 2 * costs.block_seconds)
    return exposed


def plan_checkpointing(
    layers: int,
    budget: MemoryBudget,
    costs: BlockCosts,
    link: HostLink | None = None,
    repeat: int = 1,
) -> CheckpointPlan:
    """The tier counts adding the least time whose peak fits ``budget`` (no offloading without ``link``);
    ties go to fewer offloaded blocks. Falls back to recomputing every block when nothing fits."""
    fixed = 2 * budget.shard_bytes + budget.headroom_bytes
    in_flight = 2 * (costs.kept_bytes + costs.input_bytes)
    best: tuple[tuple, CheckpointPlan] | None = None
    for block in range(layers + 1):
        end_of_backward = (
            repeat * layers * costs.input_bytes + budget.shard_bytes + (costs.kept_bytes if block else 0)
        )
        for offload in range(layers - block + 1 if link is not None else 1):
            host = repeat * offload * (costs.kept_bytes + costs.input_bytes)
            if link is not None and host > link.host_bytes:
                break
            exposed = offload_exposed_seconds(layers, block, offload, costs, link) if offload else 0.0
            for ffn in range(layers - block - offload + 1):
                plan = CheckpointPlan(block, ffn, layers - block - offload - ffn, offload)
                start_of_backward = repeat * device_saved_bytes(plan, costs) + (in_flight if offload else 0)
                if fixed + max(start_of_backward, end_of_backward) > budget.available_bytes:
                    continue
                seconds = block * costs.block_seconds + ffn * costs.ffn_seconds + exposed
                key = (round(seconds, 9), offload, block, ffn)
                if best is None or key < best[0]:
                    best = (key, plan)
    return best[1] if best is not None else CheckpointPlan(layers, 0, 0)
