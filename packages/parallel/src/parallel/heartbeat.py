"""Heartbeats of the ranks, and the watch that stops a stalled run naming the rank that stalled.

A rank says where it is with ``beat(phase)`` ("start-up", "compile", "step 27", "save step 30"): a counter
and the phase, written to a ``torch.distributed`` store under a key of its own. A thread of the rank also
ticks a second counter every few seconds, so that the watch tells a rank that still answers (its main
thread waits, e.g. in a collective for a peer) from one that stopped answering (stopped by a signal, or
hung holding the interpreter).

A run is stalled when no rank has beaten for ``stall_timeout`` seconds, or, while some rank has not sent
its first beat, for the start-up allowance (``START_UP_S`` or the stall timeout, whichever is longer:
starting a process, importing torch and joining the process group take seconds to a minute on a busy
node). Healthy ranks of a run stop beating soon after a peer stops (they wait for it in the next
collective), so any stall ends the run; a rank that works alone for long (a save) keeps the run alive as
long as it beats. The watch then names the ranks, those that stopped answering first, then those furthest
behind, each with its last phase.

Who watches: ``parallel.launch.spawn`` and ``parallel.launch.torchrun`` given ``stall_timeout`` (the beats go
to files in a folder of their launcher, :class:`FolderStore`; ranks find it through the ``PARALLEL_HEARTBEAT``
variable and report with :func:`reporting`); under a ``torchrun`` started from the
shell, :func:`watched` in every rank, whose watch thread ends its process with the diagnosis (also written
where torchrun's agent reports errors). Without either, ``beat`` does nothing.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist

ENV = "PARALLEL_HEARTBEAT"  # "folder:stall_timeout" of the launcher's beats
STALL_EXIT_CODE = 75  # a rank ended by its own watch thread
START_UP_S = 120.0  # seconds a rank may take to send its first beat, at least


class StallError(TimeoutError):
    """No rank reported progress for the stall timeout; the message names the ranks and their last phases."""


def tick_seconds(stall_timeout: float) -> float:
    """How often a rank's thread ticks and a watch looks: a tenth of the timeout, from 0.05 to 5 s."""
    return max(0.05, min(5.0, stall_timeout / 10))


def connect(host: str, port: int, timeout_s: float = 60.0) -> dist.Store:
    """A client of the store at ``host:port`` (retried until ``timeout_s``)."""
    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


class FolderStore:
    """The part of a ``torch.distributed`` store that heartbeats use (``set``, ``check``, ``get``), one file
    per key in ``folder``, for ranks on the launcher's host. Unlike a ``TCPStore`` it has no server thread,
    which a launcher that forks its ranks must not have (a forked child inherits any lock that thread held,
    and hangs on it); unlike a ``FileStore`` it takes no lock, which a rank stopped mid-write would keep."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    def _file(self, key: str) -> Path:
        return self.folder / key.replace("/", "-")

    def set(self, key: str, value: str) -> None:
        path = self._file(key)
        partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
        partial.write_text(value)
        os.replace(partial, path)

    def check(self, keys: list[str]) -> bool:
        return all(self._file(key).exists() for key in keys)

    def get(self, key: str) -> bytes:
        return self._file(key).read_bytes()


def _read(store: dist.Store, key: str) -> str | None:
    return store.get(key).decode() if store.check([key]) else None


class Reporter:
    """A rank's side: ``beat(phase)`` from its main thread, and a thread that ticks while the process runs."""

    def __init__(self, open_store, rank: int, tick_s: float):
        self.rank, self._open_store, self._tick_s = rank, open_store, tick_s
        self._store = open_store()  # the ticking thread opens its own connection
        self._count, self._stop = 0, threading.Event()
        self._ticker = threading.Thread(target=self._tick, name=f"heartbeat-tick-{rank}", daemon=True)
        self._ticker.start()
        self.beat("start-up")

    def beat(self, phase: str) -> None:
        self._count += 1
        self._store.set(f"beat/{self.rank}", f"{self._count}|{os.getpid()}|{socket.gethostname()}|{phase}")

    def _tick(self) -> None:
        store, ticks = self._open_store(), 0
        while not self._stop.is_set():
            ticks += 1
            store.set(f"tick/{self.rank}", f"{ticks}|{os.getpid()}")
            self._stop.wait(self._tick_s)

    def close(self) -> None:
        self._stop.set()
        self._ticker.join(timeout=10)


class Watch:
    """Reads every rank's beats and ticks from ``store``; ``poll()`` says when and how the run stalled."""

    def __init__(self, store: dist.Store, world_size: int, stall_timeout: float, clock=time.monotonic,
                 start_up: float = START_UP_S):  # fmt: skip
        self.store, self.world_size, self.stall_timeout, self.clock = store, world_size, stall_timeout, clock
        self.start_up = max(start_up, stall_timeout)
        started = clock()
        self._beats: list[tuple[str | None, float]] = [(None, started)] * world_size
        self._ticks: list[tuple[str | None, float]] = [(None, started)] * world_size

    def _update(self, seen: list, key: str, now: float) -> None:
        for rank in range(self.world_size):
            value = _read(self.store, f"{key}/{rank}")
            if value != seen[rank][0]:
                seen[rank] = (value, now)

    def pids(self) -> list[int]:
        """Process ids of the ranks that have ticked (to stop them)."""
        return [int(value.split("|")[1]) for value, _ in self._ticks if value is not None]

    def silent_local_pids(self) -> list[int]:
        """Process ids of the ranks on this host that stopped answering (a stopped process ignores the
        SIGTERM with which torchrun's agent ends the others)."""
        now, host = self.clock(), socket.gethostname()
        silent = [beat.split("|", 3) for rank, (beat, _) in enumerate(self._beats)
                  if beat is not None and not self._answering(rank, now)]  # fmt: skip
        return [int(pid) for _, pid, where, _ in silent if where == host]

    def poll(self) -> str | None:
        """None while some rank beat within the timeout (the start-up allowance while some rank has not beaten
        yet), else the diagnosis."""
        now = self.clock()
        self._update(self._beats, "beat", now)
        self._update(self._ticks, "tick", now)
        if now - max(changed for _, changed in self._beats) < self.limit():
            return None
        return self.diagnosis(now)

    def limit(self) -> float:
        """Seconds without a beat that stall the run: the stall timeout once every rank has beaten."""
        return self.start_up if any(beat is None for beat, _ in self._beats) else self.stall_timeout

    def diagnosis(self, now: float) -> str:
        def order(rank: int):
            beat, _ = self._beats[rank]
            return (self._answering(rank, now), int(beat.split("|")[0]) if beat else 0, rank)

        parts = []
        for rank in sorted(range(self.world_size), key=order):
            beat, beat_at = self._beats[rank]
            phase = beat.split("|", 3)[3] if beat else "before its first heartbeat (start-up)"
            host = f" on {beat.split('|')[2]}" if beat else ""
            state = "still answering" if self._answering(rank, now) else "stopped answering (stopped or hung)"
            parts.append(f"rank {rank}{host} {state}, last phase {phase!r} {now - beat_at:.0f} s ago")
        limit = self.limit()
        what = "the stall timeout" if limit == self.stall_timeout else "the start-up allowance"
        return f"no rank of {self.world_size} reported progress for {limit:g} s ({what}): " + "; ".join(parts)

    def _answering(self, rank: int, now: float) -> bool:
        tick, ticked_at = self._ticks[rank]
        return tick is not None and now - ticked_at < max(3 * tick_seconds(self.stall_timeout), 1.0)


_reporter: Reporter | None = None  # this process's reporter while a launcher or ``watched`` asks for beats


def beat(phase: str) -> None:
    """Report that this rank is alive and entering ``phase``; does nothing unless heartbeats are on."""
    if _reporter is not None:
        _reporter.beat(phase)


@contextlib.contextmanager
def _reporting_to(open_store, rank: int, tick_s: float) -> Iterator[Reporter]:
    global _reporter
    reporter = Reporter(open_store, rank, tick_s)
    _reporter = reporter
    try:
        yield reporter
    finally:
        _reporter = None
        reporter.close()


@contextlib.contextmanager
def reporting(rank: int) -> Iterator[None]:
    """Beats of this rank to the launcher's store named by ``PARALLEL_HEARTBEAT`` (nothing if unset)."""
    address = os.environ.get(ENV)
    if not address:
        yield
        return
    folder, stall_timeout = address.rsplit(":", 1)
    with _reporting_to(lambda: FolderStore(folder), rank, tick_seconds(float(stall_timeout))):
        yield


def _end_process(message: str) -> None:
    """Print ``message``, record it where torchrun's agent reads errors, end this process at once."""
    print(f"StallError: {message}", file=sys.stderr, flush=True)
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    try:
        raise StallError(message)
    except StallError as error:
        ErrorHandler().record_exception(error)
    os._exit(STALL_EXIT_CODE)


@contextlib.contextmanager
def watched(rank: int, world_size: int, stall_timeout: float, end=_end_process) -> Iterator[None]:
    """Beats of this rank, and a watch thread over every rank, through the store of the process group that
    torchrun described (MASTER_ADDR, MASTER_PORT); on a stall the thread calls ``end(diagnosis)``, which by
    default prints it and ends this process with exit code ``STALL_EXIT_CODE``."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    prefix = f"parallel-heartbeat/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"

    def open_store() -> dist.Store:
        return dist.PrefixStore(prefix, connect(host, port))

    stop = threading.Event()

    def watch() -> None:
        observer = Watch(open_store(), world_size, stall_timeout)
        while not stop.wait(tick_seconds(stall_timeout)):
            message = observer.poll()
            if message is not None:
                for pid in observer.silent_local_pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                end(message)
                return

    with _reporting_to(open_store, rank, tick_seconds(stall_timeout)):
        thread = threading.Thread(target=watch, name="heartbeat-watch", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=10)


@contextlib.contextmanager
def served(stall_timeout: float | None):
    """For a launcher: ``(PARALLEL_HEARTBEAT value for the ranks, Watch factory taking the world size)`` of a
    :class:`FolderStore` in a temporary folder, or ``(None, None)`` when ``stall_timeout`` is None."""
    if stall_timeout is None:
        yield None, None
        return
    with tempfile.TemporaryDirectory(prefix="heartbeat-") as folder:
        store = FolderStore(folder)
        yield f"{folder}:{stall_timeout}", lambda n: Watch(store, n, stall_timeout)


@contextlib.contextmanager
def stopping_on_stall(watch, world_size: int):
    """For a launcher whose ranks it cannot stop otherwise: a thread that polls ``watch(world_size)`` (from
    :func:`served`) and, on a stall, kills every rank that ticked (SIGKILL) and appends the diagnosis to the
    list it yields (empty while the run is healthy)."""
    stalled: list[str] = []
    if watch is None:
        yield stalled
        return
    observer, done = watch(world_size), threading.Event()

    def poll() -> None:
        while not done.wait(tick_seconds(observer.stall_timeout)):
            message = observer.poll()
            if message is not None:
                stalled.append(message)
                for pid in observer.pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                return

    thread = threading.Thread(target=poll, name="heartbeat-watch", daemon=True)
    thread.start()
    try:
        yield stalled
    finally:
        done.set()
        thread.join(timeout=10)
