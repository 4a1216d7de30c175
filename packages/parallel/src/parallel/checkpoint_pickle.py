"""The pickled pieces of a sharded checkpoint, read without running code from it.

``.metadata`` (``torch.distributed.checkpoint``'s map of the files, a plain pickle) goes through an
unpickler that admits only DCP's metadata classes and the torch types they hold (``torch.Size``, dtypes,
layouts) plus ``pathlib`` paths. Our own pieces (the optimizer's non-tensor state, its param groups,
``extra``) are ``torch.save`` bytes read with ``torch.load(weights_only=True)``: tensors, numbers, strings,
``None``, lists, tuples, dicts, sets and, in ``extra`` only, numpy arrays (``np.random.get_state()``). A
piece naming anything else is refused with :class:`UnsafeCheckpointError`, naming the type, before any of
it runs. Pieces are checked against the same rules when saved, so a checkpoint that would be refused is
never written.
"""

from __future__ import annotations

import contextlib
import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata

from parallel.checkpoint_errors import CorruptCheckpointError, UnsafeCheckpointError

__all__ = ["dumps", "loads", "read_dcp_metadata"]

_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"},
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, name: str):
        super().__init__(io.BytesIO(data))
        self.name = name

    def find_class(self, module: str, name: str) -> Any:
        is_dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if is_dtype or name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            f"{self.name} holds {module}.{name}, which is not one of torch.distributed.checkpoint's metadata "
            f"classes; refused without loading it")


def read_dcp_metadata(data: bytes, name: str) -> Metadata:
    """The ``Metadata`` pickled in ``data`` (the bytes of file ``name``), built from DCP's classes only."""
    try:
        metadata = _MetadataUnpickler(data, name).load()
    except UnsafeCheckpointError:
        raise
    except Exception as err:
        raise CorruptCheckpointError(f"{name} cannot be read as torch.distributed.checkpoint metadata "
                                     f"({type(err).__name__}: {_first_line(err)})") from err
    if not isinstance(metadata, Metadata):
        raise CorruptCheckpointError(f"{name} holds a {type(metadata).__name__}, not a checkpoint's Metadata")
    return metadata


def _numpy_arrays() -> list:
    """What ``torch.load(weights_only=True)`` needs to rebuild a numpy array of ``np.random.get_state()``."""
    try:
        import numpy as np
    except ImportError:  # without numpy no array was pickled
        return []
    core = getattr(np, "_core", None) or np.core  # numpy 2 / 1
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


@contextlib.contextmanager
def _allowed(numpy_arrays: bool):
    with torch.serialization.safe_globals(_numpy_arrays() if numpy_arrays else []):
        yield


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:300]


def loads(data: bytes, what: str, numpy_arrays: bool = False) -> Any:
    """Unpickle ``torch.save`` bytes with ``weights_only=True``; ``what`` names the piece and file in errors.

    ``numpy_arrays``: also admit the numpy array types of ``np.random.get_state()``.
    """
    with _allowed(numpy_arrays):
        try:
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as err:
            unsafe = _unsafe_globals(data) if isinstance(err, pickle.UnpicklingError) else []
            if unsafe:
                raise UnsafeCheckpointError(
                    f"{what} holds {', '.join(unsafe)}, which could run code when unpickled; refused without "
                    f"loading it (allowed: tensors, numbers, strings, containers"
                    f"{', numpy arrays' if numpy_arrays else ''})") from None
            raise CorruptCheckpointError(f"{what} cannot be unpickled ({type(err).__name__}: "
                                         f"{_first_line(err)})") from err


def _unsafe_globals(data: bytes) -> list[str]:
    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data))
    except Exception:  # bytes too damaged to list what they name
        return []


def dumps(obj: Any, what: str, numpy_arrays: bool = False) -> bytes:
    """``torch.save`` bytes of ``obj``; ``TypeError`` naming ``what`` and the types that :func:`loads` (with
    the same ``numpy_arrays``) would refuse."""
    buffer = io.BytesIO()
    try:
        torch.save(obj, buffer)
    except Exception as error:  # pickle's own: a lambda, a local class, an open file, a lock...
        raise TypeError(f"{what} cannot be pickled ({type(error).__name__}: {error}); store tensors, "
                        f"numbers, strings or containers of them instead") from error
    data = buffer.getvalue()
    with _allowed(numpy_arrays):
        unsafe = _unsafe_globals(data)
    if unsafe:
        raise TypeError(f"{what} holds {', '.join(unsafe)}, which load_sharded refuses to unpickle (it could "
                        f"run code); store tensors, numbers, strings or containers of them instead")
    return data
