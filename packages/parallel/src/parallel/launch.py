"""Starting ranks: what ``torch.multiprocessing`` and ``torch.distributed.run`` leave out.

- ``spawn(fn, world_size, *args)`` runs ``fn(rank, world_size, *args)`` in ``world_size`` processes of this
  machine joined in a process group (gloo on CPU, NCCL with one GPU each) on a free port, and returns each
  rank's return value: for tests and CPU runs. Unlike ``torch.multiprocessing.spawn`` it returns values,
  stops every worker after ``timeout`` seconds in all, or once no rank has sent a heartbeat for
  ``stall_timeout`` seconds (``parallel.heartbeat``), instead of hanging, runs functions of test files under
  the ``spawn`` start method, and blames the rank that failed first.
- ``torchrun(fn, nproc_per_node, *args)`` runs the same kind of function through ``torch.distributed.run``'s
  launcher (``elastic_launch``, as ``torchrun --standalone``): the multi-process launcher for GPUs; it
  watches heartbeats in the same way when given ``stall_timeout``.
- ``init_from_env()`` joins the group that ``torchrun`` describes (RANK, WORLD_SIZE, MASTER_ADDR, ...), so
  the same rank code runs on one node or several; ``call_rank(fn, rank, world_size, args)`` runs it there
  as the launchers above do (see Blame).

Blame. When one rank dies (an exception, ``os._exit``, a signal), its peers soon fail too, inside a
collective, with errors such as gloo's "Connection closed by peer". Such a peer waits ``PEER_GRACE_S``
seconds before it exits, so the launcher (ours, or torchrun's agent, which reports only the first failure
it sees) sees the dead rank first. A failure is a ``WorkerError`` naming that rank, its exit code or
signal, and its exception with traceback; a stall is a ``parallel.heartbeat.StallError`` naming the ranks
and their last phases.

Return values come back through a file each rank writes with ``torch.save`` and the launcher reads with
``torch.load(weights_only=True)``: tensors, numbers, strings, bytes, ``None``, lists, tuples, dicts, sets and
numpy arrays and scalars; a rank returning anything else fails, naming the type.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.elastic.utils.distributed import get_free_port as free_port

from parallel import heartbeat

PEER_GRACE_S = 3.0
_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator")


class WorkerError(RuntimeError):
    """A rank failed; the message names it, its exit code or signal, and its exception with traceback."""


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


def init_from_env(backend: str | None = None, timeout_s: float = 300.0) -> tuple[int, int, torch.device]:
    """Join the group torchrun describes (collectives time out after ``timeout_s``); returns
    ``(rank, world_size, device)``."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"not started by torchrun: environment lacks {', '.join(missing)}")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = init_process_group(rank, world_size, backend or default_backend(), timeout_s)
    return rank, world_size, device


def collective_timeout(timeout: float | None, stall_timeout: float | None) -> float:
    """Seconds a collective may wait: past a stall watch's verdict (so the stalled rank is named, not the
    peer that waited for it), and within ``timeout``."""
    if stall_timeout is not None:
        return 2 * stall_timeout + 60
    return timeout if timeout is not None else 300.0


def lost_a_peer(error: BaseException) -> bool:
    """Whether ``error`` looks like the consequence of another rank dying (a broken collective)."""
    text = str(error)
    return isinstance(error, dist.DistNetworkError) or any(marker in text for marker in _PEER_LOST)


def _exit_description(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        return f"killed by signal {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


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


def _fork_runs_autograd() -> bool:
    """Whether a child forked now can run autograd: it cannot once this process has run the backward of a
    ``torch.compile``'d function (autograd's engine threads do not survive a fork; torch raises in the child).
    Probed with one forked child running a one-element backward."""
    pid = os.fork()
    if pid == 0:  # the child: exit at once, without the parent's atexit handlers
        try:
            torch.ones(1, requires_grad=True).sum().backward()
        except RuntimeError:
            os._exit(1)
        os._exit(0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def cpu_start_method(fn: Callable[..., Any], requested: str | None = None) -> str:
    """``requested``, or ``fork`` (fast, and test-local functions work) unless forked children could not run
    autograd, then ``spawn``; refuses before starting anything what cannot work, naming why."""
    if requested not in (None, "fork") or _fork_runs_autograd():
        return requested or "fork"
    why = ("this process has run the backward of a torch.compile'd function, after which forked workers "
           "cannot run autograd")  # fmt: skip
    if requested == "fork":
        raise RuntimeError(f"start_method='fork' cannot work: {why}; use start_method='spawn'")
    if _picklable(fn) is fn:
        raise ValueError(f"{why}, so they are spawned, which needs a module-level function; got "
                         f"{getattr(fn, '__qualname__', fn)!r}")  # fmt: skip
    return "spawn"


def call_rank(fn, rank: int, world_size: int, args: tuple = ()) -> Any:
    """``fn(rank, world_size, *args)``; a rank that lost a peer waits before raising (see Blame)."""
    if isinstance(fn, _FunctionByFile):
        fn = fn.resolve()
    try:
        return fn(rank, world_size, *args)
    except BaseException as error:
        if lost_a_peer(error):
            time.sleep(PEER_GRACE_S)
        raise


def _result_types() -> list:
    """Types beyond ``weights_only``'s own that a rank's return value may hold: numpy arrays and scalars."""
    import numpy as np
    from numpy._core.multiarray import _reconstruct, scalar

    return [np.dtype, np.ndarray, _reconstruct, scalar, *(getattr(np.dtypes, n) for n in np.dtypes.__all__)]


def _load_outcome(path: Path) -> tuple[str, Any]:
    with torch.serialization.safe_globals(_result_types()):
        return torch.load(path, weights_only=True)


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _write_outcome(path: Path, outcome: tuple[str, Any]) -> str:
    """``outcome`` to ``path`` (through a temporary name), or an error outcome if it cannot be read back
    without running code; returns the status written."""
    tmp = path.with_suffix(".tmp")
    try:
        torch.save(outcome, tmp)
    except Exception as error:
        outcome = ("error", f"it returned a {type(outcome[1]).__name__} that cannot be pickled to send it to "
                            f"the launcher: {_first_line(error)}")  # fmt: skip
        torch.save(outcome, tmp)
    try:
        _load_outcome(tmp)
    except Exception as error:
        outcome = ("error", f"it returned a {type(outcome[1]).__name__} that the launcher cannot read back "
                            f"safely (torch.load(weights_only=True)): {_first_line(error)}")  # fmt: skip
        torch.save(outcome, tmp)
    os.replace(tmp, path)
    return outcome[0]


def _spawned(rank, fn, world_size, backend, port, args, outcome_dir, timeout_s, num_threads, beats) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    if beats is not None:
        os.environ[heartbeat.ENV] = beats
    try:
        with heartbeat.reporting(rank):
            if backend == "gloo":
                torch.set_num_threads(num_threads)
            init_process_group(rank, world_size, backend, timeout_s)
            outcome = ("ok", call_rank(fn, rank, world_size, args))
    except BaseException:
        outcome = ("error", traceback.format_exc())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    status = _write_outcome(Path(outcome_dir) / f"{rank}.pt", outcome)
    # End without the interpreter's teardown, as a forked child always does: under the spawn start method
    # the teardown destroys the C++ threads of gloo and the TCP store in no fixed order, and now and then
    # one still joinable aborts the process ("terminate called without an active exception") after its
    # outcome is on disk.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if status == "ok" else 1)


def _failure_message(rank: int, world_size: int, exitcode: int | None, error: str | None) -> str:
    if error is None:
        return f"rank {rank} of {world_size} failed: {_exit_description(exitcode)}, before returning a value"
    return f"rank {rank} of {world_size} failed: {_exit_description(exitcode)}, after raising:\n{error}"


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = None,
    timeout: float | None = 120.0,
    stall_timeout: float | None = None,
    start_method: str | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return values by rank.

    ``start_method`` defaults to ``fork`` for gloo (so test-local functions work; ``spawn`` once forked
    children could not run autograd, see :func:`cpu_start_method`) and ``spawn`` for NCCL (CUDA cannot be
    forked); with ``spawn`` ``fn`` must be a module-level function (of an importable module or of a file the
    child can load, such as a test file). Raises ``WorkerError``
    naming the first rank that failed, ``TimeoutError`` naming the ranks still running after ``timeout``
    seconds in all (None: no limit), ``heartbeat.StallError`` once no rank has called
    ``heartbeat.beat`` for ``stall_timeout`` seconds (None: not watched), naming the ranks and their last
    phases.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    _check_limits(timeout, stall_timeout)
    backend = backend or default_backend()
    known = [name for name in dist.Backend.backend_list if name != "undefined"]
    if backend not in known:
        raise ValueError(f"backend must be one of {', '.join(known)} (or None: nccl with GPUs, else gloo), "
                         f"got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        found = torch.cuda.device_count()
        raise ValueError(f"NCCL with world_size={world_size} needs that many GPUs, found {found}")
    nccl = backend == "nccl"
    start_method = (start_method or "spawn") if nccl else cpu_start_method(fn, start_method)
    if start_method == "fork":
        # torch.optim imports torch._dynamo on the first step (seconds); once here, shared by every fork.
        importlib.import_module("torch._dynamo")
    target = fn if start_method == "fork" else _picklable(fn)
    # Workers sharing the cores must not each take them all (torchrun sets OMP_NUM_THREADS=1). A forked
    # child stays on one thread: growing an OpenMP pool the parent already used hangs after fork.
    num_threads = 1 if start_method == "fork" else max(1, (os.cpu_count() or 1) // world_size)
    beats = heartbeat.served(stall_timeout)
    with tempfile.TemporaryDirectory(prefix="spawn-") as outcome_dir, beats as (address, watch):
        common = (target, world_size, backend, free_port(), args, outcome_dir,
                  collective_timeout(timeout, stall_timeout), num_threads, address)  # fmt: skip
        context = mp.start_processes(
            _spawned, args=common, nprocs=world_size, join=False, daemon=True, start_method=start_method
        )
        try:
            return _collect(context.processes, Path(outcome_dir), timeout, watch and watch(world_size))
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join()


def _check_limits(timeout: float | None, stall_timeout: float | None) -> None:
    for name, value in (("timeout", timeout), ("stall_timeout", stall_timeout)):
        if value is not None and not value > 0:
            raise ValueError(f"{name} must be a number of seconds > 0 or None, got {value}")


def _collect(processes, outcome_dir: Path, timeout: float | None, watch: heartbeat.Watch | None) -> list[Any]:
    world_size = len(processes)
    running = {p.sentinel: rank for rank, p in enumerate(processes)}
    values: dict[int, Any] = {}
    deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
    look = heartbeat.tick_seconds(watch.stall_timeout) if watch is not None else float("inf")
    while running:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            ranks = sorted(running.values())
            raise TimeoutError(f"ranks {ranks} of {world_size} did not finish within {timeout:g} s")
        stalled = watch.poll() if watch is not None else None
        if stalled is not None:
            raise heartbeat.StallError(stalled)
        failures = []
        for sentinel in multiprocessing.connection.wait(list(running), timeout=min(remaining, look)):
            rank = running.pop(sentinel)
            processes[rank].join()
            path = outcome_dir / f"{rank}.pt"
            status, value = _load_outcome(path) if path.exists() else ("died", None)
            if status == "ok" and processes[rank].exitcode == 0:
                values[rank] = value
            else:
                failures.append((rank, value if status == "error" else None))
        if failures:  # seen at the same moment: a rank that lost a peer is the least likely cause
            rank, error = min(failures, key=lambda f: f[1] is not None and any(m in f[1] for m in _PEER_LOST))
            raise WorkerError(_failure_message(rank, world_size, processes[rank].exitcode, error))
    return [values[r] for r in range(world_size)]


def _elastic_entry(fn, args: tuple, timeout_s: float, beats: str | None) -> Any:
    if beats is not None:
        os.environ[heartbeat.ENV] = beats
    with heartbeat.reporting(int(os.environ["RANK"])):
        rank, world_size, _ = init_from_env(timeout_s=timeout_s)
        try:
            return call_rank(fn, rank, world_size, args)
        finally:
            dist.destroy_process_group()


def torchrun(
    fn: Callable[..., Any],
    nproc_per_node: int,
    *args: Any,
    monitor_interval: float = 0.1,
    stall_timeout: float | None = None,
) -> list:
    """Run ``fn(rank, world_size, *args)`` on ``nproc_per_node`` processes of this node through
    ``torch.distributed.run``'s launcher (as ``torchrun --standalone``); return values by rank.

    Each process joins the default group (NCCL with one GPU each where CUDA is present, gloo otherwise)
    before calling ``fn``; with CUDA the processes are started fresh (``spawn``), so ``fn`` must then be
    a module-level function; on a CPU they are forked (spawned where :func:`cpu_start_method` says so).
    Raises ``WorkerError`` naming the failed rank, its exit code or signal and its exception;
    ``heartbeat.StallError`` (every rank stopped) once no rank has called ``heartbeat.beat`` for
    ``stall_timeout`` seconds (None: not watched).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be >= 1, got {nproc_per_node}")
    _check_limits(None, stall_timeout)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc_per_node,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        max_restarts=0,
        monitor_interval=monitor_interval,
        start_method="spawn" if torch.cuda.is_available() else cpu_start_method(fn),  # CUDA cannot be forked
    )
    with heartbeat.served(stall_timeout) as (address, watch), heartbeat.stopping_on_stall(
        watch, nproc_per_node
    ) as stalled:
        try:
            entry = (_picklable(fn), args, collective_timeout(None, stall_timeout), address)
            values = elastic_launch(config, _elastic_entry)(*entry)
        except ChildFailedError as error:
            if stalled:
                raise heartbeat.StallError(stalled[0]) from None
            rank, failure = error.get_first_failure()
            message = failure.message  # a dict where the rank recorded an exception, else a generic line
            raised = message.get("extraInfo", {}).get("py_callstack") if isinstance(message, dict) else None
            raise WorkerError(_failure_message(rank, nproc_per_node, failure.exitcode, raised)) from None
    return [values[r] for r in range(nproc_per_node)]
