"""FSDP's full state: every parameter gathered whole, state dicts that plain modules accept, and files
(sharded checkpoints through ``torch.distributed.checkpoint`` live in ``parallel.checkpoint``)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

import torch
import torch.distributed as dist
from torch import Tensor, nn

from parallel.consistency import all_ranks_ok
from parallel.fsdp_units import Layout, Piece, Placement, Unit


def persistent_buffers(module: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """``(name, buffer)`` of every buffer in ``module.state_dict()`` (non-persistent ones left out)."""
    for prefix, m in module.named_modules():
        for name, b in m._buffers.items():
            if b is not None and name not in m._non_persistent_buffers_set:
                yield (f"{prefix}.{name}" if prefix else name), b


class FullState:
    """Full-tensor views of FSDP's shards: gathered values and gradients, state dicts, files.

    ``comm_stream``: the side stream whose reductions must be finished before shards are read (CUDA).
    """

    def __init__(self, module: nn.Module, layout: Layout, placement: Placement,
                 comm_stream: torch.cuda.Stream | None):
        self.module, self.layout, self.placement = module, layout, placement
        self._comm_stream = comm_stream

    @torch.no_grad()
    def _gather_unit_fp32(self, unit: Unit, grads: bool = False) -> Tensor:
        """The unit's whole flat fp32 value (or gradient: zeros where a shard has none)."""
        local = unit.shard.detach()
        if grads:
            local = unit.shard.grad if unit.shard.grad is not None else torch.zeros_like(local)
        full = torch.empty(unit.padded_numel, dtype=torch.float32, device=self.placement.device)
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

    def flat_pieces(self) -> dict[Tensor, list[Piece]]:
        """For every parameter an optimizer of this wrapper steps (shards, replicated parameters): which of
        its flattened elements hold which elements of which named parameter (tied: under the first name)."""
        first = self.layout.first_names()
        pieces: dict[Tensor, list[Piece]] = {}
        for unit in self.layout.units:
            n = unit.shard.numel()
            lo, hi = self.placement.rank * n, (self.placement.rank + 1) * n
            found = []
            for i, p in enumerate(unit.originals):
                start, numel = unit.offsets[i], unit.shapes[i].numel()
                a, b = max(lo, start), min(hi, start + numel)
                if a < b:
                    found.append(Piece(first[p], a - lo, b - lo, a - start, numel))
            pieces[unit.shard] = found
        for p, current in self._replicated_pairs():
            pieces[current] = [Piece(first[p], 0, current.numel(), 0, current.numel())]
        return pieces

    def _replicated_pairs(self) -> Iterator[tuple[Tensor, nn.Parameter]]:
        """(original, current) of every replicated parameter."""
        return zip(self.layout.replicated_originals, self.layout.replicated, strict=True)

    def _by_name(self, values: dict[Tensor, Tensor]) -> dict[str, Tensor]:
        out, seen = {}, set()
        for name, p in self.layout.param_names:
            if p not in seen:
                seen.add(p)
                out[name] = values[p]
        return out

    def _full_values(self, device, grads: bool = False) -> dict[Tensor, Tensor]:
        """Original parameter object -> full fp32 value (or gradient) on ``device``."""
        if self._comm_stream is not None:
            torch.cuda.current_stream(self.placement.device).wait_stream(self._comm_stream)
        values: dict[Tensor, Tensor] = {}
        for unit in self.layout.units:
            full = self._gather_unit_fp32(unit, grads)
            for i, p in enumerate(unit.originals):
                off = unit.offsets[i]
                values[p] = full[off:off + unit.shapes[i].numel()].view(unit.shapes[i]).to(device, copy=True)
        for p, current in self._replicated_pairs():
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
        for name, p in self.layout.param_names:
            destination[prefix + name] = values[p]
        for name, b in persistent_buffers(self.module):
            destination[prefix + name] = b.detach().cpu().clone()
        return destination

    @torch.no_grad()
    def load_state_dict(self, state_dict: Mapping[str, Tensor], strict: bool = True, assign: bool = False):
        """Load a full state dict (from ``state_dict()`` on any number of ranks, or a plain module's).

        Every rank keeps its slice of each unit; replicated parameters and buffers are copied whole.
        """
        if assign:
            raise ValueError("FSDP.load_state_dict copies into the shards; assign=True is not supported")
        buffers = dict(persistent_buffers(self.module))
        expected = [name for name, _ in self.layout.param_names] + list(buffers)
        missing = [k for k in expected if k not in state_dict]
        unexpected = [k for k in state_dict if k not in set(expected)]
        if strict and (missing or unexpected):
            raise RuntimeError(f"FSDP.load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        first_name = {}
        for name, p in self.layout.param_names:
            if name in state_dict:
                first_name.setdefault(p, name)
        rank = self.placement.rank
        for unit in self.layout.units:
            if not any(p in first_name for p in unit.originals):
                continue
            full = self._gather_unit_fp32(unit)  # keeps parameters absent from the state dict as they are
            for i, p in enumerate(unit.originals):
                if p in first_name:
                    value = state_dict[first_name[p]]
                    if value.shape != unit.shapes[i]:
                        raise ValueError(f"state_dict[{first_name[p]!r}] has shape {tuple(value.shape)}, "
                                         f"expected {tuple(unit.shapes[i])}")
                    off = unit.offsets[i]
                    full[off:off + value.numel()].copy_(value.reshape(-1))
            n = unit.shard.numel()
            unit.shard.copy_(full[rank * n:(rank + 1) * n])
        for p, current in self._replicated_pairs():
            if p in first_name:
                current.copy_(state_dict[first_name[p]])
        for name, b in buffers.items():
            if name in state_dict:
                b.copy_(state_dict[name])
        return nn.modules.module._IncompatibleKeys(missing, unexpected)

    def save_full_state_dict(self, path: str | os.PathLike) -> None:
        """Gather the full state (collective) and write it from rank 0 to ``<path>.partial``, then rename.

        The temporary name is fixed: a save that was killed leaves at most that one file, which the next save
        overwrites; a save that fails removes it.
        """
        state = self.state_dict()
        failure = None
        if self.placement.rank == 0:
            tmp = f"{os.fspath(path)}.partial"
            try:
                torch.save(state, tmp)
                os.replace(tmp, path)
            except Exception as err:
                failure = err
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
        if not all_ranks_ok(failure is None):
            if failure is not None:
                raise failure
            raise RuntimeError(f"save_full_state_dict: rank 0 failed to write {os.fspath(path)!r}")

    def load_full_state_dict(self, path: str | os.PathLike, strict: bool = True):
        """Read a file written by :meth:`save_full_state_dict` (on any number of ranks) into the shards."""
        return self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True), strict=strict)
