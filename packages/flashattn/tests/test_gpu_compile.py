"""GPU tests of flashattn inside compiled models: ``torch.compile(fullgraph=True)`` with inductor over
``cs336_basics``' Transformer with :func:`flashattn.flash_attention` in its attention slot (one graph, no
break, loss and gradients as eager's), and a compiled training step (forward, loss, backward, AdamW)
replayed as CUDA graphs (``mode="reduce-overhead"``) that trains as the eager step does.

Eager and compiled runs share bf16 weights; both are compared with the same model in fp32 (the portable
kernels' tf32x3 dots, about fp32's accuracy): the compiled run may be at most about as far from it as eager.
"""

import copy

import pytest
import torch
from flashattn import flash_attention
from harness.testing import relative_error

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

VOCAB, BATCH, SEQ = 503, 2, 97


def transformer(head_dim: int, device: str, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """Two blocks of 4 heads of ``head_dim`` with ``flash_attention`` in the attention slot."""
    model_module = pytest.importorskip("cs336_basics.model")
    torch.manual_seed(seed)
    return model_module.BasicsTransformerLM(
        vocab_size=VOCAB, context_length=128, d_model=4 * head_dim, num_layers=2, num_heads=4,
        d_ff=8 * head_dim + 24, attention_fn=flash_attention, device=device, dtype=dtype,
    )  # fmt: skip


def batch(device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen).to(device)
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def loss_and_grads(model, inputs, targets) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = loss_of(model, inputs, targets)
    loss.backward()
    return loss.item(), [p.grad.detach().clone() for p in model.parameters()]


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().double().flatten() for t in tensors])


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def check_compiled_matches_eager(head_dim: int, device: str, dtype: torch.dtype) -> dict[str, float]:
    """One graph for the whole model; the compiled loss and every parameter's gradient as close to the fp32
    model's as the same model compiled with SDPA in the slot (within twice, plus a slack under bf16's
    resolution); returns the errors."""
    model = transformer(head_dim, device, dtype)
    inputs, targets = batch(device, seed=1)
    explained = torch._dynamo.explain(model)(inputs)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained
    code = "".join(g.code for graph in explained.graphs for g in graph.modules() if hasattr(g, "code"))
    assert "flashattn" in code, "the attention op is not in the traced graph"

    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)  # inductor
    # the compiler changes the rest of the model's numerics too (at d 48 its fused bf16 kernels move the loss
    # by ~0.03 with SDPA in the slot as well): the reference is the same model compiled with SDPA
    with_sdpa = copy.deepcopy(model)
    with_sdpa.set_attention_fn(sdpa)
    reference = torch.compile(with_sdpa, fullgraph=True)
    exact = copy.deepcopy(model).float()
    ref_loss, ref_grads = loss_and_grads(reference, inputs, targets)
    compiled_loss, compiled_grads = loss_and_grads(compiled, inputs, targets)
    exact_loss, exact_grads = loss_and_grads(exact, inputs, targets)
    errors = {"loss": abs(compiled_loss - exact_loss), "sdpa loss": abs(ref_loss - exact_loss)}
    assert errors["loss"] <= 2 * errors["sdpa loss"] + 1e-2, errors
    for (name, p), a, b, gold in zip(model.named_parameters(), compiled_grads, ref_grads, exact_grads,
                                     strict=True):  # fmt: skip
        assert a.dtype == b.dtype == p.dtype and torch.isfinite(a).all(), name
        ours, theirs = relative_error(a, gold, floor=1e-6), relative_error(b, gold, floor=1e-6)
        errors[name], errors[f"{name} sdpa"] = ours, theirs
        assert ours <= 2 * theirs + 4e-3, f"{name}: error {ours:.2e}, compiled with SDPA {theirs:.2e}"
    return errors


@pytest.mark.parametrize("head_dim", [64, 48], ids=["d64", "d48"])
def test_compiled_op_is_bitwise_eager(head_dim):
    """The op inside an inductor graph (with fused work around it) gives exactly eager's output."""
    q, k, v = (torch.randn(2, 4, 97, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    compiled = torch.compile(lambda q, k, v: flash_attention(q * 1.5, k, v, True) * 2, fullgraph=True)
    try:
        assert torch.equal(compiled(q, k, v), flash_attention(q * 1.5, k, v, True) * 2)
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("head_dim", [64, 48], ids=["d64", "d48"])
def test_fullgraph_inductor_matches_eager(head_dim):
    """d 64 runs the sm90 kernels on H100 / H200 (the portable ones elsewhere), d 48 the portable ones."""
    try:
        check_compiled_matches_eager(head_dim, "cuda", torch.bfloat16)
    finally:
        torch._dynamo.reset()


def train(model, steps: int, device: str, compile_mode: str | None) -> tuple[list[float], list[torch.Tensor]]:
    """``steps`` AdamW steps on one batch; ``compile_mode``: None (eager) or a ``torch.compile`` mode for the
    forward + loss (its backward compiled with it) and for the optimizer step. Returns the losses and the
    final parameters."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=device == "cuda", foreach=True)
    forward = lambda x, y: loss_of(model, x, y)
    update = opt.step
    if compile_mode is not None:
        forward = torch.compile(forward, mode=compile_mode, fullgraph=True)
        update = torch.compile(update, mode=compile_mode)  # the step's own graph break stays
    inputs, targets = batch(device, seed=2)
    losses = []
    for _ in range(steps):
        torch.compiler.cudagraph_mark_step_begin()
        loss = forward(inputs, targets)
        loss.backward()
        with torch.no_grad():
            update()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


def recorded_cudagraphs() -> int:
    """How many CUDA graphs the cudagraph trees of the current device have recorded (as torch's own tests of
    compiled optimizers count them)."""
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_container(torch.cuda.current_device()).tree_manager
    return 0 if manager is None else manager.new_graph_id().id


def test_training_step_replays_as_cuda_graphs_and_trains_as_eager():
    """Six steps: the first warms up, the second records, the rest replay the recorded graphs; no part is
    left out of CUDA graphs (a host sync or a CPU tensor in the call path would be); the losses and the
    trained weights are eager's within bf16's resolution."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    try:
        model = transformer(64, "cuda", torch.bfloat16)
        eager = copy.deepcopy(model)
        losses, weights = train(model, 6, "cuda", "reduce-overhead")
        skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
        assert skips == 0, f"{skips} compiled graphs ran without CUDA graphs"
        assert recorded_cudagraphs() >= 3, "forward, backward and optimizer step are not all CUDA graphs"
        eager_losses, eager_weights = train(eager, 6, "cuda", None)
    finally:
        torch._dynamo.reset()
    assert max(abs(a - b) for a, b in zip(losses, eager_losses, strict=True)) < 2e-2, (losses, eager_losses)
    assert losses[-1] < losses[0] - 0.05, losses  # it trains
    assert relative_error(flat(weights), flat(eager_weights), floor=1e-6) < 1e-2
