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

Gradient accumulation. Backward passes inside ``no_sync()`` reduce nothing: each unit's gathered gradient is
added to a local accumulator of the whole unit (``reduce_dtype``), so memory stays bounded by one full-size
gradient copy of the model however many micro-batches run (the weights are still freed after each use);
the next backward outside ``no_sync()`` adds its gradient and reduce-scatters the sum once. Where even one
full gradient does not fit, accumulate *without* ``no_sync()``: every backward then reduce-scatters and adds
into ``shard.grad``, so memory stays at one shard (communication each micro-batch instead of once).
Replicated gradients accumulate in ``.grad`` and are all-reduced by the synchronized backward.

Clipping. ``clip_grad_norm_(max_norm, norm_type)`` finishes the gradient synchronization, computes the norm
over every shard (one all-reduce of a scalar) and the replicated gradients, and scales all of them in place.

Sharded checkpoints: ``parallel.checkpoint.save_sharded`` / ``load_sharded`` (every rank writes its slices of
each parameter and of the optimizer state; loadable on any world size and into a plain module).

Agreement. Collectives are matched by order, so every rank must run the same units in the same order and
produce the same gradients. Before each gather, reduce-scatter and all-reduce the ranks compare what they are
about to issue (``parallel.lockstep``: one 16-byte all-reduce in a gloo group, no device synchronization), and
``finish_gradient_synchronization()`` checks that none has one left and that the module gained no trainable
parameter after wrapping: a module run, or a gradient produced, on some ranks only raises ``RuntimeError`` on
every rank naming the unit's parameters and what each rank was about to do, instead of a hang. A unit or
replicated parameter that gets no gradient on any rank is fine: nothing is reduced, its gradient stays as it
was.

Limits: one process per device in the default process group; the FSDP wrapper is the root module
(``state_dict`` / ``load_state_dict`` use the wrapped module's parameter names, full fp32 tensors on CPU) and
the model is not moved after wrapping;
replicated parameters stay fp32, so their modules must accept fp32 weights with ``compute_dtype`` inputs (the
reference RMSNorm computes in fp32); modules owning parameters of a meta model need ``reset_parameters()``;
buffers must not be on the meta device. A weight shared between units (tied embedding and LM head) belongs to
the first unit; it stays gathered from its last forward use until its gradient is complete.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn

from parallel.consistency import check_same_model
from parallel.fsdp_schedule import GatherSchedule
from parallel.fsdp_state import FullState
from parallel.fsdp_units import Unit, UnitLayout
from parallel.grad_norm import clip_sharded_
from parallel.grad_presence import GradPresence
from parallel.lockstep import Lockstep

__all__ = ["FSDP"]

GatherObserver = Callable[[int, str, "torch.cuda.Event"], None]


def _require_process_group() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("FSDP needs an initialized default process group (init_process_group)")


class FSDP(UnitLayout, GatherSchedule, FullState, nn.Module):
    """Shard ``module``'s weights over the default process group (see the module docstring).

    ``compute_dtype``: dtype of gathered weights and hence of the forward/backward math (None: fp32).
    ``unit_modules``: module classes whose instances each become one unit. ``reduce_dtype``: dtype of the
    gradient reduce-scatter (None: ``compute_dtype``). ``prefetch``: how many units ahead gathers run (0: on
    demand). ``seed``: initialization seed for a meta-device ``module``. ``device``: where shards and
    computation live (default: the current CUDA device under NCCL, else the CPU).
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
    ):
        super().__init__()
        _require_process_group()
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
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
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be a CPU or CUDA device, got device={self.device}")
        if self._nccl and self.device.type != "cuda":
            raise ValueError(f"the NCCL backend needs a CUDA device, got device={self.device}")
        check_same_model(module, "FSDP", self.device)
        self.compute_dtype = compute_dtype or torch.float32
        self.reduce_dtype = reduce_dtype or self.compute_dtype
        self.prefetch = prefetch
        self._sync_enabled = True
        self._gather_observers: list[GatherObserver] = []
        cuda = self.device.type == "cuda"
        self._comm_stream = torch.cuda.Stream(self.device) if cuda else None
        self._compute_stream = torch.cuda.current_stream(self.device) if cuda else None

        self._param_names = self._record_names()
        groups, replicated = self._group_parameters(unit_modules)
        self.shards = nn.ParameterList()
        self._units: list[Unit] = []
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
        self._lockstep = Lockstep("FSDP")
        self._added = GradPresence("FSDP", module, self._replicated)  # finds parameters added after wrapping

        self._forward_order: list[Unit] = []
        self._plan: list[Unit] = []  # the previous forward's unit order
        self._plan_ok = False
        self._backward_plan: list[Unit] = []
        self._backward_count = 0

    # ----------------------------------------------------------------------------------------- public
    def forward(self, *args, **kwargs):
        """The wrapped module's forward; its units are gathered and freed around their use."""
        if self._compute_stream is not None:
            self._compute_stream = torch.cuda.current_stream(self.device)
        for unit in self._units:  # leftovers of a forward without backward (weights may have changed since)
            self._free(unit)
        self._plan, self._forward_order = self._forward_order or self._plan, []
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
        over ranks, and each replicated parameter's ``.grad`` the average. Raises ``RuntimeError`` on every
        rank if a rank still has a collective to issue, or the module gained a parameter after wrapping.
        """
        self._agree_on_finish()
        if self._comm_stream is not None:
            self._compute_stream.wait_stream(self._comm_stream)
        for unit in self._units:
            self._free(unit)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate locally (one full-size gradient per unit, see the module
        docstring); the next backward outside reduces the sum once."""
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> Tensor:
        """Scale every gradient so that the global ``norm_type``-norm is at most ``max_norm``; return the norm
        before clipping (float64 scalar), as ``torch.nn.utils.clip_grad_norm_`` on the unsharded model.

        Collective (one all-reduce of a scalar): call on every rank, after backward.
        """
        self.finish_gradient_synchronization()
        return clip_sharded_([s.grad for s in self.shards if s.grad is not None],
                             [p.grad for p in self._replicated if p.grad is not None], max_norm, norm_type)

    def register_gather_observer(self, observer: GatherObserver) -> None:
        """Call ``observer(unit_index, phase, ready_event)`` whenever the compute stream is about to wait for
        a unit's gather (``phase``: "forward" or "backward"; CUDA only, the event records with timing)."""
        if self.device.type != "cuda":
            raise ValueError(f"gather observers time CUDA streams; device {self.device} has none")
        self._gather_observers.append(observer)

    def flat_shards(self) -> list[nn.Parameter]:
        """This rank's fp32 shard of every unit (1-D; unit padded to a multiple of the world size)."""
        return list(self.shards)

    def replicated_parameters(self) -> list[nn.Parameter]:
        """The parameters every rank holds whole (norm gains)."""
        return list(self._replicated)
