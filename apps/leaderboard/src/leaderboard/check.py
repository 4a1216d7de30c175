"""Equivalence check: one step of the optimized trainer against the reference model.

Reference: ``cs336_basics.BasicsTransformerLM`` in fp32 with its naive attention, ``cs336_basics``'s
``cross_entropy`` on the whole global batch, backward, one ``cs336_basics.AdamW`` step, all on one rank.
Each trainer starts from the same weights, runs one step on its rank's rows of the same batch, and is
compared on: the loss, every gradient (relative L2 error of all gradients together) and the weight
update ``w_after - w_before`` (relative L2 error against the reference update).

Tolerances (``TOLERANCES``): fp32 compute must agree to rounding of different summation orders
(and TF32 inside a Triton attention kernel on GPUs). BF16 compute has an error budget: its errors
may be at most twice the torch-native baseline's in BF16 (FSDP2 with bf16 params) plus a small floor,
and never above an absolute cap. AdamW's first update is about ``lr * sign(grad)``, so a few
gradient entries near zero flipping sign under bf16 move the update error far more than the gradients'.
"""

from __future__ import annotations

import pandas as pd
import torch
from cs336_basics import AdamW, build_model, cross_entropy
from parallel.heartbeat import beat
from torch import Tensor

from .baseline import build_baseline
from .optimized import build_optimized
from .recipes import Recipe
from .trainer import Trainer, random_batch

# metric -> (fp32 absolute limit, bf16 floor over twice the baseline's error, bf16 absolute cap)
TOLERANCES = {
    "loss_rel_err": (1e-5, 2e-3, 1e-2),
    "grad_rel_err": (2e-3, 1e-2, 0.1),
    "update_rel_err": (2e-2, 0.05, 0.5),
}


def _rel_err(got: dict[str, Tensor], want: dict[str, Tensor]) -> float:
    num = sum(float((got[k].double() - want[k].double()).pow(2).sum()) for k in want)
    den = sum(float(want[k].double().pow(2).sum()) for k in want)
    return (num / max(den, 1e-300)) ** 0.5


def reference_step(recipe: Recipe, device: torch.device, tokens: Tensor, targets: Tensor):
    """Initial weights, loss, gradients and weights after one AdamW step of the fp32 reference."""
    torch.manual_seed(recipe.seed)
    model = build_model(recipe.model_config(), device=device, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = cross_entropy(model(tokens), targets)
    loss.backward()
    loss = loss.detach()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=recipe.weight_decay).step()
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    return before, loss.item(), grads, after


def _measure(
    trainer: Trainer,
    before: dict,
    ref_loss: float,
    ref_grads: dict,
    ref_after: dict,
    tokens: Tensor,
    targets: Tensor,
) -> dict:
    import torch.distributed as dist

    trainer.load_parameters(before)
    loss = trainer.forward_backward(tokens, targets).double().reshape(1)
    dist.all_reduce(loss)
    loss = float(loss) / dist.get_world_size()
    grads = trainer.full_gradients()
    trainer.optimizer_step()
    after = {k: v.to(before[k].device) for k, v in trainer.full_parameters().items()}
    update = {k: after[k] - before[k] for k in before}
    ref_update = {k: ref_after[k] - before[k] for k in before}
    return {
        "loss": loss,
        "loss_rel_err": abs(loss - ref_loss) / abs(ref_loss),
        "grad_rel_err": _rel_err(grads, ref_grads),
        "update_rel_err": _rel_err(update, ref_update),
    }


def run_check(rank: int, world_size: int, device: torch.device, recipe: Recipe) -> dict:
    """Compare optimized (fp32, bf16) and baseline (bf16) trainers with the reference; every rank returns
    ``{"passed", "rows", "table"}``."""
    recipe.validate(world_size)
    cfg = recipe.model_config()
    if recipe.checkpoint_blocks < 0:  # exercise recomputed blocks, recomputed SwiGLUs and kept blocks
        recipe = recipe.with_(
            checkpoint_blocks=max(1, cfg.num_layers // 3), checkpoint_ffn=max(1, cfg.num_layers // 3)
        )
    tokens, targets = random_batch(
        cfg.vocab_size, recipe.batch_size, cfg.context_length, recipe.seed + 1, device
    )
    beat("check: reference step")
    before, ref_loss, ref_grads, ref_after = reference_step(recipe, device, tokens, targets)
    per_rank = recipe.batch_size // world_size
    rows = slice(rank * per_rank, (rank + 1) * per_rank)
    local = (tokens[rows], targets[rows])

    results = {}
    for label, dtype in (("optimized fp32", torch.float32), ("optimized bf16", torch.bfloat16)):
        beat(f"check: {label}")
        results[label] = _measure(
            build_optimized(recipe, device, per_rank, dtype), before, ref_loss, ref_grads, ref_after, *local
        )
    beat("check: baseline bf16")
    results["baseline bf16"] = _measure(
        build_baseline(recipe, device, per_rank, torch.bfloat16),
        before,
        ref_loss,
        ref_grads,
        ref_after,
        *local,
    )

    table_rows, passed = [], True
    for label, measured in results.items():
        for metric, (fp32_limit, floor, cap) in TOLERANCES.items():
            if label == "optimized fp32":
                limit = fp32_limit
            elif label == "optimized bf16":
                limit = min(cap, 2 * (results["baseline bf16"][metric] or 0.0) + floor)
            else:
                limit = cap
            ok = measured[metric] <= limit
            passed &= ok
            table_rows.append(
                {"trainer": label, "metric": metric, "error": measured[metric], "limit": limit, "ok": ok}
            )
    table = pd.DataFrame(table_rows)
    return {
        "passed": bool(passed),
        "reference_loss": ref_loss,
        "rows": table_rows,
        "table": table.to_markdown(index=False, floatfmt=".3g"),
    }
