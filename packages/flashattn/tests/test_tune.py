"""The tile table and the tune's candidate lists: every shape fits shared memory, the split dK/dV programs
are offered where the table uses them, and the compiled candidate sets cover every candidate."""

import pytest
import torch
from flashattn.triton_configs import SHARED_MEMORY_BYTES, padded_head_dim, shared_bytes, table
from flashattn.tune import candidate_sets, candidates_for


@pytest.mark.parametrize("head_dim", [16, 64, 80, 128, 192, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_candidates_fit_shared_memory(head_dim, dtype):
    lists = candidates_for(dtype, head_dim)
    assert {"forward", "dkdv", "dq"} <= set(lists)
    for kernel, configs in lists.items():
        assert configs, kernel
        for cfg in configs:
            assert shared_bytes(kernel, cfg, head_dim, dtype.itemsize) <= SHARED_MEMORY_BYTES, (kernel, cfg)


def test_split_candidates_for_16_bit_only():
    assert {"dk", "dv"} <= set(candidates_for(torch.bfloat16, 256))
    assert not {"dk", "dv"} & set(candidates_for(torch.float32, 256))


def test_table_fits_shared_memory_and_splits_only_wide_16_bit_heads():
    for (d, sixteen), configs in table().items():
        size = 2 if sixteen else 4
        kernels = [("forward", configs.forward), ("dq", configs.dq)]
        split = [("dk", configs.dkdv), ("dv", configs.dv)]
        kernels += [("dkdv", configs.dkdv)] if configs.dv is None else split
        for kernel, cfg in kernels:
            assert shared_bytes(kernel, cfg, d, size) <= SHARED_MEMORY_BYTES, (d, sixteen, kernel, cfg)
        assert (configs.dv is not None) == (sixteen and d > 128), (d, sixteen)
    assert padded_head_dim(192) == 256 and padded_head_dim(80) == 128


def test_candidate_sets_cover_every_candidate():
    lists = candidates_for(torch.bfloat16, 256)
    base = table()[(256, True)]
    sets = candidate_sets(lists, base)
    fused = [s for s in sets if s.dv is None]
    split = [s for s in sets if s.dv is not None]
    assert {s.forward for s in sets} == set(lists["forward"])
    assert {s.dq for s in sets} == set(lists["dq"])
    assert {s.dkdv for s in fused} == set(lists["dkdv"])
    assert {s.dkdv for s in split} == set(lists["dk"]) and {s.dv for s in split} == set(lists["dv"])
    only_dk = candidate_sets({"dk": lists["dk"]}, base)
    assert all(s.forward == base.forward and s.dq == base.dq and s.dv == base.dv for s in only_dk[1::2])
