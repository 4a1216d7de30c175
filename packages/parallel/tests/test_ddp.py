"""The DDP family against single-process training on the union of the ranks' data (gloo CPU, NCCL GPU)."""

import copy
import gc
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from harness.testing import assert_relative_error
from parallel import DDP, BucketedDDP, FlatDDP, NaiveDDP
from parallel.launch import spawn
from torch import nn

VOCAB, WIDTH, HIDDEN, SEQ = 17, 13, 29, 7

# Bucket caps in MiB: one bucket per parameter, a few parameters per bucket, everything in one bucket.
VARIANTS = {
    "naive": NaiveDDP,
    "flat": FlatDDP,
    "ddp": DDP,
    "bucketed-per-param": lambda m: BucketedDDP(m, bucket_size_mb=1e-6),
    "bucketed-few": lambda m: BucketedDDP(m, bucket_size_mb=1.5e-3),
    "bucketed-one": lambda m: BucketedDDP(m, bucket_size_mb=100),
}
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
}


class MLP(nn.Module):
    """Token ids ``(batch, seq)`` -> logits ``(batch, seq, VOCAB)``; plain, nothing shared."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.fc1 = nn.Linear(WIDTH, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens):
        return self.fc2(torch.relu(self.fc1(self.embed(tokens))))


class TiedModel(nn.Module):
    """Embedding tied to the output head, a frozen parameter, a buffer, and a parameter never used."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.frozen_bias = nn.Parameter(torch.randn(WIDTH), requires_grad=False)
        self.fc1 = nn.Linear(WIDTH, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, WIDTH)
        self.unused = nn.Linear(3, 3)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("temperature", torch.rand(()) + 0.5)

    def forward(self, tokens):
        x = self.embed(tokens) + self.frozen_bias
        x = x + self.fc2(F.gelu(self.norm(self.fc1(x))))
        return self.head(x) / self.temperature


MODELS = {"mlp": MLP, "tied": TiedModel}


def _build(model_name, seed, dtype=torch.float64, device="cpu"):
    torch.manual_seed(seed)
    return MODELS[model_name]().to(device=device, dtype=dtype)


def _global_batch(step, world_size, local_batch, device="cpu"):
    gen = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (world_size * local_batch, SEQ + 1), generator=gen)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def _loss(model, inputs, targets):
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def _train(model, optimizer, rank, world_size, steps, local_batch, device="cpu"):
    """``steps`` optimizer steps; rank ``r`` trains on rows ``[r*local_batch, (r+1)*local_batch)``."""
    for step in range(steps):
        inputs, targets = _global_batch(step, world_size, local_batch, device)
        rows = slice(rank * local_batch, (rank + 1) * local_batch)
        _loss(model, inputs[rows], targets[rows]).backward()
        if hasattr(model, "finish_gradient_synchronization"):
            model.finish_gradient_synchronization()
        optimizer.step()
        # Every way of resetting gradients must work: the optimizer's, the wrapper's, to None or in place.
        zero_grad = optimizer.zero_grad if step % 3 == 0 else model.zero_grad
        zero_grad(set_to_none=step % 3 != 1)


def _assert_params_match(wrapped, reference, **tol):
    pairs = zip(wrapped.named_parameters(), reference.named_parameters(), strict=True)
    for (name, got), (ref_name, want) in pairs:
        assert name == "module." + ref_name
        torch.testing.assert_close(got, want, **tol, msg=lambda m, n=name: f"{n}: {m}")


def _matches_single_process(rank, world_size, local_batch):
    # Each optimizer on one model keeps the test fast; both models and both optimizers are covered.
    for model_name, opt_name in [("mlp", "sgd"), ("tied", "adamw")]:
        make_opt = OPTIMIZERS[opt_name]
        for variant, wrap in VARIANTS.items():
            reference = _build(model_name, seed=0)
            # Ranks start from different weights: the wrapper must broadcast rank 0's.
            model = wrap(_build(model_name, seed=0 if rank == 0 else 100 + rank))
            _train(model, make_opt(model.parameters()), rank, world_size, 3, local_batch)
            _train(reference, make_opt(reference.parameters()), 0, 1, 3, world_size * local_batch)
            try:
                _assert_params_match(model, reference, rtol=1e-9, atol=1e-11)
            except AssertionError as err:
                raise AssertionError(f"{variant}, {model_name}, {opt_name}: {err}") from None


@pytest.mark.parametrize(("world_size", "local_batch"), [(2, 3), (3, 1)])
def test_training_matches_single_process_on_union_of_data(world_size, local_batch):
    spawn(_matches_single_process, world_size, local_batch, timeout=240)


def _no_sync_accumulates(rank, world_size):
    for variant, wrap in VARIANTS.items():
        reference = _build("tied", seed=0)
        model = wrap(_build("tied", seed=0))
        micro_batches = [_global_batch(step, world_size, 2) for step in range(3)]
        rows = slice(rank * 2, rank * 2 + 2)
        with model.no_sync():
            for inputs, targets in micro_batches[:2]:
                _loss(model, inputs[rows], targets[rows]).backward()
            model.finish_gradient_synchronization()  # inside no_sync: a no-op
        local = model.module.fc1.weight.grad.clone()
        others = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(others, local)
        assert not torch.equal(others[0], others[1]), f"{variant}: gradients were synchronized inside no_sync"
        inputs, targets = micro_batches[2]
        _loss(model, inputs[rows], targets[rows]).backward()
        model.finish_gradient_synchronization()
        for inputs, targets in micro_batches:
            _loss(reference, inputs, targets).backward()
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            if q.grad is None:
                assert p.grad is None, f"{variant}: {name} got a gradient"
            else:
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-11, msg=f"{variant}: {name}")


def test_no_sync_accumulates_then_averages():
    spawn(_no_sync_accumulates, 2, timeout=120)


def _construction_broadcasts(rank, world_size):
    model = _build("tied", seed=10 + rank)
    model.temperature.fill_(1.0 + rank)
    for wrap in VARIANTS.values():
        wrapped = wrap(copy.deepcopy(model))
        state = torch.cat([t.reshape(-1) for t in [*wrapped.parameters(), *wrapped.buffers()]])
        frozen = wrapped.module.frozen_bias.clone()
        gathered = [torch.empty_like(state) for _ in range(world_size)]
        dist.all_gather(gathered, state)
        for other in gathered[1:]:
            assert torch.equal(other, gathered[0])
        assert wrapped.module.temperature.item() == 1.0
        assert not wrapped.module.frozen_bias.requires_grad
        assert torch.equal(frozen, _build("tied", seed=10).frozen_bias)
    return True


def test_construction_broadcasts_parameters_and_buffers():
    assert spawn(_construction_broadcasts, 3, timeout=120) == [True] * 3


def _names_and_order(rank, world_size):
    for variant, wrap in VARIANTS.items():
        model = _build("tied", seed=0)
        wrapped = wrap(model)
        assert wrapped.module is model
        want = [("module." + name, p) for name, p in model.named_parameters()]
        got = list(wrapped.named_parameters())
        assert [n for n, _ in got] == [n for n, _ in want], variant
        assert all(p is q for (_, p), (_, q) in zip(got, want, strict=True)), variant
        assert list(wrapped.state_dict()) == ["module." + k for k in model.state_dict()], variant
        tokens = torch.randint(0, VOCAB, (2, SEQ))
        torch.testing.assert_close(wrapped(tokens), model(tokens), rtol=0, atol=0)


def _wrappers_are_freed(rank, world_size):
    for variant, wrap in VARIANTS.items():
        model = _build("tied", seed=0)
        wrapped = wrap(model)
        inputs, targets = _global_batch(0, 1, 2)
        _loss(wrapped, inputs, targets).backward()
        wrapped.finish_gradient_synchronization()
        wrapper_ref, weight_ref = weakref.ref(wrapped), weakref.ref(model.fc1.weight)
        del wrapped
        gc.collect()
        assert wrapper_ref() is None, f"{variant}: the wrapper outlived its last reference"
        # The module lives on without the wrapper's hooks: a backward now leaves local gradients alone.
        model.zero_grad()
        _loss(model, inputs, targets).backward()
        local = _build("tied", seed=0)
        _loss(local, inputs, targets).backward()
        torch.testing.assert_close(model.fc1.weight.grad, local.fc1.weight.grad, rtol=0, atol=0)
        del model
        gc.collect()
        assert weight_ref() is None, f"{variant}: the model's parameters were never freed"


def test_dropped_wrappers_free_the_model_and_remove_their_hooks():
    spawn(_wrappers_are_freed, 1, timeout=60)


def test_parameter_names_order_and_forward_follow_the_module():
    spawn(_names_and_order, 1, timeout=60)


def _bf16_autocast(rank, world_size, device="cpu"):
    inputs, targets = _global_batch(0, world_size, 4, device)
    rows = slice(rank * 4, rank * 4 + 4)
    for variant, wrap in VARIANTS.items():
        local = _build("tied", seed=0, dtype=torch.float32, device=device)
        union = copy.deepcopy(local)
        model = wrap(copy.deepcopy(local))
        for net, x, y in [(model, inputs[rows], targets[rows]), (local, inputs[rows], targets[rows]),
                          (union, inputs, targets)]:
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                _loss(net, x, y).backward()
        model.finish_gradient_synchronization()
        triples = zip(model.named_parameters(), local.parameters(), union.parameters(), strict=True)
        for (name, p), q, u in triples:
            if q.grad is None:
                continue
            assert p.grad.dtype == torch.float32, f"{variant}: {name} gradient is {p.grad.dtype}"
            # Exactly the mean of what autocast produced on each rank ...
            per_rank = [torch.empty_like(q.grad) for _ in range(world_size)]
            dist.all_gather(per_rank, q.grad)
            mean = torch.stack(per_rank).double().mean(0).float()
            torch.testing.assert_close(p.grad, mean, rtol=1e-5, atol=1e-7, msg=f"{variant}: {name}")
            # ... and close to the gradient of one process on the union (bf16 rounds each split differently).
            assert_relative_error(p.grad, u.grad, bound=2e-2, floor=1e-6, name=f"{variant}: {name}")


def test_bf16_autocast_gradients_are_averaged():
    spawn(_bf16_autocast, 2, timeout=120)


def _backward_twice_raises(rank, world_size):
    for wrap in (DDP, lambda m: BucketedDDP(m, bucket_size_mb=1e-3)):
        model = wrap(_build("mlp", seed=0))
        inputs, targets = _global_batch(0, 1, 2)
        _loss(model, inputs, targets).backward()
        with pytest.raises(RuntimeError, match="ready twice"):
            _loss(model, inputs, targets).backward()
        model.finish_gradient_synchronization()


def test_second_backward_without_no_sync_raises():
    spawn(_backward_twice_raises, 2, timeout=60)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="bucket_size_mb"):
        BucketedDDP(MLP(), bucket_size_mb=0)
    with pytest.raises(RuntimeError, match="process group"):
        NaiveDDP(MLP())
    with pytest.raises(TypeError, match="module"):
        DDP(lambda x: x)


def _expected_layout(numels, cap_elements):
    """Bucket sizes when each bucket closes with the parameter that brings it to the cap."""
    sizes, filled = [], 0
    for n in numels:
        filled += n
        if filled >= cap_elements:
            sizes.append(filled)
            filled = 0
    return sizes + ([filled] if filled else [])


def _bucket_layout(rank, world_size):
    model = _build("tied", seed=0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    per_param = BucketedDDP(copy.deepcopy(model), bucket_size_mb=1e-6)
    assert per_param.bucket_numels == [p.numel() for p in reversed(trainable)]
    one = BucketedDDP(copy.deepcopy(model), bucket_size_mb=100)
    assert one.bucket_numels == [sum(p.numel() for p in trainable)]
    few = BucketedDDP(copy.deepcopy(model), bucket_size_mb=1.5e-3)
    cap = int(1.5e-3 * 2**20) // 8  # float64 elements
    assert 1 < len(few.bucket_numels) < len(trainable)
    assert few.bucket_numels == _expected_layout([p.numel() for p in reversed(trainable)], cap)


def test_bucket_layout_follows_reverse_registration_order():
    spawn(_bucket_layout, 1, timeout=60)


def _nccl_matches_single_process(rank, world_size):
    device = f"cuda:{rank}"
    for variant, wrap in VARIANTS.items():  # 3 steps: BucketedDDP rebuilds its buckets after the first
        reference = _build("tied", seed=0, dtype=torch.float32, device=device)
        model = wrap(_build("tied", seed=0 if rank == 0 else 7, dtype=torch.float32, device=device))
        _train(model, OPTIMIZERS["sgd"](model.parameters()), rank, world_size, 3, 5, device)
        _train(reference, OPTIMIZERS["sgd"](reference.parameters()), 0, 1, 3, 5 * world_size, device)
        try:
            _assert_params_match(model, reference, rtol=1e-4, atol=1e-5)
        except AssertionError as err:
            raise AssertionError(f"{variant}: {err}") from None
    _bf16_autocast(rank, world_size, device)


@pytest.mark.gpu
def test_nccl_training_and_bf16_autocast_match_single_process():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    spawn(_nccl_matches_single_process, 2, backend="nccl", timeout=300)


class UsedBackwards(nn.Module):
    """Layers registered in the opposite order of their use: backward reaches ``first`` first."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(7, VOCAB, bias=False)
        self.second = nn.Linear(5, 7, bias=False)
        self.third = nn.Linear(WIDTH, 5, bias=False)
        self.embed = nn.Embedding(VOCAB, WIDTH)

    def forward(self, tokens):
        return self.first(self.second(self.third(self.embed(tokens))))


def _rebuilt_in_backward_order(rank, world_size):
    torch.manual_seed(0)
    reference = UsedBackwards().double()
    model = BucketedDDP(copy.deepcopy(reference), bucket_size_mb=1e-6)  # one parameter per bucket
    before = model.bucket_numels
    _train(model, torch.optim.AdamW(model.parameters(), lr=1e-2), rank, world_size, 3, 2)
    _train(reference, torch.optim.AdamW(reference.parameters(), lr=1e-2), 0, 1, 3, 2 * world_size)
    # numpy, not tensors: tensors would travel back through shared memory the exiting worker tears down
    trained = {n: p.detach().numpy() for n, p in model.module.named_parameters()}
    expected = {n: p.detach().numpy() for n, p in reference.named_parameters()}
    return before, model.bucket_numels, trained, expected


def test_buckets_rebuilt_in_the_order_backward_produced_gradients():
    sizes = {"embed": VOCAB * WIDTH, "third": WIDTH * 5, "second": 5 * 7, "first": 7 * VOCAB}
    for before, after, params, reference in spawn(_rebuilt_in_backward_order, 2, timeout=120):
        assert before == [sizes[n] for n in ("embed", "third", "second", "first")]  # reverse registration
        assert after == [sizes[n] for n in ("first", "second", "third", "embed")]  # backward's order
        for name, want in reference.items():  # training across the rebuild still equals one process
            got = torch.from_numpy(params[name])
            torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-9, atol=1e-11)
