"""Fully sharded data parallelism: fp32 master shards, weights gathered just in time, gradients
reduce-scattered as soon as they are ready.

    net = build_model("xl", device="meta")
    model = FSDP(net, compute_dtype=torch.bfloat16, unit_modules=(TransformerBlock,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)   # steps the fp32 shards
    loss_fn(model(x), y).backward(); model.finish_gradient_synchronization(); opt.step(); opt.zero_grad()

Units. A *unit* is a group of parameters flattened into one buffer and communicated with one all-gather
and one reduce-scatter. Every instance of a class in ``unit_modules`` (e.g. a TransformerBlock) is one unit
holding all its parameters; every other module owning a 2-D ``weight`` (Linear-like, Embedding-like) is one
unit of its own parameters; the remaining parameters (norm gains) are *replicated*: kept whole and fp32 on
every rank, their gradients all-reduced (averaged) as soon as backward produces them.

Memory. Each rank keeps one fp32 shard per unit: the flat unit (each parameter's start aligned to 16 elements)
padded to a multiple of the world size, 1/N of it per rank (``flat_shards()``, the parameters an optimizer
steps). Gathered weights exist only around their use: before a unit's forward the shard is cast to
``compute_dtype`` (then gathered: half the bytes of fp32 in bf16) into a full buffer whose storage is released
right after the forward and allocated again when backward needs it.

Schedule (CUDA). Collectives run on a side stream. The order of units in the previous forward is the plan:
when unit i's forward starts, unit i+1's gather is issued (if not yet); when it ends, unit i+2's
(``prefetch`` = 2; so at most three units are gathered at once). Backward mirrors this in reverse order: the
gather of a unit is ensured when the gradient reaches its output, the next one prefetched, and when the
unit's gradient is complete its weights are freed, the gather two ahead issued and its gradient
reduce-scattered (cast to ``reduce_dtype``, default fp32, averaged) on the side stream, accumulating into
``shard.grad`` (fp32, the shard's shape). The last unit of the forward stays gathered for the backward
that follows.
``finish_gradient_synchronization()`` makes the compute stream wait for all of it (no host synchronization).

Stream safety. Every batch of side-stream work starts by waiting for the compute stream, and the compute
stream waits on a gather's event before it uses (or frees) the gathered buffer, so buffers allocated on the
compute stream are never reused while the side stream touches them; a gradient handed to the side stream is
marked with ``record_stream``.

Activation checkpointing (``torch.utils.checkpoint(..., use_reentrant=False)``) works: a forward re-run inside
backward finds its unit gathered again (or gathers it) and keeps it until the unit's gradient is complete.

Meta-device models are materialized unit by unit: the unit's parameters are allocated on this rank's device,
the owning modules' ``reset_parameters()`` run under an RNG seeded from ``seed`` and the unit's index (the
same on every rank, independent of the world size), this rank's shard is kept and the rest freed, so the full
model never exists on one device. A model with real parameters is sharded from rank 0's values.

Limits: one process per device in the default process group; every rank runs the same units in the same order
(collectives are matched by order); the FSDP wrapper is the root module (``state_dict`` / ``load_state_dict``
use the wrapped module's parameter names, full fp32 tensors on CPU) and the model is not moved after wrapping;
replicated parameters stay fp32, so their modules must accept fp32 weights with ``compute_dtype`` inputs (the
reference RMSNorm computes in fp32); modules owning parameters of a meta model need ``reset_parameters()``;
buffers must not be on the meta device. A weight shared between units (tied embedding and LM head) belongs to
the first unit; it stays gathered from its last forward use until its gradient is complete.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["FSDP"]

_ALIGN = 16  # elements: every parameter view 32-byte aligned in bf16 (64 in fp32), as matmul kernels like
_FREE, _ISSUED, _READY = "free", "issued", "ready"


def _in_backward() -> bool:
    """True while the autograd engine runs a backward pass (e.g. a checkpointed forward being recomputed)."""
    return torch._C._current_graph_task_id() != -1


@dataclass(frozen=True)
class _Slot:
    """Where one of a unit's parameters lives as an attribute: ``module.<attr>`` is parameter ``index``."""

    module: nn.Module
    attr: str
    index: int


@dataclass
class _Use:
    """A module whose forward reads a unit's parameters (the unit's root, or a module tied to it)."""

    unit: _Unit
    module: nn.Module
    slots: list[_Slot]
    forward_position: int = -1


@dataclass
class _Unit:
    """One flat communication unit: its fp32 shard, its gathered buffer and bookkeeping."""

    index: int
    shapes: list[torch.Size]
    offsets: list[int]
    padded_numel: int
    shard: nn.Parameter
    full_data: Tensor  # compute dtype, ``padded_numel`` elements; storage empty while not gathered
    full_param: Tensor  # the same storage as a leaf that autograd accumulates the gathered gradient into
    split_sizes: list[int]  # chunks of the full buffer: parameters, alignment gaps and the tail padding
    chunk_of_param: list[int]
    uses: list[_Use] = field(default_factory=list)
    state: str = _FREE
    event: torch.cuda.Event | None = None
    backward_position: int = -1
    backward_done: bool = False


class _BackwardStart(torch.autograd.Function):
    """Identity on a unit's outputs whose backward announces that the unit's backward is about to run."""

    @staticmethod
    def forward(ctx, fsdp: FSDP, unit: _Unit, *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.fsdp, ctx.unit = fsdp, unit
        return tensors

    @staticmethod
    def backward(ctx, *grads: Tensor):
        ctx.fsdp._on_backward_start(ctx.unit)
        return (None, None, *grads)


def _owns_2d_weight(module: nn.Module) -> bool:
    weight = module._parameters.get("weight")
    return weight is not None and weight.dim() == 2


def _require_process_group() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("FSDP needs an initialized default process group (init_process_group)")


class FSDP(nn.Module):
    """Shard ``module``'s weights over the default process group (see the module docstring).

    ``compute_dtype``: dtype of gathered weights and hence of the forward/backward math (None: fp32).
    ``unit_modules``: module classes whose instances each become one unit. ``reduce_dtype``: dtype of the
    gradient reduce-scatter (None: ``compute_dtype``). ``prefetch``: how many units ahead gathers run (0: on
    demand). ``seed``: initialization seed for a meta-device ``module``. ``device``: where shards and
    computation live (default: the current CUDA device under NCCL, else the CPU). ``measure_gathers``: time
    every gather against the moment the compute stream needs it (CUDA events; see ``gather_slack``).
    """

    def __init__(
        self,
        module: nn.Module,
        compute_dtype: torch.dtype | None = None,
        unit_modules: Iterable[type[nn.Module]] = (),
        reduce_dtype: torch.dtype | None = torch.float32,
        prefetch: int = 2,
        seed: int = 0,
        device: torch.device | str | None = None,
        measure_gathers: bool = False,
    ):
        super().__init__()
        _require_process_group()
        unit_modules = tuple(unit_modules)
        if not all(isinstance(c, type) and issubclass(c, nn.Module) for c in unit_modules):
            raise TypeError(f"unit_modules must be nn.Module subclasses, got {unit_modules!r}")
        for name, dtype in (("compute_dtype", compute_dtype), ("reduce_dtype", reduce_dtype)):
            if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
                raise ValueError(f"{name} must be a floating-point torch.dtype or None, got {dtype!r}")
        if not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be a non-negative int, got {prefetch!r}")
        self.module = module
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self._nccl = dist.get_backend() == "nccl"
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if self._nccl else torch.device("cpu"))
        if self._nccl and self.device.type != "cuda":
            raise ValueError(f"the NCCL backend needs a CUDA device, got device={self.device}")
        if measure_gathers and self.device.type != "cuda":
            raise ValueError(f"measure_gathers times CUDA streams; device {self.device} has none")
        self.compute_dtype = compute_dtype or torch.float32
        self.reduce_dtype = reduce_dtype or self.compute_dtype
        self.prefetch = prefetch
        self.measure_gathers = measure_gathers
        self._gather_log: list[tuple[int, str, torch.cuda.Event, torch.cuda.Event]] = []
        cuda = self.device.type == "cuda"
        self._comm_stream = torch.cuda.Stream(self.device) if cuda else None
        self._compute_stream = torch.cuda.current_stream(self.device) if cuda else None

        self._param_names = self._record_names()
        groups, replicated = self._group_parameters(unit_modules)
        self.shards = nn.ParameterList()
        self._units: list[_Unit] = []
        self._unit_originals: list[list[Tensor]] = []  # each unit's parameters as the module held them
        for index, (root, params) in enumerate(groups):
            unit = self._build_unit(index, root, params, seed)
            self._units.append(unit)
            self._unit_originals.append(params)
            self.shards.append(unit.shard)
        self._replicated_originals = replicated
        self._replicated = self._materialize_replicated(replicated, seed + len(groups))
        self._check_buffers()
        self._register_hooks()

        self._forward_order: list[_Unit] = []
        self._plan: list[_Unit] = []  # the previous forward's unit order
        self._plan_ok = False
        self._backward_plan: list[_Unit] = []
        self._backward_count = 0

    # -------------------------------------------------------------------------------------- structure
    def _record_names(self) -> list[tuple[str, Tensor]]:
        """Every (name, parameter) of the wrapped module, tied names included, in ``state_dict`` order."""
        return list(self.module.named_parameters(remove_duplicate=False))

    def _slots_of(self) -> dict[Tensor, list[tuple[nn.Module, str]]]:
        slots: dict[Tensor, list[tuple[nn.Module, str]]] = {}
        for m in self.module.modules():
            for attr, p in m._parameters.items():
                if p is not None:
                    slots.setdefault(p, []).append((m, attr))
        return slots

    def _group_parameters(self, unit_modules) -> tuple[list[tuple[nn.Module, list[Tensor]]], list[Tensor]]:
        """``([(root module, its unit's parameters)], replicated parameters)`` in module order."""
        claimed: set[Tensor] = set()
        groups: list[tuple[nn.Module, list[Tensor]]] = []
        inside_block: set[nn.Module] = set()
        for m in self.module.modules():
            if m in inside_block:
                continue
            if unit_modules and isinstance(m, unit_modules):
                inside_block.update(m.modules())
                params = [p for p in m.parameters() if p not in claimed]
            elif _owns_2d_weight(m):
                params = [p for p in m._parameters.values() if p is not None and p not in claimed]
            else:
                continue
            params = [p for p in params if p.requires_grad]
            if params:
                claimed.update(params)
                groups.append((m, params))
        replicated = [p for p in self.module.parameters() if p not in claimed]
        return groups, replicated

    # ---------------------------------------------------------------------------------- materializing
    def _seeded(self, seed: int):
        stack = contextlib.ExitStack()
        devices = [self.device] if self.device.type == "cuda" else []
        stack.enter_context(torch.random.fork_rng(devices=devices))
        torch.default_generator.manual_seed(seed)
        if self.device.type == "cuda":
            torch.cuda.default_generators[self.device.index].manual_seed(seed)
        return stack

    def _materialize(self, params: list[Tensor], slots: dict, seed: int) -> list[Tensor]:
        """Values of ``params`` on this device: meta ones allocated and reset (seeded), others as they are."""
        if not any(p.is_meta for p in params):
            return [p.detach().to(self.device) for p in params]
        if not all(p.is_meta for p in params):
            raise ValueError("a unit mixes meta and materialized parameters; build the model on one device")
        owners: dict[nn.Module, None] = {}
        fresh = []
        for p in params:
            new = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=self.device), p.requires_grad)
            for m, attr in slots[p]:
                m._parameters[attr] = new
                owners[m] = None
            fresh.append(new)
        with self._seeded(seed), torch.no_grad():
            for m in self.module.modules():  # module order, as construction would initialize them
                if m in owners:
                    if not hasattr(m, "reset_parameters"):
                        raise ValueError(f"{type(m).__name__} owns meta parameters but no reset_parameters()")
                    m.reset_parameters()
        return [p.detach() for p in fresh]

    def _build_unit(self, index: int, root: nn.Module, params: list[Tensor], seed: int) -> _Unit:
        slots = self._slots_of()  # keyed by the original parameters, before materializing replaces them
        values = self._materialize(params, slots, seed * 1_000_003 + index)
        offsets, split_sizes, chunk_of_param, cursor = [], [], [], 0
        for v in values:
            start = -(-cursor // _ALIGN) * _ALIGN
            if start > cursor:
                split_sizes.append(start - cursor)
            offsets.append(start)
            chunk_of_param.append(len(split_sizes))
            split_sizes.append(v.numel())
            cursor = start + v.numel()
        padded = -(-cursor // self.world_size) * self.world_size
        if padded > cursor:
            split_sizes.append(padded - cursor)
        shard_numel = padded // self.world_size
        with torch.no_grad():
            full = torch.zeros(padded, dtype=torch.float32, device=self.device)
            for v, off in zip(values, offsets, strict=True):
                full[off:off + v.numel()].copy_(v.reshape(-1))
            if not any(p.is_meta for p in params):  # real weights: every rank starts from rank 0's
                dist.broadcast(full, src=0)
            shard = nn.Parameter(full[self.rank * shard_numel:(self.rank + 1) * shard_numel].clone())
        del full, values
        full_data = torch.empty(padded, dtype=self.compute_dtype, device=self.device)
        full_data.untyped_storage().resize_(0)
        full_param = full_data.detach().requires_grad_(True)
        unit = _Unit(index, [p.shape for p in params], offsets, padded, shard, full_data, full_param,
                     split_sizes, chunk_of_param)
        # Replace the parameters by plain attributes (views of the gathered buffer, set at each use).
        position = {p: i for i, p in enumerate(params)}
        in_root = set(root.modules())
        by_module: dict[nn.Module, list[_Slot]] = {}
        for p in params:
            for m, attr in slots[p]:
                del m._parameters[attr]
                use_module = root if m in in_root else m
                by_module.setdefault(use_module, []).append(_Slot(m, attr, position[p]))
        unit.uses = [_Use(unit, m, s) for m, s in by_module.items()]
        return unit

    def _materialize_replicated(self, params: list[Tensor], seed: int) -> list[nn.Parameter]:
        slots = self._slots_of()
        values = self._materialize(params, slots, seed * 1_000_003) if params else []
        replicated = []
        for p, v in zip(params, values, strict=True):
            new = nn.Parameter(v.to(torch.float32).clone(), requires_grad=p.requires_grad)
            if not p.is_meta and self.world_size > 1:
                dist.broadcast(new.data, src=0)
            for m, attr in slots[p]:
                m._parameters[attr] = new
            replicated.append(new)
        return replicated

    def _check_buffers(self) -> None:
        for name, b in self.module.named_buffers():
            if b.is_meta:
                raise ValueError(f"buffer {name!r} is on the meta device; FSDP materializes parameters only")
            if b.device != self.device:
                self.module.get_submodule(name.rpartition(".")[0])._buffers[name.rpartition(".")[2]] = \
                    b.to(self.device)

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
            for p in self._replicated:
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(lambda t: this()._all_reduce_replicated(t))

    # -------------------------------------------------------------------------------------- gathering
    def _side_stream(self):
        """Context for side-stream work, which first waits for everything queued on the compute stream."""
        if self._comm_stream is None:
            return contextlib.nullcontext()
        self._comm_stream.wait_stream(self._compute_stream)
        return torch.cuda.stream(self._comm_stream)

    def _issue_gather(self, unit: _Unit) -> None:
        if unit.state != _FREE:
            return
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
                unit.event = torch.cuda.Event(enable_timing=self.measure_gathers)
                unit.event.record(self._comm_stream)
        unit.state = _ISSUED

    def _wait_gather(self, unit: _Unit, phase: str | None = None) -> None:
        """Queue the compute stream behind the unit's gather; ``phase`` names a use for ``gather_slack``."""
        if unit.state == _ISSUED:
            if unit.event is not None:
                if self.measure_gathers and phase is not None:
                    needed = torch.cuda.Event(enable_timing=True)
                    needed.record(self._compute_stream)
                    self._gather_log.append((unit.index, phase, needed, unit.event))
                self._compute_stream.wait_event(unit.event)
                unit.event = None
            unit.state = _READY

    def _free(self, unit: _Unit) -> None:
        if unit.state == _FREE:
            return
        self._wait_gather(unit)  # the side stream is done with the buffer before the compute stream lets go
        unit.full_data.untyped_storage().resize_(0)
        unit.state = _FREE

    def _install_views(self, use: _Use) -> None:
        chunks = torch.split(use.unit.full_param, use.unit.split_sizes)
        for slot in use.slots:
            view = chunks[use.unit.chunk_of_param[slot.index]].view(use.unit.shapes[slot.index])
            slot.module.__dict__[slot.attr] = view

    def _prefetch_forward(self, position: int) -> None:
        if self._plan_ok and position < len(self._plan):
            self._issue_gather(self._plan[position])

    # ------------------------------------------------------------------------------------------ hooks
    def _pre_forward(self, use: _Use) -> None:
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

    def _post_forward(self, use: _Use, output):
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

    def _on_backward_start(self, unit: _Unit) -> None:
        position = self._backward_count
        self._backward_count += 1
        in_plan = position < len(self._backward_plan) and self._backward_plan[position] is unit
        unit.backward_position = position if in_plan else -1
        self._issue_gather(unit)
        if in_plan:
            for ahead in range(1, self.prefetch):
                self._prefetch_backward(position + ahead)
        self._wait_gather(unit, "backward")

    def _on_grad_ready(self, unit: _Unit) -> None:
        grad = unit.full_param.grad
        unit.full_param.grad = None
        unit.backward_done = True
        self._free(unit)
        if self.prefetch and unit.backward_position >= 0:
            self._prefetch_backward(unit.backward_position + self.prefetch)
        self._reduce_scatter(unit, grad)

    @torch.no_grad()
    def _reduce_scatter(self, unit: _Unit, grad: Tensor) -> None:
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
    def _all_reduce_replicated(self, p: Tensor) -> None:
        with self._side_stream():
            if self._nccl:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            else:
                dist.all_reduce(p.grad)
                p.grad.div_(self.world_size)

    # ----------------------------------------------------------------------------------------- public
    def forward(self, *args, **kwargs):
        """The wrapped module's forward; its units are gathered and freed around their use."""
        if self._compute_stream is not None:
            self._compute_stream = torch.cuda.current_stream(self.device)
        for unit in self._units:  # leftovers of a forward without backward (weights may have changed since)
            self._free(unit)
        self._plan, self._forward_order = self._forward_order or self._plan, []
        self._gather_log = []
        self._plan_ok = bool(self._plan)
        for unit in self._units:
            unit.backward_done, unit.backward_position = False, -1
        output = self.module(*args, **kwargs)
        self._backward_plan = self._forward_order[::-1]
        self._backward_count = 0
        return output

    def finish_gradient_synchronization(self) -> None:
        """Queue the compute stream behind every reduce-scatter and all-reduce; free what is still gathered.

        Afterwards each shard's ``.grad`` (fp32, the shard's shape) holds its slice of the gradient averaged
        over ranks, and each replicated parameter's ``.grad`` the average.
        """
        if self._comm_stream is not None:
            self._compute_stream.wait_stream(self._comm_stream)
        for unit in self._units:
            self._free(unit)

    def gather_slack(self) -> list[dict]:
        """For each gather the last step waited on: ``{unit, phase, late_ms}`` (needs ``measure_gathers``).

        ``late_ms`` is the time from the compute stream reaching the unit to the gather finishing: negative
        when the gather finished early (by that much), positive when compute stalled for it. Synchronizes.
        """
        if not self.measure_gathers:
            raise RuntimeError("gather_slack needs FSDP(..., measure_gathers=True)")
        torch.cuda.synchronize(self.device)
        return [{"unit": index, "phase": phase, "late_ms": needed.elapsed_time(ready)}
                for index, phase, needed, ready in self._gather_log]

    def flat_shards(self) -> list[nn.Parameter]:
        """This rank's fp32 shard of every unit (1-D; unit padded to a multiple of the world size)."""
        return list(self.shards)

    def replicated_parameters(self) -> list[nn.Parameter]:
        """The parameters every rank holds whole (norm gains)."""
        return list(self._replicated)

    @torch.no_grad()
    def _gather_unit_fp32(self, unit: _Unit, grads: bool = False) -> Tensor:
        """The unit's whole flat fp32 value (or gradient: zeros where a shard has none)."""
        local = unit.shard.detach()
        if grads:
            local = unit.shard.grad if unit.shard.grad is not None else torch.zeros_like(local)
        full = torch.empty(unit.padded_numel, dtype=torch.float32, device=self.device)
        dist.all_gather_into_tensor(full, local.float())
        return full

    @torch.no_grad()
    def gather_full_params(self, device: torch.device | str = "cpu") -> dict[str, Tensor]:
        """Every parameter of the wrapped module in full fp32, named as in ``module.named_parameters()``.

        Collective: call on every rank. Tied parameters appear once, under their first name.
        """
        return self._by_name(self._full_values(device))

    @torch.no_grad()
    def gather_full_grads(self, device: torch.device | str = "cpu") -> dict[str, Tensor]:
        """Every parameter's averaged gradient in full fp32 (zeros where none), named and deduplicated as
        in :meth:`gather_full_params`; call after ``finish_gradient_synchronization``, on every rank."""
        return self._by_name(self._full_values(device, grads=True))

    def _by_name(self, values: dict[Tensor, Tensor]) -> dict[str, Tensor]:
        out, seen = {}, set()
        for name, p in self._param_names:
            if p not in seen:
                seen.add(p)
                out[name] = values[p]
        return out

    def _full_values(self, device, grads: bool = False) -> dict[Tensor, Tensor]:
        """Original parameter object -> full fp32 value (or gradient) on ``device``."""
        if self._comm_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._comm_stream)
        values: dict[Tensor, Tensor] = {}
        for unit, params in zip(self._units, self._unit_originals, strict=True):
            full = self._gather_unit_fp32(unit, grads)
            for i, p in enumerate(params):
                off = unit.offsets[i]
                values[p] = full[off:off + unit.shapes[i].numel()].view(unit.shapes[i]).to(device, copy=True)
        for p, current in zip(self._replicated_originals, self._replicated, strict=True):
            value = current.grad if grads else current.detach()
            if value is None:
                value = torch.zeros_like(current)
            values[p] = value.to(device, torch.float32, copy=True)
        return values

    # ------------------------------------------------------------------------------------ state dicts
    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False) -> dict:
        """Full fp32 state of the wrapped module (CPU tensors, its own key names, tied keys included).

        Collective: call on every rank; a plain ``module.load_state_dict`` accepts it.
        """
        if args:
            raise TypeError("FSDP.state_dict takes keyword arguments only (destination, prefix, keep_vars)")
        destination = {} if destination is None else destination
        values = self._full_values("cpu")
        for name, p in self._param_names:
            destination[prefix + name] = values[p]
        for name, b in self.module.named_buffers():
            destination[prefix + name] = b.detach().cpu().clone()
        return destination

    @torch.no_grad()
    def load_state_dict(self, state_dict: Mapping[str, Tensor], strict: bool = True, assign: bool = False):
        """Load a full state dict (from ``state_dict()`` on any number of ranks, or a plain module's).

        Every rank keeps its slice of each unit; replicated parameters and buffers are copied whole.
        """
        if assign:
            raise ValueError("FSDP.load_state_dict copies into the shards; assign=True is not supported")
        expected = [name for name, _ in self._param_names] + [name for name, _ in self.module.named_buffers()]
        missing = [k for k in expected if k not in state_dict]
        unexpected = [k for k in state_dict if k not in set(expected)]
        if strict and (missing or unexpected):
            raise RuntimeError(f"FSDP.load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        first_name = {}
        for name, p in self._param_names:
            if name in state_dict:
                first_name.setdefault(p, name)
        for unit, params in zip(self._units, self._unit_originals, strict=True):
            if not any(p in first_name for p in params):
                continue
            full = self._gather_unit_fp32(unit)  # keeps parameters absent from the state dict as they are
            for i, p in enumerate(params):
                if p in first_name:
                    value = state_dict[first_name[p]]
                    if value.shape != unit.shapes[i]:
                        raise ValueError(f"state_dict[{first_name[p]!r}] has shape {tuple(value.shape)}, "
                                         f"expected {tuple(unit.shapes[i])}")
                    off = unit.offsets[i]
                    full[off:off + value.numel()].copy_(value.reshape(-1))
            n = unit.shard.numel()
            unit.shard.copy_(full[self.rank * n:(self.rank + 1) * n])
        for p, current in zip(self._replicated_originals, self._replicated, strict=True):
            if p in first_name:
                current.copy_(state_dict[first_name[p]])
        for name, b in self.module.named_buffers():
            if name in state_dict:
                b.copy_(state_dict[name])
        return nn.modules.module._IncompatibleKeys(missing, unexpected)

    def save_full_state_dict(self, path: str | os.PathLike) -> None:
        """Gather the full state (collective) and write it from rank 0 (temporary file, then rename)."""
        state = self.state_dict()
        if self.rank == 0:
            directory = os.path.dirname(os.path.abspath(path))
            fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
            os.close(fd)
            try:
                torch.save(state, tmp)
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        dist.barrier()

    def load_full_state_dict(self, path: str | os.PathLike, strict: bool = True):
        """Read a file written by :meth:`save_full_state_dict` (on any number of ranks) into the shards."""
        return self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=strict)
