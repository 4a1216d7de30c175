"""One GPU standing for one rank of an N-rank training step: the arithmetic of the single-GPU proxy.

A rank of the N-rank step runs every block on its own sequence and holds 1/N of the fp32 training state
(parameters, gradients, two AdamW moments: 16 bytes per parameter). The proxy runs ``L / N`` of the
``L`` blocks, unsharded, on one sequence: every block does the same work on the same shapes, and the
planner plans the rank (``measured_plan.auto_plan``): the rank's fp32 shard, every proxy block standing
for N blocks of the rank, the memory the rank would have once its shard exists.

The proxy's own state differs from the rank's: it holds all of the embedding and the LM head (which the
rank shares with N - 1 others) and 1/N of the blocks, so its fp32 shard is ``S_p = 4 (P - (N-1)/N B_all)``
bytes against the rank's ``S_r = 4 P / N`` (``P`` parameters, ``B_all`` of them in blocks). At the start of
backward the rank holds ``3 S_r`` of state (parameters and moments) and the saved activations of all its
blocks, ``N D`` if the proxy's blocks hold ``D``; the proxy holds ``3 S_p + D``. So that the proxy's step
meets the rank's memory it allocates and holds

    held_back = 3 (S_r - S_p) + (N - 1) D

bytes once the plan (and so ``D``) is known, before its first step (never less than 0; a negative value,
a proxy under more pressure than the rank, is reported as such). For ``leaderboard-8b`` on 2 ranks:
P = 8.13 B parameters, of which 6.88 B in 34 blocks of 202.4 M; the proxy runs 17 blocks (4.69 B
parameters, S_p = 17.5 GiB) for a rank's 4.06 B (S_r = 15.1 GiB), so ``3 (S_r - S_p) = -6.96 GiB``, and the
other 17 blocks' activations (``D``) are added to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cs336_basics import ModelConfig

FP32_BYTES = 4


@dataclass(frozen=True)
class RankProxy:
    """The whole model's config ``full`` and the number of ``ranks`` of the step the proxy stands for."""

    full: ModelConfig
    ranks: int

    def __post_init__(self):
        if self.ranks < 2:
            raise ValueError(f"a proxy stands for one of >= 2 ranks, got ranks={self.ranks}")
        if self.full.num_layers % self.ranks:
            raise ValueError(
                f"the model's {self.full.num_layers} blocks do not split evenly over {self.ranks} ranks"
            )

    @property
    def blocks(self) -> int:
        """Blocks the proxy runs: ``L / N``."""
        return self.full.num_layers // self.ranks

    def config(self) -> ModelConfig:
        """The proxy's model: the full model with ``blocks`` blocks."""
        return self.full.with_(num_layers=self.blocks)

    @property
    def rank_shard_bytes(self) -> int:
        """fp32 parameter bytes one rank of the full step holds: ``4 P / N`` (padding left out)."""
        return FP32_BYTES * -(-self.full.parameter_count // self.ranks)

    @property
    def proxy_shard_bytes(self) -> int:
        """fp32 parameter bytes of the proxy's unsharded model."""
        return FP32_BYTES * self.config().parameter_count

    def held_back_bytes(self, device_saved_bytes: int) -> int:
        """Bytes to allocate and hold when the proxy's blocks hold ``device_saved_bytes`` at the start of
        backward: ``3 (S_r - S_p) + (N - 1) D``, at least 0."""
        return max(0, self.state_difference_bytes + (self.ranks - 1) * device_saved_bytes)

    @property
    def state_difference_bytes(self) -> int:
        """``3 (S_r - S_p)``: fp32 parameters and AdamW moments of a rank minus the proxy's."""
        return 3 * (self.rank_shard_bytes - self.proxy_shard_bytes)
