"""How a model's tensors map onto the keys of a sharded checkpoint, and the DCP planners that write and read
a rank's slices of them (see ``parallel.checkpoint`` for the format)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    ReadItem,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import (
    _create_read_items,
    _create_write_items,
    create_read_items_for_chunk_list,
)

from parallel.ddp import _DataParallel
from parallel.fsdp import FSDP
from parallel.fsdp_state import persistent_buffers
from parallel.fsdp_units import Piece

__all__ = ["LoadPlanner", "SavePlanner", "Slice", "flat", "item", "param_shaped", "pieces"]


@dataclass
class Slice:
    """``local`` (1-D) holds elements ``[offset, offset + local.numel())`` of a flat tensor of ``numel``."""

    local: Tensor
    offset: int
    numel: int

    def chunk(self) -> ChunkStorageMetadata:
        return ChunkStorageMetadata(offsets=torch.Size([self.offset]), sizes=torch.Size([self.local.numel()]))


class SavePlanner(dcp.DefaultSavePlanner):
    """The default planner, plus ``Slice`` values written as one chunk of their flat tensor."""

    def __init__(self):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

    def create_local_plan(self) -> SavePlan:
        items = []
        for fqn, obj in self.state_dict.items():
            if not isinstance(obj, Slice):
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
        return obj.local if isinstance(obj, Slice) else super().lookup_object(index)


class LoadPlanner(dcp.DefaultLoadPlanner):
    """The default planner, plus ``Slice`` destinations that read just their chunk of a flat tensor; reads
    tensors only (the pickled pieces are read and checked before, by ``checkpoint_manifest.load_pickled``)."""

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
            if isinstance(obj, Slice):
                requests += create_read_items_for_chunk_list(fqn, md, [obj.chunk()])
            else:
                requests += _create_read_items(fqn, md, obj)
        return LoadPlan(requests)

    def lookup_tensor(self, index: MetadataIndex) -> Tensor:
        obj = self.state_dict[index.fqn]
        return obj.local if isinstance(obj, Slice) else super().lookup_tensor(index)

    def load_bytes(self, read_item: ReadItem, value) -> None:
        raise AssertionError(f"{read_item.dest_index.fqn}: pickled pieces are not read through DCP")


def pieces(model: nn.Module) -> tuple[dict[Tensor, list[Piece]], dict[str, Tensor]]:
    """``({tensor an optimizer steps: its pieces}, {name: persistent buffer})`` of any supported model."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (FSDP, a DDP wrapper or plain), got {type(model)}")
    if isinstance(model, FSDP):
        return model.flat_pieces(), dict(persistent_buffers(model.module))
    module = model.module if isinstance(model, _DataParallel) else model
    found = {p: [Piece(name, 0, p.numel(), 0, p.numel())] for name, p in module.named_parameters()}
    return found, dict(persistent_buffers(module))


def flat(t: Tensor, what: str) -> Tensor:
    """``t`` as a 1-D view (it must be contiguous: loading writes into it in place)."""
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous to be saved or loaded in place")
    return t.detach().view(-1)


def item(flat_tensor: Tensor, piece: Piece) -> Tensor | Slice:
    """The part of ``flat_tensor`` that ``piece`` names: a plain tensor when it is the whole parameter."""
    local = flat_tensor[piece.start:piece.stop]
    if piece.offset == 0 and local.numel() == piece.numel:
        return local
    return Slice(local, piece.offset, piece.numel)


def param_shaped(value: Any, param: Tensor) -> bool:
    """Whether an optimizer-state entry is saved as a tensor of its parameter's layout."""
    return torch.is_tensor(value) and value.dim() > 0 and value.shape == param.shape
