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
``shard.grad`` (fp32, the shard's shape).
``reshard_after_forward`` says which units are freed after their forward: ``"except_last"`` (default) all
but the last unit of the forward, whose backward comes first (known from the previous forward, so the first
step frees it too); ``True`` every unit (the last one is gathered
again at once by the backward); ``False`` none: every unit stays gathered from its forward until its
gradient is complete (no gathers in backward, at the memory of the whole model in ``compute_dtype``).
A forward without gradients (evaluation) frees every unit after its use.
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

Compiled blocks. A unit's module compiled in place (``block.compile()``, before or after wrapping) or
replaced by ``torch.compile(block)`` before wrapping works: the hooks that gather a unit and set its weight
views run outside the compiled region (``torch.compiler.disable``, as torch's ``fully_shard`` does), so the
compiled graph reads the views as inputs and recompiles nothing from step to step.

Agreement. Collectives are matched by order, so every rank must run the same units in the same order and
produce the same gradients. The ranks compare what they are about to issue (``parallel.lockstep``: a 32-byte
all-reduce in a gloo group, no device synchronization), and ``finish_gradient_synchronization()`` checks
that none has one left and that the module gained no trainable parameter after wrapping: a module run, or a
gradient produced, on some ranks only raises ``RuntimeError`` on every rank naming the unit's parameters and
what each rank was about to do, instead of a hang. ``check_lockstep`` says when: ``"on_change"`` (default)
before every collective of the first step, and of every forward/backward whose collectives differ from the
last checked one of its kind (training, accumulation in ``no_sync()``, evaluation), plus once at the end of
each step, a digest of all its collectives; ``"always"`` before every collective (one host round trip
each); ``"never"`` not at all. Under ``"on_change"`` a divergence of some ranks only from a step that all
ran before is caught at the end of the step if the mismatched collectives complete, and may hang
otherwise: run with ``"always"`` to find it. A unit or replicated parameter that gets no gradient on any
rank is fine: nothing is reduced, its gradient stays as it was.

Limits: one process per device in the default process group; the FSDP wrapper is the root module
(``state_dict`` / ``load_state_dict`` use the wrapped module's parameter names, full fp32 tensors on CPU) and
the model is not moved after wrapping;
replicated parameters stay fp32, so their modules must accept fp32 weights with ``compute_dtype`` inputs (the
reference RMSNorm computes in fp32); modules owning parameters of a meta model need ``reset_parameters()``;
buffers must not be on the meta device. A weight shared between units (tied embedding and LM head) belongs to
the first unit; it stays gathered from its last forward use until its gradient is complete.

Code, in the order the constructor composes it: ``fsdp_units.build_layout`` groups, materializes and shards
the parameters; ``fsdp_schedule.GatherSchedule`` (built from the layout, the ``Streams``, the
``ScheduleOptions`` and a ``parallel.lockstep.Lockstep``) gathers, frees and reduces, driven by the hooks
``_register_hooks`` installs; ``fsdp_state.FullState`` gathers full values and serves state dicts and files.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping

import torch
import torch.distributed as dist
from torch import Tensor, nn

from parallel.consistency import check_not_wrapped, check_same_model
from parallel.fsdp_schedule import RESHARD_CHOICES, GatherSchedule, ScheduleOptions, Streams
from parallel.fsdp_state import FullState
from parallel.fsdp_units import Layout, Piece, Placement, build_layout
from parallel.grad_norm import clip_sharded_
from parallel.grad_presence import GradPresence
from parallel.lockstep import MODES, Lockstep

__all__ = ["FSDP"]

GatherObserver = Callable[[int, str, "torch.cuda.Event"], None]


class FSDP(nn.Module):
    """Shard ``module``'s weights over the default process group (see the module docstring).

    ``compute_dtype``: dtype of gathered weights and hence of the forward/backward math (None: fp32).
    ``unit_modules``: module classes whose instances each become one unit. ``reduce_dtype``: dtype of the
    gradient reduce-scatter (None: ``compute_dtype``). ``prefetch``: how many units ahead gathers run (0: on
    demand). ``seed``: initialization seed for a meta-device ``module``. ``device``: where shards and
    computation live (default: the current CUDA device under NCCL, else the CPU).
    ``reshard_after_forward``: ``"except_last"`` (default), ``True`` or ``False``: which units are freed after
    their forward. ``check_lockstep``: ``"on_change"`` (default), ``"always"`` or ``"never"``: when the ranks
    check that they issue the same collectives.
    """

    wraps_for_parallel = True  # check_not_wrapped refuses to wrap it again

    def __init__(
        self,
        module: nn.Module,
        compute_dtype: torch.dtype | None = None,
        unit_modules: Iterable[type[nn.Module]] = (),
        reduce_dtype: torch.dtype | None = torch.float32,
        prefetch: int = 2,
        seed: int = 0,
        device: torch.device | str | None = None,
        *,
        reshard_after_forward: bool | str = "except_last",
        check_lockstep: str = "on_change",
    ):
        super().__init__()
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("FSDP needs an initialized default process group (init_process_group)")
        unit_modules = _checked_arguments(module, unit_modules, compute_dtype, reduce_dtype, prefetch,
                                          reshard_after_forward, check_lockstep)
        check_not_wrapped(module, "FSDP")
        self.module = module
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = _device_of(device)
        check_same_model(module, "FSDP", self.device)
        self.compute_dtype = compute_dtype or torch.float32
        self.reduce_dtype = reduce_dtype or self.compute_dtype
        self.prefetch = prefetch
        self.reshard_after_forward, self.check_lockstep = reshard_after_forward, check_lockstep

        placement = Placement(self.device, self.rank, self.world_size)
        layout = build_layout(module, unit_modules, placement, self.compute_dtype, seed)
        self.shards = nn.ParameterList(unit.shard for unit in layout.units)
        self._layout, self._param_names = layout, layout.param_names
        streams = Streams(self.device)
        options = ScheduleOptions(self.compute_dtype, self.reduce_dtype, prefetch, reshard_after_forward)
        self._schedule = GatherSchedule(layout, streams, options, Lockstep("FSDP", check_lockstep))
        _register_hooks(self._schedule, layout)
        self._full_state = FullState(module, layout, placement, streams.comm)
        self._added = GradPresence("FSDP", module, layout.replicated)  # finds parameters added after wrapping

    # ----------------------------------------------------------------------------------------- training
    def forward(self, *args, **kwargs):
        """The wrapped module's forward; its units are gathered and freed around their use."""
        self._schedule.begin_forward()
        output = self.module(*args, **kwargs)
        self._schedule.end_forward()
        return output

    def finish_gradient_synchronization(self) -> None:
        """Queue the compute stream behind every reduce-scatter and all-reduce; free what is still gathered.

        Afterwards each shard's ``.grad`` (fp32, the shard's shape) holds its slice of the gradient averaged
        over ranks, and each replicated parameter's ``.grad`` the average. Raises ``RuntimeError`` on every
        rank if a rank still has a collective to issue, or the module gained a parameter after wrapping.
        """
        checked = self.world_size > 1 and self.check_lockstep != "never"
        self._schedule.end_step(self._added.added_parameters() if checked else [])

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate locally (one full-size gradient per unit, see the module
        docstring); the next backward outside reduces the sum once."""
        previous, self._schedule.sync_enabled = self._schedule.sync_enabled, False
        try:
            yield
        finally:
            self._schedule.sync_enabled = previous

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> Tensor:
        """Scale every gradient so that the global ``norm_type``-norm is at most ``max_norm``; return the norm
        before clipping (float64 scalar), as ``torch.nn.utils.clip_grad_norm_`` on the unsharded model.

        Collective (one all-reduce of a scalar): call on every rank, after backward.
        """
        self.finish_gradient_synchronization()
        return clip_sharded_([s.grad for s in self.shards if s.grad is not None],
                             [p.grad for p in self._layout.replicated if p.grad is not None], max_norm,
                             norm_type)

    def register_gather_observer(self, observer: GatherObserver) -> None:
        """Call ``observer(unit_index, phase, ready_event)`` whenever the compute stream is about to wait for
        a unit's gather (``phase``: "forward" or "backward"; CUDA only, the event records with timing)."""
        if self.device.type != "cuda":
            raise ValueError(f"gather observers time CUDA streams; device {self.device} has none")
        self._schedule.gather_observers.append(observer)

    def flat_shards(self) -> list[nn.Parameter]:
        """This rank's fp32 shard of every unit (1-D; unit padded to a multiple of the world size)."""
        return list(self.shards)

    def replicated_parameters(self) -> list[nn.Parameter]:
        """The parameters every rank holds whole (norm gains)."""
        return list(self._layout.replicated)

    def gathered_units(self) -> list[int]:
        """Indices of the units whose full weights are gathered (or being gathered) now."""
        return [unit.index for unit in self._layout.units if unit.state != "free"]

    # ------------------------------------------------------------------------------------- full state
    def gather_full_params(self, device: torch.device | str = "cpu") -> dict[str, Tensor]:
        """Every parameter of the wrapped module in full fp32, named as in ``module.named_parameters()``.

        Collective: call on every rank. Tied parameters appear once, under their first name.
        """
        return self._full_state.gather_full_params(device)

    def gather_full_grads(self, device: torch.device | str = "cpu") -> dict[str, Tensor]:
        """Every parameter's averaged gradient in full fp32 (zeros where none), named and deduplicated as
        in :meth:`gather_full_params`; call after ``finish_gradient_synchronization``, on every rank."""
        return self._full_state.gather_full_grads(device)

    def flat_pieces(self) -> dict[Tensor, list[Piece]]:
        """For every parameter an optimizer of this wrapper steps (shards, replicated parameters): which of
        its flattened elements hold which elements of which named parameter (tied: under the first name)."""
        return self._full_state.flat_pieces()

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False) -> dict:
        """Full fp32 state of the wrapped module (CPU tensors, its own key names, tied keys included).

        Collective: call on every rank; a plain ``module.load_state_dict`` accepts it.
        """
        return self._full_state.state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)

    def load_state_dict(self, state_dict: Mapping[str, Tensor], strict: bool = True, assign: bool = False):
        """Load a full state dict (from ``state_dict()`` on any number of ranks, or a plain module's): every
        rank keeps its slice of each unit; replicated parameters and buffers are copied whole."""
        return self._full_state.load_state_dict(state_dict, strict=strict, assign=assign)

    def save_full_state_dict(self, path: str | os.PathLike) -> None:
        """Gather the full state (collective) and write it from rank 0 to ``<path>.partial``, then rename."""
        self._full_state.save_full_state_dict(path)

    def load_full_state_dict(self, path: str | os.PathLike, strict: bool = True):
        """Read a file written by :meth:`save_full_state_dict` (on any number of ranks) into the shards."""
        return self._full_state.load_full_state_dict(path, strict=strict)


def _checked_arguments(module, unit_modules, compute_dtype, reduce_dtype, prefetch, reshard_after_forward,
                       check_lockstep) -> tuple[type[nn.Module], ...]:
    """Raise naming the first bad constructor argument; return ``unit_modules`` as a tuple."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    unit_modules = tuple(unit_modules)
    if not all(isinstance(c, type) and issubclass(c, nn.Module) for c in unit_modules):
        raise TypeError(f"unit_modules must be nn.Module subclasses, got {unit_modules!r}")
    for name, dtype in (("compute_dtype", compute_dtype), ("reduce_dtype", reduce_dtype)):
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"{name} must be a floating-point torch.dtype or None, got {dtype!r}")
    if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
        raise ValueError(f"prefetch must be a non-negative int, got {prefetch!r}")
    if not any(reshard_after_forward is c if isinstance(c, bool) else reshard_after_forward == c
               for c in RESHARD_CHOICES):
        raise ValueError(f"reshard_after_forward must be True, False or 'except_last', got "
                         f"{reshard_after_forward!r}")
    if check_lockstep not in MODES:
        raise ValueError(f"check_lockstep must be one of {', '.join(map(repr, MODES))}, "
                         f"got {check_lockstep!r}")
    return unit_modules


def _device_of(device: torch.device | str | None) -> torch.device:
    """``device``, or the default: the current CUDA device under NCCL, else the CPU."""
    nccl = dist.get_backend() == "nccl"
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be a CPU or CUDA device, got device={device}")
    if nccl and device.type != "cuda":
        raise ValueError(f"the NCCL backend needs a CUDA device, got device={device}")
    return device


def _register_hooks(schedule: GatherSchedule, layout: Layout) -> None:
    """Drive ``schedule`` from module hooks around each use of a unit and gradient hooks.

    The module hooks run outside any compiled region (``torch.compiler.disable``): they issue collectives
    and set the weight views, which a compiled block then reads as graph inputs. Tensor hooks live where
    Python's garbage collector cannot follow them (autograd's C++ side), so a hook that held the schedule
    strongly would keep every shard alive after the wrapper is dropped: they hold a weak reference and an
    index instead.
    """
    pre_forward = torch.compiler.disable(lambda use: schedule.pre_forward(use))
    post_forward = torch.compiler.disable(lambda use, output: schedule.post_forward(use, output))
    for unit in layout.units:
        for use in unit.uses:
            use.module.register_forward_pre_hook(lambda m, args, use=use: pre_forward(use))
            use.module.register_forward_hook(lambda m, args, out, use=use: post_forward(use, out))
    this = weakref.ref(schedule)
    for unit in layout.units:
        if unit.shard.requires_grad:
            unit.full_param.register_post_accumulate_grad_hook(
                lambda t, index=unit.index: this().on_grad_ready(this().units[index]))
    for i, p in enumerate(layout.replicated):
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(lambda t, i=i: this().on_replicated_grad(i))
