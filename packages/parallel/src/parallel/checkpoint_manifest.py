"""Checksums of a sharded checkpoint: ``manifest.json`` beside ``torch.distributed.checkpoint``'s files.

Every item DCP writes (one chunk of a tensor or one pickled object: ``torch.save`` bytes at ``(file, offset,
length)``) gets a checksum of its stored bytes (``checkpoint_digest``'s sum64), computed by the rank that
wrote it, reading the file back once its write is done; ``.metadata`` gets a CRC-32 as a whole. The manifest
also records each file's size, the model's tensor shapes (DCP stores them flattened) and the optimizer's
class and groups (``checkpoint_checks`` compares them). Shards of another save mixed into the folder fail
their checksums.

On load, before any tensor is read: the manifest is parsed, ``.metadata``'s CRC checked before it is
unpickled (restricted, ``checkpoint_pickle``), and every file's size compared, so a truncated or missing file
is named. While loading, :class:`VerifyingReader` reads each item's bytes once into a buffer, checks them
there and deserializes them from the same buffer (no second read); a mismatch names the file and the key. A
checkpoint without a manifest (written before checksums existed) loads with a warning; its files are still
checked to reach every item.

Manifest formats: ``parallel.checkpoint/2`` (sum64 per item, written now) and ``parallel.checkpoint/1``
(CRC-32 per item: read and checked with CRC-32, at a few GB/s per core instead of sum64's ~10). Checksums
catch damage, not forgery (a forged manifest matches forged bytes); what keeps a crafted checkpoint from
running code is ``checkpoint_pickle``.
"""

from __future__ import annotations

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

from parallel.checkpoint_digest import BLOCK_BYTES, Digest
from parallel.checkpoint_errors import CheckpointError, CorruptCheckpointError
from parallel.checkpoint_pickle import loads, read_dcp_metadata

__all__ = ["MANIFEST", "METADATA", "ChecksummingWriter", "Manifest", "VerifyingReader", "load_pickled",
           "open_checkpoint", "read_item", "verify_files"]

MANIFEST = "manifest.json"
METADATA = ".metadata"
_FORMAT = "parallel.checkpoint/2"
_CHECKSUM_OF_FORMAT = {"parallel.checkpoint/1": "crc32", _FORMAT: "sum64"}
_CHUNK = (64 << 20) // BLOCK_BYTES * BLOCK_BYTES  # bytes read at a time when checksumming a written file


@dataclass
class Manifest:
    """What ``manifest.json`` holds. ``files``: name -> bytes; ``items``: name -> ``[[offset, length,
    checksum, key], ...]`` (``checksum``: sum64's 32 hex digits, or a CRC-32 int in format 1); ``shapes``:
    key -> shape of the unflattened tensor; ``optimizer``: ``{"class": qualified name, "groups":
    [{"hyperparameters": [keys], "params": [names]}]}`` or None; ``checksum``: the items' algorithm."""

    metadata: dict[str, int]  # {"bytes": ..., "crc32": ...} of .metadata
    files: dict[str, int]
    items: dict[str, list[list]]
    shapes: dict[str, list[int]]
    optimizer: dict | None
    checksum: str = "sum64"

    def expected(self, name: str, offset: int) -> tuple[int, int | str] | None:
        """``(length, checksum)`` of the item at ``offset`` of file ``name``."""
        if not hasattr(self, "_index"):
            self._index = {(f, e[0]): (e[1], e[2]) for f, entries in self.items.items() for e in entries}
        return self._index.get((name, offset))

    def write(self, folder: Path) -> None:
        fields = asdict(self)
        checksum = fields.pop("checksum")
        form = next(f for f, algorithm in _CHECKSUM_OF_FORMAT.items() if algorithm == checksum)
        (folder / MANIFEST).write_text(json.dumps({"format": form, **fields}))


def read_manifest(folder: Path) -> Manifest | None:
    """The manifest of ``folder``, None if it has none; ``CorruptCheckpointError`` naming it if unreadable
    or of an unknown format."""
    path = folder / MANIFEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        fields = json.loads(text)
        found = fields.pop("format")
        if found not in _CHECKSUM_OF_FORMAT:
            raise ValueError(f"format {found!r}, this version reads {sorted(_CHECKSUM_OF_FORMAT)}")
        return Manifest(**fields, checksum=_CHECKSUM_OF_FORMAT[found])
    except (ValueError, TypeError, KeyError) as err:
        raise CorruptCheckpointError(f"{path} is not a checkpoint manifest of {_FORMAT} or an earlier "
                                     f"format ({err})") from err


def _shown(checksum: int | str) -> str:
    return f"{checksum:08x}" if isinstance(checksum, int) else checksum


# -------------------------------------------------------------------------------------------------- save
def _checksum_file(folder: Path, name: str, entries: list[tuple[str, Any]],
                   algorithm: str = "sum64") -> tuple[str, int, list[list]]:
    """``(name, bytes, [[offset, length, checksum, key], ...])`` of the items ``[(key, storage info)]`` of
    one file, read in chunks of at most ``_CHUNK`` bytes into one buffer."""
    rows = []
    buffer = memoryview(bytearray(min(_CHUNK, max((info.length for _, info in entries), default=0))))
    with open(folder / name, "rb") as f:
        for key, info in sorted(entries, key=lambda e: e[1].offset):
            f.seek(info.offset)
            digest, left = Digest(algorithm), info.length
            while left:
                chunk = buffer[:min(left, _CHUNK)]
                if f.readinto(chunk) != len(chunk):
                    raise CorruptCheckpointError(f"{folder / name} ended before {key} was read back")
                digest.update(chunk)
                left -= len(chunk)
            rows.append([info.offset, info.length, digest.value, key])
        return name, os.fstat(f.fileno()).st_size, rows


class ChecksummingWriter(dcp.FileSystemWriter):
    """``FileSystemWriter`` that reads back what this rank wrote; ``checksums`` then holds ``{file: (bytes,
    [[offset, length, sum64, key], ...])}`` for :class:`Manifest`."""

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
        want, crc = manifest.metadata, zlib.crc32(data)
        if len(data) != want["bytes"] or crc != want["crc32"]:
            raise CorruptCheckpointError(
                f"{path} does not match its checksum: {len(data)} bytes, CRC-32 {crc:08x}; the "
                f"manifest says {want['bytes']} bytes, {want['crc32']:08x}")
    metadata = read_dcp_metadata(data, str(path))
    _check_files(folder, metadata, manifest)
    return metadata, manifest


def _item_name(folder: Path, req_or_key: ReadItem | str, info: Any) -> str:
    key = req_or_key if isinstance(req_or_key, str) else req_or_key.storage_index.fqn
    return f"{folder / info.relative_path} (item {key!r} at byte {info.offset}, {info.length} bytes)"


def _compare(found: int | str, manifest: Manifest, folder: Path, key: ReadItem | str, info: Any) -> None:
    """Raise ``CorruptCheckpointError`` naming file and key unless ``found`` is the item's checksum."""
    expected = manifest.expected(info.relative_path, info.offset)
    if expected is None or expected[0] != info.length:
        raise CorruptCheckpointError(f"{_item_name(folder, key, info)} has no checksum in "
                                     f"{folder / MANIFEST}")
    if found != expected[1]:
        raise CorruptCheckpointError(
            f"{_item_name(folder, key, info)} does not match its checksum ({manifest.checksum} "
            f"{_shown(found)}, the manifest says {_shown(expected[1])}): the bytes changed after they were "
            f"written")


def _read_into(buffer: memoryview, stream, folder: Path, key: ReadItem | str, info: Any) -> memoryview:
    """The item's bytes, read into the start of ``buffer``."""
    blob = buffer[:info.length]
    stream.seek(info.offset)
    got = stream.readinto(blob)
    if got != info.length:
        raise CorruptCheckpointError(f"{_item_name(folder, key, info)} is truncated: {got} bytes read")
    return blob


def read_item(folder: Path, metadata: Metadata, manifest: Manifest | None, key: str) -> tuple[bytes, str]:
    """``(stored bytes, description naming file and key)`` of the whole (not sharded) item ``key``, checked
    against ``manifest`` if one is given."""
    index = next((i for i in metadata.storage_data if i.fqn == key), None)
    if index is None:
        raise CheckpointError(f"checkpoint {folder} has no {key!r}")
    info = metadata.storage_data[index]
    with open(folder / info.relative_path, "rb") as f:
        blob = _read_into(memoryview(bytearray(info.length)), f, folder, key, info)
    if manifest is not None:
        _compare(Digest(manifest.checksum).update(blob).value, manifest, folder, key, info)
    return blob.tobytes(), _item_name(folder, key, info)


class _BufferFile(io.RawIOBase):
    """A read-only file over ``buffer`` that does not copy it (``io.BytesIO`` copies all but ``bytes``,
    and a tensor over ``bytes`` is read-only, which torch warns of)."""

    def __init__(self, buffer: memoryview):
        super().__init__()
        self._buffer, self._position = buffer, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._buffer)}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, out) -> int:
        n = max(0, min(len(out), len(self._buffer) - self._position))
        out[:n] = self._buffer[self._position:self._position + n]
        self._position += n
        return n

    def read(self, size: int = -1) -> bytes:
        end = len(self._buffer) if size is None or size < 0 else min(len(self._buffer), self._position + size)
        data = self._buffer[self._position:end].tobytes()
        self._position = max(self._position, end)
        return data


class VerifyingReader(dcp.FileSystemReader):
    """``FileSystemReader`` of a checkpoint opened by :func:`open_checkpoint` (its metadata is not read
    again). Reads each item once into one reused buffer (as large as the largest item), checks its checksum
    against ``manifest`` (None: no check) while the bytes are still in cache, then deserializes it from the
    same buffer: no second read. The check runs on the calling thread: on a worker it measured slower (its
    thread contends with torch's intra-op threads of the copies). Pickled items reach the planner's
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
        largest = max((info.length for reqs in by_file.values() for _, info in reqs), default=0)
        buffer = memoryview(bytearray(largest))  # reused, so that no item pays for fresh pages
        for name, reqs in by_file.items():
            with open(folder / name, "rb") as stream:
                for req, info in sorted(reqs, key=lambda r: r[1].offset):
                    blob = _read_into(buffer, stream, folder, req, info)
                    if self._manifest is not None:
                        _compare(Digest(self._manifest.checksum).update(blob).value, self._manifest, folder,
                                 req, info)
                    try:
                        self._deliver(req, info, blob, planner)
                    except CheckpointError:
                        raise
                    except Exception as err:
                        raise CorruptCheckpointError(f"{_item_name(folder, req, info)} cannot be read "
                                                     f"({type(err).__name__}: {err})") from err
        future: Future = Future()
        future.set_result(None)
        return future

    def _deliver(self, req: ReadItem, info: Any, blob: memoryview, planner: LoadPlanner) -> None:
        descriptors = info.transform_descriptors or ()
        stream = self.transforms.transform_load_stream(req, descriptors, _BufferFile(blob))
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
    """Check every item of the checkpoint against ``manifest`` (reading every file once, ``threads`` files
    at a time); returns bytes checked."""
    by_file: dict[str, list] = {}
    for index, info in metadata.storage_data.items():
        by_file.setdefault(info.relative_path, []).append((index.fqn, info))
    with ThreadPoolExecutor(threads) as pool:
        done = list(pool.map(lambda name: _checksum_file(folder, name, by_file[name], manifest.checksum),
                             by_file))
    infos = {(name, info.offset): info for name, entries in by_file.items() for _, info in entries}
    for name, _, rows in done:
        for offset, _, checksum, key in rows:
            _compare(checksum, manifest, folder, key, infos[name, offset])
    return sum(info.length for entries in by_file.values() for _, info in entries)
