"""FLOP and memory accounting of a Transformer LM configuration: the one place these formulas live.

``config`` is any object with integer attributes ``vocab_size, context_length, d_model, num_layers, num_heads,
d_ff`` (for example ``cs336_basics.presets.ModelConfig``). The model is the reference one: token embedding,
``num_layers`` pre-norm blocks (RMSNorm, causal multi-head attention with RoPE, RMSNorm, SwiGLU), final
RMSNorm, untied LM head, no biases.

Conventions and limits:

- FLOPs: an ``(A, B) @ (B, C)`` matmul costs ``2ABC``. Attention forward is ``4 B H Sq Sk D`` (scores and
  weighted sum), **halved when causal** (the project-wide convention: it slightly undercounts the diagonal,
  which a causal kernel computes in full), backward ``2.5x`` forward (five matmuls instead of two).
  The matmul part of backward is twice the forward. Embedding lookups, norms, softmax, SiLU, RoPE and the
  optimizer are not counted.
- Activation memory is what autograd saves for backward in the reference block computed in one dtype,
  counted tensor by tensor (the test checks it byte-exactly against ``saved_tensors_hooks`` in fp32).
  Mixed precision keeps extra fp32 copies (norms, RoPE, loss) that are not modelled; transient buffers of
  the backward pass (peaks a few per cent above the saved set) are not included either.
- Sharded-state helpers assume an even split of every sharded tensor over the ranks (``ceil`` per tensor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

H200_BF16_PEAK_FLOPS = 989e12
"""Dense bf16 tensor-core peak of one H200 (SXM datasheet), FLOP/s."""

H200_MEASURED_BF16_MATMUL_FLOPS = 795e12
"""The rate C the analysis assumes for a bf16 8192^3 matmul on one H200, FLOP/s: a constant, not read from a
measurement file; it lies within the range the project's own matmul measurements give."""

_CONFIG_FIELDS = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff")


def _check_config(config) -> None:
    for name in _CONFIG_FIELDS:
        value = getattr(config, name, None)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"config.{name} must be a positive int, got {value!r}")
    if config.d_model % config.num_heads:
        raise ValueError(f"config.d_model={config.d_model} must be divisible by num_heads={config.num_heads}")


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")


# ----------------------------------------------------------------------------------------------- parameters


def block_parameter_count(config) -> int:
    """Parameters of one Transformer block: q, k, v, output projections, SwiGLU W1, W2, W3, two norm gains."""
    _check_config(config)
    d, f = config.d_model, config.d_ff
    return 4 * d * d + 3 * d * f + 2 * d


def parameter_count(config) -> int:
    """All parameters: embedding ``V d``, blocks, final norm ``d``, untied LM head ``d V``."""
    _check_config(config)
    d, v = config.d_model, config.vocab_size
    return v * d + config.num_layers * block_parameter_count(config) + d + d * v


def matmul_parameter_count(config) -> int:
    """Parameters used in a matmul per token: block projections and LM head (the embedding is a lookup)."""
    _check_config(config)
    d, f = config.d_model, config.d_ff
    return config.num_layers * (4 * d * d + 3 * d * f) + d * config.vocab_size


# ---------------------------------------------------------------------------------------------------- FLOPs


def attention_flops(
    batch: int,
    heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    causal: bool = False,
    backward: bool = False,
) -> float:
    """FLOPs of softmax(Q K^T) V on ``(batch, heads, seq, head_dim)``: ``4 B H Sq Sk D``.

    Halved when ``causal`` (project convention), times 2.5 for ``backward`` (the backward pass alone).
    """
    _check_positive(batch=batch, heads=heads, seq_q=seq_q, seq_k=seq_k, head_dim=head_dim)
    flops = 4.0 * batch * heads * seq_q * seq_k * head_dim
    if causal:
        flops /= 2
    if backward:
        flops *= 2.5
    return flops


def _model_attention_flops(config, batch: int, seq: int, causal: bool, backward: bool) -> float:
    head_dim = config.d_model // config.num_heads
    per_layer = attention_flops(batch, config.num_heads, seq, seq, head_dim, causal=causal, backward=backward)
    return config.num_layers * per_layer


def forward_flops(config, batch: int, seq: int, causal: bool = True) -> float:
    """Forward FLOPs of the LM on ``(batch, seq)`` tokens: ``2 * tokens * matmul params`` plus attention."""
    _check_config(config)
    _check_positive(batch=batch, seq=seq)
    matmul = 2.0 * batch * seq * matmul_parameter_count(config)
    return matmul + _model_attention_flops(config, batch, seq, causal, backward=False)


def train_step_flops(config, batch: int, seq: int, causal: bool = True) -> float:
    """Forward + backward FLOPs: ``3x`` the matmul forward plus ``3.5x`` the attention forward."""
    _check_config(config)
    _check_positive(batch=batch, seq=seq)
    matmul = 6.0 * batch * seq * matmul_parameter_count(config)
    attention = _model_attention_flops(config, batch, seq, causal, backward=False)
    attention += _model_attention_flops(config, batch, seq, causal, backward=True)
    return matmul + attention


def mfu(flops: float, seconds: float, peak_flops: float = H200_BF16_PEAK_FLOPS) -> float:
    """Model FLOP utilization: achieved FLOP/s over ``peak_flops`` (a fraction, 1.0 = peak)."""
    _check_positive(seconds=seconds, peak_flops=peak_flops)
    if flops < 0:
        raise ValueError(f"flops must be non-negative, got {flops!r}")
    return flops / seconds / peak_flops


# --------------------------------------------------------------------------------------------------- memory


def residual_stream_bytes(config, batch: int, seq: int, dtype_bytes: int = 4) -> int:
    """Size of one residual-stream tensor ``(batch, seq, d_model)`` in bytes."""
    _check_config(config)
    _check_positive(batch=batch, seq=seq, dtype_bytes=dtype_bytes)
    return batch * seq * config.d_model * dtype_bytes


def block_activation_bytes(
    config, batch: int, seq: int, activation_bytes: int = 4, materialized_scores: bool = True
) -> int:
    """Bytes one block saves for backward (weights excluded).

    Per token, in ``activation_bytes``: two RMSNorms ``2 x (2d + 1)`` (input, rms, normalized), their
    outputs ``2d``, rotated q and k plus v ``3d``, attention output ``d``, SwiGLU ``5 d_ff`` (x1 used twice,
    sigmoid, SiLU, x3, product). With ``materialized_scores`` (naive attention): the softmax probabilities
    ``H S`` per token and a boolean ``S x S`` causal mask; otherwise (a FlashAttention kernel): the output
    ``O`` of shape ``(B, H, S, D)`` (one more ``d``; a view of the projection's input, so free, when
    ``H = 1`` or ``S = 1``) and the log-sum-exp ``H`` per token. Plus the RoPE
    cos/sin tables, always fp32: four ``(S, D/2)`` tensors.
    """
    _check_config(config)
    _check_positive(batch=batch, seq=seq, activation_bytes=activation_bytes)
    d, f, h = config.d_model, config.d_ff, config.num_heads
    per_token = 10 * d + 2 + 5 * f
    mask_bytes = 0
    if materialized_scores:
        per_token += h * seq
        mask_bytes = seq * seq
    else:
        per_token += h + (d if h > 1 and seq > 1 else 0)
    rope_bytes = 4 * seq * (d // h // 2) * 4
    return batch * seq * per_token * activation_bytes + mask_bytes + rope_bytes


def head_activation_bytes(config, batch: int, seq: int, activation_bytes: int = 4) -> int:
    """Bytes the final norm, LM head and cross-entropy save: ``3d + 1`` and ``2V`` (logits, exp) per token."""
    _check_config(config)
    _check_positive(batch=batch, seq=seq, activation_bytes=activation_bytes)
    return batch * seq * (3 * config.d_model + 1 + 2 * config.vocab_size) * activation_bytes


def checkpointed_activation_bytes(
    config,
    batch: int,
    seq: int,
    group_size: int,
    activation_bytes: int = 4,
    materialized_scores: bool = True,
) -> int:
    """Peak saved activations with one level of checkpointing over groups of ``group_size`` blocks.

    ``ceil(L / k)`` group inputs (residual streams) stay alive; the backward of one group recomputes and
    holds ``k`` blocks' activations at once; the head is not checkpointed. ``k = L`` keeps one residual
    stream and recomputes everything. Without checkpointing the blocks save ``L`` times
    :func:`block_activation_bytes` (see :func:`memory_breakdown`).
    """
    _check_config(config)
    if not isinstance(group_size, int) or not 1 <= group_size <= config.num_layers:
        raise ValueError(
            f"group_size must be an int in [1, {config.num_layers}] (num_layers), got {group_size!r}"
        )
    groups = math.ceil(config.num_layers / group_size)
    stored = groups * residual_stream_bytes(config, batch, seq, activation_bytes)
    live = group_size * block_activation_bytes(config, batch, seq, activation_bytes, materialized_scores)
    return stored + live + head_activation_bytes(config, batch, seq, activation_bytes)


def best_checkpoint_group_size(
    num_layers: int,
    block_bytes: float | None = None,
    residual_bytes: float | None = None,
    *,
    config=None,
    batch: int | None = None,
    seq: int | None = None,
    activation_bytes: int = 4,
    materialized_scores: bool = True,
) -> tuple[int, dict[int, float]]:
    """Group size ``k`` minimizing ``ceil(L/k) R + k A`` and the predicted peak (bytes) for every ``k``.

    Give either ``block_bytes`` ``A`` and ``residual_bytes`` ``R`` directly, or ``config``, ``batch`` and
    ``seq`` (then the head activations are added to every prediction). The continuous optimum is
    ``k* = sqrt(L R / A)``, which gives memory ``2 sqrt(L R A)``: ``O(sqrt L)``.
    Returns ``(best_k, {k: predicted_peak_bytes})``.
    """
    if not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
    extra = 0.0
    if config is not None:
        if batch is None or seq is None:
            raise ValueError("batch and seq are required together with config")
        if config.num_layers != num_layers:
            raise ValueError(f"num_layers={num_layers} differs from config.num_layers={config.num_layers}")
        block_bytes = block_activation_bytes(config, batch, seq, activation_bytes, materialized_scores)
        residual_bytes = residual_stream_bytes(config, batch, seq, activation_bytes)
        extra = head_activation_bytes(config, batch, seq, activation_bytes)
    if block_bytes is None or residual_bytes is None:
        raise ValueError("give block_bytes and residual_bytes, or config, batch and seq")
    _check_positive(block_bytes=block_bytes, residual_bytes=residual_bytes)
    peaks = {
        k: math.ceil(num_layers / k) * residual_bytes + k * block_bytes + extra
        for k in range(1, num_layers + 1)
    }
    best = min(peaks, key=lambda k: (peaks[k], k))
    return best, peaks


def recursive_checkpoint_cost(num_layers: int) -> tuple[int, int]:
    """``(stored states, block forwards)`` of the recursive (binary) checkpointing scheme.

    To run backward over ``n`` blocks given their input: forward the first half keeping only its output,
    recurse on the second half, then recurse on the first half. Memory ``M(n) = 1 + M(ceil(n/2))``, i.e.
    ``O(log n)`` stored residual streams (plus one block's activations); compute
    ``F(n) = floor(n/2) + F(ceil(n/2)) + F(floor(n/2))``, i.e. ``O(n log n)`` block forwards.
    """
    if not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
    if num_layers == 1:
        return 1, 1
    first, second = num_layers // 2, num_layers - num_layers // 2
    mem_second, fwd_second = recursive_checkpoint_cost(second)
    mem_first, fwd_first = recursive_checkpoint_cost(first)
    return 1 + max(mem_second, mem_first), first + fwd_second + fwd_first


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of a training step's state. ``activations`` is the variant chosen by ``checkpoint``."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations_no_checkpoint: int
    activations_checkpointed: int
    activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.activations

    def as_dict(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer_state": self.optimizer_state,
            "activations_no_checkpoint": self.activations_no_checkpoint,
            "activations_checkpointed": self.activations_checkpointed,
            "activations": self.activations,
            "total": self.total,
        }


def memory_breakdown(
    config,
    batch: int,
    seq: int,
    param_bytes: int = 4,
    grad_bytes: int = 4,
    optimizer_state_bytes: int = 8,
    activation_bytes: int = 4,
    checkpoint: int | None = None,
    materialized_scores: bool = True,
) -> MemoryBreakdown:
    """Parameters, gradients, AdamW state (``optimizer_state_bytes`` per parameter: m and v) and activations.

    ``activations_checkpointed`` is per-block checkpointing (groups of 1); ``checkpoint`` picks what
    ``activations`` (and ``total``) use: ``None`` for none, ``k`` for groups of ``k`` blocks.
    """
    params = parameter_count(config)
    full = config.num_layers * block_activation_bytes(
        config, batch, seq, activation_bytes, materialized_scores
    )
    full += head_activation_bytes(config, batch, seq, activation_bytes)
    per_block = checkpointed_activation_bytes(config, batch, seq, 1, activation_bytes, materialized_scores)
    if checkpoint is None:
        chosen = full
    else:
        chosen = checkpointed_activation_bytes(
            config, batch, seq, checkpoint, activation_bytes, materialized_scores
        )
    return MemoryBreakdown(
        parameters=params * param_bytes,
        gradients=params * grad_bytes,
        optimizer_state=params * optimizer_state_bytes,
        activations_no_checkpoint=full,
        activations_checkpointed=per_block,
        activations=chosen,
    )


# ----------------------------------------------------------------------------------------- sharded states


def _sharded_parameter_elements(config, world_size: int) -> tuple[int, int]:
    """``(elements per rank of the sharded 2-D weights, elements of the replicated norm gains)``."""
    _check_config(config)
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    weights = [v * d, d * v] + config.num_layers * ([d * d] * 4 + [d * f] * 3)
    sharded = sum(math.ceil(n / world_size) for n in weights)
    replicated = (2 * config.num_layers + 1) * d
    return sharded, replicated


def sharded_optimizer_state_bytes(config, world_size: int, optimizer_state_bytes: int = 8) -> int:
    """Optimizer state per rank when it is split evenly over ``world_size`` ranks (ZeRO-1)."""
    _check_config(config)
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    return math.ceil(parameter_count(config) / world_size) * optimizer_state_bytes


@dataclass(frozen=True)
class FSDPMemory:
    """Expected bytes per rank under FSDP (2-D weights sharded, norm gains replicated)."""

    parameters: int
    gradients: int
    optimizer_state: int
    gathered_weights: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.gathered_weights


def fsdp_memory_per_rank(
    config,
    world_size: int,
    param_bytes: int = 4,
    grad_bytes: int = 4,
    optimizer_state_bytes: int = 8,
    compute_bytes: int | None = None,
    gathered_layers: int = 3,
) -> FSDPMemory:
    """Per-rank state under FSDP, activations excluded.

    Sharded weights, their gradients and AdamW state, plus the replicated norm gains in full; and, at the
    peak, ``gathered_layers`` full weights (the layer computing and those prefetched ahead of it) in
    ``compute_bytes`` (default ``param_bytes``), bounded by the largest layers of the model.
    """
    sharded, replicated = _sharded_parameter_elements(config, world_size)
    if not isinstance(gathered_layers, int) or gathered_layers < 0:
        raise ValueError(f"gathered_layers must be a non-negative int, got {gathered_layers!r}")
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    largest = sorted([v * d, d * v] + config.num_layers * ([d * d] * 4 + [d * f] * 3), reverse=True)
    gathered = sum(largest[:gathered_layers]) if world_size > 1 else 0
    elements = sharded + replicated
    return FSDPMemory(
        parameters=elements * param_bytes,
        gradients=elements * grad_bytes,
        optimizer_state=elements * optimizer_state_bytes,
        gathered_weights=gathered * (compute_bytes or param_bytes),
    )
