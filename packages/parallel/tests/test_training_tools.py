"""Clipping, gradient accumulation and the model-consistency check on every wrapper (gloo, CPU), against
torch's own ``clip_grad_norm_`` and single-process float64 gradients."""

import contextlib
import math

import pytest
import torch
import torch.distributed as dist
from lm_cases import WRAPPERS, rank_rows
from parallel import DDP, FSDP, BucketedDDP, ShardedOptimizer
from parallel.launch import WorkerError, spawn

ROWS = 6  # sequences per step, split evenly over 2 or 3 ranks
COLLECTIVES = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast")


@contextlib.contextmanager
def _counting(counts: dict):
    """Count calls of the collectives that the wrappers use (``torch.distributed.<name>``) on the default
    group, not the small agreement checks (``parallel.grad_presence``, ``parallel.lockstep``) in their own."""
    originals = {name: getattr(dist, name) for name in COLLECTIVES}

    def counted(name):
        def call(*args, **kwargs):
            if kwargs.get("group") in (None, dist.group.WORLD):
                counts[name] = counts.get(name, 0) + 1
            return originals[name](*args, **kwargs)
        return call

    for name in COLLECTIVES:
        setattr(dist, name, counted(name))
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def _grads(model):
    if isinstance(model, FSDP):
        return {n: g.double().numpy() for n, g in model.gather_full_grads().items()}
    return {n.removeprefix("module."): p.grad.double().numpy().copy() for n, p in model.named_parameters()}


def _clip_everywhere(rank, world_size, lm, max_norm, norm_type):
    torch_lm, lm_batch, lm_loss = lm
    x, y = lm_batch(0, ROWS)
    share = rank_rows(rank, world_size, ROWS)
    results = {}
    for name, wrap in WRAPPERS.items():
        model = wrap(torch_lm(dtype=torch.float32 if name == "fsdp" else torch.float64))
        lm_loss(model, x[share], y[share]).backward()
        model.finish_gradient_synchronization()
        with _counting({}) as counts:
            norm = model.clip_grad_norm_(max_norm, norm_type)
        results[name] = (norm.item(), _grads(model), counts)
    # ShardedOptimizer on local gradients: SGD with lr 1 turns the clipped gradient into the update
    model = torch_lm(dtype=torch.float64)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=1.0)
    lm_loss(model, x[share], y[share]).backward()
    with _counting({}) as counts:
        norm = opt.clip_grad_norm_(max_norm, norm_type)
    opt.step()
    update = {n: (before[n] - p.detach()).numpy() for n, p in model.named_parameters()}
    results["zero"] = (norm.item(), update, counts)
    return results


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("norm_type", [2.0, math.inf, 3.0])
def test_clip_grad_norm_equals_torch_on_the_unsharded_model(lm, world_size, norm_type):
    torch_lm, lm_batch, lm_loss = lm
    reference = torch_lm(dtype=torch.float64)
    x, y = lm_batch(0, ROWS)
    lm_loss(reference, x, y).backward()
    unclipped = reference.head.weight.grad.norm().item()
    max_norm = 0.3 * unclipped  # clips
    norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm, norm_type).item()
    expected = {n: p.grad for n, p in reference.named_parameters()}
    for results in spawn(_clip_everywhere, world_size, lm, max_norm, norm_type, timeout=60):
        for name, (got, grads, counts) in results.items():
            tol = dict(rtol=2e-5, atol=1e-7) if name == "fsdp" else dict(rtol=1e-10, atol=1e-13)
            assert got == pytest.approx(norm, rel=tol["rtol"]), name
            assert sorted(grads) == sorted(expected), name
            for key, value in grads.items():
                torch.testing.assert_close(torch.from_numpy(value), expected[key], **tol,
                                           msg=f"{name}: {key}")
            # the DDP family: gradients equal on every rank, no message; ZeRO-1 also runs the step's own
            # reduce-scatter (on gloo a ring of send/recv, not counted here)
            calls = {"fsdp": {"all_reduce": 1}, "zero": {"all_reduce": 1}}
            assert counts == calls.get(name, {}), name


def _bad_clip(rank, world_size, value):
    model = DDP(torch.nn.Linear(3, 2))
    model.clip_grad_norm_(value)


@pytest.mark.parametrize("value", [-1.0, math.inf, math.nan, "1"])
def test_clip_refuses_negative_and_non_finite_max_norm(value):
    with pytest.raises(WorkerError, match="max_norm must be"):
        spawn(_bad_clip, 1, value, timeout=30)


def _fsdp_accumulates(rank, world_size, lm):
    torch_lm, lm_batch, lm_loss = lm
    model, share = FSDP(torch_lm()), rank_rows(rank, world_size, ROWS)
    with _counting({}) as inside, model.no_sync():
        for step in range(2):
            x, y = lm_batch(step, ROWS)
            lm_loss(model, x[share], y[share]).backward()
    x, y = lm_batch(2, ROWS)
    with _counting({}) as outside:
        lm_loss(model, x[share], y[share]).backward()
        model.finish_gradient_synchronization()
    return _grads(model), inside, outside


@pytest.mark.parametrize("world_size", [2, 3])
def test_fsdp_no_sync_then_one_synchronized_backward_is_the_whole_batch_gradient(lm, world_size):
    torch_lm, lm_batch, lm_loss = lm
    reference = torch_lm(dtype=torch.float64)
    for step in range(3):
        lm_loss(reference, *lm_batch(step, ROWS)).backward()
    for grads, inside, outside in spawn(_fsdp_accumulates, world_size, lm, timeout=60):
        assert "reduce_scatter_tensor" not in inside and "all_reduce" not in inside  # nothing communicated
        assert outside["reduce_scatter_tensor"] > 0
        for name, p in reference.named_parameters():
            torch.testing.assert_close(torch.from_numpy(grads[name]), p.grad, rtol=2e-5, atol=1e-7, msg=name)


def _different_models(rank, world_size, lm, wrapper, difference):
    torch_lm = lm[0]
    model = torch_lm()
    if rank == 1 and difference == "count":
        model.extra = torch.nn.Linear(3, 3)
    if rank == 1 and difference == "shape":
        model.up = torch.nn.Linear(12, 20)
    if rank == 1 and difference == "dtype":
        model.down.double()
    if wrapper == "zero":
        ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    else:
        WRAPPERS[wrapper](model)


@pytest.mark.parametrize("wrapper", [*WRAPPERS, "zero"])
@pytest.mark.parametrize("difference", ["count", "shape", "dtype"])
def test_ranks_with_different_models_fail_fast_naming_the_difference(lm, wrapper, difference):
    with pytest.raises(WorkerError, match=r"ranks hold different models .* rank 0 vs rank 1, first diff"):
        spawn(_different_models, 2, lm, wrapper, difference, timeout=30)


def _wrapped_twice(rank, world_size, lm):
    refused = []
    for outer in (FSDP, DDP, BucketedDDP):
        for inner in (FSDP, DDP):
            model = lm[0]()
            model.body = inner(torch.nn.Linear(3, 3))  # a wrapped submodule counts too
            try:
                outer(model)
            except ValueError as error:
                refused.append(str(error))
    return refused


def _wraps_a_meta_model(rank, world_size):
    refused = []
    for wrapper in (DDP, BucketedDDP):
        try:
            wrapper(torch.nn.Linear(3, 3, device="meta"))
        except ValueError as error:
            refused.append(str(error))
    return refused


def test_a_model_on_the_meta_device_is_refused_by_name():
    refused = spawn(_wraps_a_meta_model, 2, timeout=60)
    assert all(len(r) == 2 and "parameter 'weight' is on the meta device" in r[0] for r in refused), refused


def test_a_model_is_wrapped_once(lm):
    refused = spawn(_wrapped_twice, 2, lm, timeout=60)
    assert refused[0] == refused[1] and len(refused[0]) == 6
    assert refused[0][0] == "FSDP: its submodule 'body' is already a FSDP; wrap the plain model once"
    assert refused[0][3] == "DDP: its submodule 'body' is already a DDP; wrap the plain model once"


@pytest.mark.parametrize("size", [math.inf, math.nan, "25", 0, -1.0, True, None])
def test_bucket_size_must_be_a_finite_positive_number(size):
    with pytest.raises(ValueError, match="bucket_size_mb must be a finite number of MiB > 0"):
        BucketedDDP(torch.nn.Linear(2, 2), bucket_size_mb=size)


def _save_full(rank, world_size, lm, path):
    model = FSDP(lm[0]())
    model.save_full_state_dict(path)
    try:
        model.save_full_state_dict(path.parent / "missing-folder" / "x.pt")
    except Exception as err:
        return str(err)
    return "saved"


def test_full_state_save_leaves_no_temporary_file(tmp_path, lm):
    path = tmp_path / "model.pt"
    (tmp_path / "model.pt.partial").write_bytes(b"left by a killed save")
    errors = spawn(_save_full, 2, lm, path, timeout=60)
    assert "does not exist" in errors[0] and "rank 0 failed to write" in errors[1]
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]
    plain = lm[0](seed=4)
    plain.load_state_dict(torch.load(path))  # non-persistent buffers are not in it
