"""The tile table and the tune's candidate lists: every shape fits shared memory, the split dK/dV programs
are offered where the table uses them, and the compile jobs cover every candidate."""

import pytest
import torch
from flashattn.triton_configs import SHARED_MEMORY_BYTES, padded_head_dim, shared_bytes, table
from flashattn.tune import candidates_for, compile_jobs


@pytest.mark.parametrize("head_dim", [16, 64, 80, 128, 192, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_candidates_fit_shared_memory(head_dim, dtype):
    lists = candidates_for(dtype, head_dim)
    assert {"forward", "dkdv", "dq"} <= set(lists)
    for kernel, configs in lists.items():
        assert configs, kernel
        for cfg in configs:
            assert shared_bytes(kernel, cfg, head_dim, dtype.itemsize) <= SHARED_MEMORY_BYTES, (kernel, cfg)


def test_unestimated_lists_add_the_shapes_the_estimate_rules_out():
    estimated = candidates_for(torch.bfloat16, 256)
    every = candidates_for(torch.bfloat16, 256, estimate=False)
    assert estimated.keys() == every.keys()
    ruled_out = [(k, c) for k, v in every.items() for c in v if c not in estimated[k]]
    assert all(set(estimated[k]) <= set(v) for k, v in every.items()) and ruled_out
    assert all(shared_bytes(k, c, 256, 2) > SHARED_MEMORY_BYTES for k, c in ruled_out)


def test_split_candidates_for_16_bit_only():
    assert {"dk", "dv"} <= set(candidates_for(torch.bfloat16, 256))
    assert not {"dk", "dv"} & set(candidates_for(torch.float32, 256))


def test_table_fits_shared_memory_and_splits_only_16_bit_heads():
    for (d, sixteen), configs in table().items():
        size = 2 if sixteen else 4
        kernels = [("forward", configs.forward), ("dq", configs.dq)]
        split = [("dk", configs.dkdv), ("dv", configs.dv)]
        kernels += [("dkdv", configs.dkdv)] if configs.dv is None else split
        for kernel, cfg in kernels:
            assert shared_bytes(kernel, cfg, d, size) <= SHARED_MEMORY_BYTES, (d, sixteen, kernel, cfg)
        assert configs.dv is None or sixteen, (d, sixteen)
    assert padded_head_dim(192) == 256 and padded_head_dim(80) == 128


def test_compile_jobs_cover_every_candidate_and_the_forward_lse():
    lists = candidates_for(torch.bfloat16, 256)
    base = table()[(256, True)]
    jobs = compile_jobs(lists, base)
    assert sorted(jobs) == sorted((k, c) for k, v in lists.items() for c in v)
    only_split = {k: lists[k] for k in ("dk", "dv")}
    jobs = compile_jobs(only_split, base)
    assert jobs[-1] == ("forward", base.forward) and len(jobs) == len(lists["dk"]) + len(lists["dv"]) + 1
