"""Sharded checkpoints through ``torch.distributed.checkpoint``: every rank writes what it holds, in parallel.

    save_sharded("ckpt/step-1000", model, optimizer, extra={"step": 1000, "rng": torch.get_rng_state()})
    extra = load_sharded("ckpt/step-1000", model, optimizer)      # on any world size, into any wrapper

``model`` is a ``parallel.FSDP``, a wrapper of the DDP family, or a plain ``nn.Module``; ``optimizer`` a
``torch.optim.Optimizer`` over its parameters or a ``parallel.ShardedOptimizer``. Nothing is gathered on one
rank: FSDP ranks write their slices of each parameter and of the optimizer state, a ``ShardedOptimizer`` rank
the state of the parameters it owns; tensors every rank holds (a DDP replica) are written once, the writes
spread over the ranks by ``torch.distributed.checkpoint``'s de-duplication.

Format (one folder, ``torch.distributed.checkpoint``'s files): every parameter and persistent buffer under
``model/<name>`` flattened to 1-D (names of the wrapped module, without DDP's ``module.`` prefix; a tied
weight under its first name); each optimizer-state tensor of a parameter's shape under ``optim/<name>/<key>``
in the same flattened form, the other state entries (``step``) under ``optim/<name>/other``; hyper-parameters
under ``optim/param_groups``; ``extra`` per rank under ``extra/rank<r>``. Because the key space is the model's
own parameter names with global sizes, a checkpoint written on N ranks loads on M ranks (each reads only the
chunks overlapping its slices), into another wrapper, or into a plain unsharded module.

Atomicity: every rank writes into ``<path>.partial`` (removed first if an earlier save left it, and on
failure); ``torch.distributed.checkpoint`` writes its ``.metadata`` after all ranks' data; then rank 0 renames
the folder to ``path`` (an existing ``path`` is moved aside first and removed after). ``load_sharded`` reads
only a folder with ``.metadata``, so an interrupted save is never taken for a checkpoint.

Limits: ``path`` must be on a file system every rank sees (as for ``FileSystemWriter``); ``extra`` and the
non-tensor state are pickled (load only checkpoints you trust); the optimizer must be built over the same
parameters, in the same groups, as the one saved; ``extra`` comes back as saved by the same rank index (rank
0's when the saving run had fewer ranks).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import LoadPlan, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import (
    _create_read_items,
    _create_write_items,
    create_read_items_for_chunk_list,
)

from parallel.consistency import all_ranks_ok
from parallel.ddp import _DataParallel
from parallel.fsdp import FSDP
from parallel.fsdp_state import persistent_buffers
from parallel.fsdp_units import Piece
from parallel.zero import ShardedOptimizer

__all__ = ["load_sharded", "save_sharded"]

_METADATA = ".metadata"


@dataclass
class _Slice:
    """``local`` (1-D) holds elements ``[offset, offset + local.numel())`` of a flat tensor of ``numel``."""

    local: Tensor
    offset: int
    numel: int

    def chunk(self) -> ChunkStorageMetadata:
        return ChunkStorageMetadata(offsets=torch.Size([self.offset]), sizes=torch.Size([self.local.numel()]))


class _SavePlanner(dcp.DefaultSavePlanner):
    """The default planner, plus ``_Slice`` values written as one chunk of their flat tensor."""

    def __init__(self):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def create_local_plan(self) -> SavePlan:
        items = []
        for fqn, obj in self.state_dict.items():
            if not isinstance(obj, _Slice):
                items += _create_write_items(fqn, obj)
                continue
            properties = TensorProperties.create_from_tensor(obj.local)
            data = TensorWriteData(chunk=obj.chunk(), properties=properties, size=torch.Size([obj.numel]))
            index = MetadataIndex(fqn, torch.Size([obj.offset]))
            items.append(WriteItem(index=index, type=WriteItemType.SHARD, tensor_data=data))
        self.plan = SavePlan(items)
        return self.plan

    def lookup_object(self, index: MetadataIndex) -> Any:
        obj = self.state_dict[index.fqn]
        return obj.local if isinstance(obj, _Slice) else super().lookup_object(index)


class _LoadPlanner(dcp.DefaultLoadPlanner):
    """The default planner, plus ``_Slice`` destinations that read just their chunk of a flat tensor."""

    def __init__(self):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def set_up_planner(self, state_dict: dict, metadata=None, is_coordinator: bool = False) -> None:
        # The default set-up rewrites every value it does not know (ours) as None; the destinations here are
        # real tensors already, so there is nothing to initialize.
        self.original_state_dict = self.state_dict = state_dict
        self.metadata, self.is_coordinator = metadata, is_coordinator

    def create_local_plan(self) -> LoadPlan:
        requests = []
        for fqn, obj in self.state_dict.items():
            md = self.metadata.state_dict_metadata[fqn]
            if isinstance(obj, _Slice):
                requests += create_read_items_for_chunk_list(fqn, md, [obj.chunk()])
            else:
                requests += _create_read_items(fqn, md, obj)
        return LoadPlan(requests)

    def lookup_tensor(self, index: MetadataIndex) -> Tensor:
        obj = self.state_dict[index.fqn]
        return obj.local if isinstance(obj, _Slice) else super().lookup_tensor(index)


# ------------------------------------------------------------------------------------------ layout
def _pieces(model: nn.Module) -> tuple[dict[Tensor, list[Piece]], dict[str, Tensor]]:
    """``({tensor an optimizer steps: its pieces}, {name: persistent buffer})`` of any supported model."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (FSDP, a DDP wrapper or plain), got {type(model)}")
    if isinstance(model, FSDP):
        return model.flat_pieces(), dict(persistent_buffers(model.module))
    module = model.module if isinstance(model, _DataParallel) else model
    pieces = {p: [Piece(name, 0, p.numel(), 0, p.numel())] for name, p in module.named_parameters()}
    return pieces, dict(persistent_buffers(module))


def _flat(t: Tensor, what: str) -> Tensor:
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous to be saved or loaded in place")
    return t.detach().view(-1)


def _item(flat: Tensor, piece: Piece) -> Tensor | _Slice:
    """The part of ``flat`` that ``piece`` names: a plain tensor when it is the whole parameter."""
    local = flat[piece.start:piece.stop]
    if piece.offset == 0 and local.numel() == piece.numel:
        return local
    return _Slice(local, piece.offset, piece.numel)


def _inner(optimizer) -> tuple[torch.optim.Optimizer, list[dict]]:
    """``(the optimizer holding this rank's state, the groups whose hyper-parameters are saved)``."""
    if isinstance(optimizer, ShardedOptimizer):
        return optimizer.local_optimizer, optimizer.param_groups
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}")
    return optimizer, optimizer.param_groups


def _param_shaped(value: Any, param: Tensor) -> bool:
    return torch.is_tensor(value) and value.dim() > 0 and value.shape == param.shape


def _hyper(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


@contextlib.contextmanager
def _quiet_without_group():
    """Without a process group ``torch.distributed.checkpoint`` warns that it runs in one process: meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _pickled(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _unpickled(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


# -------------------------------------------------------------------------------------------- save
def _save_state(model, optimizer, extra) -> dict[str, Any]:
    pieces, buffers = _pieces(model)
    state: dict[str, Any] = {}
    for p, found in pieces.items():
        flat = _flat(p, f"parameter {found[0].name if found else ''}")
        for piece in found:
            state[f"model/{piece.name}"] = _item(flat, piece)
    for name, b in buffers.items():
        state[f"model/{name}"] = _flat(b, f"buffer {name}")
    if optimizer is not None:
        inner, groups = _inner(optimizer)
        for p, entry in inner.state.items():
            if p not in pieces:
                raise ValueError("optimizer steps a tensor that is not a parameter of model")
            other = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in entry.items()
                     if not _param_shaped(v, p)}
            other = _pickled(other)
            for piece in pieces[p]:
                for key, value in entry.items():
                    if _param_shaped(value, p):
                        state[f"optim/{piece.name}/{key}"] = _item(_flat(value, f"state {key}"), piece)
                state[f"optim/{piece.name}/other"] = other
        state["optim/param_groups"] = _pickled([_hyper(g) for g in groups])
    if extra is not None:
        state[f"extra/rank{_rank()}"] = _pickled(extra)
    return state


def save_sharded(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 extra: dict | None = None, *, threads: int = 4) -> None:
    """Write ``model``'s parameters and persistent buffers, ``optimizer``'s state and ``extra`` to the folder
    ``path`` (collective: call on every rank). ``threads``: writer threads per rank, each copying one tensor
    at a time to the host (a rank on a GPU holds at most ``threads`` tensors there while saving)."""
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"extra must be a dict or None, got {type(extra).__name__}")
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    final = Path(path)
    if final.exists() and not (final.is_dir() and (final / _METADATA).exists()):
        raise FileExistsError(f"path {str(final)!r} exists and is not a sharded checkpoint; not replacing it")
    # Objects are pickled here, before any file is touched: torch.distributed.checkpoint's writer threads
    # would drop an object that fails to pickle and still complete the checkpoint. A rank that fails here
    # makes every rank fail (instead of the others waiting for it).
    failure = None
    try:
        state = _save_state(model, optimizer, extra)
    except Exception as err:
        failure = err
    if not all_ranks_ok(failure is None):
        if failure is not None:
            raise failure
        raise RuntimeError("save_sharded: another rank failed to prepare its state (see its error)")
    partial = final.with_name(final.name + ".partial")
    if _rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)  # what an interrupted save left
        partial.mkdir(parents=True)
    _barrier()
    try:
        with _quiet_without_group():
            # One file per tensor: torch's writer keeps the host copy of every tensor of a file until the
            # file is closed, so with one file per thread a GPU rank would hold its whole state on the host.
            writer = dcp.FileSystemWriter(partial, thread_count=threads, single_file_per_rank=False)
            dcp.save(state, storage_writer=writer, planner=_SavePlanner())
    except BaseException as err:
        if _rank() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        if isinstance(err, CheckpointException):  # a BaseException: let `except Exception` see it
            raise RuntimeError(f"save_sharded({str(final)!r}) failed on ranks {sorted(err.failures)}: "
                               f"{err}") from err
        raise
    if _rank() == 0:
        if final.exists():
            old = final.with_name(final.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            partial.rename(final)
            shutil.rmtree(old)
        else:
            partial.rename(final)
    _barrier()


# -------------------------------------------------------------------------------------------- load
def _check_size(stored: dict, key: str, numel: int) -> None:
    if key not in stored:
        raise KeyError(f"checkpoint has no {key!r}")
    size = getattr(stored[key], "size", None)
    if size is None or size.numel() != numel:
        raise ValueError(f"checkpoint's {key!r} has {None if size is None else size.numel()} elements, "
                         f"the model's {numel}")


def _request_optimizer(optimizer, pieces, stored: dict, request: dict) -> list:
    """Destinations for the optimizer's state; returns ``[(param, {key: flat dest}, other key)]``."""
    inner, _ = _inner(optimizer)
    plan = []
    for group in inner.param_groups:
        for p in group["params"]:
            if p not in pieces:
                raise ValueError("optimizer steps a tensor that is not a parameter of model")
            found = pieces[p]
            if not found or f"optim/{found[0].name}/other" not in stored:
                plan.append((p, {}, None))
                continue
            prefix = f"optim/{found[0].name}/"
            keys = [k[len(prefix):] for k in stored if k.startswith(prefix) and k != prefix + "other"]
            dests = {}
            for key in keys:
                dest = torch.zeros(p.numel(), dtype=stored[prefix + key].properties.dtype, device=p.device)
                for piece in found:
                    _check_size(stored, f"optim/{piece.name}/{key}", piece.numel)
                    request[f"optim/{piece.name}/{key}"] = _item(dest, piece)
                dests[key] = dest
            request[prefix + "other"] = None
            plan.append((p, dests, prefix + "other"))
    return plan


def _load_optimizer(optimizer, plan: list, loaded: dict) -> None:
    inner, outer = _inner(optimizer)
    saved_groups = _unpickled(loaded["optim/param_groups"])
    if len(saved_groups) != len(outer):
        raise ValueError(f"optimizer has {len(outer)} param_groups, the checkpoint {len(saved_groups)}")
    for group, saved in zip(outer, saved_groups, strict=True):
        group.update(saved)
    index = {p: i for i, (p, _, _) in enumerate(plan)}
    state = {}
    for p, dests, other_key in plan:
        if other_key is not None:
            tensors = {k: d.view(p.shape) for k, d in dests.items()}
            state[index[p]] = {**_unpickled(loaded[other_key]), **tensors}
    groups = [{**_hyper(local), **saved, "params": [index[p] for p in local["params"]]}
              for local, saved in zip(inner.param_groups, saved_groups, strict=True)]
    inner.load_state_dict({"state": state, "param_groups": groups})
    if isinstance(optimizer, ShardedOptimizer):
        optimizer.state = inner.state


def load_sharded(path: str | os.PathLike, model: nn.Module,
                 optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Read a checkpoint of :func:`save_sharded` (any world size, any supported wrapper) into ``model`` and
    ``optimizer`` in place; return the ``extra`` dict saved by this rank index (``{}`` if none).

    Collective: call on every rank. Every parameter and persistent buffer must be in the checkpoint with its
    number of elements; the optimizer's state is loaded if it was saved.
    """
    folder = Path(path)
    if not (folder / _METADATA).is_file():
        raise FileNotFoundError(f"{str(folder)!r} is not a complete sharded checkpoint (no {_METADATA}); an "
                                f"interrupted save leaves only {folder.name}.partial")
    reader = dcp.FileSystemReader(folder)
    stored = reader.read_metadata().state_dict_metadata
    pieces, buffers = _pieces(model)
    request: dict[str, Any] = {}
    for p, found in pieces.items():
        flat = _flat(p, f"parameter {found[0].name if found else ''}")
        for piece in found:
            _check_size(stored, f"model/{piece.name}", piece.numel)
            request[f"model/{piece.name}"] = _item(flat, piece)
    for name, b in buffers.items():
        _check_size(stored, f"model/{name}", b.numel())
        request[f"model/{name}"] = _flat(b, f"buffer {name}")
    plan = []
    if optimizer is not None:
        if "optim/param_groups" not in stored:
            raise KeyError(f"checkpoint {str(folder)!r} holds no optimizer state")
        plan = _request_optimizer(optimizer, pieces, stored, request)
        request["optim/param_groups"] = None
    extra_key = next((k for k in (f"extra/rank{_rank()}", "extra/rank0") if k in stored), None)
    if extra_key is not None:
        request[extra_key] = None
    try:
        with torch.no_grad(), _quiet_without_group():
            dcp.load(request, storage_reader=reader, planner=_LoadPlanner())
    except CheckpointException as err:
        raise RuntimeError(f"load_sharded({str(folder)!r}) failed on ranks {sorted(err.failures)}: "
                           f"{err}") from err
    if optimizer is not None:
        _load_optimizer(optimizer, plan, request)
    return _unpickled(request[extra_key]) if extra_key is not None else {}
