"""Offloading the saved activations of chosen Transformer blocks to pinned host memory.

``ActivationOffload(layers, offloaded)`` hooks the blocks at the indices ``offloaded`` (a forward pre-hook
and a forward hook, so parameter names and sharding wrappers stay as they are). While an offloaded block
runs forward, ``torch.autograd.graph.saved_tensors_hooks`` hand every tensor autograd saves to its group;
when the block's forward ends the group is copied to pinned host memory and the device copies are let go.
In backward each group is brought back one offloaded block ahead of its use.

Synchronization (CUDA; one D2H and one H2D side stream per device):
- end of an offloaded block's forward: the D2H stream waits for the compute stream (the saved tensors are
  written), copies every saved storage range into pinned memory and records ``copied``; each device range is
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

Views of one storage are copied once: each group copies, per storage, the byte range its saved views read
(strided views and views with gaps included) and rebuilds every view on the fetched copy. Not offloaded (kept
on the device as autograd saved them): CUDA tensors below ``min_bytes``, views whose storage range is over
twice their bytes (a small view of a large buffer), and parameters or views of a leaf that requires grad
(weights, including ``parallel.FSDP``'s gathered buffers: they exist anyway and are re-gathered for backward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn


def _extent_bytes(t: Tensor) -> tuple[int, int]:
    """The byte range ``[start, end)`` of ``t``'s storage that ``t`` reads (any strides, gaps included)."""
    size = t.element_size()
    last = t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    return t.storage_offset() * size, (last + 1) * size


def _parameter_like(t: Tensor) -> bool:
    base = t._base if t._base is not None else t
    return isinstance(t, nn.Parameter) or (base.is_leaf and base.requires_grad)


class _Chunk:
    """The part of one device storage that a group's saved views read, copied out once for all of them:
    bytes ``[start, end)`` of the storage (``start`` rounded down to 16 so every view's offset stays
    aligned for its dtype)."""

    __slots__ = ("end", "host", "start", "view_bytes", "views")

    def __init__(self):
        self.start, self.end, self.view_bytes = None, 0, 0
        self.views: list[_Saved] = []
        self.host: Tensor | None = None

    def add(self, saved: _Saved, t: Tensor) -> None:
        first, last = _extent_bytes(t)
        self.start = first // 16 * 16 if self.start is None else min(self.start, first // 16 * 16)
        self.end = max(self.end, last)
        self.view_bytes += t.numel() * t.element_size()
        self.views.append(saved)

    @property
    def nbytes(self) -> int:
        return self.end - self.start


class _Saved:
    """One saved view: the original tensor until its chunk is offloaded, then rebuilt from the chunk."""

    __slots__ = ("dtype", "group", "offset", "shape", "stride", "tensor", "waited")

    def __init__(self, group: _Group, t: Tensor):
        self.group, self.tensor = group, t
        self.shape, self.stride, self.dtype = tuple(t.shape), t.stride(), t.dtype
        self.offset = t.storage_offset() * t.element_size()  # bytes from the storage's start
        self.waited = False

    def rebuild(self, buffer: Tensor, start: int) -> None:
        """Point this view at ``buffer``: a uint8 copy of its storage from byte ``start`` (16-aligned, the
        length a multiple of 16)."""
        elements = (self.offset - start) // self.dtype.itemsize
        self.tensor = buffer.view(self.dtype).as_strided(self.shape, self.stride, elements)


class _Group:
    """The saved views of one offloaded block's forward (deduplicated by storage and geometry, while the
    forward runs) and the storage chunks they read, one per storage."""

    def __init__(self, index: int):
        self.index = index
        self.saved: dict[tuple, _Saved] = {}
        self.chunks: dict[int, _Chunk] = {}
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
            group.chunks.clear()
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
            or t.numel() == 0
            or (t.is_cuda and t.numel() * t.element_size() < self.min_bytes)
            or _parameter_like(t)
        ):
            return t
        storage = t.untyped_storage()
        key = (storage.data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        saved = group.saved.get(key)
        if saved is None:
            saved = group.saved[key] = _Saved(group, t)
            if storage.data_ptr() not in group.chunks:
                group.chunks[storage.data_ptr()] = _Chunk()
            group.chunks[storage.data_ptr()].add(saved, t)
        return saved

    def _side_streams(self, device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Stream]:
        if device not in self._streams:
            self._streams[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
        return self._streams[device]

    def _offload(self, group: _Group) -> None:
        """Copy each chunk out once; a chunk whose range is over twice its views' bytes (a small view of a
        large buffer) stays on the device with its views."""
        group.saved = {}  # from here autograd holds the views; the chunks know theirs
        group.chunks = {p: c for p, c in group.chunks.items() if c.nbytes <= 2 * c.view_bytes}
        if not group.chunks:
            return
        device = next(iter(group.chunks.values())).views[0].tensor.device
        on_cuda = device.type == "cuda"
        context = contextlib.nullcontext()
        if on_cuda:
            d2h, _ = self._side_streams(device)
            d2h.wait_stream(torch.cuda.current_stream(device))
            context = torch.cuda.stream(d2h)
        with context:
            for chunk in group.chunks.values():
                piece = chunk.views[0].tensor.new_empty(0, dtype=torch.uint8)
                piece.set_(chunk.views[0].tensor.untyped_storage())
                piece = piece[chunk.start : chunk.end]
                chunk.host = torch.empty(-(-chunk.nbytes // 16) * 16, dtype=torch.uint8, pin_memory=on_cuda)
                chunk.host[: chunk.nbytes].copy_(piece, non_blocking=on_cuda)
                if on_cuda:
                    piece.record_stream(d2h)
                for saved in chunk.views:
                    saved.tensor = None
                self.bytes_offloaded += chunk.nbytes
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
        chunks = list(group.chunks.values())
        # allocated on the compute stream, which owns (and may just have freed) this memory
        buffers = [torch.empty(c.host.numel(), dtype=torch.uint8, device=device) for c in chunks]
        context = contextlib.nullcontext()
        if on_cuda:
            _, h2d = self._side_streams(device)
            h2d.wait_stream(torch.cuda.current_stream(device))
            h2d.wait_event(group.copied)
            context = torch.cuda.stream(h2d)
        with context:
            for chunk, buffer in zip(chunks, buffers, strict=True):
                buffer.copy_(chunk.host, non_blocking=on_cuda)
                if on_cuda:
                    buffer.record_stream(h2d)
                for saved in chunk.views:
                    saved.rebuild(buffer, chunk.start)
            if on_cuda:
                group.fetched = h2d.record_event()
        group.chunks = {}  # from here autograd's saved views alone hold the fetched buffers

    def _unpack(self, packed):
        if not isinstance(packed, _Saved):
            return packed
        group = packed.group
        self._fetch(group)  # normally started one block earlier; here only if no trigger ran
        if group.fetched is not None and not packed.waited:
            torch.cuda.current_stream(group.device).wait_event(group.fetched)
            packed.waited = True
        return packed.tensor
