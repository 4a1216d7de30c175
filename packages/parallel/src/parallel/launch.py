"""Start N worker processes for a ``torch.distributed`` function, on one node or under torchrun.

``spawn(fn, world_size, *args)`` runs ``fn(rank, world_size, *args)`` in ``world_size`` fresh
processes joined in a process group (gloo on CPU, NCCL with one GPU each on CUDA) on a free
port; it returns each rank's return value, re-raises a worker's exception with its traceback,
and kills every worker after ``timeout`` seconds instead of hanging.

Under ``torchrun`` (RANK / WORLD_SIZE / MASTER_ADDR set), ``init_from_env()`` joins the group that
torchrun describes, so the same worker code runs on one node or several.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import os
import queue
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class WorkerError(RuntimeError):
    """A worker raised; the message holds its rank and traceback."""


def free_port() -> int:
    """A TCP port that was free on localhost a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_process_group(rank: int, world_size: int, backend: str, timeout_s: float = 300.0) -> torch.device:
    """Join the default group (env MASTER_ADDR/MASTER_PORT) and return this rank's device."""
    device = torch.device("cpu")
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    dist.init_process_group(
        backend,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if backend == "nccl" else None,
    )
    return device


def init_from_env(backend: str | None = None) -> tuple[int, int, torch.device]:
    """Join the group torchrun describes; returns ``(rank, world_size, device)``."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"not started by torchrun: environment lacks {', '.join(missing)}")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = init_process_group(rank, world_size, backend or default_backend())
    return rank, world_size, device


@dataclass(frozen=True)
class _FunctionByFile:
    """A module-level function named by module, qualified name and source file.

    A ``spawn``-started child imports ``fn``'s module by name; a module loaded from a path (a test file
    under pytest's importlib mode) is not importable by name there, so the child loads its file instead.
    """

    module: str
    qualname: str
    path: str

    def resolve(self) -> Callable[..., Any]:
        try:
            obj: Any = importlib.import_module(self.module)
        except ImportError:
            spec = importlib.util.spec_from_file_location(self.module, self.path)
            if spec is None or spec.loader is None:
                raise
            obj = importlib.util.module_from_spec(spec)
            sys.modules[self.module] = obj
            spec.loader.exec_module(obj)
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return obj


def _picklable(fn: Callable[..., Any]) -> Callable[..., Any] | _FunctionByFile:
    code = getattr(fn, "__code__", None)
    if code is None or "<locals>" in fn.__qualname__ or fn.__module__ == "__main__":
        return fn
    return _FunctionByFile(fn.__module__, fn.__qualname__, code.co_filename)


def _worker(fn, rank, world_size, backend, port, args, results, timeout_s, num_threads) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    try:
        if isinstance(fn, _FunctionByFile):
            fn = fn.resolve()
        if backend == "gloo":
            torch.set_num_threads(num_threads)
        init_process_group(rank, world_size, backend, timeout_s)
        value = fn(rank, world_size, *args)
        results.put((rank, "ok", value))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = None,
    timeout: float = 120.0,
    start_method: str | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return values by rank.

    ``start_method`` defaults to ``fork`` for gloo (so test-local functions work) and ``spawn``
    for NCCL (CUDA cannot be forked); with ``spawn`` ``fn`` must be a module-level function (of an
    importable module or of a file the child can load, such as a test file).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    backend = backend or default_backend()
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        found = torch.cuda.device_count()
        raise ValueError(f"NCCL with world_size={world_size} needs that many GPUs, found {found}")
    start_method = start_method or ("spawn" if backend == "nccl" else "fork")
    ctx = mp.get_context(start_method)
    if start_method == "fork":
        # torch.optim imports torch._dynamo on the first step (seconds); once here, shared by every fork.
        importlib.import_module("torch._dynamo")
    target = fn if start_method == "fork" else _picklable(fn)
    # Workers sharing the cores must not each take them all (torchrun sets OMP_NUM_THREADS=1). A forked
    # child stays on one thread: growing an OpenMP pool the parent already used hangs after fork.
    num_threads = 1 if start_method == "fork" else max(1, (os.cpu_count() or 1) // world_size)
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(target, r, world_size, backend, port, args, results, timeout, num_threads),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    values: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(values) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = world_size - len(values)
                raise TimeoutError(f"{missing} of {world_size} workers did not finish in {timeout:.0f} s")
            try:
                rank, status, value = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in values]
                if dead:
                    code = procs[dead[0]].exitcode
                    raise WorkerError(f"worker {dead[0]} died with exit code {code}") from None
                continue
            if status == "error":
                raise WorkerError(f"rank {rank} of {world_size} failed:\n{value}")
            values[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5 if len(values) == world_size else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
    return [values[r] for r in range(world_size)]
