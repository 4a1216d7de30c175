"""The tune's candidate lists: every shape fits the target it is tuned on (shared memory and, on sm_100,
tensor memory), the split dK/dV programs are offered where the table uses them, each list starts with the
tile the library's rule chooses there, and the compile jobs cover every candidate."""

import pytest
import torch
from flashattn.portable.tiles import HOPPER, configs_for, family_target, fits, table
from flashattn_bench.tune import candidates_for, chosen_tiles, compile_jobs, with_baseline

TARGETS = [HOPPER, family_target(89), family_target(100)]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm_{t.capability[0]}{t.capability[1]}")
@pytest.mark.parametrize("head_dim", [16, 80, 128, 200])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_candidates_fit_the_target_and_start_with_the_rules_tile(target, head_dim, dtype):
    rule = configs_for(head_dim, dtype, target)
    lists = with_baseline(candidates_for(dtype, head_dim, target=target), rule)
    for kernel, tile in chosen_tiles(rule).items():
        assert lists[kernel][0] == tile and lists[kernel].count(tile) == 1, (kernel, tile)
    for kernel, configs in lists.items():
        assert configs and all(fits(kernel, c, head_dim, dtype.itemsize, target) for c in configs), kernel


def test_unestimated_lists_add_the_shapes_the_estimate_rules_out():
    estimated = candidates_for(torch.bfloat16, 256)
    every = candidates_for(torch.bfloat16, 256, estimate=False)
    assert estimated.keys() == every.keys()
    ruled_out = [(k, c) for k, v in every.items() for c in v if c not in estimated[k]]
    assert all(set(estimated[k]) <= set(v) for k, v in every.items()) and ruled_out
    assert not any(fits(k, c, 256, 2, HOPPER) for k, c in ruled_out)


def test_split_candidates_for_16_bit_only():
    assert {"dk", "dv"} <= set(candidates_for(torch.bfloat16, 256))
    assert not {"dk", "dv"} & set(candidates_for(torch.float32, 256))


def test_chosen_tiles_name_the_split_programs_where_the_table_splits():
    split, fused = table()[(256, True)], table()[(128, True)]
    assert chosen_tiles(split) == {"forward": split.forward, "dk": split.dkdv, "dv": split.dv, "dq": split.dq}
    assert chosen_tiles(fused) == {"forward": fused.forward, "dkdv": fused.dkdv, "dq": fused.dq}


def test_compile_jobs_cover_every_candidate_and_the_forward_lse():
    lists = candidates_for(torch.bfloat16, 256)
    base = table()[(256, True)]
    jobs = compile_jobs(lists, base)
    assert sorted(jobs) == sorted((k, c) for k, v in lists.items() for c in v)
    only_split = {k: lists[k] for k in ("dk", "dv")}
    jobs = compile_jobs(only_split, base)
    assert jobs[-1] == ("forward", base.forward) and len(jobs) == len(lists["dk"]) + len(lists["dv"]) + 1
