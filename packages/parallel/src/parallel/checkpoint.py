"""Sharded checkpoints through ``torch.distributed.checkpoint``: every rank writes what it holds, in parallel;
every byte is checksummed, every tensor compared with its destination, and nothing in a checkpoint runs code.

    save_sharded("ckpt/step-1000", model, optimizer, extra={"step": 1000, "rng": torch.get_rng_state()})
    extra = load_sharded("ckpt/step-1000", model, optimizer)      # on any world size, into any wrapper
    recipe = read_extra("ckpt/step-1000")["recipe"]                # extra alone, before building anything

``model`` is a ``parallel.FSDP``, a wrapper of the DDP family, or a plain ``nn.Module``; ``optimizer`` a
``torch.optim.Optimizer`` over its parameters or a ``parallel.ShardedOptimizer``. Nothing is gathered on one
rank: FSDP ranks write their slices of each parameter and of the optimizer state, a ``ShardedOptimizer`` rank
the state of the parameters it owns; tensors every rank holds (a DDP replica) are written once, the writes
spread over the ranks by ``torch.distributed.checkpoint``'s de-duplication.

Format (one folder, ``torch.distributed.checkpoint``'s files plus ``manifest.json``): every parameter and
persistent buffer under ``model/<name>`` flattened to 1-D (names of the wrapped module, without DDP's
``module.`` prefix; a tied weight under its first name); each optimizer-state tensor of a parameter's shape
under ``optim/<name>/<key>`` in the same flattened form, the other state entries (``step``) under
``optim/<name>/other``; hyper-parameters under ``optim/param_groups``; ``extra`` per rank under
``extra/rank<r>``. Because the key space is the model's own parameter names with global sizes, a checkpoint
written on N ranks loads on M ranks (each reads only the chunks overlapping its slices), into another
wrapper, or into a plain unsharded module. ``manifest.json`` (``checkpoint_manifest``) holds a checksum of
every stored item (sum64, ``checkpoint_digest``; CRC-32 in manifests of format 1, which still load) and a
CRC-32 of ``.metadata``, each file's size, the tensors' unflattened shapes and the optimizer's class and
groups.

Loading checks, before any tensor is read: the checksum of ``.metadata`` and every file's size (a truncated
or missing file is named); keys, shapes and dtypes of every tensor, the optimizer's class, its groups'
membership and hyper-parameter keys (``checkpoint_checks``; missing or unexpected keys are refused unless
``strict=False``). While reading, every item's checksum, computed on the buffer the item then deserializes
from (``verify=False`` skips this). A checkpoint written
before checksums existed loads with a warning that it cannot be verified. Every refusal is a
``CheckpointError`` (``CorruptCheckpointError``, ``UnsafeCheckpointError``) naming the file or key.

Safety: ``.metadata`` is read by an unpickler that admits only DCP's metadata classes; ``extra``, the
optimizer's non-tensor state and its groups by ``torch.load(weights_only=True)`` (tensors, numbers,
strings, containers, numpy arrays in ``extra``); ``save_sharded`` refuses other types up front
(``checkpoint_pickle``). The checksums catch damage, not forgery.

Atomicity: every rank writes into ``<path>.partial`` (removed first if an earlier save left it, and on
failure); ``torch.distributed.checkpoint`` writes its ``.metadata`` after all ranks' data, then rank 0 the
manifest; then rank 0 renames the folder to ``path`` (an existing ``path`` is moved aside first and removed
after). ``load_sharded`` reads only a folder with ``.metadata``, so an interrupted save is never taken for a
checkpoint.

Limits: ``path`` must be on a file system every rank sees (as for ``FileSystemWriter``); ``extra`` comes back
as saved by the same rank index (rank 0's when the saving run had fewer ranks); a load that fails while
reading tensors (a bad checksum) leaves the model partly overwritten.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from parallel.checkpoint_checks import (
    check_dtype,
    check_model,
    check_optimizer,
    describe_optimizer,
    hyperparameters,
    inner_optimizer,
    model_shapes,
)
from parallel.checkpoint_errors import CheckpointError
from parallel.checkpoint_layout import LoadPlanner, SavePlanner, flat, item, param_shaped, pieces
from parallel.checkpoint_manifest import (
    METADATA,
    ChecksummingWriter,
    Manifest,
    VerifyingReader,
    load_pickled,
    open_checkpoint,
    verify_files,
)
from parallel.checkpoint_pickle import dumps, read_dcp_metadata
from parallel.consistency import all_ranks_ok
from parallel.zero import ShardedOptimizer

__all__ = ["load_sharded", "read_extra", "save_sharded", "verify_sharded"]


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


@contextlib.contextmanager
def _quiet_without_group():
    """Without a process group ``torch.distributed.checkpoint`` warns that it runs in one process: meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _together(what: str, prepare, *args) -> Any:
    """``prepare(*args)`` on every rank; if it raises on any, every rank raises (the others a
    ``RuntimeError`` pointing to it) instead of some waiting in the next collective."""
    failure, result = None, None
    try:
        result = prepare(*args)
    except Exception as err:
        failure = err
    if not all_ranks_ok(failure is None):
        if failure is not None:
            raise failure
        raise RuntimeError(f"{what}: another rank failed (see its error)")
    return result


# -------------------------------------------------------------------------------------------- save
def _save_state(model, optimizer, extra) -> tuple[dict[str, Any], list[list[str]]]:
    """``(DCP state of this rank, names of the parameters in each optimizer group as this rank sees them)``"""
    found, buffers = pieces(model)
    state: dict[str, Any] = {}
    for p, mine in found.items():
        flat_p = flat(p, f"parameter {mine[0].name if mine else ''}")
        for piece in mine:
            state[f"model/{piece.name}"] = item(flat_p, piece)
    for name, b in buffers.items():
        state[f"model/{name}"] = flat(b, f"buffer {name}")
    group_names: list[list[str]] = []
    if optimizer is not None:
        inner, groups = inner_optimizer(optimizer)
        for p, entry in inner.state.items():
            if p not in found:
                raise ValueError("optimizer steps a tensor that is not a parameter of model")
            name = found[p][0].name if found[p] else "?"
            other = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in entry.items()
                     if not param_shaped(v, p)}
            other = dumps(other, f"optimizer state of parameter {name!r}")
            for piece in found[p]:
                for key, value in entry.items():
                    if param_shaped(value, p):
                        state[f"optim/{piece.name}/{key}"] = item(flat(value, f"state {key}"), piece)
                state[f"optim/{piece.name}/other"] = other
        state["optim/param_groups"] = dumps(hyperparameters(optimizer), "optimizer param_groups")
        if any(p not in found for g in groups for p in g["params"]):
            raise ValueError("optimizer steps a tensor that is not a parameter of model")
        group_names = [[piece.name for p in g["params"] for piece in found[p]] for g in groups]
    if extra is not None:
        state[f"extra/rank{_rank()}"] = dumps(extra, "extra", numpy_arrays=True)
    return state, group_names


def _check_same_path(final: Path) -> None:
    """Every rank must name the same folder (collective): each writes its shards where it was told, and
    rank 0 alone writes the metadata and renames the folder."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return
    paths: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(paths, os.path.abspath(final))
    if len(set(paths)) > 1:
        named = ", ".join(f"rank {rank}: {path!r}" for rank, path in enumerate(paths))
        raise ValueError(f"save_sharded needs the same path on every rank, got {named}")


def _gather_on_rank0(obj: Any) -> list | None:
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [obj]
    out = [None] * dist.get_world_size() if _rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def _write_manifest(folder: Path, writer: ChecksummingWriter, model, optimizer, group_names) -> None:
    """Gather every rank's checksums and group members; rank 0 writes the manifest (collective)."""
    gathered = _gather_on_rank0((getattr(writer, "checksums", {}), group_names))
    if gathered is None:
        return
    files, items = {}, {}
    for checksums, _ in gathered:
        for name, (size, rows) in checksums.items():
            files[name], items[name] = size, rows
    described = None
    if optimizer is not None:
        members = [sorted({n for _, names in gathered for n in names[i]}) for i in range(len(group_names))]
        described = describe_optimizer(optimizer, members)
    data = (folder / METADATA).read_bytes()
    read_dcp_metadata(data, str(folder / METADATA))  # what load_sharded will accept
    shapes = {k: list(v) for k, v in model_shapes(model).items()}
    Manifest({"bytes": len(data), "crc32": zlib.crc32(data)}, files, items, shapes,
             described).write(folder)


def save_sharded(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 extra: dict | None = None, *, threads: int = 4) -> None:
    """Write ``model``'s parameters and persistent buffers, ``optimizer``'s state and ``extra`` to the folder
    ``path`` with checksums (collective: call on every rank). ``threads``: writer threads per rank, each
    copying one tensor at a time to the host (a rank on a GPU holds at most ``threads`` tensors there while
    saving), then reading its files back to checksum them. ``extra`` may hold tensors, numbers, strings,
    containers and numpy arrays; anything else is refused (``TypeError``) before a file is touched."""
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"extra must be a dict or None, got {type(extra).__name__}")
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    final = Path(path)
    _check_same_path(final)
    if final.exists() and not (final.is_dir() and (final / METADATA).exists()):
        raise FileExistsError(f"path {str(final)!r} exists and is not a sharded checkpoint; not replacing it")
    # Objects are pickled here, before any file is touched: torch.distributed.checkpoint's writer threads
    # would drop an object that fails to pickle and still complete the checkpoint.
    state, group_names = _together("save_sharded", _save_state, model, optimizer, extra)
    partial = final.with_name(final.name + ".partial")
    if _rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)  # what an interrupted save left
        partial.mkdir(parents=True)
    _barrier()
    try:
        with _quiet_without_group():
            # One file per tensor: torch's writer keeps the host copy of every tensor of a file until the
            # file is closed, so with one file per thread a GPU rank would hold its whole state on the host.
            writer = ChecksummingWriter(partial, thread_count=threads, single_file_per_rank=False)
            dcp.save(state, storage_writer=writer, planner=SavePlanner())
        _together("save_sharded (manifest)", _write_manifest, partial, writer, model, optimizer, group_names)
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
def _open(path: str | os.PathLike) -> tuple[Path, Any, Manifest | None]:
    folder = Path(path)
    if not (folder / METADATA).is_file():
        raise FileNotFoundError(f"{str(folder)!r} is not a complete sharded checkpoint (no {METADATA}); an "
                                f"interrupted save leaves only {folder.name}.partial")
    metadata, manifest = open_checkpoint(folder)
    if manifest is None and _rank() == 0:
        warnings.warn(f"checkpoint {str(folder)!r} has no manifest.json (written before checksums existed): "
                      f"its bytes, tensor shapes and optimizer class cannot be verified", stacklevel=3)
    return folder, metadata, manifest


def _request_optimizer(optimizer, found, stored, request, missing, source) -> list:
    """Destinations for the optimizer's state: ``[(param, {key: flat destination}, other state or None)]``"""
    inner, _ = inner_optimizer(optimizer)
    plan = []
    for group in inner.param_groups:
        for p in group["params"]:
            if p not in found:
                raise ValueError("optimizer steps a tensor that is not a parameter of model")
            mine = found[p]
            other_key = f"optim/{mine[0].name}/other" if mine else None
            if other_key is None or other_key not in stored:
                plan.append((p, {}, None))
                continue
            other = load_pickled(*source, other_key)
            prefix = f"optim/{mine[0].name}/"
            keys = [k[len(prefix):] for k in stored if k.startswith(prefix) and k != other_key]
            dests = {}
            for key in keys:
                read = [piece for piece in mine
                        if f"model/{piece.name}" not in missing and f"optim/{piece.name}/{key}" in stored]
                whole = sum(piece.stop - piece.start for piece in read) == p.numel()  # else zeros stay
                new = torch.empty if whole else torch.zeros
                dest = new(p.numel(), dtype=stored[prefix + key].properties.dtype, device=p.device)
                for piece in read:
                    name = f"optim/{piece.name}/{key}"
                    if stored[name].size.numel() != piece.numel:
                        raise CheckpointError(f"checkpoint's {name!r} has {stored[name].size.numel()} "
                                              f"elements, the parameter {piece.numel}")
                    request[name] = item(dest, piece)
                dests[key] = dest
            plan.append((p, dests, other))
    return plan


def _prepare_load(path, model, optimizer, strict: bool, verify: bool) -> tuple:
    """Everything before reading tensors: open and check the checkpoint, compare it with model and optimizer,
    read the pickled pieces; returns ``(folder, reader, request, optimizer plan, saved groups, extra)``."""
    folder, metadata, manifest = _open(path)
    source = (folder, metadata, manifest if verify else None)
    stored = metadata.state_dict_metadata
    missing = check_model(stored, manifest.shapes if manifest else None, model_shapes(model), strict)
    found, buffers = pieces(model)
    request: dict[str, Any] = {}
    for p, mine in found.items():
        flat_p = flat(p, f"parameter {mine[0].name if mine else ''}")
        for piece in mine:
            if f"model/{piece.name}" not in missing:
                check_dtype(stored, f"model/{piece.name}", flat_p)
                request[f"model/{piece.name}"] = item(flat_p, piece)
    for name, b in buffers.items():
        if f"model/{name}" not in missing:
            check_dtype(stored, f"model/{name}", b)
            request[f"model/{name}"] = flat(b, f"buffer {name}")
    plan, saved_groups = [], []
    if optimizer is not None:
        if "optim/param_groups" not in stored:
            raise CheckpointError(f"checkpoint {str(folder)!r} holds no optimizer state")
        saved_groups = load_pickled(*source, "optim/param_groups")
        _, groups = inner_optimizer(optimizer)
        names = [[piece.name for p in g["params"] for piece in found.get(p, [])] for g in groups]
        check_optimizer(manifest.optimizer if manifest else None, saved_groups, optimizer, names, strict)
        plan = _request_optimizer(optimizer, found, stored, request, missing, source)
    extra_key = next((k for k in (f"extra/rank{_rank()}", "extra/rank0") if k in stored), None)
    extra = load_pickled(*source, extra_key, numpy_arrays=True) if extra_key else {}
    return folder, VerifyingReader(*source), request, plan, saved_groups, extra


def _load_optimizer(optimizer, plan: list, saved_groups: list[dict]) -> None:
    inner, outer = inner_optimizer(optimizer)
    for group, current, saved in zip(outer, hyperparameters(optimizer), saved_groups, strict=True):
        group.update({k: v for k, v in saved.items() if k in current})
    index = {p: i for i, (p, _, _) in enumerate(plan)}
    state = {index[p]: {**other, **{k: d.view(p.shape) for k, d in dests.items()}}
             for p, dests, other in plan if other is not None}
    groups = [{**local, **{k: v for k, v in saved.items() if k in local and k != "params"},
               "params": [index[p] for p in local["params"]]}
              for local, saved in zip(inner.param_groups, saved_groups, strict=True)]
    inner.load_state_dict({"state": state, "param_groups": groups})
    if isinstance(optimizer, ShardedOptimizer):
        optimizer.state = inner.state


def _unwrapped(err: CheckpointException, folder: Path) -> Exception:
    """The error a rank raised inside ``torch.distributed.checkpoint``, with every failing rank named."""
    failures = {rank: pair[0] for rank, pair in err.failures.items()}
    ranks = sorted(failures)
    messages = "; ".join(f"rank {r}: {failures[r]}" for r in ranks)
    first = failures[ranks[0]]
    cls = type(first) if isinstance(first, CheckpointError) else RuntimeError
    return cls(f"load_sharded({str(folder)!r}) failed on ranks {ranks}: {messages}")


def load_sharded(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 *, strict: bool = True, verify: bool = True) -> dict:
    """Read a checkpoint of :func:`save_sharded` (any world size, any supported wrapper) into ``model`` and
    ``optimizer`` in place; return the ``extra`` dict saved by this rank index (``{}`` if none).

    Collective: call on every rank. ``strict``: refuse keys only one side has (parameters, buffers,
    optimizer hyper-parameters); ``False`` loads what both have, the rest keeps its value. ``verify``: check
    every item's checksum while reading (``.metadata``'s and the file sizes are checked always). Raises
    ``CheckpointError`` (or a subclass) on every rank before any tensor is read when the checkpoint does not
    fit, is damaged or carries code; a bad checksum found while reading names the file and the key (items
    read before it are loaded already: load a good checkpoint before going on).
    """
    folder, reader, request, plan, saved_groups, extra = _together(
        f"load_sharded({str(path)!r})", _prepare_load, path, model, optimizer, strict, verify)
    try:
        with torch.no_grad(), _quiet_without_group():
            dcp.load(request, storage_reader=reader, planner=LoadPlanner())
    except CheckpointException as err:
        raise _unwrapped(err, folder) from None
    if optimizer is not None:
        _load_optimizer(optimizer, plan, saved_groups)
    return extra


def read_extra(path: str | os.PathLike, rank: int | None = None, *, verify: bool = True) -> dict:
    """The ``extra`` dict that rank ``rank`` (default: this process's) saved into the checkpoint ``path``,
    rank 0's if the saving run had fewer ranks, ``{}`` if none; checked as :func:`load_sharded` checks it,
    reading nothing else (not collective: e.g. to compare a saved recipe before building the model)."""
    folder, metadata, manifest = _open(path)
    rank = _rank() if rank is None else rank
    key = next((k for k in (f"extra/rank{rank}", "extra/rank0") if k in metadata.state_dict_metadata), None)
    return load_pickled(folder, metadata, manifest if verify else None, key, numpy_arrays=True) if key else {}


def verify_sharded(path: str | os.PathLike, *, threads: int = 4) -> int:
    """Check every stored byte of the checkpoint ``path`` against its manifest (not collective); returns the
    number of bytes checked. ``CorruptCheckpointError`` names the first bad file and key; ``CheckpointError``
    if the checkpoint has no manifest (written before checksums existed)."""
    folder = Path(path)
    if not (folder / METADATA).is_file():
        raise FileNotFoundError(f"{str(folder)!r} is not a complete sharded checkpoint (no {METADATA})")
    metadata, manifest = open_checkpoint(folder)
    if manifest is None:
        raise CheckpointError(f"checkpoint {str(folder)!r} has no manifest.json (written before checksums "
                              f"existed): it cannot be verified")
    return verify_files(folder, metadata, manifest, threads)
