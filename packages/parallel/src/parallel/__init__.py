"""Data-parallel wrappers, optimizer-state sharding, FSDP and sharded checkpoints on torch.distributed.

The library imports only torch; its benchmarks live in the ``parallel-bench`` package (``python -m
parallel_bench.<module>``). The public names load their module on first use, so importing ``parallel``
does not import torch.
"""

from __future__ import annotations

import importlib

_HOME = {
    "DDP": "parallel.ddp",
    "BucketedDDP": "parallel.ddp",
    "FlatDDP": "parallel.ddp",
    "NaiveDDP": "parallel.ddp",
    "broadcast_module_state": "parallel.ddp",
    "FSDP": "parallel.fsdp",
    "WorkerError": "parallel.launch",
    "free_port": "parallel.launch",
    "init_from_env": "parallel.launch",
    "spawn": "parallel.launch",
    "torchrun": "parallel.launch",
    "ShardedOptimizer": "parallel.zero",
    "CheckpointError": "parallel.checkpoint_errors",
    "CorruptCheckpointError": "parallel.checkpoint_errors",
    "UnsafeCheckpointError": "parallel.checkpoint_errors",
    "load_sharded": "parallel.checkpoint",
    "read_extra": "parallel.checkpoint",
    "save_sharded": "parallel.checkpoint",
    "verify_sharded": "parallel.checkpoint",
}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'parallel' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
