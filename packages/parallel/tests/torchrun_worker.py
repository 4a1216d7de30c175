"""Run under ``torchrun``: train the plain-torch language model with every wrapper for a few steps, each rank
on its share of every batch; rank 0 writes the final parameters to ``sys.argv[1]`` (torch.save)."""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lm_cases import WRAPPERS, torch_lm, train_step
from parallel import ShardedOptimizer
from parallel.launch import init_from_env

ROWS, STEPS = 12, 3


def train(model, opt, rank, world_size):
    for step in range(STEPS):
        train_step(model, opt, step, ROWS, rank, world_size)


def main() -> None:
    rank, world_size, _ = init_from_env("gloo")
    results = {}
    for name, wrap in WRAPPERS.items():
        model = wrap(torch_lm(seed=rank))
        train(model, torch.optim.AdamW(model.parameters(), lr=1e-2), rank, world_size)
        state = model.state_dict()
        results[name] = {k.removeprefix("module."): v.clone() for k, v in state.items()}
    model = torch_lm(seed=rank)
    train(model, ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2), rank, world_size)
    results["zero"] = {k: v.clone() for k, v in model.state_dict().items()}
    if rank == 0:
        torch.save({"world_size": world_size, "results": results}, sys.argv[1])
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
