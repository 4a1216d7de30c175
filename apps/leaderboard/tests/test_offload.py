"""Offloading saved activations: every saved tensor comes back exactly, each storage is copied once, gradients
are unchanged, and the tensors that must stay (weights, small ones, small views of large buffers) stay."""

import typing

import pytest
import torch
from cs336_basics import build_model, get_preset
from leaderboard.offload import ActivationOffload
from torch import nn


class _Recorder(torch.autograd.Function):
    """``x * y`` saving ``x``, ``y``, ``x.T`` (dense, permuted) and ``x[:, ::2]`` (with gaps); records
    what backward gets back."""

    seen: typing.ClassVar[list] = []

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y, x.t(), x[:, ::2])
        ctx.originals = [(t.detach().clone(), t.stride()) for t in (x, y, x.t(), x[:, ::2])]
        return x * y

    @staticmethod
    def backward(ctx, grad):
        _Recorder.seen.append((ctx.originals, list(ctx.saved_tensors)))
        x, y, _, _ = ctx.saved_tensors
        return grad * y, grad * x


class _Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n, dtype=torch.float64))

    def forward(self, x):
        return _Recorder.apply(x @ self.weight, torch.tanh(x @ self.weight))


def test_hooks_restore_every_saved_tensor_exactly():
    torch.manual_seed(0)
    layers = nn.ModuleList(_Block(17) for _ in range(3))
    offloader = ActivationOffload(layers, [0, 2], min_bytes=0)
    x = torch.randn(17, 17, dtype=torch.float64, requires_grad=True)
    out = x
    for layer in layers:
        out = layer(out)
    # block 0: the storages of x @ W (saved whole, transposed and with gaps: copied once) and tanh; block 2
    # also its input (block 0's is a leaf that requires grad, like the weights, so it stays)
    assert [len(g.chunks) for g in offloader.groups] == [2, 3]
    assert offloader.bytes_offloaded == (2 + 3) * 17 * 17 * 8  # each storage once, no view twice
    chunks = [c for g in offloader.groups for c in g.chunks.values()]
    assert all(c.host is not None and all(v.tensor is None for v in c.views) for c in chunks)
    _Recorder.seen.clear()
    out.sum().backward()
    assert len(_Recorder.seen) == 3
    for originals, restored in _Recorder.seen:
        for (want, stride), got in zip(originals, restored, strict=True):
            assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == stride
            assert torch.equal(got, want)
    assert all(not g.chunks and not g.saved for g in offloader.groups)  # autograd alone holds what came back


class _SavesAColumn(torch.autograd.Function):
    """``x @ w`` saving ``w`` (a weight), ``x`` and the first column of a fresh ``(n, n)`` product."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w, (x * 2)[:, :1])
        return x @ w

    @staticmethod
    def backward(ctx, grad):
        x, w, _ = ctx.saved_tensors
        return grad @ w.T, x.T @ grad


def test_what_stays_on_the_device():
    """A column of a square buffer reads a range 33x its bytes: it stays; the dense input leaves; the weight
    is never handed over."""
    block = nn.Linear(33, 33, bias=False, dtype=torch.float64)
    block.forward = lambda x: _SavesAColumn.apply(x, block.weight)
    offloader = ActivationOffload([block], [0], min_bytes=0)
    x = torch.randn(33, 33, dtype=torch.float64).tanh()
    out = block(x)
    (chunk,) = offloader.groups[0].chunks.values()
    assert chunk.nbytes == x.nbytes and offloader.bytes_offloaded == x.nbytes
    assert chunk.views[0].shape == (33, 33)
    out.sum().backward()  # the kept column and the fetched input both come back
    torch.testing.assert_close(block.weight.grad, x.T @ torch.ones_like(out), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("offloaded", [[0], [1], [0, 1, 2]])
def test_gradients_with_offload_equal_those_without(offloaded):
    """fp32 on a CPU: bitwise the same gradients, over two steps (the groups are reused)."""
    torch.manual_seed(0)
    model = build_model(get_preset("tiny").with_(num_layers=3))
    tokens = torch.randint(0, 503, (3, 97))
    want = torch.autograd.grad(model(tokens).square().mean(), list(model.parameters()))
    offloader = ActivationOffload(model.layers, offloaded, min_bytes=0)
    for _ in range(2):
        got = torch.autograd.grad(model(tokens).square().mean(), list(model.parameters()))
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
        assert offloader.bytes_offloaded > len(offloaded) * 3 * 97 * 64 * 4  # at least the inputs and more
    offloader.remove()
    assert not model.layers[0]._forward_hooks and not model.layers[0]._forward_pre_hooks


def test_offload_beside_recomputation_and_bad_indices():
    from leaderboard.checkpoint_plan import CheckpointPlan

    torch.manual_seed(1)
    model = build_model(get_preset("tiny").with_(num_layers=4))
    tokens = torch.randint(0, 503, (2, 17))
    want = torch.autograd.grad(model(tokens).square().mean(), list(model.parameters()))
    CheckpointPlan(1, 1, 1, 1).apply(model.layers)
    got = torch.autograd.grad(model(tokens).square().mean(), list(model.parameters()))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 4\)"):
        ActivationOffload(model.layers, [4])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_offload_frees_device_memory_and_keeps_gradients():
    """On a GPU: the offloaded blocks' activations leave the device during forward, the gradients match
    those without offload (same kernels in the same order), and nothing stays allocated afterwards.

    What outlives the step is read once the loss (its graph) and the device gradients are gone, so it must
    be exactly 0 bytes: the caching allocator counts a gradient in the block it landed in, which can be up
    to 1 MiB larger than the gradient (it does not split off a smaller remainder), so comparing the bytes
    held with the gradients' own sizes measured that rounding (0.25-1.9 MB an offloaded step on an H200)."""
    torch.manual_seed(0)
    cfg = get_preset("tiny").with_(d_model=512, d_ff=1376, num_heads=8, num_layers=6, context_length=2048)
    model = build_model(cfg, device="cuda")
    tokens = torch.randint(0, cfg.vocab_size, (2, 1999), device="cuda")

    def held_after_forward_and_grads():
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        loss = model(tokens).float().square().mean()
        torch.cuda.synchronize()
        torch.empty(1, device="cuda")  # lets the allocator retire blocks whose side-stream copies are done
        held = torch.cuda.memory_allocated() - before
        grads = [g.cpu() for g in torch.autograd.grad(loss, list(model.parameters()))]
        del loss
        torch.cuda.synchronize()
        return held, grads, torch.cuda.memory_allocated() - before

    held_plain, want, _ = held_after_forward_and_grads()
    offloader = ActivationOffload(model.layers, [0, 2, 4])
    held_after_forward_and_grads()  # the first use pins the host buffers
    held_offload, got, left = held_after_forward_and_grads()
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert offloader.bytes_offloaded > 0.3 * held_plain
    assert held_offload < held_plain - 0.8 * offloader.bytes_offloaded
    assert left == 0, f"{left} bytes stay allocated on the device after an offloaded step"


@pytest.mark.parametrize(
    "view",
    [
        lambda x: x.transpose(1, 2),
        lambda x: x.permute(3, 0, 2, 1),
        lambda x: x[:, 1:],
        lambda x: x[:, :, 3:11],
        lambda x: x[..., ::2],
        lambda x: x[:, :1].expand(2, 4, 17, 5),
    ],
)
def test_any_view_comes_back_with_its_geometry(view):
    """Strided views (offsets, gaps, zero strides) are rebuilt on the fetched bytes as they were saved."""
    from leaderboard.offload import _Chunk, _Saved

    base = torch.randn(2, 3, 17, 5, dtype=torch.float16)
    want = view(base)
    chunk, saved = _Chunk(), _Saved(None, want)
    chunk.add(saved, want)
    flat = torch.empty(0, dtype=torch.uint8).set_(base.untyped_storage())
    buffer = torch.zeros(-(-chunk.nbytes // 16) * 16, dtype=torch.uint8)
    buffer[: chunk.nbytes] = flat[chunk.start : chunk.end]
    saved.rebuild(buffer, chunk.start)
    assert saved.tensor.stride() == want.stride() and torch.equal(saved.tensor, want)


def test_offload_moves_most_of_a_blocks_saved_bytes():
    """The activations of the offloaded blocks (attention scores, SwiGLU inputs, ...) leave, not only a few
    flat tensors: bytes moved are most of the distinct saved storage of those blocks."""
    torch.manual_seed(0)
    cfg = get_preset("tiny").with_(d_model=64, d_ff=176, num_heads=4, num_layers=4, context_length=128)
    model = build_model(cfg, device="cpu")
    tokens = torch.randint(0, cfg.vocab_size, (2, 97))
    storages, inside = {}, []
    for i in (1, 3):
        model.layers[i].register_forward_pre_hook(lambda m, a: inside.append(True) and None)
        model.layers[i].register_forward_hook(lambda m, a, o: inside.clear())

    def count(t):
        base = t._base if t._base is not None else t
        if inside and not (base.is_leaf and base.requires_grad):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        model(tokens)
    offloader = ActivationOffload(model.layers, [1, 3], min_bytes=0)
    model(tokens)
    assert 0.8 * sum(storages.values()) < offloader.bytes_offloaded <= sum(storages.values())
