"""Compile the portable kernels on a CPU for GPUs this machine does not have, and check that they fit.

``python -m flashattn.aot --targets 80 86 89 90 100 120`` runs the launchers of
:mod:`flashattn.portable.launch` on small CPU tensors with the tiles that
:func:`flashattn.portable.tiles.configs_for` chooses for each target (its family's shared memory per
block), head dim, dtype and mask kind. Triton's own argument binding turns each launch into the signature,
constexprs and alignment attributes a GPU run compiles (nothing runs), and Triton compiles that for the target
with its bundled ptxas. Each row: target, kernel (``forward``, ``delta``, ``dkdv`` or, split, ``dk`` and
``dv``, ``dq``), dtype,
head dim, mask kind, tile (``block_m x block_n``, warps, stages), Triton's shared memory and the tile rule's
estimate of it against the target's limit, tensor-memory columns (sm_100) against 512, ptxas's registers per
thread and spill bytes, and whether it fits. Head dims that compile to the same kernel (same padded width and
alignment) are compiled once. Mask kinds: ``causal``, ``non-causal``, ``window`` (both sides bounded) and
``varlen`` (packed documents, causal). Compiled kernels go to a temporary cache, not Triton's.

The table is printed (every row when there are at most 100, else the rows that do not fit) with a summary per
target; ``--csv`` and ``--md`` write them (the Markdown file holds the summary and the rows that do not fit).
"""

import argparse
import contextlib
import csv
import io
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

TARGETS = (80, 86, 89, 90, 100, 120)
HEAD_DIMS = tuple(range(16, 257, 8))
DTYPES = ("bf16", "fp16", "fp32")
MASKS = ("causal", "non-causal", "window", "varlen")
COLUMNS = ("target", "kernel", "dtype", "head_dim", "mask", "tile", "shared_bytes", "estimate_bytes",
           "limit_bytes", "tmem_columns", "tmem_limit", "registers", "spill_bytes", "fits", "kernel_id",
           "compile_s", "error")  # fmt: skip
_ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_SEQ = 48  # rows of the CPU tensors the launchers see; lengths are not specialised on


class Launch(NamedTuple):
    """One kernel launch as Triton would compile it: the ``@triton.jit`` function's name in
    :mod:`flashattn.portable` and the arguments of :class:`triton.compiler.ASTSource` and its options."""

    kernel: str
    function: str
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict

    def named(self) -> dict[str, object]:
        """The constexprs by argument name."""
        names = list(self.signature)
        return {names[path[0]]: value for path, value in self.constexprs.items()}

    def tile(self) -> str:
        """``block_m x block_n / warps / stages`` (the delta kernel has rows only)."""
        c = self.named()
        rows = f"{c['BLOCK_M']}x{c['BLOCK_N']}" if "BLOCK_N" in c else f"{c['BLOCK_M']}"
        return f"{rows}/{self.options['num_warps']}w/{self.options['num_stages']}s"

    def key(self) -> str:
        """Equal for launches that compile to the same kernel."""
        attrs = sorted((k, repr(v)) for k, v in self.attrs.items())
        return repr((self.function, self.signature, sorted(self.constexprs.items()), attrs,
                     sorted(self.options.items())))  # fmt: skip


class Compiled(NamedTuple):
    """What the compiler reports of one kernel: bytes of shared memory, tensor-memory columns (0 before
    sm_100), ptxas's registers per thread and spill-store bytes; ``error`` if it did not compile."""

    shared_bytes: int
    tmem_columns: int
    registers: int
    spill_bytes: int
    seconds: float
    error: str = ""


class _NoDevice:
    """The parts of Triton's driver that binding a launch asks for, answered for a ``GPUTarget``."""

    def __init__(self, target) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return self.target.arch  # a device slot of its own per target in each kernel's cache

    def get_current_stream(self, device: int) -> int:
        return 0

    def get_current_target(self):
        return self.target


def _kernels() -> dict:
    from flashattn.portable.bwd import delta_kernel, dkdv_kernel, dq_kernel
    from flashattn.portable.fwd import fwd_kernel

    found = {k.fn.__name__: k for k in (fwd_kernel, delta_kernel, dkdv_kernel, dq_kernel)}
    from triton.runtime.jit import JITFunction

    if not all(isinstance(k, JITFunction) for k in found.values()):
        raise RuntimeError(
            "flashattn.aot compiles the kernels: unset TRITON_INTERPRET before importing flashattn"
        )
    return found


def _kernel_name(function: str, constexprs: dict[str, object]) -> str:
    if function == "dkdv_kernel" and not (constexprs["WANT_DK"] and constexprs["WANT_DV"]):
        return "dk" if constexprs["WANT_DK"] else "dv"
    return {"fwd_kernel": "forward", "delta_kernel": "delta", "dkdv_kernel": "dkdv", "dq_kernel": "dq"}[
        function
    ]


@contextlib.contextmanager
def _capturing(capability: int) -> Iterator[list[Launch]]:
    """Launches made inside are recorded (for ``sm_<capability>``) instead of compiled and run."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    kernels = _kernels()
    seen: list[Launch] = []

    def record(*, fn, compile, **_) -> bool:
        names = list(compile["signature"])
        named = {names[path[0]]: value for path, value in compile["constants"].items()}
        options = {
            name: compile[name] for name in ("num_warps", "num_stages", "num_ctas", "enable_fp_fusion")
        }
        seen.append(Launch(_kernel_name(fn.name, named), fn.name, compile["signature"], compile["constants"],
                           compile["configs"][0], options))  # fmt: skip
        return True  # handled: Triton neither compiles nor launches

    previous = driver._active
    driver.set_active(_NoDevice(GPUTarget("cuda", capability, 32)))
    try:
        with knobs.runtime.scope():
            knobs.runtime.jit_cache_hook = record
            yield seen
    finally:
        driver.set_active(previous)
        for kernel in kernels.values():
            kernel.device_caches.pop(capability, None)


def launches(capability: int, head_dim: int, dtype: str, mask: str, tiles=None) -> list[Launch]:
    """The kernels a forward and backward pass launch on ``sm_<capability>`` (``tiles``: a
    :class:`~flashattn.portable.tiles.KernelConfigs`; default the tile rule's choice for that target)."""
    import torch

    from flashattn.portable import launch
    from flashattn.portable import tiles as tile_rule

    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    torch_dtype = getattr(torch, _TORCH_DTYPES[dtype])
    tiles = tiles or tile_rule.configs_for(head_dim, torch_dtype, tile_rule.family_target(capability))
    causal, window = mask in ("causal", "varlen"), (32, 32) if mask == "window" else None
    varlen = None
    if mask == "varlen":  # packed (total, H, d) documents of 17 and 31 rows
        shape = (_SEQ, 4, head_dim)
        cu = torch.tensor([0, 17, _SEQ], dtype=torch.int32)
        varlen = launch.Varlen(cu, cu, 31, 31)
    else:
        shape = (2, 4, _SEQ, head_dim)
    q, k, v, do = (torch.zeros(shape, dtype=torch_dtype) for _ in range(4))
    with _capturing(capability) as seen:
        o, lse = launch.forward(q, k, v, causal, window, None, tiles, varlen)
        launch.backward(q, k, v, o, lse, do, causal, window, None, tiles, varlen)
    return seen


def _number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    return int(found.group(1)) if found else -1


def compile_launch(launch: Launch, capability: int) -> Compiled:
    """Compile ``launch`` for ``sm_<capability>`` in a temporary cache; ptxas's report gives registers and
    spills. A compile error becomes ``error`` (first line) with -1 in the numbers."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(_kernels()[launch.function], launch.signature, launch.constexprs, launch.attrs)
    log = io.StringIO()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache, knobs.cache.scope(), knobs.nvidia.scope():
        knobs.cache.dir = cache
        knobs.nvidia.dump_ptxas_log = True  # ptxas -v's report, printed by Triton after a fresh compile
        try:
            with contextlib.redirect_stdout(log):
                compiled = triton.compile(
                    src, target=GPUTarget("cuda", capability, 32), options=launch.options
                )
        except Exception as error:
            first = (str(error).strip().splitlines() or [""])[0]
            return Compiled(-1, -1, -1, -1, time.perf_counter() - start, f"{type(error).__name__}: {first}")
    report = log.getvalue()
    return Compiled(compiled.metadata.shared, getattr(compiled.metadata, "tmem_size", 0) or 0,
                    _number(r"Used (\d+) registers", report), _number(r"(\d+) bytes spill stores", report),
                    time.perf_counter() - start)  # fmt: skip


class Case(NamedTuple):
    """One (target, dtype, head dim, mask kind) of the table."""

    capability: int
    dtype: str
    head_dim: int
    mask: str


def _rows(case: Case, found: list[Launch], compiled: dict[str, Compiled], ids: dict[str, int]) -> list[dict]:
    """The table's rows of one case: each launch with its compile report, estimate and limits."""
    from flashattn.portable import tiles as tile_rule

    target = tile_rule.family_target(case.capability)
    tmem_limit = tile_rule.family_of(target).tmem_columns
    rows = []
    for launch in found:
        key = f"{case.capability} {launch.key()}"
        got = compiled[key]
        c = launch.named()
        estimate = ""
        if launch.kernel != "delta":
            cfg = tile_rule.TileConfig(c["BLOCK_M"], c["BLOCK_N"], launch.options["num_warps"],
                                       launch.options["num_stages"], c["PRECISION"])  # fmt: skip
            estimate = tile_rule.shared_bytes(
                launch.kernel, cfg, case.head_dim, _ITEMSIZE[case.dtype], target
            )
        fits = not got.error and got.shared_bytes <= target.shared_bytes and got.tmem_columns <= tmem_limit
        rows.append({"target": f"sm_{case.capability}", "kernel": launch.kernel, "dtype": case.dtype,
                     "head_dim": case.head_dim, "mask": case.mask, "tile": launch.tile(),
                     "shared_bytes": got.shared_bytes, "estimate_bytes": estimate,
                     "limit_bytes": target.shared_bytes, "tmem_columns": got.tmem_columns,
                     "tmem_limit": tmem_limit, "registers": got.registers, "spill_bytes": got.spill_bytes,
                     "fits": fits, "kernel_id": ids[key], "compile_s": round(got.seconds, 2),
                     "error": got.error})  # fmt: skip
    return rows


def _case_launches(case: Case) -> list[Launch]:
    return launches(case.capability, case.head_dim, case.dtype, case.mask)


def _compile_job(job: tuple[Launch, int]) -> tuple[str, Compiled]:
    launch, capability = job
    return f"{capability} {launch.key()}", compile_launch(launch, capability)


def build_table(cases: Sequence[Case], jobs: int = 1, progress=None) -> list[dict]:
    """Every case's rows; each distinct kernel is compiled once, ``jobs`` at a time in worker processes.
    ``progress(done, total, launch, compiled)`` is called after each compile."""
    found = {case: _case_launches(case) for case in cases}
    todo: dict[str, tuple[Launch, int]] = {}
    for case, launched in found.items():
        for launch in launched:
            todo.setdefault(f"{case.capability} {launch.key()}", (launch, case.capability))
    compiled: dict[str, Compiled] = {}
    pool = ProcessPoolExecutor(jobs) if jobs > 1 else None
    results = pool.map(_compile_job, todo.values()) if pool else map(_compile_job, todo.values())
    try:
        for done, ((key, result), (launch, capability)) in enumerate(
            zip(results, todo.values(), strict=True), 1
        ):
            compiled[key] = result
            if progress:
                progress(done, len(todo), launch, capability, result)
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
    ids = {key: i for i, key in enumerate(todo)}
    return [row for case in cases for row in _rows(case, found[case], compiled, ids)]


def summary(rows: Sequence[dict]) -> list[dict]:
    """Per target: distinct kernels compiled, rows, rows over, the largest shared memory against the limit,
    the most tensor-memory columns, rows that spill and the most spilled bytes, compile seconds."""
    out = []
    for target in dict.fromkeys(r["target"] for r in rows):
        mine = [r for r in rows if r["target"] == target]
        distinct = {r["kernel_id"]: r for r in mine}.values()
        top = max(mine, key=lambda r: r["shared_bytes"])
        out.append({"target": target, "kernels": len(distinct), "rows": len(mine),
                    "over": sum(not r["fits"] for r in mine),
                    "max_shared": f"{top['shared_bytes']} ({top['kernel']} {top['dtype']} "
                                  f"d{top['head_dim']})",
                    "limit": top["limit_bytes"], "max_tmem": max(r["tmem_columns"] for r in mine),
                    "spilling": sum(r["spill_bytes"] > 0 for r in distinct),
                    "max_spill": max(r["spill_bytes"] for r in mine),
                    "compile_s": round(sum(r["compile_s"] for r in distinct), 1)})  # fmt: skip
    return out


def _text(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """A plain aligned table."""
    cells = [[str(c) for c in columns]] + [[str(r[c]) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _markdown(rows: Sequence[dict], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows])


def _write(path: Path, text: str) -> None:
    """Write through a temporary name, then rename: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _csv(rows: Sequence[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


SHOWN = ("target", "kernel", "dtype", "head_dim", "mask", "tile", "shared_bytes", "estimate_bytes",
         "limit_bytes", "tmem_columns", "registers", "spill_bytes", "fits")  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashattn.aot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--targets", type=int, nargs="+", default=list(TARGETS), metavar="SM",
                   help="compute capabilities as 80, 86, 89, 90, 100, 120 (default: all six)")  # fmt: skip
    p.add_argument("--head-dims", type=int, nargs="+", default=list(HEAD_DIMS), metavar="D",
                   help="head dims, multiples of 8 from 16 to 256 (default: all 31)")  # fmt: skip
    p.add_argument(
        "--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES, help="input dtypes (default: all)"
    )
    p.add_argument("--masks", nargs="+", default=list(MASKS), choices=MASKS, help="mask kinds (default: all)")
    p.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="compiles at once (default: CPU count)"
    )
    p.add_argument("--csv", type=Path, help="write every row to this CSV file")
    p.add_argument(
        "--md", type=Path, help="write the per-target summary and the rows over to this Markdown file"
    )
    return p


def _check(args: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    for d in args.head_dims:
        if d % 8 or not 16 <= d <= 256:
            p.error(f"--head-dims: {d} is not a multiple of 8 from 16 to 256")
    for sm in args.targets:
        if sm not in TARGETS:
            p.error(f"--targets: {sm} is not one of {', '.join(map(str, TARGETS))} (the portable kernels "
                    f"need sm_80 or newer, and these are the targets whose limits are known)")
    if args.jobs < 1:
        p.error(f"--jobs must be at least 1, got {args.jobs}")
    for option, path in (("--csv", args.csv), ("--md", args.md)):
        folder = path.parent if path is not None else None
        if folder is not None and not (folder.is_dir() and os.access(folder, os.W_OK)):
            p.error(f"{option} {path}: cannot write into {folder} (not a writable folder)")


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    _check(args, p)
    cases = [Case(sm, dtype, d, mask) for sm in args.targets for dtype in args.dtypes for d in args.head_dims
             for mask in args.masks]  # fmt: skip
    start = time.perf_counter()

    def progress(done: int, total: int, launch: Launch, capability: int, got: Compiled) -> None:
        print(f"[{done}/{total}] sm_{capability} {launch.kernel} {launch.tile()}: {got.shared_bytes} bytes, "
              f"{got.seconds:.1f} s", file=sys.stderr, flush=True)  # fmt: skip

    rows = build_table(cases, args.jobs, progress)
    seconds = time.perf_counter() - start
    over = [r for r in rows if not r["fits"]]
    print(_text(rows if len(rows) <= 100 else over, SHOWN) if rows and (len(rows) <= 100 or over) else "")
    totals = summary(rows)
    print(_text(totals, list(totals[0])))
    print(f"{len(rows)} rows, {sum(t['kernels'] for t in totals)} kernels compiled in {seconds:.0f} s "
          f"({args.jobs} jobs); {len(over)} do not fit")  # fmt: skip
    if args.csv:
        _write(args.csv, _csv(rows))
    if args.md:
        parts = [_markdown(totals, list(totals[0])), "", "Rows that do not fit:", ""]
        parts.append(_markdown(over, SHOWN) if over else "none")
        _write(args.md, "\n".join(parts) + "\n")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
