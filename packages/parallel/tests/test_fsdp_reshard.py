"""``reshard_after_forward``: which units stay gathered between forward and backward, how many gathers the
backward then issues, and that the choice changes no result (gloo, 2 ranks)."""

import pytest
import torch
import torch.distributed as dist
from cs336_basics.model import BasicsTransformerLM, TransformerBlock
from cs336_basics.nn_utils import cross_entropy
from parallel.fsdp import FSDP
from parallel.launch import spawn

CONFIG = dict(vocab_size=41, context_length=12, d_model=20, num_layers=3, num_heads=2, d_ff=28)
CHOICES = (True, False, "except_last")


def _train(rank, world_size, reshard, steps=3):
    """Per step: the units gathered after the forward and the backward's gathers; the parameters."""
    torch.manual_seed(0)
    model = BasicsTransformerLM(**CONFIG)
    fsdp = FSDP(model, unit_modules=(TransformerBlock,), reshard_after_forward=reshard)
    opt = torch.optim.SGD(fsdp.parameters(), lr=0.3, momentum=0.9)
    gather, record = dist.all_gather_into_tensor, []
    dist.all_gather_into_tensor = lambda *a, **k: (record.append(1), gather(*a, **k))[1]
    seen = []
    try:
        for step in range(steps):
            gen = torch.Generator().manual_seed(step + 9 * rank)
            ids = torch.randint(0, CONFIG["vocab_size"], (2, 12), generator=gen)
            loss = cross_entropy(fsdp(ids[:, :-1]), ids[:, 1:])
            kept, record[:] = fsdp.gathered_units(), []
            loss.backward()
            seen.append((kept, len(record)))
            fsdp.finish_gradient_synchronization()
            opt.step()
            opt.zero_grad()
            assert fsdp.gathered_units() == []
    finally:
        dist.all_gather_into_tensor = gather
    return seen, {n: t.numpy() for n, t in fsdp.gather_full_params().items()}


def _all_choices(rank, world_size):
    return {str(reshard): _train(rank, world_size, reshard) for reshard in CHOICES}


def test_reshard_after_forward_keeps_what_it_says_and_changes_no_result():
    units = 1 + CONFIG["num_layers"] + 1  # embedding, blocks, LM head (the final norm is replicated)
    last = units - 1
    for results in spawn(_all_choices, 2, timeout=120):
        expected = {
            "True": [([], units)] * 3,
            "False": [(list(range(units)), 0)] * 3,
            # the last unit is known only from the previous forward: the first step frees it too
            "except_last": [([], units)] + [([last], units - 1)] * 2,
        }
        for choice, (seen, _) in results.items():
            assert seen == expected[choice], choice
        reference = results["True"][1]
        for choice, (_, params) in results.items():
            for name, value in params.items():
                assert (value == reference[name]).all(), (choice, name)


@pytest.mark.parametrize("value", ["yes", None, 1])
def test_reshard_after_forward_refuses_other_values(value):
    with pytest.raises(Exception, match="reshard_after_forward must be True, False or 'except_last'"):
        spawn(lambda rank, world_size: FSDP(BasicsTransformerLM(**CONFIG), reshard_after_forward=value), 1,
              timeout=60)
