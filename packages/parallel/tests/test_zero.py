"""ShardedOptimizer (ZeRO-1) against the same optimizer unsharded, on gloo with 2 and 4 processes."""

import copy

import pytest
import torch
import torch.distributed as dist
from cs336_basics.optimizer import AdamW as BasicsAdamW
from parallel.launch import spawn
from parallel.zero import ShardedOptimizer
from torch import nn

VOCAB, DIM = 37, 13


class TiedToy(nn.Module):
    """Embedding, two hidden layers of awkward sizes, LM head tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.hidden = nn.Linear(DIM, 17)
        self.out = nn.Linear(17, DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.out(torch.relu(self.hidden(self.emb(ids))))))


def _toy(seed=0):
    torch.manual_seed(seed)
    return TiedToy()


def _averaged_grads(model, rank, step):
    """Backward on this rank's batch, then average the gradients over ranks (what DDP would do)."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    ids = torch.randint(0, VOCAB, (3, 7), generator=gen)
    loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.roll(1, -1).flatten())
    loss.backward()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def _max_diff(model, reference):
    pairs = zip(model.parameters(), reference.parameters(), strict=True)
    return max((a - b).abs().max().item() for a, b in pairs)


def _copy_grads(src, dst):
    for ps, pd in zip(src.parameters(), dst.parameters(), strict=True):
        pd.grad = None if ps.grad is None else ps.grad.clone()


OPTIMIZERS = {
    "torch_adamw": (torch.optim.AdamW, dict(lr=3e-2, weight_decay=0.1)),
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    "basics_adamw": (BasicsAdamW, dict(lr=3e-2, weight_decay=0.1)),
}


def _train_against_reference(rank, world_size, name, steps, mode):
    cls, kwargs = OPTIMIZERS[name]
    model, reference = _toy(), _toy()
    sharded = ShardedOptimizer(model.parameters(), cls, mode=mode, **kwargs)
    plain = cls(reference.parameters(), **kwargs)
    for step in range(steps):
        _averaged_grads(model, rank, step)
        _copy_grads(model, reference)
        sharded.step()
        plain.step()
        sharded.zero_grad()
        plain.zero_grad()
    diff = _max_diff(model, reference)
    owned = sum(p.numel() for p in sharded.state)
    largest = max(p.numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    return diff, owned, largest, total, [p.detach().numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize(("name", "mode"), [("torch_adamw", "reduce_scatter"), ("sgd_momentum", "broadcast"),
                                            ("basics_adamw", "reduce_scatter"), ("torch_adamw", "broadcast")])
def test_equals_unsharded_after_ten_steps(world_size, name, mode):
    """Averaged gradients in: both modes (averaging an average changes nothing)."""
    results = spawn(_train_against_reference, world_size, name, 10, mode, timeout=120)
    for diff, owned, largest, total, _ in results:
        assert diff < 1e-6
        assert abs(owned - total / world_size) <= largest  # ~1/N of the state, within one parameter
    # every rank holds the same parameters
    first = results[0][4]
    for *_, params in results[1:]:
        for a, b in zip(first, params, strict=True):
            assert (a == b).all()
    # state is spread over ranks: each rank owns something, together everything, once
    assert sum(owned for _, owned, *_ in results) == results[0][3]


def _local_gradients(rank, world_size, mode_steps):
    """True ZeRO-1: each rank passes its own batch's gradient; the optimizer averages by reduce-scatter."""
    model = _toy(seed=rank)  # different initial values: construction broadcasts rank 0's
    reference = _toy(seed=0)
    sharded = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=3e-2, weight_decay=0.1)
    plain = torch.optim.AdamW(reference.parameters(), lr=3e-2, weight_decay=0.1)
    for step in range(mode_steps):
        gen = torch.Generator().manual_seed(step)
        ids = torch.randint(0, VOCAB, (3 * world_size, 7), generator=gen)
        for net, rows in ((model, ids[3 * rank:3 * rank + 3]), (reference, ids)):
            logits = net(rows).flatten(0, 1)
            nn.functional.cross_entropy(logits, rows.roll(1, -1).flatten()).backward()
        sharded.step()
        plain.step()
        sharded.zero_grad()
        plain.zero_grad()
    return _max_diff(model, reference), [p.detach().numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("world_size", [2, 3])
def test_reduce_scatter_mode_on_local_gradients_equals_unsharded_adamw(world_size):
    results = spawn(_local_gradients, world_size, 6, timeout=120)
    for diff, params in results:
        assert diff < 2e-6
        for a, b in zip(results[0][1], params, strict=True):
            assert (a == b).all()  # the all-gather leaves every rank with the same parameters


def test_rejects_unknown_mode():
    with pytest.raises(Exception, match="mode must be one of reduce_scatter, broadcast"):
        spawn(lambda rank, world_size: ShardedOptimizer(_toy().parameters(), torch.optim.SGD, mode="x"),
              1, timeout=30)


def _add_group_mid_training(rank, world_size):
    model, reference = _toy(), _toy()
    frozen = list(model.out.parameters())
    frozen_ref = list(reference.out.parameters())
    rest = [p for p in model.parameters() if all(p is not f for f in frozen)]
    rest_ref = [p for p in reference.parameters() if all(p is not f for f in frozen_ref)]
    sharded = ShardedOptimizer(rest, torch.optim.AdamW, lr=2e-2)
    plain = torch.optim.AdamW(rest_ref, lr=2e-2)
    for step in range(8):
        if step == 4:  # unfreeze a layer with its own learning rate
            sharded.add_param_group({"params": frozen, "lr": 5e-2})
            plain.add_param_group({"params": frozen_ref, "lr": 5e-2})
        _averaged_grads(model, rank, step)
        _copy_grads(model, reference)
        if step < 4:
            for p in frozen:
                p.grad = None
            for p in frozen_ref:
                p.grad = None
        for opt in (sharded, plain):
            opt.param_groups[0]["lr"] *= 0.9  # a schedule edits the outer groups
            opt.step()
            opt.zero_grad()
    owners = {sharded.param_to_rank[p] for p in frozen}
    diff = _max_diff(model, reference)
    return diff, owners


@pytest.mark.parametrize("world_size", [2, 3])
def test_add_param_group_mid_training(world_size):
    for diff, owners in spawn(_add_group_mid_training, world_size, timeout=120):
        assert diff < 1e-6
        assert owners <= set(range(world_size))


def _save_state(rank, world_size, path):
    model = _toy()
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2, betas=(0.8, 0.95))
    for step in range(3):
        _averaged_grads(model, rank, step)
        opt.step()
        opt.zero_grad()
    state = opt.state_dict()
    if rank == 0:
        torch.save({"optimizer": state, "model": model.state_dict()}, path)
    # plain arrays travel back to the test process (shared-memory tensors would not outlive the worker)
    return {i: {k: v.numpy() if torch.is_tensor(v) else v for k, v in entry.items()}
            for i, entry in state["state"].items()}


def _load_state(rank, world_size, path):
    saved = torch.load(path)
    model, reference = _toy(), _toy()
    model.load_state_dict(saved["model"])
    reference.load_state_dict(saved["model"])
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1.0)
    opt.load_state_dict(saved["optimizer"])
    plain = torch.optim.AdamW(reference.parameters(), lr=1.0)
    plain.load_state_dict(copy.deepcopy(saved["optimizer"]))
    for step in range(3, 6):
        _averaged_grads(model, rank, step)
        _copy_grads(model, reference)
        opt.step()
        plain.step()
        opt.zero_grad()
        plain.zero_grad()
    lr = opt.param_groups[0]["lr"]
    diff = _max_diff(model, reference)
    return diff, lr


def test_state_dict_saved_on_two_ranks_loads_on_four(tmp_path):
    path = tmp_path / "opt.pt"
    states = spawn(_save_state, 2, path, timeout=120)
    # the full state is identical on every rank and has an entry for every parameter
    assert states[0].keys() == states[1].keys() == set(range(len(list(_toy().parameters()))))
    for i, entry in states[0].items():
        assert (entry["exp_avg_sq"] == states[1][i]["exp_avg_sq"]).all()
    for diff, lr in spawn(_load_state, 4, path, timeout=120):
        assert diff < 1e-6
        assert lr == 1e-2  # hyper-parameters come from the state dict


def _bad_class(rank, world_size):
    ShardedOptimizer(_toy().parameters(), "adamw", lr=1.0)


def test_rejects_non_optimizer_class():
    with pytest.raises(Exception, match=r"optimizer_cls must be a torch\.optim\.Optimizer subclass"):
        spawn(_bad_class, 2, timeout=60)


def test_needs_process_group():
    with pytest.raises(RuntimeError, match="process group"):
        ShardedOptimizer(_toy().parameters(), torch.optim.SGD, lr=1.0)


def _cuda_against_reference(rank, world_size):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(97, 130), nn.GELU(), nn.Linear(130, 17)).cuda()
    reference = copy.deepcopy(model)
    sharded = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    for step in range(10):
        x = torch.randn(5, 97, device="cuda", generator=torch.Generator("cuda").manual_seed(step * 10 + rank))
        model(x).square().mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        _copy_grads(model, reference)
        for opt in (sharded, plain):
            opt.step()
            opt.zero_grad()
    return _max_diff(model, reference)


@pytest.mark.gpu
def test_cuda_nccl_equals_unsharded():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    assert max(spawn(_cuda_against_reference, 2, backend="nccl", timeout=300)) < 1e-6
