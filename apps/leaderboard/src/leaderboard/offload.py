"""Offloading the saved activations of chosen Transformer blocks to pinned host memory.

``ActivationOffload(layers, offloaded)`` hooks the blocks at the indices ``offloaded`` (a forward pre-hook
and a forward hook, so parameter names and sharding wrappers stay as they are). While an offloaded block
runs forward, ``torch.autograd.graph.saved_tensors_hooks`` hand every tensor autograd saves to its group;
when the block's forward ends the group is copied to pinned host memory and the device copies are let go.
In backward each group is brought back one offloaded block ahead of its use.

Synchronization (CUDA; one D2H and one H2D side stream per device):
- end of an offloaded block's forward: the D2H stream waits for the compute stream (the saved tensors are
  written), copies every saved tensor into pinned memory and records ``copied``; each device tensor is
  marked ``record_stream(d2h)`` before it is dropped, so the allocator reuses its memory only after the
  copy has read it;
- end of the next offloaded block's forward: the compute stream waits for the previous group's
  ``copied`` before going on; at most two groups are on the device, and a link slower than compute
  shows up as a stall (the planner counts it) instead of a growing pile of device memory;
- backward: an identity on the output of block ``t`` runs first in ``t``'s backward and starts the fetch
  of the group whose turn comes next (``t`` is the next offloaded block, or the last block for the last
  group): the buffers are allocated on the compute stream, the H2D stream waits for the compute stream
  (that memory's previous use) and for the group's ``copied``, copies, and records ``fetched``; each
  buffer is marked ``record_stream(h2d)``;
- unpack: the compute stream waits for ``fetched``. Pinned buffers are freed through torch's caching
  host allocator, which holds them until the copies that used them are done.

On a CPU the same path runs without streams or pinning (a plain copy out and back), so tests exercise it.

Not offloaded (kept on the device as autograd saved them): CUDA tensors below ``min_bytes``, tensors that are
not dense (views with gaps), and parameters or views of a leaf that requires grad (weights, including
``parallel.FSDP``'s gathered buffers: they exist anyway and are re-gathered for backward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn


def _is_dense(t: Tensor) -> bool:
    """True when ``t`` covers exactly ``numel`` consecutive elements in some order of its dimensions."""
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(t.shape, t.stride(), strict=True) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _parameter_like(t: Tensor) -> bool:
    base = t._base if t._base is not None else t
    return isinstance(t, nn.Parameter) or (base.is_leaf and base.requires_grad)


class _Saved:
    """One saved tensor of a group: on the device until offloaded, then on the host, then fetched back."""

    __slots__ = ("device_tensor", "fetched", "group", "host", "waited")

    def __init__(self, group: _Group, tensor: Tensor):
        self.group, self.device_tensor = group, tensor
        self.host: Tensor | None = None
        self.fetched: Tensor | None = None
        self.waited = False


class _Group:
    """The saved tensors of one offloaded block's forward, deduplicated by storage and geometry."""

    def __init__(self, index: int):
        self.index = index
        self.saved: dict[tuple, _Saved] = {}
        self.copied: torch.cuda.Event | None = None
        self.fetched: torch.cuda.Event | None = None
        self.fetch_started = False
        self.device: torch.device | None = None


class _OnBackward(torch.autograd.Function):
    """Identity whose backward calls ``callback`` first (the start of the block's backward)."""

    @staticmethod
    def forward(ctx, callback: Callable[[], None], x: Tensor) -> Tensor:
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.callback()
        return None, grad


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class ActivationOffload:
    """Saved activations of ``layers[i]`` for ``i`` in ``offloaded`` live in host memory between their
    block's forward and backward. ``layers`` as the model runs them (forward order); hooks stay until
    ``remove()``. ``bytes_offloaded`` counts the bytes moved out in the last forward."""

    def __init__(self, layers: Sequence[nn.Module], offloaded: Sequence[int], min_bytes: int = 1 << 20):
        offloaded = sorted(set(offloaded))
        if offloaded and not 0 <= offloaded[0] <= offloaded[-1] < len(layers):
            raise ValueError(f"offloaded block indices must lie in [0, {len(layers)}), got {offloaded}")
        self.min_bytes = min_bytes
        self.groups = [_Group(i) for i in offloaded]
        self.bytes_offloaded = 0
        self._active: _Group | None = None
        self._hooks_context: torch.autograd.graph.saved_tensors_hooks | None = None
        self._streams: dict[torch.device, tuple[torch.cuda.Stream, torch.cuda.Stream]] = {}
        self._handles = []
        for position, group in enumerate(self.groups):
            block = layers[group.index]
            self._handles.append(block.register_forward_pre_hook(self._pre_forward_hook(position)))
            self._handles.append(block.register_forward_hook(self._post_forward_hook(position)))
        # group j is fetched when the backward of the next offloaded block starts (the last block's, for
        # the last group), so its copy overlaps the backward of the blocks in between
        for position, group in enumerate(self.groups):
            trigger = self.groups[position + 1].index if position + 1 < len(self.groups) else len(layers) - 1
            self._handles.append(layers[trigger].register_forward_hook(self._fetch_trigger(group)))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # ------------------------------------------------------------------------------------------ forward
    def _pre_forward_hook(self, position: int):
        def hook(module, args):
            if _in_backward() or not torch.is_grad_enabled():
                return
            if position == 0:
                self.bytes_offloaded = 0
            group = self.groups[position]
            group.saved.clear()
            group.copied = group.fetched = group.device = None
            group.fetch_started = False
            self._active = group
            self._hooks_context = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self._hooks_context.__enter__()

        return hook

    def _post_forward_hook(self, position: int):
        def hook(module, args, output):
            group = self.groups[position]
            if self._active is not group:
                return output
            self._hooks_context.__exit__(None, None, None)
            self._active = self._hooks_context = None
            previous = self.groups[position - 1] if position else None
            if previous is not None and previous.copied is not None:  # at most two groups on the device
                torch.cuda.current_stream(previous.device).wait_event(previous.copied)
            self._offload(group)
            return output

        return hook

    def _fetch_trigger(self, group: _Group):
        def hook(module, args, output):
            if _in_backward() or not (torch.is_grad_enabled() and isinstance(output, Tensor)):
                return output
            if not output.requires_grad:
                return output
            return _OnBackward.apply(lambda: self._fetch(group), output)

        return hook

    def _pack(self, t: Tensor):
        group = self._active
        if (
            group is None
            or (t.is_cuda and t.numel() * t.element_size() < self.min_bytes)
            or not _is_dense(t)
            or _parameter_like(t)
        ):
            return t
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        saved = group.saved.get(key)
        if saved is None:
            saved = group.saved[key] = _Saved(group, t)
        return saved

    def _side_streams(self, device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
        if device not in self._streams:
            self._streams[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
        return self._streams[device]

    def _offload(self, group: _Group) -> None:
        saved = list(group.saved.values())
        if not saved:
            return
        device = saved[0].device_tensor.device
        on_cuda = device.type == "cuda"
        context = contextlib.nullcontext()
        if on_cuda:
            d2h, _ = self._side_streams(device)
            d2h.wait_stream(torch.cuda.current_stream(device))
            context = torch.cuda.stream(d2h)
        with context:
            for s in saved:
                t = s.device_tensor
                s.host = torch.empty_strided(
                    t.shape, t.stride(), dtype=t.dtype, device="cpu", pin_memory=on_cuda
                )
                s.host.copy_(t, non_blocking=on_cuda)
                if on_cuda:
                    t.record_stream(d2h)
                s.device_tensor = None
                self.bytes_offloaded += t.numel() * t.element_size()
            if on_cuda:
                group.copied = d2h.record_event()
        group.device = device

    # ----------------------------------------------------------------------------------------- backward
    def _fetch(self, group: _Group) -> None:
        if group.fetch_started or group.device is None:  # fetched already, or nothing was offloaded
            return
        group.fetch_started = True
        device = group.device
        on_cuda = device.type == "cuda"
        buffers = [
            torch.empty_strided(s.host.shape, s.host.stride(), dtype=s.host.dtype, device=device)
            for s in group.saved.values()
        ]  # on the compute stream, which owns (and may just have freed) this memory
        context = contextlib.nullcontext()
        if on_cuda:
            _, h2d = self._side_streams(device)
            h2d.wait_stream(torch.cuda.current_stream(device))
            h2d.wait_event(group.copied)
            context = torch.cuda.stream(h2d)
        with context:
            for s, buffer in zip(group.saved.values(), buffers, strict=True):
                buffer.copy_(s.host, non_blocking=on_cuda)
                if on_cuda:
                    buffer.record_stream(h2d)
                s.fetched, s.host = buffer, None
            if on_cuda:
                group.fetched = h2d.record_event()
        group.saved = {}  # from here autograd's saved variables alone hold the fetched tensors

    def _unpack(self, packed):
        if not isinstance(packed, _Saved):
            return packed
        group = packed.group
        self._fetch(group)  # normally started one block earlier; here only if no trigger ran
        tensor = packed.fetched
        if group.fetched is not None and not packed.waited:
            torch.cuda.current_stream(group.device).wait_event(group.fetched)
            packed.waited = True
        return tensor
