"""Compile the sm90 Gluon kernels for compute capability 9.0 on any machine (no GPU); report what ptxas says.

For each (kernel, head dim, variant, causal): seconds to compile, shared memory bytes, registers per thread
at entry, stack frame and spill bytes (``ptxas -v`` of the PTX, for sm_90a), whether ptxas serialised the
``wgmma`` instructions for want of registers (its warning C7512), and the counts of ``wgmma``
instructions and register moves (``setmaxnreg``) in the PTX: the checks that a kernel change keeps its matrix
instructions and does not spill, before any GPU time is spent. Kernels: ``forward``
(:mod:`flashattn.sm90.fwd`; variants :data:`VARIANTS` are changes to its
:class:`flashattn.sm90.tiles.ForwardTile`, the forward steps of ``flashattn_bench.sm90``), ``dq``
(:mod:`flashattn.sm90.dq`) and ``dkdv`` (:mod:`flashattn.sm90.dkdv`), each in the tile table's shape
(:data:`flashattn.sm90.tiles.TILES`).

Prints a line per compile; ``--out`` also writes the rows as CSV and Markdown.

Usage: ``python -m flashattn_bench.compile_report --kernels forward dq dkdv --head-dims 64 128``
"""

import re
import subprocess
import tempfile
import time
from pathlib import Path

from harness import cli

VARIANTS = {  # name -> changes to the table's ForwardTile
    "default": {},
    "stages-2": {"stages": 2},
    "stages-3": {"stages": 3},
    "keys-64": {"block_n": 64},
    "persistent": {"persistent": True},
    "one-item-a-program": {"persistent": False},
}
KERNELS = ("forward", "dq", "dkdv")
SCALARS = {"n_heads": "i32", "group": "i32", "seq_q": "i32", "seq_k": "i32", "left": "i32", "right": "i32",
           "qk_scale": "fp32"}  # fmt: skip


def _launch(kernel: str, head_dim: int, changes: dict, causal: bool, window: bool = False) -> tuple:
    """``(jit function, descriptors by argument name, scalar types, constexprs)`` of one kernel, its tile
    the table's with ``changes``."""
    import torch
    from flashattn.sm90.launch import descriptor
    from flashattn.sm90.tiles import TILES

    table = TILES[head_dim]
    t = torch.zeros(1, 1, 256, head_dim, dtype=torch.bfloat16)  # only the descriptors' types matter
    common = {"HEAD_DIM": head_dim, "CAUSAL": causal, "WINDOW": window}
    if kernel == "forward":
        from flashattn.sm90.fwd import gluon_fwd_kernel

        tile = table.forward._replace(**changes)
        descs = {f"desc_{n}": descriptor(t, tile.block_n if n in "kv" else tile.block_m) for n in "qkvo"}
        claims = "*i32" if tile.persistent else "*fp32"
        types = {"LSE": "*fp32", "claims": claims, "n_items": "i32"} | SCALARS
        constants = common | {"BLOCK_M": tile.block_m, "BLOCK_N": tile.block_n, "STAGES": tile.stages,
                              "PERSISTENT": tile.persistent}  # fmt: skip
        return gluon_fwd_kernel, descs, types, constants
    types = {"LSE": "*fp32", "DELTA": "*fp32"} | SCALARS | {"sm_scale": "fp32"}
    if kernel == "dq":
        from flashattn.sm90.dq import gluon_dq_kernel

        tile = table.dq._replace(**changes)
        names = ("q", "k", "v", "o", "do", "dq")
        descs = {f"desc_{n}": descriptor(t, tile.block_n if n in "kv" else tile.block_m) for n in names}
        constants = common | {"BLOCK_M": tile.block_m, "BLOCK_N": tile.block_n, "STAGES": tile.stages,
                              "OVERLAP": tile.overlap}  # fmt: skip
        return gluon_dq_kernel, descs, types, constants
    from flashattn.sm90.dkdv import gluon_dkdv_kernel

    tile = table.dkdv._replace(**changes)
    names = ("q", "k", "v", "do", "dk", "dv")
    descs = {f"desc_{n}": descriptor(t, tile.block_m if n in ("q", "do") else tile.block_n) for n in names}
    constants = common | {"BLOCK": tile.block_n, "BLOCK_M": tile.block_m, "STAGES": tile.stages,
                          "TILE_MAJOR": False}  # fmt: skip
    return gluon_dkdv_kernel, descs, types, constants


def compile_sm90(
    head_dim: int, changes: dict, causal: bool, kernel: str = "forward", window: bool = False
) -> dict:
    """Compile one kernel (:data:`KERNELS`) with ``changes`` to its tile for sm90 (``window``: its
    sliding-window version); return its report row."""
    import triton
    from flashattn.sm90.tiles import max_registers
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    fn, descs, scalars, constants = _launch(kernel, head_dim, changes, causal, window)
    signature = {name: mangle_type(d) for name, d in descs.items()} | scalars
    signature |= dict.fromkeys(constants, "constexpr")
    start = time.perf_counter()
    compiled = triton.compile(
        GluonASTSource(fn, signature, constants),
        target=GPUTarget("cuda", 90, 128),
        options={"num_warps": 4, "maxnreg": max_registers()},
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


def main(argv: list[str] | None = None) -> None:
    p = cli.command_parser("python -m flashattn_bench.compile_report", __doc__)
    cli.add_list(p, "--kernels", str, ["forward"], "kernels to compile", choices=KERNELS)
    cli.add_list(p, "--head-dims", int, [64, 128], "head dims", choices=[64, 128])
    cli.add_list(p, "--variants", str, VARIANTS, "forward variants (backward kernels: the tile table's "
                 "entry)", choices=list(VARIANTS))  # fmt: skip
    p.add_argument("--causal", choices=["yes", "no", "both"], default="both", help="causal kernels or not")
    p.add_argument("--window", action="store_true", help="the sliding-window versions of the kernels")
    cli.add_out(p, None, "also write <out>.csv and <out>.md")
    args = p.parse_args(argv)
    causal = {"yes": [True], "no": [False], "both": [True, False]}[args.causal]
    rows = []
    for kernel in args.kernels:
        for head_dim in args.head_dims:
            for name in args.variants if kernel == "forward" else ["default"]:
                for c in causal:
                    row = compile_sm90(head_dim, VARIANTS[name], c, kernel, args.window)
                    shown = ", ".join(f"{k} {v}" for k, v in list(row.items())[4:])
                    print(f"{kernel} d={head_dim} {name} causal={c}: {shown}", flush=True)
                    rows.append({"variant": name, **row, "window": args.window})
    if args.out is not None:
        import pandas as pd
        from harness.results import write_table

        write_table(pd.DataFrame(rows).astype({"changes": str}), Path(args.out), ".3g")


if __name__ == "__main__":
    main()
