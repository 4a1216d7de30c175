"""The reference Transformer language model.

Pre-norm decoder-only Transformer: token embedding, ``num_layers`` blocks of
(RMSNorm -> causal multi-head self-attention with RoPE -> residual,
RMSNorm -> SwiGLU feed-forward -> residual), a final RMSNorm and an untied LM head.
No biases anywhere.

Every module takes ``device`` and ``dtype`` so a model can be built on the ``meta``
device without allocating, then materialized with ``to_empty`` + ``reset_parameters``.

The attention kernel is pluggable: ``attention_fn(q, k, v, is_causal) -> out`` on
``(..., seq, head_dim)`` tensors. The default is :func:`naive_attention`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import torch
from torch import Tensor, nn

AttentionFn = Callable[[Tensor, Tensor, Tensor, bool], Tensor]


def naive_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """softmax(q k^T / sqrt(d) + mask) v on ``(..., seq, d)`` tensors; materializes the scores."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        seq_q, seq_k = q.shape[-2], k.shape[-2]
        mask = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).tril(seq_k - seq_q)
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return probs @ v


def _trunc_normal_(weight: Tensor, std: float) -> None:
    nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-3 * std, b=3 * std)


class Linear(nn.Module):
    """y = x W^T with W of shape ``(d_out, d_in)``; no bias."""

    def __init__(self, d_in: int, d_out: int, device=None, dtype=None):
        super().__init__()
        self.d_in, self.d_out = d_in, d_out
        self.weight = nn.Parameter(torch.empty(d_out, d_in, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _trunc_normal_(self.weight, math.sqrt(2.0 / (self.d_in + self.d_out)))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.t()

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out={self.d_out}"


class Embedding(nn.Module):
    """Lookup table of shape ``(vocab_size, d_model)``: ``(...,)`` ids -> ``(..., d_model)``."""

    def __init__(self, vocab_size: int, d_model: int, device=None, dtype=None):
        super().__init__()
        self.vocab_size, self.d_model = vocab_size, d_model
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _trunc_normal_(self.weight, 1.0)

    def forward(self, token_ids: Tensor) -> Tensor:
        return self.weight[token_ids]

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, d_model={self.d_model}"


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g, computed in fp32, returned in the input dtype."""

    def __init__(self, d_model: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.d_model, self.eps = d_model, eps
        self.weight = nn.Parameter(torch.empty(d_model, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        in_dtype = x.dtype
        x32 = x.float()
        rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x32 * rms * self.weight.float()).to(in_dtype)

    def add_and_norm(self, x: Tensor, delta: Tensor) -> tuple[Tensor, Tensor]:
        """``(self(x + delta), x + delta)``: a residual add and the pre-norm after it (a subclass may fuse
        the two)."""
        residual = x + delta
        return self(residual), residual


class RotaryEmbedding(nn.Module):
    """Rotary position embedding on ``(..., seq, d_k)`` tensors, rotating pairs (x[2i], x[2i+1]).

    Angles are computed on the fly from the positions (cheap next to attention), so the module
    holds no buffers and works unchanged on the meta device and under any sharding.
    """

    def __init__(self, theta: float, d_k: int, max_seq_len: int, device=None):
        super().__init__()
        if d_k % 2:
            raise ValueError(f"RoPE needs an even head dimension, got d_k={d_k}")
        self.theta, self.d_k, self.max_seq_len = theta, d_k, max_seq_len

    def angles(self, token_positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos and sin of shape ``(..., seq, d_k // 2)`` in fp32."""
        exponent = torch.arange(0, self.d_k, 2, device=token_positions.device, dtype=torch.float32) / self.d_k
        inv_freq = self.theta ** (-exponent)
        freqs = token_positions.to(torch.float32)[..., None] * inv_freq
        return freqs.cos(), freqs.sin()

    def forward(self, x: Tensor, token_positions: Tensor) -> Tensor:
        cos, sin = self.angles(token_positions)
        x32 = x.float()
        even, odd = x32[..., 0::2], x32[..., 1::2]
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return rotated.flatten(-2).to(x.dtype)


def silu(x: Tensor) -> Tensor:
    return x * torch.sigmoid(x)


class SwiGLU(nn.Module):
    """W2(SiLU(W1 x) * W3 x) with W1, W3: d_model -> d_ff and W2: d_ff -> d_model."""

    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device=device, dtype=dtype)
        self.w2 = Linear(d_ff, d_model, device=device, dtype=dtype)
        self.w3 = Linear(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(silu(self.w1(x)) * self.w3(x))


class CausalMultiHeadSelfAttention(nn.Module):
    """Causal multi-head self-attention with RoPE on queries and keys.

    ``(..., seq, d_model)`` -> ``(..., seq, d_model)``; heads of size d_model // num_heads.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        rope: RotaryEmbedding | None = None,
        attention_fn: AttentionFn | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.d_model, self.num_heads, self.d_head = d_model, num_heads, d_model // num_heads
        self.rope = rope
        self.attention_fn: AttentionFn = attention_fn or naive_attention
        self.q_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.k_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.v_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.output_proj = Linear(d_model, d_model, device=device, dtype=dtype)

    def _split_heads(self, x: Tensor) -> Tensor:
        return x.unflatten(-1, (self.num_heads, self.d_head)).transpose(-3, -2)

    def rotate(self, q: Tensor, k: Tensor, token_positions: Tensor) -> tuple[Tensor, Tensor]:
        """RoPE of ``q`` and ``k`` (``(..., heads, seq, d_head)``) at ``token_positions`` (a subclass may
        rotate both at once)."""
        return self.rope(q, token_positions), self.rope(k, token_positions)

    def forward(self, x: Tensor, token_positions: Tensor | None = None) -> Tensor:
        seq = x.shape[-2]
        q, k, v = (self._split_heads(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        if self.rope is not None:
            if token_positions is None:
                token_positions = torch.arange(seq, device=x.device)
            q, k = self.rotate(q, k, token_positions)
        out = self.attention_fn(q, k, v, True)
        return self.output_proj(out.transpose(-3, -2).flatten(-2))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then + ffn(norm2(x)). Shape ``(..., seq, d_model)``."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        rope: RotaryEmbedding | None = None,
        attention_fn: AttentionFn | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.ln1 = RMSNorm(d_model, device=device, dtype=dtype)
        self.attn = CausalMultiHeadSelfAttention(d_model, num_heads, rope, attention_fn, device, dtype)
        self.ln2 = RMSNorm(d_model, device=device, dtype=dtype)
        self.ffn = SwiGLU(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x: Tensor, token_positions: Tensor | None = None) -> Tensor:
        normed, x = self.ln2.add_and_norm(x, self.attn(self.ln1(x), token_positions))
        return x + self.ffn(normed)


class BasicsTransformerLM(nn.Module):
    """Decoder-only LM: ``(batch, seq)`` token ids -> ``(batch, seq, vocab_size)`` logits."""

    def __init__(
        self,
        vocab_size: int,
        context_length: int,
        d_model: int,
        num_layers: int,
        num_heads: int,
        d_ff: int,
        rope_theta: float = 10000.0,
        attention_fn: AttentionFn | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.vocab_size, self.context_length = vocab_size, context_length
        self.token_embeddings = Embedding(vocab_size, d_model, device=device, dtype=dtype)
        rope = RotaryEmbedding(rope_theta, d_model // num_heads, context_length)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, rope, attention_fn, device, dtype)
            for _ in range(num_layers)
        )
        self.ln_final = RMSNorm(d_model, device=device, dtype=dtype)
        self.lm_head = Linear(d_model, vocab_size, device=device, dtype=dtype)

    def set_attention_fn(self, attention_fn: AttentionFn) -> None:
        """Swap the attention kernel of every block (e.g. for ``flashattn.flash_attention``)."""
        for layer in self.layers:
            layer.attn.attention_fn = attention_fn

    def check_input(self, in_indices: Tensor) -> None:
        """Raise ValueError / IndexError naming the problem with ``in_indices``.

        Shape and dtype are always checked. Token values are checked on the CPU; on an accelerator only when
        ``CS336_BASICS_CHECK_TOKENS=1`` is set (a debug flag: reading the values back waits for the device
        on every forward), otherwise an out-of-range id fails inside the embedding lookup.
        """
        if in_indices.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"in_indices must hold integer token ids, got dtype {in_indices.dtype}")
        if in_indices.ndim < 1:
            raise ValueError("in_indices must have shape (..., seq), got a 0-d tensor")
        if in_indices.shape[-1] > self.context_length:
            raise ValueError(
                f"sequence length {in_indices.shape[-1]} exceeds context_length {self.context_length}"
            )
        on_host = in_indices.device.type == "cpu"
        if in_indices.numel() and (on_host or os.environ.get("CS336_BASICS_CHECK_TOKENS") == "1"):
            lo, hi = int(in_indices.min()), int(in_indices.max())
            if lo < 0 or hi >= self.vocab_size:
                raise IndexError(f"token ids must lie in [0, {self.vocab_size}), got min {lo} and max {hi}")

    def hidden_states(self, in_indices: Tensor, token_positions: Tensor | None = None) -> Tensor:
        """Final-norm output before the LM head: ``(batch, seq, d_model)``.

        ``token_positions`` (``(seq,)`` or ``(batch, seq)``, default ``0 ... seq - 1``) are the rotary
        positions; packed documents pass positions that restart at 0 in each document.
        """
        if not torch.compiler.is_compiling():
            self.check_input(in_indices)
        x = self.token_embeddings(in_indices)
        if token_positions is None:
            token_positions = torch.arange(in_indices.shape[-1], device=in_indices.device)
        elif token_positions.shape[-1] != in_indices.shape[-1] or token_positions.ndim > in_indices.ndim:
            raise ValueError(
                f"token_positions has shape {tuple(token_positions.shape)}; expected (seq,) or (batch, seq) "
                f"matching in_indices {tuple(in_indices.shape)}"
            )
        # (batch, seq) positions broadcast over the heads axis of (batch, heads, seq, d_head)
        positions = token_positions.unsqueeze(-2) if token_positions.ndim > 1 else token_positions
        for layer in self.layers:
            x = layer(x, positions)
        return self.ln_final(x)

    def forward(self, in_indices: Tensor, token_positions: Tensor | None = None) -> Tensor:
        return self.lm_head(self.hidden_states(in_indices, token_positions))

    def reset_parameters(self) -> None:
        """Re-initialize every parameter (after ``to_empty`` from the meta device)."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
