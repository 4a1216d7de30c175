"""The exclusive lock of a ``--save`` folder: one training run writes its checkpoints there at a time.

``DIR/.lock`` holds the holder's host, process id, start time and command line (JSON) under an
``fcntl.flock`` kept for the whole run; the kernel drops the flock when the process ends, however it ends.
A second run is refused at start, naming the holder. A lock file whose flock is free was left by a process
that is gone: written on this host, it is taken over (and said so); written on another host, only with
``--force``, since a network file system need not carry the flock across hosts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".lock"


def _holder_text(holder: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    command = holder.get("command")
    return f"pid {holder.get('pid')} on host {holder.get('host')!r} (since {started}: {command})"


def _read(fd: int) -> dict:
    text = os.pread(fd, 1 << 16, 0).decode(errors="replace")
    try:
        return json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {"pid": "?", "host": "?", "command": f"unreadable lock file: {text[:80]!r}"}


def _open_locked(path: Path, folder: Path) -> int:
    """A descriptor of ``path`` whose flock this process holds (ValueError naming the holder if another
    process holds it)."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise ValueError(f"--save {folder}: cannot write there ({error.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise ValueError(
                f"--save {folder} is in use by {_holder_text(holder)}; wait for that run to end or choose "
                f"another folder"
            ) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:  # not unlinked by a holder releasing it meanwhile
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


@contextlib.contextmanager
def save_lock(folder: Path, command: str, force: bool = False, say=print) -> Iterator[None]:
    """Hold the lock of ``folder`` (created if missing) while the block runs; ValueError naming the holder
    or why the folder cannot be written."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--save {folder}: is a file, expected a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"--save {folder}: cannot create it ({error.strerror})") from None
    path = folder / LOCK_NAME
    fd = _open_locked(path, folder)
    try:
        left = _read(fd)
        if left and left.get("host") != socket.gethostname() and not force:
            raise ValueError(
                f"--save {folder} is locked by {_holder_text(left)}, another host; if that run has ended, "
                f"pass --force to take the lock over"
            )
        if left:
            say(f"taking over the lock of --save {folder} left by {_holder_text(left)}: that process is gone")
        mine = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "command": command}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(mine) + "\n").encode(), 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # while the flock is held, so no other process took this file meanwhile
        os.close(fd)
