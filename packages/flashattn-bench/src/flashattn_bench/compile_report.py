"""Compile the Gluon kernels for compute capability 9.0 on any machine (no GPU) and report what ptxas says.

For each (kernel, head dim, variant, causal): seconds to compile, shared memory bytes, registers per thread
at entry, stack frame and spill bytes (``ptxas -v`` of the PTX, for sm_90a), whether ptxas serialised the
``wgmma`` instructions for want of registers (its warning C7512), and the counts of ``wgmma``
instructions and register moves (``setmaxnreg``) in the PTX: the checks that a kernel change keeps its matrix
instructions and does not spill, before any GPU time is spent. Kernels: ``forward``
(:mod:`flashattn.gluon_fwd`; variants :data:`VARIANTS` are changes to
:class:`flashattn.hopper_tiles.GluonTile`, the ablation steps of ``flashattn.hopper_bench``), ``dq``
(:mod:`flashattn.gluon_dq`), ``dkdv`` (:mod:`flashattn.gluon_bwd`) and ``dkdvdq`` (the five-product
:mod:`flashattn.gluon_bwd5`), each in the tile table's shape.

Usage: ``python -m flashattn.gluon_compile --kernels forward dq dkdv --head-dims 64 128 --variants default``
"""

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path

VARIANTS = {
    "default": {},
    "no-overlap": {"overlap": False},
    "one-consumer": {"consumers": 1},
    "pingpong": {"pingpong": True, "persistent": False},
    "stages-2": {"stages": 2},
    "stages-3": {"stages": 3},
    "three-consumers": {"consumers": 3},
    "three-consumers-64": {"consumers": 3, "block_n": 64},
    "persistent": {"persistent": True},
    "one-item-a-program": {"persistent": False},
}


KERNELS = ("forward", "dq", "dkdv", "dkdvdq")


def _launch(kernel: str, head_dim: int, changes: dict, causal: bool, window: bool = False) -> tuple:
    """``(jit function, descriptors by argument name, scalar types, constexprs, maxnreg)`` of one kernel."""
    import torch
    from flashattn.hopper import gluon_descriptor
    from flashattn.hopper_tiles import GluonTile, configs_for

    configs = configs_for(head_dim)
    t = torch.zeros(1, 1, 256, head_dim, dtype=torch.bfloat16)  # only the descriptors' types matter
    maxnreg = GluonTile(consumers=2).maxnreg()
    scalars = {"n_heads": "i32", "group": "i32", "seq_q": "i32", "seq_k": "i32", "qk_scale": "fp32"}
    band = {"left": "i32", "right": "i32"}  # the window's sides (all but the five-product kernel)
    if kernel == "forward":
        from flashattn.gluon_fwd import gluon_fwd_kernel

        tile = configs.gluon._replace(**changes)
        descs = {f"desc_{n}": gluon_descriptor(t, tile.block_n if n in "kv" else tile.block_m)
                 for n in "qkvo"}  # fmt: skip
        constants = {"HEAD_DIM": head_dim, "BLOCK_M": tile.block_m, "BLOCK_N": tile.block_n,
                     "STAGES": tile.stages, "CAUSAL": causal, "WINDOW": window, "CONSUMERS": tile.consumers,
                     "OVERLAP": tile.overlap, "PINGPONG": tile.pingpong,
                     "PERSISTENT": tile.persistent}  # fmt: skip
        claims = "*i32" if tile.persistent else "*fp32"
        types = {"LSE": "*fp32", "claims": claims, "n_items": "i32"} | scalars | band
        return gluon_fwd_kernel, descs, types, constants, tile.maxnreg()
    scalars = {"LSE": "*fp32", "DELTA": "*fp32"} | scalars | {"sm_scale": "fp32"}
    if kernel == "dq":
        from flashattn.gluon_dq import gluon_dq_kernel

        tile = configs.gluon_dq._replace(**changes)
        names = ("q", "k", "v", "o", "do", "dq")
        descs = {f"desc_{n}": gluon_descriptor(t, tile.block_n if n in "kv" else tile.block_m) for n in names}
        constants = {"HEAD_DIM": head_dim, "BLOCK_M": tile.block_m, "BLOCK_N": tile.block_n,
                     "STAGES": tile.stages, "CAUSAL": causal, "WINDOW": window,
                     "OVERLAP": tile.overlap}  # fmt: skip
        return gluon_dq_kernel, descs, scalars | band, constants, maxnreg
    tile = (configs.gluon_dkdv if kernel == "dkdv" else configs.gluon_dkdvdq)._replace(**changes)
    names = ("q", "k", "v", "do", "dk", "dv")
    descs = {f"desc_{n}": gluon_descriptor(t, tile.block_m if n in ("q", "do") else tile.block_n)
             for n in names}  # fmt: skip
    constants = {"HEAD_DIM": head_dim, "BLOCK": tile.block_n, "BLOCK_M": tile.block_m, "STAGES": tile.stages,
                 "CAUSAL": causal}  # fmt: skip
    if kernel == "dkdv":
        from flashattn.gluon_bwd import gluon_dkdv_kernel

        constants |= {"WINDOW": window, "OVERLAP": tile.overlap, "TILE_MAJOR": False}
        return gluon_dkdv_kernel, descs, scalars | band, constants, maxnreg
    from flashattn.gluon_bwd5 import gluon_dkdvdq_kernel
    from flashattn.hopper import dq_accumulator

    descs["desc_acc"] = dq_accumulator(t, tile.block_m)[1]
    constants |= {"EARLY_DQ": tile.early_dq, "DEFER_STAGE": tile.defer_stage}
    return gluon_dkdvdq_kernel, descs, scalars | {"TURNS": "*i32"}, constants, maxnreg


def compile_sm90(
    head_dim: int, changes: dict, causal: bool, kernel: str = "forward", window: bool = False
) -> dict:
    """Compile one kernel (:data:`KERNELS`) with ``changes`` to its tile for sm90 (``window``: its
    sliding-window version; not the five-product kernel's); return its report row."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    fn, descs, scalars, constants, maxnreg = _launch(kernel, head_dim, changes, causal, window)
    signature = {name: mangle_type(d) for name, d in descs.items()} | scalars
    signature |= dict.fromkeys(constants, "constexpr")
    start = time.perf_counter()
    compiled = triton.compile(
        GluonASTSource(fn, signature, constants),
        target=GPUTarget("cuda", 90, 128),
        options={"num_warps": 4, "maxnreg": maxnreg},
    )
    seconds = time.perf_counter() - start
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        report = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(path), "-o", str(path) + ".o"],
                                capture_output=True, text=True, check=True).stderr  # fmt: skip

    def number(pattern: str) -> int:
        found = re.search(pattern, report)
        return int(found.group(1)) if found else -1

    return {"kernel": kernel, "head_dim": head_dim, "changes": changes, "causal": causal,
            "compile_s": round(seconds, 1), "shared_bytes": compiled.metadata.shared,
            "registers": number(r"Used (\d+) registers"), "stack_bytes": number(r"(\d+) bytes stack frame"),
            "spill_bytes": number(r"(\d+) bytes spill stores"), "wgmma_serialized": "C7512" in report,
            "wgmma": ptx.count("wgmma.mma_async"), "setmaxnreg": ptx.count("setmaxnreg")}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", nargs="+", default=["forward"], choices=KERNELS, help="kernels to compile")
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128], choices=[64, 128], help="head dims")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                   help="forward variants (backward kernels: the tile table's entry)")  # fmt: skip
    p.add_argument("--causal", choices=["yes", "no", "both"], default="both", help="causal kernels or not")
    args = p.parse_args()
    causal = {"yes": [True], "no": [False], "both": [True, False]}[args.causal]
    for kernel in args.kernels:
        for head_dim in args.head_dims:
            for name in args.variants if kernel == "forward" else ["default"]:
                for c in causal:
                    row = compile_sm90(head_dim, VARIANTS[name], c, kernel)
                    shown = ", ".join(f"{k} {v}" for k, v in list(row.items())[4:])
                    print(f"{kernel} d={head_dim} {name} causal={c}: {shown}", flush=True)


if __name__ == "__main__":
    main()
