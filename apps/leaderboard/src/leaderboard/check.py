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

Memory: before anything is built the check plans the largest reference the device holds
(``check_memory.plan_check``); at a shorter context or with fewer blocks than the recipe's, it checks the
same code on that smaller model and says so in its result.
"""

from __future__ import annotations

import pandas as pd
import torch
from cs336_basics import AdamW, ModelConfig, build_model, cross_entropy
from parallel.heartbeat import beat
from torch import Tensor

from .build import build_trainer
from .check_memory import plan_check
from .measured_plan import available_bytes
from .ranks import mean_over_ranks, random_batch, rank_rows
from .recipe import Recipe
from .trainer import Trainer

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


def reference_step(
    recipe: Recipe, config: ModelConfig, device: torch.device, tokens: Tensor, targets: Tensor
):
    """Initial weights, loss, gradients and weights after one AdamW step of the fp32 reference."""
    torch.manual_seed(recipe.training.seed)
    model = build_model(config, device=device, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = cross_entropy(model(tokens), targets)
    loss.backward()
    loss = loss.detach()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    settings = recipe.optimizer
    AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=settings.weight_decay).step()
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
    trainer.load_parameters(before)
    loss = mean_over_ranks(trainer.forward_backward(tokens, targets))
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
    ``{"passed", "rows", "table", "reference_loss", "shrunk"}`` (``shrunk``: what the memory plan made
    smaller than the recipe, or "")."""
    free = available_bytes(device) if device.type == "cuda" else None
    shape = plan_check(recipe.model_config(), recipe.training.batch_size, free)
    config, layers = shape.config, shape.config.num_layers
    if shape.note and rank == 0:
        print(f"check: {shape.note}", flush=True)
    recipe = recipe.with_(context_length=config.context_length)
    if recipe.activation_checkpoint.blocks < 0:  # exercise recomputed blocks, recomputed SwiGLUs, kept blocks
        recipe = recipe.with_(checkpoint_blocks=max(1, layers // 3), checkpoint_ffn=max(1, layers // 3))
    batch = recipe.training.batch_size
    tokens, targets = random_batch(
        config.vocab_size, batch, config.context_length, recipe.training.seed + 1, device
    )
    beat("check: reference step")
    before, ref_loss, ref_grads, ref_after = reference_step(recipe, config, device, tokens, targets)
    rows = rank_rows(batch, rank, world_size)
    local = (tokens[rows], targets[rows])
    per_rank = batch // world_size

    results = {}
    for label, dtype, baseline in (("optimized fp32", torch.float32, False),
                                   ("optimized bf16", torch.bfloat16, False),
                                   ("baseline bf16", torch.bfloat16, True)):  # fmt: skip
        beat(f"check: {label}")
        trainer = build_trainer(recipe, config, device, per_rank, baseline, dtype)
        results[label] = _measure(trainer, before, ref_loss, ref_grads, ref_after, *local)
        del trainer  # before the next one is built

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
        "shrunk": shape.note,
        "rows": table_rows,
        "table": table.to_markdown(index=False, floatfmt=".3g"),
    }
