"""Compile the Gluon forward for compute capability 9.0 on any machine (no GPU) and report what ptxas says.

For each (head dim, variant, causal): seconds to compile, shared memory bytes, registers per thread at entry,
stack frame and spill bytes (``ptxas -v`` of the PTX, for sm_90a), and the counts of ``wgmma`` instructions
and register moves (``setmaxnreg``) in the PTX: the checks that a kernel change keeps its matrix instructions
and does not spill, before any GPU time is spent. Variants are :class:`flashattn.hopper.GluonTile` changes
to the tile table's entry (the ablation steps of ``flashattn.hopper_bench``).

Usage: ``python -m flashattn.gluon_compile --head-dims 64 128 --variants default no-overlap``
"""

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path

VARIANTS = {"default": {}, "no-overlap": {"overlap": False}, "one-consumer": {"consumers": 1},
            "pingpong": {"pingpong": True}, "stages-2": {"stages": 2}, "stages-3": {"stages": 3},
            "three-consumers": {"consumers": 3}, "three-consumers-64": {"consumers": 3, "block_n": 64}}


def compile_sm90(head_dim: int, changes: dict, causal: bool) -> dict:
    """Compile one variant for sm90 and return its report row."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from flashattn.gluon_fwd import gluon_fwd_kernel
    from flashattn.hopper import configs_for, gluon_descriptor

    tile = configs_for(head_dim).gluon._replace(**changes)
    t = torch.zeros(1, 1, 256, head_dim, dtype=torch.bfloat16)  # only the descriptors' types matter
    descs = {f"desc_{n}": gluon_descriptor(t, tile.block_n if n in "kv" else tile.block_m) for n in "qkvo"}
    signature = {name: mangle_type(d) for name, d in descs.items()}
    signature |= {"LSE": "*fp32", "qk_scale": "fp32"} | dict.fromkeys(
        ("n_heads", "group", "seq_q", "seq_k"), "i32"
    )
    constants = {"HEAD_DIM": head_dim, "BLOCK_M": tile.block_m, "BLOCK_N": tile.block_n,
                 "STAGES": tile.stages, "CAUSAL": causal, "CONSUMERS": tile.consumers,
                 "OVERLAP": tile.overlap, "PINGPONG": tile.pingpong}  # fmt: skip
    signature |= dict.fromkeys(constants, "constexpr")
    start = time.perf_counter()
    kernel = triton.compile(
        GluonASTSource(gluon_fwd_kernel, signature, constants),
        target=GPUTarget("cuda", 90, 128),
        options={"num_warps": 4, "maxnreg": tile.maxnreg()},
    )
    seconds = time.perf_counter() - start
    ptx = kernel.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        report = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(path), "-o", str(path) + ".o"],
                                capture_output=True, text=True, check=True).stderr  # fmt: skip

    def number(pattern: str) -> int:
        found = re.search(pattern, report)
        return int(found.group(1)) if found else -1

    return {"head_dim": head_dim, "variant": tile, "causal": causal, "compile_s": round(seconds, 1),
            "shared_bytes": kernel.metadata.shared, "registers": number(r"Used (\d+) registers"),
            "stack_bytes": number(r"(\d+) bytes stack frame"),
            "spill_bytes": number(r"(\d+) bytes spill stores"),
            "wgmma": ptx.count("wgmma.mma_async"), "setmaxnreg": ptx.count("setmaxnreg")}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128], choices=[64, 128], help="head dims")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), help="variants")
    p.add_argument("--causal", choices=["yes", "no", "both"], default="both", help="causal kernels or not")
    args = p.parse_args()
    causal = {"yes": [True], "no": [False], "both": [True, False]}[args.causal]
    for head_dim in args.head_dims:
        for name in args.variants:
            for c in causal:
                row = compile_sm90(head_dim, VARIANTS[name], c)
                print(f"d={head_dim} {name} causal={c}: " + ", ".join(f"{k} {v}" for k, v in row.items()
                                                                     if k not in ("head_dim", "causal")),
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
