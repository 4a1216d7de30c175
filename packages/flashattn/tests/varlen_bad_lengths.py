"""``flash_attention_varlen`` on CUDA with cumulative lengths that break their contract; run as a script
(``python varlen_bad_lengths.py``), it prints one JSON object. It runs in a process of its own because the
device-side assertion it triggers leaves that process's CUDA context unusable.

- ``clamped``: with the device-side check switched off, the kernels run on the lengths clamped into the
  packed tensors, which sit between NaN guard rows: outputs and gradients (relative errors against the
  independent oracle attending the clamped documents) and whether they are finite, i.e. read no guard row;
- ``asserted``: with the check on, while the GPU is still busy with earlier work, whether the call returned
  without raising (no host sync in it), and the error the next synchronisation raised.
"""

import json
import os

import torch
from attention_oracle import packed, rel_err
from flashattn import flash_attention_varlen

TOTAL_Q, TOTAL_K, GUARD, HEADS, HEADS_KV, HEAD_DIM = 400, 450, 64, 4, 2, 64
# Negative, falling and past-the-end entries: clamped to [0, total], then made non-decreasing.
BAD_CU_Q = [-7, 120, 90, TOTAL_Q + 33]
BAD_CU_K = [0, 150, 150, 10**6]
CLAMPED_Q, CLAMPED_K = [120, 0, TOTAL_Q - 120], [150, 0, TOTAL_K - 150]
MAX_SEQLEN = 300  # at least every clamped document's length


def _guarded(total: int, heads: int, gen: torch.Generator) -> torch.Tensor:
    """A leaf ``(total, heads, HEAD_DIM)`` bf16 tensor in the middle of NaN rows."""
    shape = (total + 2 * GUARD, heads, HEAD_DIM)
    storage = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
    storage[GUARD : GUARD + total] = torch.randn(total, heads, HEAD_DIM, device="cuda", generator=gen)
    return storage[GUARD : GUARD + total].requires_grad_()


def clamped(q, k, v, do, cu_q, cu_k) -> dict:
    """Forward and backward with the device-side check switched off: the kernels see the clamped lengths."""
    check = torch._assert_async
    torch._assert_async = lambda *args, **kwargs: None
    try:
        o = flash_attention_varlen(q, k, v, cu_q, cu_k, MAX_SEQLEN, MAX_SEQLEN, True)
    finally:
        torch._assert_async = check
    o.backward(do)
    torch.cuda.synchronize()
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    gold = packed(*leaves, CLAMPED_Q, CLAMPED_K, True)
    gold.backward(do.double())
    ours = (o, q.grad, k.grad, v.grad)
    golds = (gold, *(t.grad for t in leaves))
    names = ("o", "dq", "dk", "dv")
    return {
        "finite": {n: bool(torch.isfinite(x).all()) for n, x in zip(names, ours, strict=True)},
        "errors": {n: rel_err(x, g) for n, x, g in zip(names, ours, golds, strict=True)},
    }


def asserted(q, k, v, cu_q, cu_k) -> dict:
    """The same tensors as :func:`clamped` (the kernel compiled there runs, nothing compiles here)."""
    q, k, v = (t.detach() for t in (q, k, v))
    torch.cuda.synchronize()
    torch.cuda._sleep(4_000_000_000)  # about two seconds of GPU time queued ahead of the call's kernels
    try:
        flash_attention_varlen(q, k, v, cu_q, cu_k, MAX_SEQLEN, MAX_SEQLEN, True)
        returned = "returned"
    except RuntimeError as error:
        returned = f"raised {error}"
    try:
        torch.cuda.synchronize()
        synchronized = "no error"
    except RuntimeError as error:
        synchronized = str(error)
    return {"call": returned, "synchronize": synchronized}


if __name__ == "__main__":
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, do = _guarded(TOTAL_Q, HEADS, gen), _guarded(TOTAL_Q, HEADS, gen).detach()
    k, v = _guarded(TOTAL_K, HEADS_KV, gen), _guarded(TOTAL_K, HEADS_KV, gen)
    # copied to the device before it is kept busy: a copy from pageable memory may wait for the stream
    cu_q, cu_k = (torch.tensor(cu, dtype=torch.int32, device="cuda") for cu in (BAD_CU_Q, BAD_CU_K))
    result = {"clamped": clamped(q, k, v, do, cu_q, cu_k)}
    print(json.dumps(result | {"asserted": asserted(q, k, v, cu_q, cu_k)}), flush=True)
    os._exit(0)  # no interpreter teardown on a CUDA context the assertion has ended
