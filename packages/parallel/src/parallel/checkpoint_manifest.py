"""Checksums of a sharded checkpoint: ``manifest.json`` beside ``torch.distributed.checkpoint``'s files.

Every item DCP writes (one chunk of a tensor or one pickled object: ``torch.save`` bytes at ``(file, offset,
length)``) gets a CRC-32 of its stored bytes, computed by the rank that wrote it, reading the file back once
its write is done; ``.metadata`` gets one as a whole. The manifest also records each file's size, the
model's tensor shapes (DCP stores them flattened) and the optimizer's class and groups (``checkpoint_checks``
compares them). Shards of another save mixed into the folder fail their checksums.

On load, before any tensor is read: the manifest is parsed, ``.metadata``'s CRC checked before it is
unpickled (restricted, ``checkpoint_pickle``), and every file's size compared, so a truncated or missing file
is named. While loading, :class:`VerifyingReader` reads each item's bytes once into memory; a worker thread
computes their CRC while the main thread deserializes them; a mismatch names the file and the key. A
checkpoint without a manifest (written before checksums existed) loads with a warning; its files are still
checked to reach every item.

CRC-32 (zlib's, about 4 GB/s per core) catches every burst of up to 32 flipped bits and all but 2^-32 of
random damage. It does not defend against a crafted checkpoint (a forged manifest matches forged bytes); what
keeps a crafted checkpoint from running code is ``checkpoint_pickle``.
"""

from __future__ import annotations

import collections
import io
import json
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from parallel.checkpoint_errors import CheckpointError, CorruptCheckpointError
from parallel.checkpoint_pickle import loads, read_dcp_metadata

__all__ = ["MANIFEST", "METADATA", "ChecksummingWriter", "Manifest", "VerifyingReader", "load_pickled",
           "open_checkpoint", "read_item", "verify_files"]

MANIFEST = "manifest.json"
METADATA = ".metadata"
_FORMAT = "parallel.checkpoint/1"
_CHUNK = 64 << 20  # bytes read at a time when checksumming a written file
# CRC workers beside the thread that deserializes (zlib.crc32 releases the GIL): at ~2-4 GB/s a worker, a
# checkpoint read from the page cache needs several to keep verification under a tenth of the load
_CHECK_THREADS = max(2, min(8, (os.cpu_count() or 2) - 1))


@dataclass
class Manifest:
    """What ``manifest.json`` holds. ``files``: name -> bytes; ``items``: name -> ``[[offset, length, crc32,
    key], ...]``; ``shapes``: key -> shape of the unflattened tensor; ``optimizer``: ``{"class": qualified
    name, "groups": [{"hyperparameters": [keys], "params": [names]}]}`` or None."""

    metadata: dict[str, int]  # {"bytes": ..., "crc32": ...} of .metadata
    files: dict[str, int]
    items: dict[str, list[list]]
    shapes: dict[str, list[int]]
    optimizer: dict | None

    def checksum(self, name: str, offset: int) -> tuple[int, int] | None:
        """``(length, crc32)`` of the item at ``offset`` of file ``name``."""
        if not hasattr(self, "_index"):
            self._index = {(f, e[0]): (e[1], e[2]) for f, entries in self.items.items() for e in entries}
        return self._index.get((name, offset))

    def write(self, folder: Path) -> None:
        (folder / MANIFEST).write_text(json.dumps({"format": _FORMAT, **asdict(self)}))


def read_manifest(folder: Path) -> Manifest | None:
    """The manifest of ``folder``, None if it has none; ``CorruptCheckpointError`` naming it if unreadable."""
    path = folder / MANIFEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        fields = json.loads(text)
        if fields.pop("format") != _FORMAT:
            raise ValueError("unknown format")
        return Manifest(**fields)
    except (ValueError, TypeError, KeyError) as err:
        raise CorruptCheckpointError(f"{path} is not a checkpoint manifest of {_FORMAT} ({err})") from err


def _crc(data: bytes | memoryview) -> int:
    return zlib.crc32(data)


# -------------------------------------------------------------------------------------------------- save
def _checksum_file(folder: Path, name: str, entries: list[tuple[str, Any]]) -> tuple[str, int, list[list]]:
    rows = []
    with open(folder / name, "rb") as f:
        for key, info in sorted(entries, key=lambda e: e[1].offset):
            f.seek(info.offset)
            crc, left = 0, info.length
            while left:
                chunk = f.read(min(left, _CHUNK))
                if not chunk:
                    raise CorruptCheckpointError(f"{folder / name} ended before {key} was read back")
                crc, left = zlib.crc32(chunk, crc), left - len(chunk)
            rows.append([info.offset, info.length, crc, key])
        return name, os.fstat(f.fileno()).st_size, rows


class ChecksummingWriter(dcp.FileSystemWriter):
    """``FileSystemWriter`` that reads back what this rank wrote; ``checksums`` then holds ``{file: (bytes,
    [[offset, length, crc32, key], ...])}`` for :class:`Manifest`."""

    checksums: dict[str, tuple[int, list[list]]]

    def write_data(self, plan, planner) -> Future:
        future = super().write_data(plan, planner)
        by_file: dict[str, list] = {}
        for result in future.wait():
            by_file.setdefault(result.storage_data.relative_path, []).append((result.index.fqn,
                                                                              result.storage_data))
        with ThreadPoolExecutor(self.thread_count) as pool:
            done = pool.map(lambda name: _checksum_file(Path(self.path), name, by_file[name]), by_file)
            self.checksums = {name: (size, rows) for name, size, rows in done}
        return future


# -------------------------------------------------------------------------------------------------- load
def _file_extents(metadata: Metadata) -> dict[str, int]:
    """File name -> the least size that holds every item DCP put in it."""
    extents: dict[str, int] = {}
    for info in metadata.storage_data.values():
        extents[info.relative_path] = max(extents.get(info.relative_path, 0), info.offset + info.length)
    return extents


def _check_files(folder: Path, metadata: Metadata, manifest: Manifest | None) -> None:
    for name, extent in sorted(_file_extents(metadata).items()):
        path = folder / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise CorruptCheckpointError(f"{path} is missing (the checkpoint's .metadata lists it)") from None
        if manifest is None:
            if size < extent:
                raise CorruptCheckpointError(f"{path} is truncated: {size} bytes, its items reach {extent}")
        elif name not in manifest.files:
            raise CorruptCheckpointError(f"{path} has no entry in {folder / MANIFEST}")
        elif size != manifest.files[name]:
            raise CorruptCheckpointError(f"{path} has {size} bytes, the manifest says {manifest.files[name]}"
                                         f"{' (truncated)' if size < manifest.files[name] else ''}")


def open_checkpoint(folder: Path) -> tuple[Metadata, Manifest | None]:
    """``(DCP's metadata, manifest or None)`` of ``folder``, checked: ``.metadata``'s checksum, every file's
    presence and size. Raises ``CorruptCheckpointError`` naming the file."""
    manifest = read_manifest(folder)
    path = folder / METADATA
    data = path.read_bytes()
    if manifest is not None:
        want = manifest.metadata
        if len(data) != want["bytes"] or _crc(data) != want["crc32"]:
            raise CorruptCheckpointError(
                f"{path} does not match its checksum: {len(data)} bytes, CRC-32 {_crc(data):08x}; the "
                f"manifest says {want['bytes']} bytes, {want['crc32']:08x}")
    metadata = read_dcp_metadata(data, str(path))
    _check_files(folder, metadata, manifest)
    return metadata, manifest


def _verify(blob: bytes, expected: int, where: str) -> None:
    _verify_crc(_crc(blob), expected, where)


def _verify_crc(found: int, expected: int, where: str) -> None:
    if found != expected:
        raise CorruptCheckpointError(f"{where} does not match its checksum (CRC-32 {found:08x}, the manifest "
                                     f"says {expected:08x}): the bytes changed after they were written")


def _item_name(folder: Path, req_or_key: ReadItem | str, info: Any) -> str:
    key = req_or_key if isinstance(req_or_key, str) else req_or_key.storage_index.fqn
    return f"{folder / info.relative_path} (item {key!r} at byte {info.offset}, {info.length} bytes)"


def _read_blob(stream, folder: Path, key: ReadItem | str, info: Any) -> bytes:
    stream.seek(info.offset)
    blob = stream.read(info.length)
    if len(blob) != info.length:
        raise CorruptCheckpointError(f"{_item_name(folder, key, info)} is truncated: {len(blob)} bytes read")
    return blob


def _expected_crc(manifest: Manifest, folder: Path, key: ReadItem | str, info: Any) -> int:
    found = manifest.checksum(info.relative_path, info.offset)
    if found is None or found[0] != info.length:
        raise CorruptCheckpointError(f"{_item_name(folder, key, info)} has no checksum in "
                                     f"{folder / MANIFEST}")
    return found[1]


def read_item(folder: Path, metadata: Metadata, manifest: Manifest | None, key: str) -> tuple[bytes, str]:
    """``(stored bytes, description naming file and key)`` of the whole (not sharded) item ``key``, checked
    against ``manifest`` if one is given."""
    index = next((i for i in metadata.storage_data if i.fqn == key), None)
    if index is None:
        raise CheckpointError(f"checkpoint {folder} has no {key!r}")
    info = metadata.storage_data[index]
    with open(folder / info.relative_path, "rb") as f:
        blob = _read_blob(f, folder, key, info)
    where = _item_name(folder, key, info)
    if manifest is not None:
        _verify(blob, _expected_crc(manifest, folder, key, info), where)
    return blob, where


class VerifyingReader(dcp.FileSystemReader):
    """``FileSystemReader`` of a checkpoint opened by :func:`open_checkpoint` (its metadata is not read
    again), reading each item once into memory and checking its CRC-32 against ``manifest`` (None: no
    check) on a worker thread while the item is deserialized. Pickled items reach the planner's
    ``load_bytes`` as stored bytes: unpickling them is the caller's (``checkpoint_pickle``)."""

    def __init__(self, folder: Path, metadata: Metadata, manifest: Manifest | None):
        super().__init__(folder)
        self._metadata, self._manifest = metadata, manifest

    def read_metadata(self, *args, **kwargs) -> Metadata:
        return self._metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        folder = Path(self.path)
        by_file: dict[str, list] = {}
        for req in plan.items:
            info = self.storage_data[req.storage_index]
            by_file.setdefault(info.relative_path, []).append((req, info))
        pending: collections.deque = collections.deque()
        with ThreadPoolExecutor(_CHECK_THREADS) as pool:
            for name, reqs in by_file.items():
                with open(folder / name, "rb") as stream:
                    for req, info in sorted(reqs, key=lambda r: r[1].offset):
                        blob = _read_blob(stream, folder, req, info)
                        check = None
                        if self._manifest is not None:
                            expected = _expected_crc(self._manifest, folder, req, info)
                            check = pool.submit(_verify, blob, expected, _item_name(folder, req, info))
                            pending.append(check)
                        try:
                            self._deliver(req, info, blob, planner)
                        except CheckpointError:
                            raise
                        except Exception as err:
                            if check is not None:
                                check.result()  # a failed checksum is the better explanation
                            raise CorruptCheckpointError(f"{_item_name(folder, req, info)} cannot be read "
                                                         f"({type(err).__name__}: {err})") from err
                        while len(pending) > 2 * _CHECK_THREADS:  # bounds the blobs held in memory
                            pending.popleft().result()
            for check in pending:
                check.result()
        future: Future = Future()
        future.set_result(None)
        return future

    def _deliver(self, req: ReadItem, info: Any, blob: bytes, planner: LoadPlanner) -> None:
        descriptors = info.transform_descriptors or ()
        stream = self.transforms.transform_load_stream(req, descriptors, io.BytesIO(blob))
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(stream.read()))
            return
        tensor = torch.load(stream, map_location="cpu", weights_only=True)
        tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise CheckpointError(f"{req.storage_index.fqn}: stored chunk has size {tuple(tensor.size())}, "
                                  f"the destination {tuple(target.size())}")
        target.copy_(tensor)
        planner.commit_tensor(req, target)


def load_pickled(folder: Path, metadata: Metadata, manifest: Manifest | None, key: str,
                 numpy_arrays: bool = False) -> Any:
    """The object ``save_sharded`` pickled under ``key`` (DCP's ``torch.save`` of our ``torch.save`` bytes),
    checked against the manifest, unpickled with ``weights_only=True`` (``checkpoint_pickle``'s ``loads``)."""
    blob, where = read_item(folder, metadata, manifest, key)
    outer = loads(blob, where)
    if not isinstance(outer, bytes):
        raise CorruptCheckpointError(f"{where} holds a {type(outer).__name__}, not the pickled bytes that "
                                     f"save_sharded writes")
    return loads(outer, where, numpy_arrays)


def verify_files(folder: Path, metadata: Metadata, manifest: Manifest, threads: int = 4) -> int:
    """Check every item of the checkpoint against ``manifest`` (reading every file); returns bytes checked."""
    by_file: dict[str, list] = {}
    for index, info in metadata.storage_data.items():
        by_file.setdefault(info.relative_path, []).append((index.fqn, info))
    with ThreadPoolExecutor(threads) as pool:
        done = list(pool.map(lambda name: _checksum_file(folder, name, by_file[name]), by_file))
    infos = {(name, info.offset): info for name, entries in by_file.items() for _, info in entries}
    for name, _, rows in done:
        for offset, _, crc, key in rows:
            info = infos[name, offset]
            _verify_crc(crc, _expected_crc(manifest, folder, key, info), _item_name(folder, key, info))
    return sum(info.length for entries in by_file.values() for _, info in entries)
