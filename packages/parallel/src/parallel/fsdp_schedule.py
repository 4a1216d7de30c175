"""FSDP's gather / reduce-scatter schedule: module hooks, the side stream, prefetching and the gradient
reductions (see ``parallel.fsdp`` for the schedule in words)."""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from parallel.fsdp_units import FREE, ISSUED, READY, Unit, Use

# Kinds of collective: the high half of the code ranks compare before issuing one (see parallel.lockstep).
_GATHER, _REDUCE_SCATTER, _ALL_REDUCE, _FINISH = 1, 2, 3, 4


def _in_backward() -> bool:
    """True while the autograd engine runs a backward pass (e.g. a checkpointed forward being recomputed)."""
    return torch._C._current_graph_task_id() != -1



class _BackwardStart(torch.autograd.Function):
    """Identity on a unit's outputs whose backward announces that the unit's backward is about to run."""

    @staticmethod
    def forward(ctx, fsdp: GatherSchedule, unit: Unit, *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.fsdp, ctx.unit = fsdp, unit
        return tensors

    @staticmethod
    def backward(ctx, *grads: Tensor):
        ctx.fsdp._on_backward_start(ctx.unit)
        return (None, None, *grads)


class GatherSchedule:
    """Gathers, frees and gradient reductions of FSDP's units around their use (a mixin of FSDP)."""

    def _register_hooks(self) -> None:
        for unit in self._units:
            for use in unit.uses:
                use.module.register_forward_pre_hook(lambda m, a, use=use: self._pre_forward(use))
                use.module.register_forward_hook(lambda m, a, out, use=use: self._post_forward(use, out))
        # Tensor hooks live where Python's garbage collector cannot follow them (autograd's C++ side), so a
        # hook that held this object or a unit strongly would keep every shard alive after the wrapper is
        # dropped: they hold a weak reference and a unit index instead.
        this = weakref.ref(self)
        for unit in self._units:
            if unit.shard.requires_grad:
                unit.full_param.register_post_accumulate_grad_hook(
                    lambda t, index=unit.index: this()._on_grad_ready(this()._units[index]))
        if self.world_size > 1:
            for i, p in enumerate(self._replicated):
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(lambda t, i=i: this()._all_reduce_replicated(t, i))

    # ------------------------------------------------------------------------------------- agreement
    def _name_of(self, original: Tensor) -> str:
        return next(name for name, p in self._param_names if p is original)

    def _unit_label(self, unit: Unit) -> str:
        names = [repr(self._name_of(p)) for p in self._unit_originals[unit.index]]
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} parameters)" if len(names) > 3 else "")
        return f"unit {unit.index} ({shown})"

    def _agree(self, kind: int, index: int, describe) -> None:
        """Every rank is about to issue the same collective (``kind``, ``index``), or all raise."""
        try:
            self._lockstep.agree(kind << 32 | index, describe)
        except RuntimeError:
            self._forward_order, self._plan, self._plan_ok = [], [], False  # the ranks' orders differ
            raise

    def _agree_on_finish(self) -> None:
        """Every rank finishes the step with no collective left over, and none gained a trainable parameter
        after wrapping (it would be neither sharded nor averaged), or all raise naming what differs."""
        if self.world_size == 1:
            return
        added = self._added.added_parameters()
        detail = f" with parameters added to the module after wrapping: {', '.join(map(repr, added))}"
        self._agree(_FINISH, len(added), lambda: "finish the step" + (detail if added else ""))
        if added:
            raise RuntimeError(f"FSDP: trainable parameters were added to the module after wrapping (they "
                               f"would be neither sharded nor averaged): {', '.join(map(repr, added))}; add "
                               f"them before wrapping, or wrap the module again")

    # -------------------------------------------------------------------------------------- gathering
    def _side_stream(self):
        """Context for side-stream work, which first waits for everything queued on the compute stream."""
        if self._comm_stream is None:
            return contextlib.nullcontext()
        self._comm_stream.wait_stream(self._compute_stream)
        return torch.cuda.stream(self._comm_stream)

    def _issue_gather(self, unit: Unit) -> None:
        if unit.state != FREE:
            return
        self._agree(_GATHER, unit.index, lambda: f"gather {self._unit_label(unit)} for its "
                    f"{'backward' if _in_backward() else 'forward'}")
        nbytes = unit.padded_numel * unit.full_data.element_size()
        with torch.cuda.stream(self._compute_stream) if self._compute_stream is not None else \
                contextlib.nullcontext():
            unit.full_data.untyped_storage().resize_(nbytes)
        # Refilling the buffer must not bump the version that autograd saved with the weight views.
        keep_version = torch.autograd._unsafe_preserve_version_counter(unit.full_data)
        with self._side_stream(), torch.no_grad(), keep_version:
            shard = unit.shard.detach()
            if shard.dtype != self.compute_dtype:
                shard = shard.to(self.compute_dtype)
            dist.all_gather_into_tensor(unit.full_data, shard)
            if self._comm_stream is not None:
                unit.event = torch.cuda.Event(enable_timing=bool(self._gather_observers))
                unit.event.record(self._comm_stream)
        unit.state = ISSUED

    def _wait_gather(self, unit: Unit, phase: str | None = None) -> None:
        """Queue the compute stream behind the unit's gather; ``phase`` names the use for gather observers."""
        if unit.state == ISSUED:
            if unit.event is not None:
                if phase is not None:
                    for observer in self._gather_observers:
                        observer(unit.index, phase, unit.event)
                self._compute_stream.wait_event(unit.event)
                unit.event = None
            unit.state = READY

    def _free(self, unit: Unit) -> None:
        if unit.state == FREE:
            return
        self._wait_gather(unit)  # the side stream is done with the buffer before the compute stream lets go
        unit.full_data.untyped_storage().resize_(0)
        unit.state = FREE

    def _install_views(self, use: Use) -> None:
        chunks = torch.split(use.unit.full_param, use.unit.split_sizes)
        for slot in use.slots:
            view = chunks[use.unit.chunk_of_param[slot.index]].view(use.unit.shapes[slot.index])
            slot.module.__dict__[slot.attr] = view

    def _prefetch_forward(self, position: int) -> None:
        if self._plan_ok and position < len(self._plan):
            self._issue_gather(self._plan[position])

    # ------------------------------------------------------------------------------------------ hooks
    def _pre_forward(self, use: Use) -> None:
        unit = use.unit
        if not _in_backward():
            position = len(self._forward_order)
            self._forward_order.append(unit)
            use.forward_position = position
            self._plan_ok = self._plan_ok and position < len(self._plan) and self._plan[position] is unit
            self._issue_gather(unit)
            for ahead in range(1, self.prefetch):
                self._prefetch_forward(position + ahead)
            self._wait_gather(unit, "forward")
        else:  # a checkpointed forward re-run in backward: the unit stays until its gradient is done
            self._issue_gather(unit)
            self._wait_gather(unit, "backward")
        self._install_views(use)

    def _post_forward(self, use: Use, output):
        if _in_backward():
            return output
        unit, position = use.unit, use.forward_position
        keep_for_backward = (torch.is_grad_enabled() and self._plan_ok and position == len(self._plan) - 1)
        if not keep_for_backward:
            self._free(unit)
        if self.prefetch:
            self._prefetch_forward(position + self.prefetch)
        if not torch.is_grad_enabled():
            return output
        flat, spec = tree_flatten(output)
        needs = [i for i, t in enumerate(flat) if isinstance(t, Tensor) and t.requires_grad]
        if not needs:
            return output
        wrapped = _BackwardStart.apply(self, unit, *(flat[i] for i in needs))
        for i, t in zip(needs, wrapped, strict=True):
            flat[i] = t
        return tree_unflatten(flat, spec)

    def _prefetch_backward(self, position: int) -> None:
        if 0 <= position < len(self._backward_plan):
            unit = self._backward_plan[position]
            if not unit.backward_done:
                self._issue_gather(unit)

    def _on_backward_start(self, unit: Unit) -> None:
        position = self._backward_count
        self._backward_count += 1
        in_plan = position < len(self._backward_plan) and self._backward_plan[position] is unit
        unit.backward_position = position if in_plan else -1
        self._issue_gather(unit)
        if in_plan:
            for ahead in range(1, self.prefetch):
                self._prefetch_backward(position + ahead)
        self._wait_gather(unit, "backward")

    def _on_grad_ready(self, unit: Unit) -> None:
        grad = unit.full_param.grad
        unit.full_param.grad = None
        unit.backward_done = True
        self._free(unit)
        if self.prefetch and unit.backward_position >= 0:
            self._prefetch_backward(unit.backward_position + self.prefetch)
        if not self._sync_enabled:  # no_sync(): keep the unit's whole gradient locally
            if unit.accumulated is None:
                unit.accumulated = grad.to(self.reduce_dtype, copy=True)
            else:
                unit.accumulated.add_(grad)
            return
        if unit.accumulated is not None:
            grad, unit.accumulated = unit.accumulated.add_(grad), None
        self._reduce_scatter(unit, grad)

    @torch.no_grad()
    def _reduce_scatter(self, unit: Unit, grad: Tensor) -> None:
        self._agree(_REDUCE_SCATTER, unit.index,
                    lambda: f"reduce-scatter the gradient of {self._unit_label(unit)}")
        with self._side_stream():
            if self._comm_stream is not None:
                grad.record_stream(self._comm_stream)
            send = grad if grad.dtype == self.reduce_dtype else grad.to(self.reduce_dtype)
            out = torch.empty(unit.shard.numel(), dtype=self.reduce_dtype, device=self.device)
            if self._nccl:
                dist.reduce_scatter_tensor(out, send, op=dist.ReduceOp.AVG)
            else:
                dist.reduce_scatter_tensor(out, send)
                out.div_(self.world_size)
            out = out.to(torch.float32)
            if unit.shard.grad is None:
                unit.shard.grad = out
            else:
                unit.shard.grad.add_(out)

    @torch.no_grad()
    def _all_reduce_replicated(self, p: Tensor, index: int) -> None:
        if not self._sync_enabled:
            return
        self._agree(_ALL_REDUCE, index, lambda: "all-reduce the gradient of "
                    f"{self._name_of(self._replicated_originals[index])!r}")
        with self._side_stream():
            if self._nccl:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            else:
                dist.all_reduce(p.grad)
                p.grad.div_(self.world_size)

