"""Collective benchmarks, data-parallel wrappers, optimizer-state sharding and FSDP on torch.distributed.

The library imports only torch; the benchmarks (``python -m parallel.bench_*``) also build the reference
model of ``cs336_basics`` (the optional extra ``parallel[bench]``). Every name below is imported on first
use, so that ``python -m parallel.<command> --help`` answers before torch (and, for ``save_sharded`` /
``load_sharded``, ``torch.distributed.checkpoint``, seconds more) is imported.
"""

import importlib

_WHERE = {
    "DDP": "ddp",
    "BucketedDDP": "ddp",
    "FlatDDP": "ddp",
    "NaiveDDP": "ddp",
    "broadcast_module_state": "ddp",
    "FSDP": "fsdp",
    "ShardedOptimizer": "zero",
    "WorkerError": "launch",
    "free_port": "launch",
    "init_from_env": "launch",
    "spawn": "launch",
    "load_sharded": "checkpoint",
    "save_sharded": "checkpoint",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'parallel' has no attribute {name!r}")
    return getattr(importlib.import_module(f"parallel.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
