"""Two ``torchrun`` "nodes" on this machine (c10d rendezvous on 127.0.0.1, gloo, 2 processes each) train with
every wrapper exactly as one process on all the data."""

import os
import subprocess
import sys

import pytest
import torch
from lm_cases import train_step
from parallel.launch import free_port

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun_worker.py")


def _reference(lm):
    model = lm[0]()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(3):
        train_step(model, opt, step, 12)
    return model.state_dict()


def test_two_torchrun_nodes_train_like_one_process(tmp_path, lm):
    port, out = free_port(), tmp_path / "result.pt"
    def torchrun(node):
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", "multinode-test", "--local-addr", "127.0.0.1", "--max-restarts", "0",
                WORKER, str(out)]

    nodes = [subprocess.Popen(torchrun(node), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
             for node in (0, 1)]
    logs = []
    try:
        for node in nodes:
            logs.append(node.communicate(timeout=90)[0])
    except subprocess.TimeoutExpired:
        pytest.fail("torchrun nodes did not finish in 90 s")
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.communicate()
    assert all(node.returncode == 0 for node in nodes), "\n".join(log[-3000:] for log in logs)
    saved = torch.load(out)
    assert saved["world_size"] == 4
    expected = _reference(lm)
    for name, state in saved["results"].items():
        assert sorted(state) == sorted(expected), name
        for key, value in state.items():  # AdamW near zero gradients: summation order moves ~1% of lr
            torch.testing.assert_close(value, expected[key], atol=2e-4, rtol=0, msg=f"{name}: {key}")
