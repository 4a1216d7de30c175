"""FSDP against single-process training of the same model, on gloo with 2 and 4 processes (CPU)."""

import copy
import gc
import warnings
import weakref

import pytest
import torch
import torch.distributed as dist
from cs336_basics.model import BasicsTransformerLM, TransformerBlock
from cs336_basics.nn_utils import cross_entropy
from parallel.fsdp import FSDP
from parallel.launch import spawn
from torch import nn
from torch.utils.checkpoint import checkpoint

CONFIG = dict(vocab_size=97, context_length=16, d_model=24, num_layers=2, num_heads=3, d_ff=40)
BATCH, SEQ = 2, 11  # per rank


def _model(tied=False, device=None, seed=0):
    torch.manual_seed(seed)
    model = BasicsTransformerLM(**CONFIG, device=device)
    if tied:
        model.lm_head.weight = model.token_embeddings.weight
    return model


def _batch(step, rank):
    gen = torch.Generator().manual_seed(7919 * step + rank)
    ids = torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ + 1), generator=gen)
    return ids[:, :-1], ids[:, 1:]


def _full_batch(step, world_size):
    parts = [_batch(step, r) for r in range(world_size)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.5, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=2e-2, weight_decay=0.1),
}
# AdamW divides by sqrt(v): where a gradient is ~0, summation-order noise moves a weight by up to ~1% of lr.
TOLERANCE = {"sgd": 2e-5, "adamw": 2e-4}


def _reference(world_size, steps, optimizer, tied, compute_dtype=None):
    """Single-process training on every rank's batch at once; forward/backward in ``compute_dtype``."""
    model = _model(tied)
    opt = OPTIMIZERS[optimizer](model.parameters())
    for step in range(steps):
        x, y = _full_batch(step, world_size)
        if compute_dtype is None:
            cross_entropy(model(x), y).backward()
        else:  # the same cast FSDP does: low-precision copy of the weights, fp32 master update
            low = copy.deepcopy(model).to(compute_dtype)
            for p in low.parameters():
                if p.dim() == 1:  # norm gains stay fp32 under FSDP (replicated parameters)
                    p.data = p.data.float()
            cross_entropy(low(x), y).backward()
            for p, q in zip(model.parameters(), low.parameters(), strict=True):
                p.grad = q.grad.float()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _train_fsdp(rank, world_size, steps, optimizer, tied, compute_dtype, units, wrap_checkpoint=False):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = _model(tied)
        if wrap_checkpoint:
            model.layers = nn.ModuleList(_Checkpointed(block) for block in model.layers)
        fsdp = FSDP(model, compute_dtype=compute_dtype, unit_modules=units)
        opt = OPTIMIZERS[optimizer](fsdp.parameters())
        for step in range(steps):
            x, y = _batch(step, rank)
            cross_entropy(fsdp(x), y).backward()
            fsdp.finish_gradient_synchronization()
            grads_ok = all(s.grad is not None and s.grad.shape == s.shape and s.grad.dtype == torch.float32
                           for s in fsdp.flat_shards())
            replicated = [p.grad.clone() for p in fsdp.replicated_parameters()]
            opt.step()
            opt.zero_grad()
        full = fsdp.gather_full_params()
    messages = [str(w.message) for w in caught]
    return {n: t.numpy() for n, t in full.items()}, grads_ok, [g.numpy() for g in replicated], messages


class _Checkpointed(nn.Module):
    """Re-runs the block's forward in backward (non-reentrant activation checkpointing)."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x, positions=None):
        return checkpoint(self.block, x, positions, use_reentrant=False)


def _compare(results, reference, atol):
    for full, grads_ok, _, messages in results:
        assert grads_ok
        assert messages == []
        assert list(full) == list(reference)
        for name, value in full.items():
            assert value.shape == tuple(reference[name].shape), name
            torch.testing.assert_close(torch.from_numpy(value), reference[name], atol=atol, rtol=0, msg=name)
    for _, _, replicated, _ in results[1:]:  # replicated gradients agree across ranks
        for a, b in zip(results[0][2], replicated, strict=True):
            assert (a == b).all()


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_fp32_equals_single_process(world_size, optimizer):
    steps = 4
    results = spawn(_train_fsdp, world_size, steps, optimizer, False, None, (), timeout=180)
    _compare(results, _reference(world_size, steps, optimizer, False), atol=TOLERANCE[optimizer])


@pytest.mark.parametrize("units", [(), (TransformerBlock,)], ids=["per-layer", "per-block"])
def test_tied_weights_and_block_units(units):
    steps = 4
    results = spawn(_train_fsdp, 2, steps, "adamw", True, None, units, timeout=180)
    reference = _reference(2, steps, "adamw", True)
    _compare(results, reference, atol=TOLERANCE["adamw"])
    assert "lm_head.weight" not in results[0][0]  # the tied weight appears once, under its first name


@pytest.mark.parametrize("wrap_checkpoint", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("units", [(), (TransformerBlock,)], ids=["per-layer", "per-block"])
def test_activation_checkpointing(units, wrap_checkpoint):
    results = spawn(_train_fsdp, 2, 3, "adamw", False, None, units, wrap_checkpoint, timeout=180)
    reference = _reference(2, 3, "adamw", False)
    if wrap_checkpoint:  # the wrapper adds ".block" to the block parameters' names
        reference = {n.replace("layers.0.", "layers.0.block.").replace("layers.1.", "layers.1.block."): v
                     for n, v in reference.items()}
    _compare(results, reference, atol=TOLERANCE["adamw"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_within_budget_of_same_cast(dtype):
    steps = 3
    results = spawn(_train_fsdp, 2, steps, "sgd", False, dtype, (TransformerBlock,), timeout=180)
    exact = _reference(2, steps, "sgd", False)
    cast = _reference(2, steps, "sgd", False, compute_dtype=dtype)
    for full, grads_ok, _, messages in results:
        assert grads_ok and messages == []
        for name, value in full.items():
            ours = (torch.from_numpy(value) - exact[name]).abs().max().item()
            plain = (cast[name] - exact[name]).abs().max().item()
            assert ours <= 2 * plain + 1e-3, (name, ours, plain)


def _meta_init(rank, world_size, units):
    fsdp = FSDP(_model(device="meta"), unit_modules=units, seed=5)
    full = fsdp.gather_full_params()
    x, _ = _batch(0, 0)
    with torch.no_grad():
        logits = fsdp(x)
    return {n: t.numpy() for n, t in full.items()}, logits.numpy()


@pytest.mark.parametrize("units", [(), (TransformerBlock,)], ids=["per-layer", "per-block"])
def test_meta_model_materialized_identically_on_any_world_size(units):
    one = spawn(_meta_init, 2, units, timeout=120)[0]
    for full, logits in spawn(_meta_init, 3, units, timeout=120):
        assert full.keys() == one[0].keys()
        for name in full:
            assert (full[name] == one[0][name]).all(), name
        torch.testing.assert_close(torch.from_numpy(logits), torch.from_numpy(one[1]), atol=1e-5, rtol=1e-5)
    full = one[0]
    assert (full["layers.0.ln1.weight"] == 1).all()
    std = full["layers.1.ffn.w2.weight"].std()
    expected = (2 / (CONFIG["d_model"] + CONFIG["d_ff"])) ** 0.5
    assert 0.7 * expected < std < 1.1 * expected  # truncated normal at 3 sigma
    assert not (full["layers.0.attn.q_proj.weight"] == full["layers.1.attn.q_proj.weight"]).all()


def _steps(fsdp, opt, steps, rank):
    """``steps`` training steps on this rank's batches."""
    for step in range(steps):
        x, y = _batch(step, rank)
        cross_entropy(fsdp(x), y).backward()
        fsdp.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()


def _save(rank, world_size, path):
    fsdp = FSDP(_model(tied=True), unit_modules=(TransformerBlock,))
    _steps(fsdp, torch.optim.AdamW(fsdp.parameters(), lr=1e-2), 2, rank)
    fsdp.save_full_state_dict(path)
    x, _ = _batch(9, 0)
    with torch.no_grad():
        return fsdp(x).numpy()


def _load(rank, world_size, path):
    fsdp = FSDP(_model(tied=True, seed=1))  # other initial values, per-layer units: a different layout
    fsdp.load_full_state_dict(path)
    x, _ = _batch(9, 0)
    with torch.no_grad():
        logits = fsdp(x).numpy()
    return logits, {n: t.numpy() for n, t in fsdp.state_dict().items()}


def test_state_dict_saved_on_two_ranks_loads_on_four(tmp_path):
    path = tmp_path / "model.pt"
    saved_logits = spawn(_save, 2, path, timeout=180)[0]
    saved = torch.load(path)
    plain = _model(tied=True, seed=2)
    plain.load_state_dict(saved)  # a plain module accepts the full state dict
    assert saved.keys() == plain.state_dict().keys()
    assert torch.equal(saved["lm_head.weight"], saved["token_embeddings.weight"])
    for logits, state in spawn(_load, 4, path, timeout=180):
        torch.testing.assert_close(torch.from_numpy(logits), torch.from_numpy(saved_logits), atol=1e-5,
                                   rtol=1e-5)
        for name, value in state.items():
            assert (value == saved[name].numpy()).all(), name


def _replicated_grads_and_eval(rank, world_size):
    fsdp = FSDP(_model(), unit_modules=(TransformerBlock,))
    x, y = _batch(0, rank)
    with torch.no_grad():  # an evaluation forward first must not disturb training
        fsdp(x)
    cross_entropy(fsdp(x), y).backward()
    fsdp.finish_gradient_synchronization()
    gathered_left = fsdp.gathered_units()
    return [p.grad.numpy() for p in fsdp.replicated_parameters()], gathered_left


def test_replicated_gradients_identical_and_nothing_left_gathered():
    results = spawn(_replicated_grads_and_eval, 3, timeout=120)
    for grads, left in results:
        assert left == []
        assert len(grads) == 1  # the final norm; the blocks' norm gains belong to the block units
        for a, b in zip(results[0][0], grads, strict=True):
            assert (a == b).all()
    # the averaged norm gradient equals the single-process one
    model = _model()
    x, y = _full_batch(0, 3)
    cross_entropy(model(x), y).backward()
    averaged = torch.from_numpy(results[0][0][-1])
    torch.testing.assert_close(averaged, model.ln_final.weight.grad, atol=1e-6, rtol=1e-5)


def _full_grads(rank, world_size, tied):
    fsdp = FSDP(_model(tied), unit_modules=(TransformerBlock,))
    x, y = _batch(0, rank)
    cross_entropy(fsdp(x), y).backward()
    fsdp.finish_gradient_synchronization()
    return {name: g.numpy() for name, g in fsdp.gather_full_grads().items()}


@pytest.mark.parametrize("tied", [False, True])
def test_gather_full_grads_equals_single_process_gradients(tied):
    results = spawn(_full_grads, 2, tied, timeout=120)
    model = _model(tied)
    x, y = _full_batch(0, 2)
    cross_entropy(model(x), y).backward()
    expected = dict(model.named_parameters())  # tied weights appear once, under their first name
    for grads in results:
        assert list(grads) == list(expected)
        for name, g in grads.items():
            torch.testing.assert_close(torch.from_numpy(g), expected[name].grad, atol=1e-6, rtol=1e-5)


def _dropped_wrapper_is_freed(rank, world_size):
    fsdp = FSDP(_model(), unit_modules=(TransformerBlock,))
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-3)
    x, y = _batch(0, rank)
    cross_entropy(fsdp(x), y).backward()
    fsdp.finish_gradient_synchronization()
    opt.step()
    kept = [fsdp, fsdp.flat_shards()[0], fsdp.replicated_parameters()[0]]
    refs = [weakref.ref(t) for t in kept]
    del kept
    del fsdp, opt
    gc.collect()
    return [r() is None for r in refs]


def test_dropped_wrapper_frees_its_shards():
    """Gradient hooks must not keep the wrapper (and every shard) alive once the caller drops it."""
    assert spawn(_dropped_wrapper_is_freed, 2, timeout=120) == [[True, True, True]] * 2


def _prefetch_distance(rank, world_size, prefetch):
    fsdp = FSDP(_model(tied=True), prefetch=prefetch)
    _steps(fsdp, torch.optim.SGD(fsdp.parameters(), lr=0.5), 3, rank)
    return {n: t.numpy() for n, t in fsdp.gather_full_params().items()}


def test_prefetch_distance_changes_no_result():
    results = [spawn(_prefetch_distance, 2, prefetch, timeout=120)[0] for prefetch in (0, 1, 3)]
    for other in results[1:]:
        for name, value in results[0].items():
            assert (value == other[name]).all(), name


def _load_partial(rank, world_size, strict, bad_shape):
    fsdp = FSDP(_model())
    state = _model(seed=3).state_dict()
    del state["ln_final.weight"]
    if bad_shape:
        state["lm_head.weight"] = torch.zeros(3, 3)
    fsdp.load_state_dict(state, strict=strict)
    full = fsdp.gather_full_params()
    return full["lm_head.weight"].numpy(), full["ln_final.weight"].numpy()


def test_load_state_dict_checks_keys_and_shapes():
    head, gain = spawn(_load_partial, 2, False, False, timeout=60)[0]
    assert (head == _model(seed=3).lm_head.weight.detach().numpy()).all()
    assert (gain == 1).all()  # absent from the state dict: kept as it was
    with pytest.raises(Exception, match=r"missing keys \['ln_final.weight'\]"):
        spawn(_load_partial, 2, True, False, timeout=60)
    with pytest.raises(Exception, match=r"state_dict\['lm_head.weight'\] has shape \(3, 3\)"):
        spawn(_load_partial, 2, False, True, timeout=60)


def _bad(rank, world_size, kwargs):
    FSDP(_model(), **kwargs)


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(unit_modules=("TransformerBlock",)), "unit_modules must be nn.Module subclasses"),
    (dict(compute_dtype=torch.int8), "compute_dtype must be a floating-point"),
    (dict(prefetch=-1), "prefetch must be a non-negative int"),
    (dict(device="meta"), "device must be a CPU or CUDA device"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(Exception, match=message):
        spawn(_bad, 2, kwargs, timeout=60)


def test_needs_process_group():
    with pytest.raises(RuntimeError, match="process group"):
        FSDP(_model())


def test_worker_sees_group():
    assert spawn(lambda rank, world_size: dist.get_world_size(), 2, timeout=60) == [2, 2]


# ----------------------------------------------------------------------------------------------- GPU (NCCL)
def _train_fsdp_cuda(compute_dtype, units, wrap_checkpoint, prefetch, steps=5, layers=6):
    torch.manual_seed(0)
    model = BasicsTransformerLM(**{**CONFIG, "num_layers": layers, "d_model": 96, "d_ff": 264})
    if wrap_checkpoint:
        model.layers = nn.ModuleList(_Checkpointed(block) for block in model.layers)
    fsdp = FSDP(model, compute_dtype=compute_dtype, unit_modules=units, prefetch=prefetch)
    waits = []
    fsdp.register_gather_observer(lambda index, phase, ready: waits.append((index, phase)))
    opt = torch.optim.SGD(fsdp.parameters(), lr=0.5, momentum=0.9)
    for step in range(steps):
        x, y = (t.cuda() for t in _batch(step, dist.get_rank()))
        cross_entropy(fsdp(x), y).backward()
        fsdp.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()
    timed = len(waits)
    return {n: t.numpy() for n, t in fsdp.gather_full_params().items()}, timed


def _prefetch_variants(rank, world_size, compute_dtype):
    eager = _train_fsdp_cuda(compute_dtype, (TransformerBlock,), True, prefetch=0)
    ahead = _train_fsdp_cuda(compute_dtype, (TransformerBlock,), True, prefetch=2)
    per_layer = _train_fsdp_cuda(compute_dtype, (), False, prefetch=2)
    return eager, ahead, per_layer


@pytest.mark.gpu
@pytest.mark.parametrize("compute_dtype", [None, torch.bfloat16])
def test_cuda_streams_prefetch_changes_no_result(compute_dtype):
    """Prefetching on the side stream computes exactly what on-demand gathering does (no stream race)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    eager, ahead, per_layer = spawn(_prefetch_variants, 2, compute_dtype, backend="nccl", timeout=300)[0]
    assert ahead[1] > 0  # gathers were timed
    for name, value in eager[0].items():
        assert (value == ahead[0][name]).all(), name
        tol = 1e-4 if compute_dtype is None else 2e-2
        other = torch.from_numpy(per_layer[0][name.replace(".block.", ".")])  # no checkpoint wrapper there
        torch.testing.assert_close(other, torch.from_numpy(value), atol=tol, rtol=0)
