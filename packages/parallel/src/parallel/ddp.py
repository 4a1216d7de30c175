"""Data-parallel wrappers: every rank trains a full replica on its own batch, gradients are averaged.

Four strategies, from the simplest to the fastest; all share one interface::

    model = BucketedDDP(net, bucket_size_mb=25)       # or NaiveDDP / FlatDDP / DDP
    loss_fn(model(x), y).backward()
    model.finish_gradient_synchronization()            # gradients now hold the mean over ranks
    optimizer.step()

- ``NaiveDDP``: after backward, one blocking all-reduce per gradient. No overlap, many small calls.
- ``FlatDDP``: after backward, every gradient copied into one flat buffer, one all-reduce, copied back.
- ``DDP``: a post-accumulate-grad hook launches an asynchronous all-reduce of each gradient as soon as
  backward has produced it (and every gradient before it in the launch order, see ``BucketedDDP``: it is
  ``BucketedDDP`` with one parameter per bucket), overlapping communication with the rest of backward.
- ``BucketedDDP``: parameters are grouped into buckets of ``bucket_size_mb`` in the order backward produces
  their gradients (first guessed as reverse registration order, then, once, the order the first synchronized
  backward actually produced them); each bucket is all-reduced asynchronously once all its gradients are
  ready, in bucket order. As in torch's DDP a bucket closes once it holds at least ``bucket_size_mb``, so a
  small parameter shares the bucket of the large one after it instead of travelling alone. Parameters
  sharing a bucket share a persistent flat buffer and their
  ``param.grad`` is a view into it (torch's ``gradient_as_bucket_view=True``), so no copy goes back; a
  parameter that fills a bucket alone is reduced where its gradient lies, with no copy at all.

Common behaviour: rank 0's parameters and buffers are broadcast at construction; parameters with
``requires_grad=False`` are left alone; a parameter shared by several modules (tied weights) is reduced
once; gradients are averaged with ``ReduceOp.AVG`` in their own dtype (fp32 parameters under BF16
autocast communicate fp32 gradients); ``no_sync()`` makes backward passes only accumulate locally, and the
next synchronized step averages the accumulated sum; ``.module`` is the wrapped model, so parameter names
carry the ``module.`` prefix and keep its order, as with ``torch.nn.parallel.DistributedDataParallel``.

Missing gradients. Collectives are matched by order, so every rank must produce gradients for the same
parameters between two synchronizations. ``finish_gradient_synchronization()`` first checks that they did
(one all-gather of a few bytes per parameter in a gloo group of its own, ``parallel.grad_presence``), also
that the module gained no trainable parameter after wrapping (it would be neither broadcast nor averaged),
and raises ``RuntimeError`` on every rank naming the parameters and ranks otherwise, never hanging: the
hook-driven wrappers launch gradients strictly in a launch order shared by all ranks, so a rank without a
gradient stops launching at it, and on a disagreement each rank first launches (zeros where it has no
gradient) what the others already launched, so that every collective in flight completes. A parameter that
gets no gradient on any rank is fine, as with torch's ``find_unused_parameters=True`` (but without its graph
walk): it is not reduced and keeps its ``.grad`` as it was, in every wrapper. Unlike torch, which averages
zeros in for the ranks without the gradient, a gradient missing on some ranks only is an error.

Limits: one process per device in the default process group (NCCL needs CUDA parameters; parameters on
the meta device are refused: materialize them before wrapping). In ``BucketedDDP`` and ``DDP``, which reduce
during backward, calling backward twice outside ``no_sync()`` before ``finish_gradient_synchronization()``
is an error; ``NaiveDDP`` and ``FlatDDP``, which reduce only in ``finish_gradient_synchronization()``,
average the accumulated gradients then. In ``BucketedDDP`` a
shared bucket receives a gradient that autograd put elsewhere (the first after an optimizer's
``zero_grad(set_to_none=True)``) by one copy; ``BucketedDDP.zero_grad()`` avoids it (shared buffers zeroed
in place, lone gradients set to None). The buckets are rebuilt once, after the first
synchronized step, from rank 0's observed gradient order (broadcast, so every rank builds the same
buckets; the rebuild briefly holds the gradients twice); a model whose backward order changes from step
to step overlaps less.
"""

from __future__ import annotations

import abc
import contextlib
import math
import numbers
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn

from parallel.consistency import check_not_wrapped, check_same_model
from parallel.grad_norm import clip_replicated_
from parallel.grad_presence import GradPresence

__all__ = ["DDP", "BucketedDDP", "FlatDDP", "NaiveDDP", "broadcast_module_state"]


_READY_TWICE = (
    "a gradient became ready twice before finish_gradient_synchronization(); "
    "accumulate over several backward passes inside no_sync()"
)


def _require_process_group(who: str) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{who} needs an initialized default process group (dist.init_process_group)")


@torch.no_grad()
def broadcast_module_state(module: nn.Module, src: int = 0) -> None:
    """Overwrite every parameter and buffer of ``module`` with rank ``src``'s values, in place."""
    _require_process_group("broadcast_module_state")
    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor.data, src=src)


def _remove_all(handles: list) -> None:
    for handle in handles:
        handle.remove()


class _DataParallel(nn.Module, abc.ABC):
    """Construction, forward and ``no_sync`` shared by the four strategies."""

    wraps_for_parallel = True  # check_not_wrapped refuses to wrap it again

    def __init__(self, module: nn.Module):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        _require_process_group(type(self).__name__)
        check_not_wrapped(module, type(self).__name__)
        on_meta = next((name for name, p in module.named_parameters() if p.device.type == "meta"), None)
        if on_meta is not None:
            raise ValueError(f"module: parameter {on_meta!r} is on the meta device (no data); materialize "
                             f"the model (to_empty and initialize, or load its weights) before wrapping")
        if dist.get_backend() == "nccl":
            off_gpu = [name for name, p in module.named_parameters() if p.device.type != "cuda"]
            if off_gpu:
                raise ValueError(f"module: the NCCL backend needs CUDA parameters, {off_gpu[0]!r} is on CPU")
        first = next(module.parameters(), None)
        check_same_model(module, type(self).__name__, first.device if first is not None else None)
        self.module = module
        self.world_size = dist.get_world_size()
        self._sync_enabled = True
        # module.parameters() yields a tied parameter once, in registration order.
        self._params: list[nn.Parameter] = [p for p in module.parameters() if p.requires_grad]
        broadcast_module_state(module)
        self._presence = GradPresence(type(self).__name__, module, self._params, prefix="module.")
        self._register_grad_ready_hooks()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _register_grad_ready_hooks(self) -> None:
        """Call ``self._on_grad_ready(param)`` once autograd has accumulated each trainable gradient."""
        # Autograd keeps hooks alive from C++, where the garbage collector cannot see them: a hook holding
        # the wrapper strongly would keep wrapper, model and buckets alive forever. So hooks hold it weakly,
        # and are removed from the parameters when the wrapper is collected.
        wrapper = weakref.ref(self)

        def hook(param: nn.Parameter) -> None:
            live = wrapper()
            if live is not None:
                live._on_grad_ready(param)

        handles = [p.register_post_accumulate_grad_hook(hook) for p in self._params]
        weakref.finalize(self, _remove_all, handles)

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        self._presence.mark(param)

    def _agreed_gradients(self) -> list[nn.Parameter]:
        """The parameters that got a gradient since the last synchronization, the same on every rank (one
        small collective, see ``parallel.grad_presence``); raises ``RuntimeError`` naming the parameters and
        ranks otherwise, on every rank."""
        present, disagreement = self._presence.agree()
        if disagreement is not None:
            raise RuntimeError(disagreement.message)
        return present

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients locally; the next synchronized one averages."""
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> Tensor:
        """Scale the gradients so that their ``norm_type``-norm is at most ``max_norm``; return the norm
        before clipping (float64 scalar). Call after ``finish_gradient_synchronization()``: the gradients are
        then equal on every rank, so the norm needs no communication and every rank scales alike."""
        return clip_replicated_([p.grad for p in self._params if p.grad is not None], max_norm, norm_type)

    @abc.abstractmethod
    def finish_gradient_synchronization(self) -> None:
        """Make every ``param.grad`` the mean over ranks (waits for communication in flight)."""


class NaiveDDP(_DataParallel):
    """One blocking all-reduce per gradient, all issued after backward."""

    def finish_gradient_synchronization(self) -> None:
        if not self._sync_enabled:
            return
        for p in self._agreed_gradients():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


class FlatDDP(_DataParallel):
    """All gradients flattened into one buffer per dtype and device, one all-reduce each, copied back."""

    def finish_gradient_synchronization(self) -> None:
        if not self._sync_enabled:
            return
        groups: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
        for p in self._agreed_gradients():
            groups.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
        for grads in groups.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.AVG)
            chunks = flat.split([g.numel() for g in grads])
            torch._foreach_copy_(grads, [chunk.view_as(g) for chunk, g in zip(chunks, grads, strict=True)])


@dataclass
class _Bucket:
    """Parameters whose gradients are all-reduced by one call.

    With several parameters, ``buffer`` is a flat gradient buffer and ``views[i]`` is ``params[i]``'s
    gradient inside it; a bucket of one parameter has neither and reduces that gradient where it lies.
    """

    params: list[nn.Parameter]
    buffer: Tensor | None
    views: list[Tensor]
    ready: set[int] = field(default_factory=set)
    work: dist.Work | None = None


def _adopt_gradient(param: nn.Parameter, view: Tensor) -> None:
    """Make ``param.grad`` the bucket view ``view``, copying the gradient in if it lives elsewhere."""
    grad = param.grad
    if grad is None:
        view.zero_()
    elif grad.data_ptr() != view.data_ptr():
        view.copy_(grad)
    else:
        return
    param.grad = view


class BucketedDDP(_DataParallel):
    """Gradients packed into buckets of at least ``bucket_size_mb`` in backward order, each all-reduced when
    its gradients are all ready.

    A bucket closes with the parameter that brings it to ``bucket_size_mb`` (MiB, 2**20 bytes) or beyond;
    parameters of different dtypes or devices never share one. After the first synchronized step the buckets
    are rebuilt in the order that step produced the gradients (see the module docstring).
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float = 25.0):
        if (isinstance(bucket_size_mb, bool) or not isinstance(bucket_size_mb, numbers.Real)
                or not math.isfinite(bucket_size_mb) or bucket_size_mb <= 0):
            raise ValueError(f"bucket_size_mb must be a finite number of MiB > 0, got {bucket_size_mb!r}")
        super().__init__(module)
        self.bucket_size_mb = bucket_size_mb
        self._set_buckets(list(reversed(self._params)))
        self._observed: list[nn.Parameter] | None = []  # gradient order of the first synchronized backward

    def _set_buckets(self, order: list[nn.Parameter]) -> None:
        self._buckets = self._build_buckets(order, int(self.bucket_size_mb * 2**20))
        self._slot = {p: (b, i) for b, bk in enumerate(self._buckets) for i, p in enumerate(bk.params)}
        self._next_launch = 0

    @property
    def bucket_numels(self) -> list[int]:
        """Number of gradient elements in each bucket, in launch order."""
        return [sum(p.numel() for p in bucket.params) for bucket in self._buckets]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset gradients, keeping shared buckets' views: each shared buffer is zeroed in one fill.

        A lone parameter's gradient is set to None (or zeroed, with ``set_to_none=False``); a gradient that
        is None stays None, also in a shared bucket.
        """
        for bucket in self._buckets:
            if bucket.buffer is None:
                p = bucket.params[0]
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.detach_().zero_()
                continue
            bucket.buffer.zero_()
            for p, view in zip(bucket.params, bucket.views, strict=True):
                if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
                    p.grad = view

    @staticmethod
    def _build_buckets(order: list[nn.Parameter], cap_bytes: int) -> list[_Bucket]:
        """Buckets of ``order``'s parameters, filled in that order; existing gradients move into them."""
        groups: list[list[nn.Parameter]] = []
        open_group: dict[tuple[torch.dtype, torch.device], tuple[list[nn.Parameter], int]] = {}
        for p in order:
            key = (p.dtype, p.device)
            members, filled = open_group.get(key, (None, 0))
            if members is None:
                members, filled = [], 0
                groups.append(members)
            members.append(p)
            filled += p.numel() * p.element_size()
            if filled >= cap_bytes:
                open_group.pop(key, None)
            else:
                open_group[key] = (members, filled)
        buckets = []
        for members in groups:
            if len(members) == 1:
                buckets.append(_Bucket(members, None, []))
                continue
            first = members[0]
            buffer = torch.zeros(sum(p.numel() for p in members), dtype=first.dtype, device=first.device)
            chunks = buffer.split([p.numel() for p in members])
            views = [chunk.view_as(p) for chunk, p in zip(chunks, members, strict=True)]
            for p, view in zip(members, views, strict=True):
                if p.grad is not None:
                    _adopt_gradient(p, view)
            buckets.append(_Bucket(members, buffer, views))
        return buckets

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        self._presence.mark(param)
        b, i = self._slot[param]
        bucket = self._buckets[b]
        if self._sync_enabled and i in bucket.ready:
            raise RuntimeError(_READY_TWICE)
        if bucket.buffer is not None:
            _adopt_gradient(param, bucket.views[i])
        if not self._sync_enabled:
            return
        if self._observed is not None:
            self._observed.append(param)
        bucket.ready.add(i)
        while (
            self._next_launch < len(self._buckets)
            and len(self._buckets[self._next_launch].ready) == len(self._buckets[self._next_launch].params)
        ):
            self._launch(self._buckets[self._next_launch])
            self._next_launch += 1

    @staticmethod
    def _launch(bucket: _Bucket) -> None:
        p = bucket.params[0]
        tensor = bucket.buffer if bucket.buffer is not None else p.grad if p.grad is not None else \
            torch.zeros_like(p)  # a rank without this gradient pairs zeros with the others' (see below)
        bucket.work = dist.all_reduce(tensor, op=dist.ReduceOp.AVG, async_op=True)

    def _launch_up_to(self, stop: int, present: set[nn.Parameter] | None) -> None:
        """Launch the buckets from the next unlaunched one up to ``stop`` (exclusive), in order.

        With ``present`` (the parameters that got a gradient, the same on every rank) only buckets holding one
        of them; otherwise every bucket, so that this rank's collectives pair with those that other ranks
        already launched. Parameters without a gradient keep theirs: a lone one is not reduced; in a shared
        buffer its slot holds its current value (equal on every rank after earlier steps) or zeros.
        """
        for bucket in self._buckets[self._next_launch:stop]:
            if present is not None and not any(p in present for p in bucket.params):
                continue
            for i, (p, view) in enumerate(zip(bucket.params, bucket.views, strict=False)):  # none if lone
                if i not in bucket.ready:
                    if p.grad is None:
                        view.zero_()
                    else:
                        _adopt_gradient(p, view)
            self._launch(bucket)
        self._next_launch = max(self._next_launch, stop)

    def finish_gradient_synchronization(self) -> None:
        if not self._sync_enabled:
            return
        present, disagreement = self._presence.agree(launched=self._next_launch)
        # Buckets launch strictly in order, so every rank has launched a prefix of the same list: on a
        # disagreement the ranks first launch up to the longest prefix, so that no collective is left waiting.
        stop = len(self._buckets) if disagreement is None else disagreement.most_launched
        self._launch_up_to(stop, None if disagreement is not None else set(present))
        for bucket in self._buckets:
            if bucket.work is not None:
                bucket.work.wait()
            bucket.work = None
            bucket.ready.clear()
        self._next_launch = 0
        if disagreement is not None:
            if self._observed is not None:
                self._observed = []
            raise RuntimeError(disagreement.message)
        if self._observed is not None and present:
            self._rebuild_in_observed_order()

    def _rebuild_in_observed_order(self) -> None:
        """Rebuild the buckets in rank 0's observed gradient order (parameters never seen keep their turn
        after them); gradients already averaged move into the new buckets unchanged."""
        index = {p: i for i, p in enumerate(self._params)}
        seen = [[index[p] for p in self._observed]]
        self._observed = None
        dist.broadcast_object_list(seen, src=0)
        order = [self._params[i] for i in seen[0]]
        missing = set(self._params) - set(order)
        order += [p for bucket in self._buckets for p in bucket.params if p in missing]
        if [id(p) for p in order] != [id(p) for bucket in self._buckets for p in bucket.params]:
            self._set_buckets(order)


class DDP(BucketedDDP):
    """Each gradient all-reduced on its own, asynchronously, as soon as backward has accumulated it and every
    gradient before it in the launch order has been launched: ``BucketedDDP`` with one parameter per bucket,
    so no gradient is copied. The launch order is reverse registration order, then, after the first
    synchronized step, the order that step produced the gradients in (see the module docstring)."""

    def __init__(self, module: nn.Module):
        super().__init__(module, bucket_size_mb=2**-20)  # a 1-byte cap: every parameter closes its own bucket
