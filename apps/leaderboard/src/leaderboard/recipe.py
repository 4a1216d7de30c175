"""The recipe of a run: one frozen configuration in sections, checked once before any process starts.

Sections (``--set SECTION.FIELD=VALUE`` overrides one field; each field's plain name, the recipe's flat name
of old, is accepted as its alias, e.g. ``--set checkpoint_blocks=8`` is ``activation_checkpoint.blocks=8``):

- ``model``: the ``cs336_basics`` preset at a context length and how it computes (attention kernel, fused
  block, compiled regions, fused LM head + loss);
- ``parallelism``: the sharding of the step, or a single-GPU proxy of one rank of an N-rank step;
- ``optimizer``: AdamW, its schedule and gradient clipping (the schedule and clipping: training only);
- ``training``: global batch, steps, seed, evaluation and what a non-finite step does;
- ``activation_checkpoint``: what backward recomputes or offloads to host memory, or the planner's headroom;
- ``checkpoint``: how often a training run saves;
- ``benchmark``: warm-up steps left out of the timing.

Aliases whose section field has another name: ``checkpoint_blocks`` -> ``activation_checkpoint.blocks``,
``checkpoint_ffn`` -> ``activation_checkpoint.ffn``, ``optimizer`` -> ``optimizer.implementation``.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when used, so that ``train.py --help`` answers before torch is loaded
    from cs336_basics import ModelConfig

    from .proxy import RankProxy

ATTENTION_CHOICES = ("auto", "flashattn", "cudnn", "flash", "efficient", "math")
NONFINITE_CHOICES = ("stop", "skip")
OPTIMIZER_CHOICES = ("auto", "triton", "torch")
SHARDING_CHOICES = ("ours", "fsdp2")


def _alias(name: str, default):
    """A field whose plain (flat) name differs from its name in the section."""
    return field(default=default, metadata={"alias": name})


@dataclass(frozen=True)
class Model:
    preset: str  # a cs336_basics preset
    context_length: int
    attention: str = "auto"  # "auto" (fastest measured), "flashattn", "cudnn", "flash", "efficient", "math"
    fused_block: bool = True  # residual add + RMSNorm, RoPE of q and k, SwiGLU fused (``fused_block``)
    compile_regions: bool = True  # torch.compile RMSNorm, RoPE and SwiGLU, one region each
    fused_loss: bool = True  # fused LM head + cross-entropy; False: chunked F.cross_entropy as the baseline
    loss_chunk_tokens: int = 4096  # tokens per chunk of the LM head + cross-entropy


@dataclass(frozen=True)
class Parallelism:
    sharding: str = "ours"  # "ours" (parallel.FSDP, block-level flat units) or "fsdp2" (torch fully_shard)
    proxy_ranks: int = 1  # N > 1: a one-GPU proxy of one rank of the preset's N-rank step (proxy.py)


@dataclass(frozen=True)
class Optimizer:
    implementation: str = _alias(
        "optimizer", "auto"
    )  # "auto" (Triton on CUDA, else torch), "triton", "torch"
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    min_learning_rate: float = 0.0  # training: the cosine schedule decays to this at ``training.steps``
    lr_warmup_steps: int = 0  # training: linear warm-up before the cosine decay
    max_grad_norm: float = 1.0  # training: gradients clipped to this global L2 norm


@dataclass(frozen=True)
class Training:
    batch_size: int  # global: sequences per step over all ranks
    steps: int = 5  # measured steps of the benchmark, trained steps of a training run
    seed: int = 0  # initial weights, the benchmark's batch, the training data's streams
    eval_every: int = 50  # steps between evaluations on the held-out file (and after the last step)
    eval_batches: int = 4  # batches of batch_size sequences per evaluation
    # a step whose training loss or gradient norm is not finite: "stop" the run there (nothing saved after
    # it, exit status 1) or "skip" it (no optimizer step; the row is marked skipped; 3 in a row end the run)
    on_nonfinite: str = "stop"


@dataclass(frozen=True)
class ActivationCheckpoint:
    """How many blocks recompute everything in backward (``blocks``), how many more only their SwiGLU
    (``ffn``), or -1 for the cheapest plan that the measured memory allows (``checkpoint_plan``). The
    baseline always checkpoints every block."""

    blocks: int = _alias("checkpoint_blocks", -1)
    ffn: int = _alias("checkpoint_ffn", 0)
    memory_headroom_gib: float = 10.0  # left free when planning automatically
    # -1: the automatic plan (blocks=-1) may offload blocks' saved activations to pinned host memory where
    # that costs less than recomputing; N > 0 with fixed counts offloads N of the blocks not recomputed
    offload_blocks: int = 0
    offload_host_gib: float = 48.0  # pinned host memory the planner may fill per rank (a proxy: as its rank)


@dataclass(frozen=True)
class Checkpoint:
    save_every: int = 0  # steps between sharded checkpoints of a training run (0: only after the last step)


@dataclass(frozen=True)
class Benchmark:
    warmup: int = 2  # steps before the measured ones (the first compiles and autotunes)


SECTIONS = {"model": Model, "parallelism": Parallelism, "optimizer": Optimizer, "training": Training,
            "activation_checkpoint": ActivationCheckpoint, "checkpoint": Checkpoint,
            "benchmark": Benchmark}  # fmt: skip
FIELDS = [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
ALIASES = {f.metadata.get("alias", f.name): f"{s}.{f.name}" for s, cls in SECTIONS.items()
           for f in dataclasses.fields(cls)}  # fmt: skip


def field_path(key: str) -> str:
    """``"section.field"`` for a dotted path or a flat alias; ValueError naming the key otherwise."""
    path = key if key in FIELDS else ALIASES.get(key)
    if path is None:
        raise ValueError(f"unknown recipe field {key!r}; known: {', '.join(FIELDS)} (or their plain names)")
    return path


@dataclass(frozen=True)
class Recipe:
    """One named run configuration; ``with_`` gives a changed copy, ``validate`` checks it for a world."""

    name: str
    model: Model
    training: Training
    parallelism: Parallelism = field(default_factory=Parallelism)
    optimizer: Optimizer = field(default_factory=Optimizer)
    activation_checkpoint: ActivationCheckpoint = field(default_factory=ActivationCheckpoint)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    benchmark: Benchmark = field(default_factory=Benchmark)

    def with_(self, **changes) -> Recipe:
        """A copy with fields replaced, keyed ``"section.field"`` or by plain name (ValueError if unknown)."""
        by_section: dict[str, dict] = {}
        for key, value in changes.items():
            section, name = field_path(key).split(".")
            by_section.setdefault(section, {})[name] = value
        replaced = {s: dataclasses.replace(getattr(self, s), **values) for s, values in by_section.items()}
        return dataclasses.replace(self, **replaced)

    def flat(self) -> dict[str, object]:
        """``{"section.field": value}`` for every field (and ``"name"``)."""
        return {"name": self.name} | {path: getattr(getattr(self, path.split(".")[0]), path.split(".")[1])
                                      for path in FIELDS}  # fmt: skip

    def as_dict(self) -> dict:
        """Nested: ``{"name": ..., "model": {...}, ...}`` (what results and checkpoints record)."""
        return dataclasses.asdict(self)

    def model_config(self) -> ModelConfig:
        """The cs336_basics model config at this recipe's context length and batch (for a proxy: its
        ``L / proxy_ranks`` blocks)."""
        proxy = self.proxy()
        return proxy.config() if proxy is not None else self.full_model_config()

    def full_model_config(self) -> ModelConfig:
        """The preset's whole model at this recipe's context length and batch."""
        from cs336_basics import get_preset

        return get_preset(self.model.preset).with_(
            context_length=self.model.context_length, batch_size=self.training.batch_size
        )

    def proxy(self) -> RankProxy | None:
        """The rank this recipe stands for when it is a single-GPU proxy (``proxy_ranks > 1``), else None."""
        if self.parallelism.proxy_ranks == 1:
            return None
        from .proxy import RankProxy

        return RankProxy(self.full_model_config(), self.parallelism.proxy_ranks)

    def validate(self, world_size: int) -> None:
        """Raise ValueError naming the field that cannot work on ``world_size`` ranks."""
        from cs336_basics.presets import PRESETS

        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        values = self.flat()
        for path, value in values.items():
            if isinstance(value, float) and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{path} must be a finite number >= 0, got {value}")
        lowest = {"activation_checkpoint.blocks": -1, "activation_checkpoint.offload_blocks": -1,
                  "training.steps": 1, "model.context_length": 2, "model.loss_chunk_tokens": 1,
                  "parallelism.proxy_ranks": 1, "training.eval_every": 1,
                  "training.eval_batches": 1}  # fmt: skip
        for path, value in values.items():
            if isinstance(value, int) and not isinstance(value, bool) and value < lowest.get(path, 0):
                raise ValueError(f"{path} must be >= {lowest.get(path, 0)}, got {value}")
        choices = {"model.preset": tuple(PRESETS), "model.attention": ATTENTION_CHOICES,
                   "parallelism.sharding": SHARDING_CHOICES, "optimizer.implementation": OPTIMIZER_CHOICES,
                   "training.on_nonfinite": NONFINITE_CHOICES}  # fmt: skip
        for path, allowed in choices.items():
            if values[path] not in allowed:
                raise ValueError(f"{path} must be one of {', '.join(allowed)}, got {values[path]!r}")
        self._validate_offload_and_proxy(world_size)
        batch = self.training.batch_size
        if batch < world_size or batch % world_size:
            raise ValueError(
                f"training.batch_size={batch} must be a positive multiple of the number of ranks "
                f"({world_size})"
            )
        if not self.optimizer.max_grad_norm > 0:
            raise ValueError(f"optimizer.max_grad_norm must be > 0, got {self.optimizer.max_grad_norm}")
        if not self.optimizer.min_learning_rate <= self.optimizer.learning_rate:
            raise ValueError(
                f"optimizer.min_learning_rate={self.optimizer.min_learning_rate} must lie in "
                f"[0, optimizer.learning_rate={self.optimizer.learning_rate}]"
            )

    def _validate_offload_and_proxy(self, world_size: int) -> None:
        memory = self.activation_checkpoint
        if memory.offload_blocks == -1 and memory.blocks != -1:
            raise ValueError(
                "activation_checkpoint.offload_blocks=-1 (planned) needs activation_checkpoint.blocks=-1 "
                "(the automatic plan)"
            )
        if memory.offload_blocks > 0 and memory.blocks < 0:
            raise ValueError(
                f"activation_checkpoint.offload_blocks={memory.offload_blocks} needs fixed checkpoint counts "
                f"(activation_checkpoint.blocks >= 0)"
            )
        ranks = self.parallelism.proxy_ranks
        if ranks > 1:
            if world_size != 1:
                raise ValueError(
                    f"parallelism.proxy_ranks={ranks} is a one-GPU proxy; run it on 1 rank, not {world_size}"
                )
            self.proxy()  # raises ValueError when the blocks do not split over proxy_ranks


def parse_override(item: str) -> tuple[str, object]:
    """``"FIELD=VALUE"`` -> ``("section.field", VALUE converted to the field's type)``; FIELD is a dotted
    path or a plain name; ValueError naming the field."""
    key, sep, text = item.partition("=")
    if not sep:
        raise ValueError(f"--set expects FIELD=VALUE, got {item!r}")
    path = field_path(key)
    section, name = path.split(".")
    kind = typing.get_type_hints(SECTIONS[section])[name]  # the field's type, resolved from its annotation
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"--set {key}: expected true or false, got {text!r}")
        return path, text.lower() in ("true", "1")
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"--set {key}: expected {kind.__name__}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise ValueError(f"--set {key}: expected a finite number, got {text!r}")
    return path, value
