"""The five-product backward's dK/dV/dQ kernel compiles for sm90 on the CPU (no GPU): wgmma dots, the
acquire spin and the release of its dQ turns, and Triton still software-pipelines the query loop (a CTA
barrier written as ``tl.debug_barrier()`` would stop that, so the release is written in PTX)."""

import re

import pytest
import torch
import triton
from flashattn import hopper_tiles
from flashattn.hopper_bwd5 import dkdvdq_kernel
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import mangle_type
from triton.tools.tensor_descriptor import TensorDescriptor

SHARED_LIMIT = 232448  # bytes one Hopper thread block may opt into


def _compile(head_dim: int, causal: bool):
    tile = hopper_tiles.configs_for(head_dim).dkdvdq
    t = torch.zeros(1, 1, 256, head_dim, dtype=torch.bfloat16)  # only the descriptors' types matter
    rows = {"q": tile.block_m, "k": tile.block_n, "v": tile.block_n, "do": tile.block_m, "dk": tile.block_n,
            "dv": tile.block_n}  # fmt: skip
    signature = {f"desc_{n}": mangle_type(TensorDescriptor.from_tensor(t, [1, 1, r, head_dim]))
                 for n, r in rows.items()}  # fmt: skip
    signature |= {"DQ": "*bf16"} | dict.fromkeys(("stride_dqb", "stride_dqh", "stride_dqs"), "i32")
    signature |= {"LSE": "*fp32", "DELTA": "*fp32", "DQ_ACC": "*fp32", "TURNS": "*i32"}
    signature |= dict.fromkeys(("n_heads", "group", "seq_q", "seq_k"), "i32")
    signature |= {"qk_scale": "fp32", "sm_scale": "fp32"}
    constants = {"HEAD_DIM": head_dim, "BLOCK_M": tile.block_m, "BLOCK_N": tile.block_n, "CAUSAL": causal,
                 "INTERPRET": False}  # fmt: skip
    signature |= dict.fromkeys(constants, "constexpr")
    kernel = triton.compile(
        ASTSource(dkdvdq_kernel, signature, constants),
        target=GPUTarget("cuda", 90, 128),
        options={"num_warps": tile.num_warps, "num_stages": tile.num_stages},
    )
    return tile, kernel


@pytest.mark.parametrize("head_dim, causal", [(128, True), (64, False)])
def test_dkdvdq_kernel_compiles_pipelined_for_sm90(head_dim, causal):
    tile, kernel = _compile(head_dim, causal)
    ptx, ttgir = kernel.asm["ptx"], kernel.asm["ttgir"]
    assert ptx.count("wgmma.mma_async") > 0
    assert "ld.global.acquire.gpu" in ptx and "red.release.gpu.global.add" in ptx
    ring = re.escape(f"memdesc<{tile.num_stages}x{tile.block_m}x{head_dim}x")  # q and dO tiles in flight
    assert len(re.findall(ring, ttgir)) >= 2, "the query loop is no longer software-pipelined"
    assert 0 < kernel.metadata.shared <= SHARED_LIMIT
