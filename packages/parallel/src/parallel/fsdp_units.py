"""FSDP's flat-unit layout: which parameters form a unit, where each lives in the flat buffer, and how a
meta-device model is materialized unit by unit (see ``parallel.fsdp`` for the whole picture)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

ALIGN = 16  # elements: every parameter view 32-byte aligned in bf16 (64 in fp32), as matmul kernels like
FREE, ISSUED, READY = "free", "issued", "ready"


class Piece(NamedTuple):
    """Flattened elements ``[start, stop)`` of a tensor hold elements ``[offset, offset + stop - start)`` of
    the flattened parameter ``name``, which has ``numel`` elements in all."""

    name: str
    start: int
    stop: int
    offset: int
    numel: int


@dataclass(frozen=True)
class Slot:
    """Where one of a unit's parameters lives as an attribute: ``module.<attr>`` is parameter ``index``."""

    module: nn.Module
    attr: str
    index: int


@dataclass
class Use:
    """A module whose forward reads a unit's parameters (the unit's root, or a module tied to it)."""

    unit: Unit
    module: nn.Module
    slots: list[Slot]
    forward_position: int = -1


@dataclass
class Unit:
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
    originals: list[Tensor]  # the parameters as the wrapped module held them (names, state dicts)
    uses: list[Use] = field(default_factory=list)
    state: str = FREE
    event: torch.cuda.Event | None = None
    backward_position: int = -1
    backward_done: bool = False
    accumulated: Tensor | None = None  # the whole unit's gradient summed over backward passes in no_sync()


def owns_2d_weight(module: nn.Module) -> bool:
    weight = module._parameters.get("weight")
    return weight is not None and weight.dim() == 2




@dataclass(frozen=True)
class Placement:
    """Where shards live: this rank of ``world_size`` ranks, on ``device``."""

    device: torch.device
    rank: int
    world_size: int


@dataclass
class Layout:
    """Where the wrapped module's parameters went: flat sharded units and whole replicated parameters."""

    param_names: list[tuple[str, Tensor]]  # every (name, original parameter), tied names included, in order
    units: list[Unit]
    replicated: list[nn.Parameter]  # fp32, installed in the module in place of ``replicated_originals``
    replicated_originals: list[Tensor]

    def first_names(self) -> dict[Tensor, str]:
        """Original parameter -> its first name (a tied parameter has several)."""
        first: dict[Tensor, str] = {}
        for name, p in self.param_names:
            first.setdefault(p, name)
        return first


def build_layout(module: nn.Module, unit_modules: tuple[type[nn.Module], ...], placement: Placement,
                 compute_dtype: torch.dtype, seed: int) -> Layout:
    """Group ``module``'s parameters into units, shard them (materializing a meta model unit by unit) and
    replace them in ``module`` by plain attributes (set to views of the gathered buffer at each use).
    Collective (broadcasts rank 0's values of a real model): call on every rank."""
    param_names = list(module.named_parameters(remove_duplicate=False))
    groups, replicated = group_parameters(module, unit_modules)
    units = [_build_unit(module, index, root, params, placement, compute_dtype, seed)
             for index, (root, params) in enumerate(groups)]
    current = _materialize_replicated(module, replicated, placement, seed + len(groups))
    _move_buffers(module, placement.device)
    return Layout(param_names, units, current, replicated)


def _slots_of(module: nn.Module) -> dict[Tensor, list[tuple[nn.Module, str]]]:
    slots: dict[Tensor, list[tuple[nn.Module, str]]] = {}
    for m in module.modules():
        for attr, p in m._parameters.items():
            if p is not None:
                slots.setdefault(p, []).append((m, attr))
    return slots


def group_parameters(module: nn.Module, unit_modules: tuple[type[nn.Module], ...]
                     ) -> tuple[list[tuple[nn.Module, list[Tensor]]], list[Tensor]]:
    """``([(root module, its unit's parameters)], replicated parameters)`` in module order."""
    claimed: set[Tensor] = set()
    groups: list[tuple[nn.Module, list[Tensor]]] = []
    inside_block: set[nn.Module] = set()
    for m in module.modules():
        if m in inside_block:
            continue
        if unit_modules and isinstance(m, unit_modules):
            inside_block.update(m.modules())
            params = [p for p in m.parameters() if p not in claimed]
        elif owns_2d_weight(m):
            params = [p for p in m._parameters.values() if p is not None and p not in claimed]
        else:
            continue
        params = [p for p in params if p.requires_grad]
        if params:
            claimed.update(params)
            groups.append((m, params))
    replicated = [p for p in module.parameters() if p not in claimed]
    return groups, replicated


def _seeded(device: torch.device, seed: int) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(torch.random.fork_rng(devices=[device] if device.type == "cuda" else []))
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.default_generators[device.index].manual_seed(seed)
    return stack


def _materialize(module: nn.Module, params: list[Tensor], slots: dict, device: torch.device,
                 seed: int) -> list[Tensor]:
    """Values of ``params`` on ``device``: meta ones allocated and reset (seeded), others as they are."""
    if not any(p.is_meta for p in params):
        return [p.detach().to(device) for p in params]
    if not all(p.is_meta for p in params):
        raise ValueError("a unit mixes meta and materialized parameters; build the model on one device")
    owners: dict[nn.Module, None] = {}
    fresh = []
    for p in params:
        new = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device), p.requires_grad)
        for m, attr in slots[p]:
            m._parameters[attr] = new
            owners[m] = None
        fresh.append(new)
    with _seeded(device, seed), torch.no_grad():
        for m in module.modules():  # module order, as construction would initialize them
            if m in owners:
                if not hasattr(m, "reset_parameters"):
                    raise ValueError(f"{type(m).__name__} owns meta parameters but no reset_parameters()")
                m.reset_parameters()
    return [p.detach() for p in fresh]


def _build_unit(module: nn.Module, index: int, root: nn.Module, params: list[Tensor], placement: Placement,
                compute_dtype: torch.dtype, seed: int) -> Unit:
    slots = _slots_of(module)  # keyed by the original parameters, before materializing replaces them
    values = _materialize(module, params, slots, placement.device, seed * 1_000_003 + index)
    offsets, split_sizes, chunk_of_param, cursor = [], [], [], 0
    for v in values:
        start = -(-cursor // ALIGN) * ALIGN
        if start > cursor:
            split_sizes.append(start - cursor)
        offsets.append(start)
        chunk_of_param.append(len(split_sizes))
        split_sizes.append(v.numel())
        cursor = start + v.numel()
    world_size, rank = placement.world_size, placement.rank
    padded = -(-cursor // world_size) * world_size
    if padded > cursor:
        split_sizes.append(padded - cursor)
    shard_numel = padded // world_size
    with torch.no_grad():
        full = torch.zeros(padded, dtype=torch.float32, device=placement.device)
        for v, off in zip(values, offsets, strict=True):
            full[off:off + v.numel()].copy_(v.reshape(-1))
        if not any(p.is_meta for p in params):  # real weights: every rank starts from rank 0's
            dist.broadcast(full, src=0)
        shard = nn.Parameter(full[rank * shard_numel:(rank + 1) * shard_numel].clone())
    del full, values
    full_data = torch.empty(padded, dtype=compute_dtype, device=placement.device)
    full_data.untyped_storage().resize_(0)
    full_param = full_data.detach().requires_grad_(True)
    unit = Unit(index, [p.shape for p in params], offsets, padded, shard, full_data, full_param,
                split_sizes, chunk_of_param, params)
    # Replace the parameters by plain attributes (views of the gathered buffer, set at each use).
    position = {p: i for i, p in enumerate(params)}
    in_root = set(root.modules())
    by_module: dict[nn.Module, list[Slot]] = {}
    for p in params:
        for m, attr in slots[p]:
            del m._parameters[attr]
            use_module = root if m in in_root else m
            by_module.setdefault(use_module, []).append(Slot(m, attr, position[p]))
    unit.uses = [Use(unit, m, s) for m, s in by_module.items()]
    return unit


def _materialize_replicated(module: nn.Module, params: list[Tensor], placement: Placement,
                            seed: int) -> list[nn.Parameter]:
    slots = _slots_of(module)
    values = _materialize(module, params, slots, placement.device, seed * 1_000_003) if params else []
    replicated = []
    for p, v in zip(params, values, strict=True):
        new = nn.Parameter(v.to(torch.float32).clone(), requires_grad=p.requires_grad)
        if not p.is_meta and placement.world_size > 1:
            dist.broadcast(new.data, src=0)
        for m, attr in slots[p]:
            m._parameters[attr] = new
        replicated.append(new)
    return replicated


def _move_buffers(module: nn.Module, device: torch.device) -> None:
    for name, b in module.named_buffers():
        if b.is_meta:
            raise ValueError(f"buffer {name!r} is on the meta device; FSDP materializes parameters only")
        if b.device != device:
            owner, _, attr = name.rpartition(".")
            module.get_submodule(owner)._buffers[attr] = b.to(device)
