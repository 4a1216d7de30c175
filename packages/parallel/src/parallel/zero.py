"""ZeRO stage 1: optimizer state sharded over the ranks of a data-parallel group.

``ShardedOptimizer(params, optimizer_cls, mode=..., **defaults)`` is a ``torch.optim.Optimizer`` that gives
every parameter one owner rank (greedy balancing of element counts, largest first) and builds
``optimizer_cls`` over the owned parameters only, so each rank keeps ~1/N of the optimizer state. Two modes:

- ``mode="reduce_scatter"`` (the default; ZeRO-1 as in the paper): pass *local* gradients (no DDP wrapper, or
  inside its ``no_sync``). ``step`` reduce-scatters them, so each rank receives the average of the gradients
  it owns, steps those parameters, and all-gathers the updated parameters. The parameters of one dtype and
  device live in one flat buffer laid out rank by rank (each rank's owned parameters contiguous, every rank's
  segment padded to the same length; ``p.data`` are views into it), so the two collectives move the bytes of
  one all-reduce of that buffer. Rank 0's values are broadcast at construction.

      opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
      loss_fn(model(x), y).backward(); opt.clip_grad_norm_(1.0); opt.step(); opt.zero_grad()

- ``mode="broadcast"``: gradients are already averaged (``DDP``, or an all-reduce); after each ``step`` every
  parameter is broadcast from its owner (in place). All-reduce plus broadcasts: 1.5x the bytes of the above.

      model = DDP(net)
      opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, mode="broadcast", lr=1e-3)

Common behaviour: parameter groups keep their own hyper-parameters; changes to ``param_groups[i]`` (LR
schedules) reach the wrapped optimizer at the next ``step``; ``add_param_group`` during training assigns the
new parameters (and rebuilds the flat buffers). ``clip_grad_norm_`` clips by the global norm (in
``reduce_scatter`` mode it reduces the gradients first, then one all-reduce of a scalar). ``state_dict()`` is
collective: every rank returns the full state in ``optimizer_cls``'s own format (state moved to CPU), so an
unsharded optimizer or a ``ShardedOptimizer`` on any number of ranks loads it; ``parallel.checkpoint`` saves
the shards without gathering them.

Limits: every rank must build the optimizer with the same parameters in the same order (collectives are
matched by order; checked at construction); the assignment is by whole parameters, so per-rank state (and the
padding of the flat segments) is within one parameter of 1/N; a closure passed to ``step`` runs on every rank;
in ``reduce_scatter`` mode a parameter without a gradient on every rank is not stepped (as in the unsharded
optimizer), and one with a gradient on some ranks only is an error: before reducing, the ranks all-gather
which parameters have one (``parallel.grad_presence``, a few bytes per parameter) and all raise
``RuntimeError`` naming the parameters (``param_groups[g]['params'][i]``) and the ranks. A gradient is what
``.grad`` holds, so after ``zero_grad(set_to_none=False)`` a parameter unused on a rank counts as a zero one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from parallel.consistency import check_same_model
from parallel.grad_norm import clip_replicated_, clip_sharded_
from parallel.grad_presence import agree_on_presence

__all__ = ["ShardedOptimizer"]

MODES = ("reduce_scatter", "broadcast")
_PIECE = 1 << 18  # elements per send/recv of the gloo ring: several in flight keep the TCP link busy


def _exchange(send: Tensor, recv: Tensor, to: int, source: int) -> None:
    works = []
    for a, b in zip(send.split(_PIECE), recv.split(_PIECE), strict=True):
        works += [dist.isend(a, to), dist.irecv(b, source)]
    for work in works:
        work.wait()


def ring_reduce_scatter_(out: Tensor, full: Tensor, rank: int, world_size: int) -> None:
    """``out`` (``full.numel() / N`` elements) = sum over ranks of chunk ``rank`` of ``full``: a ring of
    send/recv (gloo's own reduce-scatter took twice the time of an all-reduce of the same data here)."""
    if world_size == 1:
        out.copy_(full)
        return
    chunks = full.view(world_size, -1)
    send, spare = chunks[(rank - 1) % world_size], None
    for step in range(world_size - 1):
        recv = out if step == world_size - 2 else torch.empty_like(out) if spare is None else spare
        _exchange(send, recv, (rank + 1) % world_size, (rank - 1) % world_size)
        recv.add_(chunks[(rank - 2 - step) % world_size])
        spare = send if step > 0 else None
        send = recv


def ring_all_gather_(full: Tensor, rank: int, world_size: int) -> None:
    """Fill every chunk of ``full`` from its rank, chunk ``rank`` being this rank's (a send/recv ring)."""
    chunks = full.view(world_size, -1)
    for step in range(world_size - 1):
        _exchange(chunks[(rank - step) % world_size], chunks[(rank - 1 - step) % world_size],
                  (rank + 1) % world_size, (rank - 1) % world_size)


@dataclass
class _FlatGroup:
    """Parameters of one dtype and device in one buffer: rank r's owned parameters at ``[r * segment, ...)``,
    followed by one has-gradient flag per owned parameter, then padding up to ``segment`` elements."""

    buffer: Tensor
    segment: int
    owned: list[list[Tensor]]  # per rank, in buffer order


def _require_process_group() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("ShardedOptimizer needs an initialized default process group")


class ShardedOptimizer(torch.optim.Optimizer):
    """``optimizer_cls`` over this rank's share of ``params``; parameters re-synchronized after each step.

    ``param_to_rank`` maps each parameter to its owner; ``local_optimizer`` is the wrapped optimizer.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], optimizer_cls: type[torch.optim.Optimizer],
                 mode: str = "reduce_scatter", **defaults: Any):
        _require_process_group()
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_cls must be a torch.optim.Optimizer subclass, got {optimizer_cls!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.optimizer_cls, self.rank, self.world_size = optimizer_cls, dist.get_rank(), dist.get_world_size()
        self.mode = mode
        self._gloo = dist.get_backend() == "gloo"
        self.param_to_rank: dict[Tensor, int] = {}
        self._rank_loads = [(0, r) for r in range(self.world_size)]  # heap of (elements owned, rank)
        self.local_optimizer: torch.optim.Optimizer | None = None
        self._flat: list[_FlatGroup] | None = None
        self._reduced = False  # gradients already reduce-scattered this step (by clip_grad_norm_)
        super().__init__(params, defaults)
        self.state = self.local_optimizer.state  # this rank's share, for inspection
        params = self._all_params()
        cuda = next((p.device for p in params if p.device.type == "cuda"), None)
        check_same_model(params, "ShardedOptimizer", cuda)
        if mode == "reduce_scatter":
            self._build_flat(broadcast=True)

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
        if self._flat is not None:
            self._build_flat(broadcast=False)

    def _all_params(self) -> list[Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def _build_flat(self, broadcast: bool) -> None:
        """Move every parameter into the flat buffers of its dtype and device (``p.data`` becomes a view)."""
        keyed: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
        for p in self._all_params():
            keyed.setdefault((p.dtype, p.device), []).append(p)
        self._flat = []
        for (dtype, device), params in keyed.items():
            owned = [[p for p in params if self.param_to_rank[p] == r] for r in range(self.world_size)]
            segment = max(sum(p.numel() + 1 for p in mine) for mine in owned)
            buffer = torch.zeros(self.world_size * segment, dtype=dtype, device=device)
            for r, mine in enumerate(owned):
                offset = r * segment
                for p in mine:
                    view = buffer[offset:offset + p.numel()].view_as(p)
                    view.copy_(p)
                    p.data = view
                    offset += p.numel()
            if broadcast:
                dist.broadcast(buffer, src=0)
            self._flat.append(_FlatGroup(buffer, segment, owned))

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
        if self.mode == "reduce_scatter":
            if not self._reduced:
                self._reduce_scatter_gradients()
            self._reduced = False
            self.local_optimizer.step(**kwargs)
            self._all_gather_parameters()
        else:
            self.local_optimizer.step(**kwargs)
            self._broadcast_parameters()
        return loss

    @torch.no_grad()
    def _reduce_scatter_gradients(self) -> None:
        """Give every owned parameter the average over ranks of its gradient (None if no rank had one)."""
        labels = [(g, i, p) for g, grp in enumerate(self.param_groups) for i, p in enumerate(grp["params"])]
        disagreement = agree_on_presence(
            "ShardedOptimizer", lambda k: f"param_groups[{labels[k][0]}]['params'][{labels[k][1]}] (shape "
            f"{list(labels[k][2].shape)})", [p.grad is not None for _, _, p in labels])
        if disagreement is not None:
            raise RuntimeError(disagreement.message)
        for flat in self._flat:
            send = torch.zeros_like(flat.buffer)
            for r, mine in enumerate(flat.owned):
                offset, flags = r * flat.segment, r * flat.segment + sum(p.numel() for p in mine)
                for i, p in enumerate(mine):
                    if p.grad is not None:
                        send[offset:offset + p.numel()].copy_(p.grad.reshape(-1))
                        send[flags + i] = 1
                    offset += p.numel()
            received = torch.empty(flat.segment, dtype=send.dtype, device=send.device)
            if self._gloo:
                ring_reduce_scatter_(received, send, self.rank, self.world_size)
                received.div_(self.world_size)
            else:
                dist.reduce_scatter_tensor(received, send, op=dist.ReduceOp.AVG)
            offset = 0
            mine = flat.owned[self.rank]
            flags = sum(p.numel() for p in mine)
            for i, p in enumerate(mine):
                p.grad = received[offset:offset + p.numel()].view_as(p) if received[flags + i] > 0 else None
                offset += p.numel()

    @torch.no_grad()
    def _all_gather_parameters(self) -> None:
        for flat in self._flat:
            if self._gloo:
                ring_all_gather_(flat.buffer, self.rank, self.world_size)
            else:
                mine = flat.buffer[self.rank * flat.segment:(self.rank + 1) * flat.segment].clone()
                dist.all_gather_into_tensor(flat.buffer, mine)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> Tensor:
        """Scale the gradients so that their global ``norm_type``-norm is at most ``max_norm``; return the
        norm before clipping (float64 scalar), as ``torch.nn.utils.clip_grad_norm_`` over all the parameters.

        ``reduce_scatter`` mode: reduces the gradients (which ``step`` then does not do again) and all-reduces
        one scalar; ``broadcast`` mode: the averaged gradients are equal on every rank, no communication.
        """
        if self.mode == "broadcast":
            return clip_replicated_([p.grad for p in self._all_params() if p.grad is not None], max_norm,
                                    norm_type)
        if not self._reduced:
            self._reduce_scatter_gradients()
            self._reduced = True
        owned = [p.grad for p in self._all_params()
                 if self.param_to_rank[p] == self.rank and p.grad is not None]
        device = self._flat[0].buffer.device if self._flat else None
        return clip_sharded_(owned, [], max_norm, norm_type, device=device)

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
