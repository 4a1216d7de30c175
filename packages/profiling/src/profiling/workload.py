"""One benchmarkable workload: a model, a random batch, and the step of a chosen mode.

Modes: ``forward`` (inference, under ``torch.no_grad``), ``forward-backward`` (loss and gradients),
``train`` (forward, backward, AdamW step, gradients dropped). Precision: ``fp32`` (true fp32; TF32
stays off, torch's default) or ``bf16`` (autocast around forward and loss; parameters, gradients
and optimizer state stay fp32). Each phase is a named range (see :mod:`profiling.ranges`).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from cs336_basics import AdamW, ModelConfig, build_model, cross_entropy, get_preset, naive_attention
from torch import Tensor, nn

from .checkpointing import apply_checkpointing
from .options import ATTENTIONS, MODES
from .ranges import Ranges

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def attention_function(name: str, ranges: Ranges) -> Callable[[Tensor, Tensor, Tensor, bool], Tensor]:
    """``naive``: the reference math with a range per part (of ``ranges``); ``flash``:
    ``flashattn.flash_attention``."""
    if name == "naive":
        return ranges.attention
    if name == "flash":
        try:
            from flashattn import flash_attention
        except ImportError as err:
            raise RuntimeError(
                "--attention flash needs flashattn.flash_attention, which this installation lacks"
            ) from err
        return flash_attention
    raise ValueError(f"attention must be one of {ATTENTIONS}, got {name!r}")


def free_device_memory() -> None:
    """Collect garbage and return cached CUDA blocks, so the next configuration starts clean."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def is_oom(err: BaseException) -> bool:
    """True for CUDA out-of-memory errors (also when wrapped in a RuntimeError)."""
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def resolve_config(preset: str, **overrides: int | None) -> ModelConfig:
    """A preset with the fields given (not None) overridden, e.g. ``context_length=2048``."""
    config = get_preset(preset)
    changes = {k: v for k, v in overrides.items() if v is not None}
    for key, value in changes.items():
        if isinstance(value, int) and value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value}")
    return config.with_(**changes)


@dataclass
class Workload:
    """Model, batch and optimizer for one benchmark configuration."""

    config: ModelConfig
    mode: str
    dtype: str = "fp32"
    compile: bool = False
    attention: str = "naive"
    checkpoint: str = "none"
    device: str = "cuda"
    seed: int = 0
    with_ranges: bool = True  # False: every range of this workload off (see profiling.ranges)
    ranges: Ranges = field(init=False)
    model: nn.Module = field(init=False)
    inputs: Tensor = field(init=False)
    targets: Tensor = field(init=False)
    optimizer: torch.optim.Optimizer | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        torch.manual_seed(self.seed)
        self.ranges = Ranges(self.with_ranges)
        attention_fn = attention_function(self.attention, self.ranges)
        base = build_model(self.config, device=self.device, attention_fn=attention_fn)
        self.base_model = base
        self.hooks = [] if self.compile else self.ranges.annotate_blocks(base)
        if self.compile and self.attention == "naive":
            base.set_attention_fn(naive_attention)
        apply_checkpointing(base, self.checkpoint)  # after the block ranges: their hooks stay on the blocks
        self.model = torch.compile(base) if self.compile else base
        shape = (self.config.batch_size, self.config.context_length)
        self.inputs = torch.randint(0, self.config.vocab_size, shape, device=self.device)
        self.targets = torch.randint(0, self.config.vocab_size, shape, device=self.device)
        if self.mode == "train":
            self.optimizer = AdamW(base.parameters(), lr=1e-4)

    def autocast(self) -> contextlib.AbstractContextManager:
        dtype = DTYPES[self.dtype]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(self.device).type, dtype=dtype)

    def loss(self) -> Tensor:
        """Forward pass and loss, in the ``forward`` range."""
        with self.ranges.annotate("forward"), self.autocast():
            return cross_entropy(self.model(self.inputs), self.targets)

    def step(self) -> None:
        """One step of this workload's mode (no synchronization)."""
        if self.mode == "forward":
            with torch.no_grad(), self.ranges.annotate("forward"), self.autocast():
                self.model(self.inputs)
            return
        loss = self.loss()
        with self.ranges.annotate("backward"):
            loss.backward()
        if self.optimizer is not None:
            with self.ranges.annotate("optimizer_step"):
                self.optimizer.step()
        self.base_model.zero_grad(set_to_none=True)

    def close(self) -> None:
        """Drop hooks, optimizer state and gradients so the memory can be reused."""
        for handle in self.hooks:
            handle.remove()
        self.optimizer = None
        self.base_model.zero_grad(set_to_none=True)
