"""Fewer passes over activations in a ``cs336_basics.TransformerBlock``, by swapping in fused modules.

Independent fusions (``FUSIONS``), each replacing one of the block's modules by a subclass of its
``cs336_basics`` class that overrides one method (a forward, or a slot the reference forwards call) with
this app's fused piece. The new module is made by ``adopt``: it holds the old one's submodules and
Parameter objects, so the parameter names, checkpoints, state dicts and both sharding wrappers see the
reference model. The optimized step applies ``STEP_FUSIONS``, each measured on a GPU (docs/leaderboard.md,
"Fusions"):

- ``rope``: ``attn`` becomes a ``FusedRopeAttention``, rotating q and k in one region that keeps the
  projections' layout (``fused_rope``), so the attention output and the gradients of q, k and the output
  need no copies;
- ``norm``: ``ln2`` becomes a ``FusedAddRMSNorm``, adding the attention's output to the residual and
  normalizing in one region returning both (``fused_norm.add_rmsnorm``);
- ``swiglu``: ``ffn`` becomes a ``FusedSwiGLU``, computing ``fused_swiglu.swiglu`` on its three weights.
"""

from __future__ import annotations

from cs336_basics import TransformerBlock
from torch import nn

from .adopt import adopt
from .fused_norm import FusedAddRMSNorm
from .fused_rope import FusedRopeAttention
from .fused_swiglu import FusedSwiGLU

FUSED_MODULES: dict[str, tuple[str, type[nn.Module]]] = {
    "rope": ("attn", FusedRopeAttention),
    "norm": ("ln2", FusedAddRMSNorm),
    "swiglu": ("ffn", FusedSwiGLU),
}
"""Each fusion: the name of the block's module it replaces and the fused class."""
FUSIONS = tuple(FUSED_MODULES)
STEP_FUSIONS = ("rope", "norm", "swiglu")


def fuse_block(block: TransformerBlock, fusions: tuple[str, ...] = STEP_FUSIONS) -> list[nn.Module]:
    """Apply ``fusions`` (a subset of ``FUSIONS``) to ``block`` in place; call before wrapping its modules
    (checkpointing, sharding). Returns the block's modules whose own forward still runs (``ln1``, and
    ``ln2`` and ``ffn`` where not fused): compile each as a region of its own, or it runs eagerly (in bf16
    an eager RMSNorm keeps an fp32 copy of its input for backward)."""
    unknown = set(fusions) - set(FUSIONS)
    if unknown:
        raise ValueError(f"fusions must be among {FUSIONS}, got {sorted(unknown)}")
    if not isinstance(block, TransformerBlock):
        raise TypeError(f"block must be a cs336_basics TransformerBlock, got {type(block).__name__}")
    for fusion in fusions:
        name, fused_class = FUSED_MODULES[fusion]
        module = getattr(block, name)
        if not issubclass(fused_class, type(module)):
            raise TypeError(
                f"block.{name} must be a cs336_basics {fused_class.__base__.__name__} for the {fusion!r} "
                f"fusion (fuse before wrapping), got {type(module).__name__}"
            )
    for fusion in fusions:
        name, fused_class = FUSED_MODULES[fusion]
        setattr(block, name, adopt(fused_class, getattr(block, name)))
    fused_away = (FusedAddRMSNorm, FusedSwiGLU)  # their forwards do not run in the block
    return [module for module in (block.ln1, block.ln2, block.ffn) if not isinstance(module, fused_away)]
