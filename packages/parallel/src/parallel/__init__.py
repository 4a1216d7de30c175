"""Collective benchmarks, data-parallel wrappers, optimizer-state sharding and FSDP on torch.distributed.

The library imports only torch; the benchmarks (``python -m parallel.bench_*``) also build the reference
model of ``cs336_basics`` (the optional extra ``parallel[bench]``).
"""

from parallel.checkpoint import load_sharded, save_sharded
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
