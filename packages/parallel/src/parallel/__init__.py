"""Collective benchmarks, data-parallel wrappers, optimizer-state sharding and FSDP on torch.distributed.

The library imports only torch; the benchmarks (``python -m parallel.bench_*``) also build the reference
model of ``cs336_basics`` (the optional extra ``parallel[bench]``). ``save_sharded`` / ``load_sharded``
(``parallel.checkpoint``) are imported on first use: ``torch.distributed.checkpoint`` takes seconds to import.
"""

from parallel.ddp import DDP, BucketedDDP, FlatDDP, NaiveDDP, broadcast_module_state
from parallel.fsdp import FSDP
from parallel.launch import WorkerError, free_port, init_from_env, spawn
from parallel.zero import ShardedOptimizer

__all__ = [
    "DDP",
    "FSDP",
    "BucketedDDP",
    "FlatDDP",
    "NaiveDDP",
    "ShardedOptimizer",
    "WorkerError",
    "broadcast_module_state",
    "free_port",
    "init_from_env",
    "load_sharded",
    "save_sharded",
    "spawn",
]


def __getattr__(name: str):
    if name in ("save_sharded", "load_sharded"):
        from parallel import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'parallel' has no attribute {name!r}")
