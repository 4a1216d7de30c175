"""Named training-step recipes: a model preset plus everything the benchmark needs to run it.

Each recipe is a documented, frozen configuration; the command line overrides it field by field
(``Recipe.with_``) and the resolved recipe is printed and saved with every result.

Recipes:
    ``leaderboard-8b``  the 8B model (vocab 151 936, d_model 4096, 34 layers, 32 heads, d_ff 11 008) at
                        context 32 768, global batch 2: one sequence per GPU on two GPUs.
    ``large-8k``        the ``large`` preset (d_model 1280, 36 layers) at context 8192, global batch 2:
                        the local analogue that also fits on one GPU.
    ``tiny``            a 2-layer model at context 128, global batch 4, for CPUs and tests.
    ``proxy-8b``        a single-GPU proxy of one rank of ``leaderboard-8b`` on 2 GPUs: 17 of the 34 blocks
                        (unsharded, with the whole embedding and LM head), one sequence of 32 768 tokens,
                        planned as that rank and holding back the memory the rank's other 17 blocks and
                        its smaller state leave over (``proxy.RankProxy``: ``3 (S_r - S_p) + D`` bytes,
                        -6.96 GiB plus the other blocks' saved activations ``D``). Its step time is the
                        proxy's, never the 8B step's.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when used, so that ``train.py --help`` answers before torch is loaded
    from cs336_basics import ModelConfig

    from .proxy import RankProxy


@dataclass(frozen=True)
class Recipe:
    """One benchmark configuration.

    ``checkpoint_blocks`` is how many Transformer blocks the optimized step recomputes in backward (and
    ``checkpoint_ffn`` how many more recompute only their SwiGLU), or -1 for the cheapest plan that the
    measured memory allows (``checkpoint_plan``). The baseline always
    checkpoints every block.
    """

    name: str
    preset: str
    context_length: int
    batch_size: int  # global: sequences per step over all ranks
    steps: int = 5
    warmup: int = 2
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    loss_chunk_tokens: int = 4096  # tokens per chunk of the fused LM head + cross-entropy
    checkpoint_blocks: int = -1
    checkpoint_ffn: int = 0  # with checkpoint_blocks >= 0: the next blocks recompute only their SwiGLU
    memory_headroom_gib: float = 10.0  # left free when planning checkpointing automatically
    compile_regions: bool = True  # torch.compile RMSNorm, RoPE and SwiGLU, one region each
    fused_block: bool = True  # residual add + RMSNorm, RoPE of q and k, SwiGLU fused (``fused_block``)
    attention: str = "auto"  # "auto" (fastest measured), "flashattn", "cudnn", "flash", "efficient", "math"
    fused_loss: bool = True  # fused LM head + cross-entropy; False: chunked F.cross_entropy as the baseline
    optimizer: str = "auto"  # "auto" (Triton on CUDA, torch elsewhere), "triton", "torch"
    sharding: str = "ours"  # "ours" (parallel.FSDP, block-level flat units) or "fsdp2" (torch fully_shard)
    seed: int = 0
    # offloading: -1 lets the automatic plan (checkpoint_blocks=-1) offload blocks' saved activations to
    # pinned host memory where that costs less than recomputing; N > 0 with fixed checkpoint counts
    # offloads N of the blocks that are not recomputed
    offload_blocks: int = 0
    offload_host_gib: float = 48.0  # pinned host memory the planner may fill per rank (a proxy: as its rank)
    proxy_ranks: int = 1  # N > 1: a one-GPU proxy of one rank of the preset's N-rank step (proxy.py)
    # training on a token file (train.py --data); the timing benchmark ignores these
    min_learning_rate: float = 0.0  # the cosine schedule decays from learning_rate to this at ``steps``
    lr_warmup_steps: int = 0  # linear warm-up before the cosine decay
    max_grad_norm: float = 1.0  # gradients clipped to this global L2 norm
    eval_every: int = 50  # steps between evaluations on the held-out file (and after the last step)
    eval_batches: int = 4  # batches of batch_size sequences per evaluation
    save_every: int = 0  # steps between sharded checkpoints (0: only after the last step)
    # a step whose training loss or gradient norm is not finite: "stop" the run there (nothing saved after
    # it, exit status 1) or "skip" it (no optimizer step; the row is marked skipped)
    on_nonfinite: str = "stop"

    def model_config(self) -> ModelConfig:
        """The cs336_basics model config at this recipe's context length and batch (for a proxy: its
        ``L / proxy_ranks`` blocks)."""
        proxy = self.proxy()
        return proxy.config() if proxy is not None else self.full_model_config()

    def full_model_config(self) -> ModelConfig:
        """The preset's whole model at this recipe's context length and batch."""
        from cs336_basics import get_preset

        return get_preset(self.preset).with_(context_length=self.context_length, batch_size=self.batch_size)

    def proxy(self) -> RankProxy | None:
        """The rank this recipe stands for when it is a single-GPU proxy (``proxy_ranks > 1``), else None."""
        if self.proxy_ranks == 1:
            return None
        from .proxy import RankProxy

        return RankProxy(self.full_model_config(), self.proxy_ranks)

    def with_(self, **changes) -> Recipe:
        """A copy with the given fields replaced; unknown fields raise ValueError."""
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = set(changes) - fields
        if unknown:
            raise ValueError(f"unknown recipe fields: {sorted(unknown)}; known: {sorted(fields)}")
        return dataclasses.replace(self, **changes)

    def validate(self, world_size: int) -> None:
        """Raise ValueError naming the field that cannot work on ``world_size`` ranks."""
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        from cs336_basics.presets import PRESETS

        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
        self._validate_numbers()
        self._validate_offload_and_proxy(world_size)
        if self.batch_size < world_size or self.batch_size % world_size:
            raise ValueError(
                f"batch_size={self.batch_size} must be a positive multiple of the number of ranks "
                f"({world_size})"
            )
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.context_length < 2:
            raise ValueError(f"context_length must be >= 2, got {self.context_length}")
        if self.loss_chunk_tokens < 1:
            raise ValueError(f"loss_chunk_tokens must be >= 1, got {self.loss_chunk_tokens}")
        if self.sharding not in SHARDING_CHOICES:
            raise ValueError(f"sharding must be one of {SHARDING_CHOICES}, got {self.sharding!r}")
        if self.optimizer not in OPTIMIZER_CHOICES:
            raise ValueError(f"optimizer must be one of {OPTIMIZER_CHOICES}, got {self.optimizer!r}")
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention must be one of {ATTENTION_CHOICES}, got {self.attention!r}")
        for name in ("lr_warmup_steps", "save_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("eval_every", "eval_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.on_nonfinite not in NONFINITE_CHOICES:
            raise ValueError(f"on_nonfinite must be one of {NONFINITE_CHOICES}, got {self.on_nonfinite!r}")
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        if not 0 <= self.min_learning_rate <= self.learning_rate:
            raise ValueError(
                f"min_learning_rate={self.min_learning_rate} must lie in "
                f"[0, learning_rate={self.learning_rate}]"
            )

    def _validate_numbers(self) -> None:
        """Every float field finite and none negative; counts in range."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{f.name} must be a finite number >= 0, got {value}")
        for name, low in (("checkpoint_blocks", -1), ("checkpoint_ffn", 0), ("seed", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")

    def _validate_offload_and_proxy(self, world_size: int) -> None:
        if self.offload_blocks < -1:
            raise ValueError(f"offload_blocks must be -1 (planned), 0 or a count, got {self.offload_blocks}")
        if self.offload_blocks == -1 and self.checkpoint_blocks != -1:
            raise ValueError("offload_blocks=-1 (planned) needs checkpoint_blocks=-1 (the automatic plan)")
        if self.offload_blocks > 0 and self.checkpoint_blocks < 0:
            raise ValueError(
                f"offload_blocks={self.offload_blocks} needs fixed checkpoint counts (checkpoint_blocks >= 0)"
            )
        if not self.offload_host_gib >= 0:
            raise ValueError(f"offload_host_gib must be >= 0, got {self.offload_host_gib}")
        if self.proxy_ranks < 1:
            raise ValueError(f"proxy_ranks must be >= 1, got {self.proxy_ranks}")
        if self.proxy_ranks > 1:
            if world_size != 1:
                raise ValueError(
                    f"proxy_ranks={self.proxy_ranks} is a one-GPU proxy; run it on 1 rank, not {world_size}"
                )
            self.proxy()  # raises ValueError when the blocks do not split over proxy_ranks

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


ATTENTION_CHOICES = ("auto", "flashattn", "cudnn", "flash", "efficient", "math")
NONFINITE_CHOICES = ("stop", "skip")
OPTIMIZER_CHOICES = ("auto", "triton", "torch")
SHARDING_CHOICES = ("ours", "fsdp2")

RECIPES: dict[str, Recipe] = {
    # headroom: the root unit's gathered embedding + head (2.5 GB bf16), their gradients and fp32 reduction
    # buffers (7.5 GB), one fp32 loss chunk of 4096 x 151 936 (2.5 GB) and its softmax temporaries, plus
    # room for the caching allocator: planned to 16 GiB, the step ran at 138 of 139.8 GiB reserved and
    # stalled on allocator retries; planned to 24 GiB the single-GPU proxy still retried 4 times a step and
    # was slower than at 32 GiB, where the offload tier then gained 3% more (docs/leaderboard.md, proxy).
    "leaderboard-8b": Recipe(
        "leaderboard-8b",
        "leaderboard-8b",
        context_length=32_768,
        batch_size=2,
        steps=4,
        memory_headroom_gib=32.0,
        offload_blocks=-1,
    ),
    "large-8k": Recipe("large-8k", "large", context_length=8192, batch_size=2, steps=5),
    "tiny": Recipe(
        "tiny",
        "tiny",
        context_length=128,
        batch_size=4,
        steps=5,
        warmup=1,
        loss_chunk_tokens=97,
        memory_headroom_gib=0.0,
        compile_regions=False,
        fused_block=False,
    ),
    # one rank of leaderboard-8b on 2 GPUs, on one GPU (proxy.py): the same headroom as the rank, whose
    # root unit (embedding + head), loss chunks and gradient buffers the proxy has too
    "proxy-8b": Recipe(
        "proxy-8b",
        "leaderboard-8b",
        context_length=32_768,
        batch_size=1,
        steps=3,
        warmup=1,
        memory_headroom_gib=32.0,
        offload_blocks=-1,
        proxy_ranks=2,
    ),
}


def parse_override(item: str) -> tuple[str, object]:
    """``"FIELD=VALUE"`` -> ``(FIELD, VALUE converted to the field's type)``; ValueError naming the field."""
    types = typing.get_type_hints(Recipe)  # the fields' types, resolved from their annotations
    settable = sorted(set(types) - {"name"})
    key, sep, text = item.partition("=")
    if not sep or key not in settable:
        raise ValueError(f"--set expects FIELD=VALUE with FIELD one of {settable}, got {item!r}")
    kind = types[key]
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"--set {key}: expected true or false, got {text!r}")
        return key, text.lower() in ("true", "1")
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"--set {key}: expected {kind.__name__}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise ValueError(f"--set {key}: expected a finite number, got {text!r}")
    return key, value


# What ``--resume`` refuses to change: the fields that shape the model (preset, proxy_ranks, context_length),
# the data stream (context_length, batch_size) or the optimizer state and the schedule that built it.
RESUME_FIXED_FIELDS = (
    "preset", "proxy_ranks", "context_length", "batch_size", "sharding", "optimizer",
    "learning_rate", "min_learning_rate", "lr_warmup_steps", "weight_decay",
)  # fmt: skip


def resume_changes(saved: dict, current: Recipe) -> tuple[list[str], list[str]]:
    """``(refused, others)``: ``"field saved -> current"`` for each field of ``saved`` (a checkpoint's
    ``Recipe.as_dict()``) that differs from ``current``, split by ``RESUME_FIXED_FIELDS``."""
    now = current.as_dict()
    changed = [name for name in now if name in saved and saved[name] != now[name]]
    text = {name: f"{name} {saved[name]!r} -> {now[name]!r}" for name in changed}
    return ([text[n] for n in changed if n in RESUME_FIXED_FIELDS],
            [text[n] for n in changed if n not in RESUME_FIXED_FIELDS])  # fmt: skip


class ResumeMismatch(ValueError):
    """``--resume`` with a recipe whose fixed fields differ from the checkpoint's."""


def check_resumable(saved: dict, current: Recipe, checkpoint: str) -> list[str]:
    """ResumeMismatch naming the fixed fields that differ from those ``checkpoint`` was trained with; else
    the other fields that changed."""
    refused, others = resume_changes(saved, current)
    if refused:
        raise ResumeMismatch(
            f"--resume: fields that shape the model, the data or the optimizer state differ from those "
            f"{checkpoint} was trained with (saved -> now): {', '.join(refused)}; they cannot change on "
            f"resume (drop those --set, or start a new --save folder)"
        )
    return others


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}") from None


def ablation_steps(recipe: Recipe, device_type: str) -> list[tuple[str, bool, dict]]:
    """The ablation: ``(label, is_baseline, recipe overrides)``, each row adding one optimization.

    Starts from the torch-native baseline, then our trainer with only the fused LM head + loss (torch
    FSDP2 as in the baseline, every block checkpointed, SDPA cuDNN, torch's fused AdamW, nothing
    compiled), then adds one piece per row; the last row is ``recipe``'s own configuration (for the GPU
    recipes, the default ``train.py`` step).
    """
    attention = "cudnn" if device_type == "cuda" else "math"
    step = {
        "sharding": "fsdp2",
        "attention": attention,
        "fused_loss": True,
        "compile_regions": False,
        "fused_block": False,
        "optimizer": "torch",
        "checkpoint_blocks": recipe.model_config().num_layers,
    }
    rows = [("baseline (torch FSDP2, SDPA, every block checkpointed, fused torch AdamW)", True, {})]
    rows.append(("+ fused LM head + cross-entropy", False, dict(step)))
    step["compile_regions"] = True
    rows.append(("+ torch.compile of RMSNorm, RoPE, SwiGLU", False, dict(step)))
    step["fused_block"] = True
    rows.append(("+ fused residual add + RMSNorm, RoPE of q and k, SwiGLU backward", False, dict(step)))
    step["checkpoint_blocks"] = -1
    rows.append(("+ recompute only what memory needs (SwiGLUs first, then whole blocks)", False, dict(step)))
    step["optimizer"] = "auto"  # Triton on CUDA; torch where Triton cannot run
    rows.append(("+ Triton AdamW", False, dict(step)))
    step["attention"] = "auto"
    rows.append(("+ fastest attention kernel measured (flashattn Triton, cuDNN, flash)", False, dict(step)))
    if recipe.sharding != "fsdp2":
        step["sharding"] = recipe.sharding
        rows.append(("+ our parallel.FSDP (flat block units) instead of torch FSDP2", False, dict(step)))
    if recipe.offload_blocks == -1:
        step["offload_blocks"] = -1
        rows.append(
            ("+ offload tier: saved activations to pinned host memory where cheaper", False, dict(step))
        )
    return _proxy_labels(recipe, rows)


def ablation_alternatives(recipe: Recipe, device_type: str) -> list[tuple[str, bool, dict]]:
    """Rows that change one setting of the fully optimized step (compared, not added): on CUDA, the
    automatic plan with the offload tier (unless the recipe has it already); when the recipe plans with
    any memory headroom, 8 GiB more and 8 GiB less of it."""
    full = ablation_steps(recipe, device_type)[-1][2]
    headroom = recipe.memory_headroom_gib
    rows = [
        (
            f"full step planned with {changed:g} GiB memory headroom instead of {headroom:g}",
            False,
            {**full, "memory_headroom_gib": changed},
        )
        for changed in ((headroom + 8, headroom - 8) if headroom >= 8 else ())
    ]
    if device_type == "cuda" and recipe.offload_blocks == 0 and full["checkpoint_blocks"] == -1:
        label = "full step with the offload tier (saved activations to pinned host memory where cheaper)"
        rows.insert(0, (label, False, {**full, "offload_blocks": -1}))
    return _proxy_labels(recipe, rows)


def _proxy_labels(recipe: Recipe, rows: list[tuple[str, bool, dict]]) -> list[tuple[str, bool, dict]]:
    """Rows of a single-GPU proxy say so, so that no table reads as the full step's."""
    if recipe.proxy_ranks == 1:
        return rows
    return [(f"proxy (1 GPU for 1 of {recipe.proxy_ranks} ranks): {label}", *rest) for label, *rest in rows]
