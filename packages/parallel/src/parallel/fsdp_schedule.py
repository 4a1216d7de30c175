"""FSDP's schedule: when each unit is gathered, freed and its gradient reduced, on which stream, each
collective checked by ``parallel.lockstep`` (see ``parallel.fsdp`` for the schedule in words).

``GatherSchedule`` is driven by FSDP's hooks: ``pre_forward`` / ``post_forward`` around each use of a unit,
``on_backward_start`` when the gradient reaches a unit's outputs, ``on_grad_ready`` when a unit's gradient is
complete, ``on_replicated_grad`` for a replicated parameter; and by FSDP itself: ``begin_forward`` /
``end_forward`` around the root forward, ``end_step`` when the step's gradients are needed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten

from parallel.fsdp_units import FREE, ISSUED, READY, Layout, Unit, Use
from parallel.lockstep import Lockstep

# Kinds of collective: the high half of the code ranks compare before issuing one (see parallel.lockstep).
_GATHER, _REDUCE_SCATTER, _ALL_REDUCE, _STEP_END = 1, 2, 3, 4
RESHARD_CHOICES = (True, False, "except_last")


def in_backward() -> bool:
    """True while the autograd engine runs a backward pass (e.g. a checkpointed forward being recomputed)."""
    return torch._C._current_graph_task_id() != -1


@dataclass(frozen=True)
class ScheduleOptions:
    """How units are gathered and reduced (FSDP's constructor arguments of the same names)."""

    compute_dtype: torch.dtype
    reduce_dtype: torch.dtype
    prefetch: int
    reshard_after_forward: bool | str


class Streams:
    """The compute stream and the side stream that carries every collective (both None on the CPU)."""

    def __init__(self, device: torch.device):
        cuda = device.type == "cuda"
        self.device = device
        self.comm = torch.cuda.Stream(device) if cuda else None
        self.compute = torch.cuda.current_stream(device) if cuda else None

    def follow_current(self) -> None:
        """Take the caller's current stream as the compute stream (at the start of each forward)."""
        if self.comm is not None:
            self.compute = torch.cuda.current_stream(self.device)

    def side(self):
        """Context for side-stream work, which first waits for everything queued on the compute stream."""
        if self.comm is None:
            return contextlib.nullcontext()
        self.comm.wait_stream(self.compute)
        return torch.cuda.stream(self.comm)

    def on_compute(self):
        return contextlib.nullcontext() if self.compute is None else torch.cuda.stream(self.compute)

    def join(self) -> None:
        """Queue the compute stream behind all side-stream work (no host synchronization)."""
        if self.comm is not None:
            self.compute.wait_stream(self.comm)


class _BackwardStart(torch.autograd.Function):
    """Identity on a unit's outputs whose backward announces that the unit's backward is about to run."""

    @staticmethod
    def forward(ctx, schedule: GatherSchedule, unit: Unit, *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.schedule, ctx.unit = schedule, unit
        return tensors

    @staticmethod
    def backward(ctx, *grads: Tensor):
        ctx.schedule.on_backward_start(ctx.unit)
        return (None, None, *grads)


class GatherSchedule:
    """Gathers, frees and gradient reductions of ``layout``'s units around their use."""

    def __init__(self, layout: Layout, streams: Streams, options: ScheduleOptions, lockstep: Lockstep):
        self.units, self.replicated = layout.units, layout.replicated
        self.streams, self.options, self.lockstep = streams, options, lockstep
        self.world_size = dist.get_world_size()
        self.nccl = dist.get_backend() == "nccl"
        self.sync_enabled = True  # False inside no_sync(): gradients accumulate locally
        self.gather_observers: list = []  # called as observer(unit_index, phase, ready_event), CUDA only
        self._names = layout.first_names()
        self._replicated_originals = layout.replicated_originals
        self._forward_order: list[Unit] = []
        self._plan: list[Unit] = []  # the previous forward's unit order
        self._plan_ok = False  # this forward follows the plan so far (prefetching it is safe)
        self._backward_plan: list[Unit] = []
        self._backward_count = 0

    # ------------------------------------------------------------------------------- step boundaries
    def begin_forward(self) -> None:
        self.streams.follow_current()
        self.free_all()  # leftovers of a forward without backward (weights may have changed since)
        self.lockstep.begin_pass((torch.is_grad_enabled(), self.sync_enabled))
        self._plan, self._forward_order = self._forward_order or self._plan, []
        self._plan_ok = bool(self._plan)
        for unit in self.units:
            unit.backward_done, unit.backward_position = False, -1

    def end_forward(self) -> None:
        self._backward_plan = self._forward_order[::-1]
        self._backward_count = 0

    def end_step(self, added: list[str]) -> None:
        """Every rank ends the step with no collective left over and none gained a trainable parameter
        after wrapping (names in ``added``), or all raise; then the compute stream waits for reductions."""
        detail = f" with parameters added to the module after wrapping: {', '.join(map(repr, added))}"
        self._agree(_STEP_END, len(added), lambda: "finish the step" + (detail if added else ""),
                    step_end=True)
        if added:
            raise RuntimeError(f"FSDP: trainable parameters were added to the module after wrapping (they "
                               f"would be neither sharded nor averaged): {', '.join(map(repr, added))}; add "
                               f"them before wrapping, or wrap the module again")
        self.streams.join()
        self.free_all()

    def free_all(self) -> None:
        for unit in self.units:
            self._free(unit)

    # ----------------------------------------------------------------------------------------- hooks
    def pre_forward(self, use: Use) -> None:
        unit = use.unit
        if not in_backward():
            position = len(self._forward_order)
            self._forward_order.append(unit)
            use.forward_position = position
            self._plan_ok = self._plan_ok and position < len(self._plan) and self._plan[position] is unit
            self._issue_gather(unit)
            for ahead in range(1, self.options.prefetch):
                self._prefetch_forward(position + ahead)
            self._wait_gather(unit, "forward")
        else:  # a checkpointed forward re-run in backward: the unit stays until its gradient is done
            self._issue_gather(unit)
            self._wait_gather(unit, "backward")
        self._install_views(use)

    def post_forward(self, use: Use, output):
        if in_backward():
            return output
        unit, position = use.unit, use.forward_position
        if not (torch.is_grad_enabled() and self._keep_for_backward(position)):
            self._free(unit)
        if self.options.prefetch:
            self._prefetch_forward(position + self.options.prefetch)
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

    def on_backward_start(self, unit: Unit) -> None:
        position = self._backward_count
        self._backward_count += 1
        in_plan = position < len(self._backward_plan) and self._backward_plan[position] is unit
        unit.backward_position = position if in_plan else -1
        self._issue_gather(unit)
        if in_plan:
            for ahead in range(1, self.options.prefetch):
                self._prefetch_backward(position + ahead)
        self._wait_gather(unit, "backward")

    def on_grad_ready(self, unit: Unit) -> None:
        grad = unit.full_param.grad
        unit.full_param.grad = None
        unit.backward_done = True
        self._free(unit)
        if self.options.prefetch and unit.backward_position >= 0:
            self._prefetch_backward(unit.backward_position + self.options.prefetch)
        if not self.sync_enabled:  # no_sync(): keep the unit's whole gradient locally
            if unit.accumulated is None:
                unit.accumulated = grad.to(self.options.reduce_dtype, copy=True)
            else:
                unit.accumulated.add_(grad)
            return
        if unit.accumulated is not None:
            grad, unit.accumulated = unit.accumulated.add_(grad), None
        self._reduce_scatter(unit, grad)

    @torch.no_grad()
    def on_replicated_grad(self, index: int) -> None:
        if not self.sync_enabled or self.world_size == 1:
            return
        p = self.replicated[index]
        self._agree(_ALL_REDUCE, index, lambda: "all-reduce the gradient of "
                    f"{self._names[self._replicated_originals[index]]!r}")
        with self.streams.side():
            if self.nccl:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            else:
                dist.all_reduce(p.grad)
                p.grad.div_(self.world_size)

    # ------------------------------------------------------------------------------------- decisions
    def _keep_for_backward(self, position: int) -> bool:
        """Keep a unit gathered after its forward (``reshard_after_forward``), for the backward to come."""
        reshard = self.options.reshard_after_forward
        if reshard == "except_last":  # the unit whose backward comes first, as far as the plan tells
            return self._plan_ok and position == len(self._plan) - 1
        return not reshard

    def _prefetch_forward(self, position: int) -> None:
        if self._plan_ok and position < len(self._plan):
            self._issue_gather(self._plan[position])

    def _prefetch_backward(self, position: int) -> None:
        if 0 <= position < len(self._backward_plan):
            unit = self._backward_plan[position]
            if not unit.backward_done:
                self._issue_gather(unit)

    # ----------------------------------------------------------------------------------- collectives
    def _unit_label(self, unit: Unit) -> str:
        names = [repr(self._names[p]) for p in unit.originals]
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} parameters)" if len(names) > 3 else "")
        return f"unit {unit.index} ({shown})"

    def _agree(self, kind: int, index: int, describe, step_end: bool = False) -> None:
        """Every rank is about to issue the same collective (``kind``, ``index``), or all raise."""
        agree = self.lockstep.agree_on_step_end if step_end else self.lockstep.agree
        try:
            agree(kind << 32 | index, describe)
        except RuntimeError:
            self._forward_order, self._plan, self._plan_ok = [], [], False  # the ranks' orders differ
            raise

    def _issue_gather(self, unit: Unit) -> None:
        if unit.state != FREE:
            return
        self._agree(_GATHER, unit.index, lambda: f"gather {self._unit_label(unit)} for its "
                    f"{'backward' if in_backward() else 'forward'}")
        nbytes = unit.padded_numel * unit.full_data.element_size()
        with self.streams.on_compute():
            unit.full_data.untyped_storage().resize_(nbytes)
        # Refilling the buffer must not bump the version that autograd saved with the weight views.
        keep_version = torch.autograd._unsafe_preserve_version_counter(unit.full_data)
        with self.streams.side(), torch.no_grad(), keep_version:
            shard = unit.shard.detach()
            if shard.dtype != self.options.compute_dtype:
                shard = shard.to(self.options.compute_dtype)
            dist.all_gather_into_tensor(unit.full_data, shard)
            if self.streams.comm is not None:
                unit.event = torch.cuda.Event(enable_timing=bool(self.gather_observers))
                unit.event.record(self.streams.comm)
        unit.state = ISSUED

    def _wait_gather(self, unit: Unit, phase: str | None = None) -> None:
        """Queue the compute stream behind the unit's gather; ``phase`` names the use for gather observers."""
        if unit.state == ISSUED:
            if unit.event is not None:
                if phase is not None:
                    for observer in self.gather_observers:
                        observer(unit.index, phase, unit.event)
                self.streams.compute.wait_event(unit.event)
                unit.event = None
            unit.state = READY

    def _free(self, unit: Unit) -> None:
        if unit.state == FREE:
            return
        self._wait_gather(unit)  # the side stream is done with the buffer before the compute stream lets go
        unit.full_data.untyped_storage().resize_(0)
        unit.state = FREE

    @staticmethod
    def _install_views(use: Use) -> None:
        chunks = torch.split(use.unit.full_param, use.unit.split_sizes)
        for slot in use.slots:
            view = chunks[use.unit.chunk_of_param[slot.index]].view(use.unit.shapes[slot.index])
            slot.module.__dict__[slot.attr] = view

    @torch.no_grad()
    def _reduce_scatter(self, unit: Unit, grad: Tensor) -> None:
        self._agree(_REDUCE_SCATTER, unit.index,
                    lambda: f"reduce-scatter the gradient of {self._unit_label(unit)}")
        reduce_dtype = self.options.reduce_dtype
        with self.streams.side():
            if self.streams.comm is not None:
                grad.record_stream(self.streams.comm)
            send = grad if grad.dtype == reduce_dtype else grad.to(reduce_dtype)
            out = torch.empty(unit.shard.numel(), dtype=reduce_dtype, device=self.streams.device)
            if self.nccl:
                dist.reduce_scatter_tensor(out, send, op=dist.ReduceOp.AVG)
            else:
                dist.reduce_scatter_tensor(out, send)
                out.div_(self.world_size)
            out = out.to(torch.float32)
            if unit.shard.grad is None:
                unit.shard.grad = out
            else:
                unit.shard.grad.add_(out)
