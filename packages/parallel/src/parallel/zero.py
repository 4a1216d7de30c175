"""ZeRO stage 1: optimizer state sharded over the ranks of a data-parallel group.

``ShardedOptimizer(params, optimizer_cls, **defaults)`` is a ``torch.optim.Optimizer`` that gives every
parameter one owner rank (greedy balancing of element counts, largest first), builds ``optimizer_cls`` over
the owned parameters only, so each rank keeps ~1/N of the optimizer state, and after each ``step`` makes
every rank hold identical parameters by broadcasting each parameter from its owner (in place, no extra
buffer). Gradients are not touched: average them first (``DDP``, or an all-reduce), as in ZeRO stage 1.

    model = DDP(net)
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    loss_fn(model(x), y).backward(); model.finish_gradient_synchronization(); opt.step(); opt.zero_grad()

- Parameter groups keep their own hyper-parameters; changes to ``param_groups[i]`` (LR schedules) reach the
  wrapped optimizer at the next ``step``. ``add_param_group`` during training assigns the new parameters.
- ``state_dict()`` is collective: every rank returns the full state in ``optimizer_cls``'s own format (state
  moved to CPU), so an unsharded optimizer or a ``ShardedOptimizer`` on any number of ranks loads it.

Limits: every rank must build the optimizer with the same parameters in the same order (collectives are
matched by order); the assignment is by whole parameters, so per-rank state is within one parameter of
1/N; a closure passed to ``step`` runs on every rank; the owner broadcast costs one collective per
parameter (communication of one all-gather of the parameters, i.e. what ZeRO-1 prescribes).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["ShardedOptimizer"]


def _require_process_group() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("ShardedOptimizer needs an initialized default process group")


class ShardedOptimizer(torch.optim.Optimizer):
    """``optimizer_cls`` over this rank's share of ``params``; parameters re-synchronized after each step.

    ``param_to_rank`` maps each parameter to its owner; ``local_optimizer`` is the wrapped optimizer.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], optimizer_cls: type[torch.optim.Optimizer],
                 **defaults: Any):
        _require_process_group()
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_cls must be a torch.optim.Optimizer subclass, got {optimizer_cls!r}")
        self.optimizer_cls, self.rank, self.world_size = optimizer_cls, dist.get_rank(), dist.get_world_size()
        self.param_to_rank: dict[Tensor, int] = {}
        self._rank_loads = [(0, r) for r in range(self.world_size)]  # heap of (elements owned, rank)
        self.local_optimizer: torch.optim.Optimizer | None = None
        super().__init__(params, defaults)
        self.state = self.local_optimizer.state  # this rank's share, for inspection

    # ------------------------------------------------------------------------------------------ groups
    def _assign(self, params: list[Tensor]) -> None:
        """Give each new parameter to the least-loaded rank, largest parameters first (stable order)."""
        for p in sorted(params, key=lambda t: -t.numel()):
            load, rank = heapq.heappop(self._rank_loads)
            self.param_to_rank[p] = rank
            heapq.heappush(self._rank_loads, (load + p.numel(), rank))

    def _local_group(self, group: dict) -> dict:
        local = {k: v for k, v in group.items() if k != "params"}
        local["params"] = [p for p in group["params"] if self.param_to_rank[p] == self.rank]
        return local

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (e.g. unfrozen layers) and assign its parameters to owner ranks."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        self._assign(group["params"])
        local = self._local_group(group)
        if self.local_optimizer is None:
            self.local_optimizer = self.optimizer_cls([local], **self.defaults)
        else:
            self.local_optimizer.add_param_group(local)

    def _sync_hyperparameters(self) -> None:
        for group, local in zip(self.param_groups, self.local_optimizer.param_groups, strict=True):
            for key, value in group.items():
                if key != "params":
                    local[key] = value

    # -------------------------------------------------------------------------------------------- step
    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any) -> float | None:
        """Step the owned parameters, then broadcast every parameter from its owner."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_hyperparameters()
        self.local_optimizer.step(**kwargs)
        self._broadcast_parameters()
        return loss

    @torch.no_grad()
    def _broadcast_parameters(self) -> None:
        works = [
            dist.broadcast(p.data, src=self.param_to_rank[p], async_op=True)
            for group in self.param_groups
            for p in group["params"]
        ]
        for work in works:
            work.wait()

    # ------------------------------------------------------------------------------------- state dict
    def _global_index(self) -> dict[Tensor, int]:
        params = [p for group in self.param_groups for p in group["params"]]
        return {p: i for i, p in enumerate(params)}

    def state_dict(self) -> dict[str, Any]:
        """The full optimizer state (collective: call on every rank), in ``optimizer_cls``'s format."""
        index = self._global_index()
        local_state = self.local_optimizer.state
        # Owners describe their entries (tensor shapes/dtypes and plain values); tensors follow by broadcast.
        described = {
            index[p]: {k: (("tensor", tuple(v.shape), v.dtype) if torch.is_tensor(v) else ("value", v))
                       for k, v in local_state[p].items()}
            for p in index if self.param_to_rank[p] == self.rank and p in local_state
        }
        descriptions: list[dict] = [None] * self.world_size
        dist.all_gather_object(descriptions, described)
        owners = {i: r for r, d in enumerate(descriptions) for i in d}
        params = list(index)
        full_state: dict[int, dict[str, Any]] = {}
        for i in sorted(owners):
            owner, entry = owners[i], {}
            for key, desc in descriptions[owners[i]][i].items():
                if desc[0] == "value":
                    entry[key] = desc[1]
                    continue
                if owner == self.rank:
                    tensor = local_state[params[i]][key].detach().clone()
                else:
                    tensor = torch.empty(desc[1], dtype=desc[2], device=params[i].device)
                dist.broadcast(tensor, src=owner)
                entry[key] = tensor.cpu()
            full_state[i] = entry
        # The wrapped optimizer's groups hold every hyper-parameter it needs (its defaults included).
        groups = [{**{k: v for k, v in local.items() if k != "params"},
                   **{k: v for k, v in g.items() if k != "params"}, "params": [index[p] for p in g["params"]]}
                  for g, local in zip(self.param_groups, self.local_optimizer.param_groups, strict=True)]
        return {"state": full_state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a full state (from ``state_dict()`` of any world size, or of an unsharded optimizer)."""
        groups = state_dict.get("param_groups")
        if groups is None or len(groups) != len(self.param_groups):
            raise ValueError(f"state_dict must have {len(self.param_groups)} param_groups, "
                             f"got {None if groups is None else len(groups)}")
        for i, (saved, group) in enumerate(zip(groups, self.param_groups, strict=True)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"param_groups[{i}] holds {len(group['params'])} parameters, "
                                 f"the state_dict's {len(saved['params'])}")
        local_groups, local_state = [], {}
        for saved, group in zip(groups, self.param_groups, strict=True):
            group.update({k: v for k, v in saved.items() if k != "params"})
            local = self._local_group(group)
            owned = [saved_id for saved_id, p in zip(saved["params"], group["params"], strict=True)
                     if self.param_to_rank[p] == self.rank]
            local_state.update({sid: state_dict["state"][sid] for sid in owned if sid in state_dict["state"]})
            local["params"] = owned
            local_groups.append(local)
        self.local_optimizer.load_state_dict({"state": local_state, "param_groups": local_groups})
        self.state = self.local_optimizer.state

    def __repr__(self) -> str:
        return (f"ShardedOptimizer({self.optimizer_cls.__name__}, rank {self.rank} of {self.world_size}, "
                f"{sum(len(g['params']) for g in self.local_optimizer.param_groups)} owned parameters)")
