"""What one Transformer block saves for backward, by operation, and the size of its gradients.

:func:`block_report` (the command: ``python -m profiling.saved``) runs one block of the model forward on
a random residual stream and reports, per autograd operation, the bytes it keeps for backward (top operations
and their shares), next to ``analysis.accounting.block_activation_bytes``; then it runs backward and
reports the bytes of the block's parameter gradients next to ``4 x block_parameter_count``.

Two independent counts: ``saved_tensors_hooks`` see every tensor autograd packs (total of distinct
storages), and a walk of the autograd graph reads each node's saved tensors (``_saved_*``) to name the
operation. A storage saved by several operations (the softmax output, kept by softmax and by the
weighted sum) counts once, for the earliest operation in forward order; parameters (weights kept by
matmuls) are listed apart, as they are not activation memory.
"""

from __future__ import annotations

import re
from contextlib import nullcontext
from functools import partial

import pandas as pd
import torch
from analysis.accounting import block_activation_bytes, block_parameter_count
from cs336_basics import ModelConfig, TransformerBlock, build_model
from torch import Tensor, nn

from .workload import DTYPES

PARAMETERS = "(parameters)"


def _storage_key(t: Tensor) -> tuple[torch.device, int]:
    return t.device, t.untyped_storage().data_ptr()


def _op_name(node) -> str:
    return re.sub(r"Backward\d*$", "", node.name())


def _saved_by_node(root) -> dict[tuple, tuple[int, str, int]]:
    """storage key -> (sequence number, op name, storage bytes) for the earliest op saving it."""
    found: dict[tuple, tuple[int, str, int]] = {}
    seen, stack = set(), [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                value = getattr(node, attr)
            except RuntimeError:  # saved tensor already freed or not accessible
                continue
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, Tensor) and t.untyped_storage().nbytes():
                    key = _storage_key(t)
                    entry = (node._sequence_nr(), _op_name(node), t.untyped_storage().nbytes())
                    if key not in found or entry[0] < found[key][0]:
                        found[key] = entry
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def saved_breakdown(block: nn.Module, x: Tensor, positions: Tensor, autocast_dtype: torch.dtype | None
                    ) -> tuple[pd.DataFrame, int, Tensor]:
    """Per-operation bytes ``block(x)`` saves for backward.

    Returns the table (``op, module, tensors, MiB, share_pct``; module: the innermost submodule running
    when the tensor was first saved; parameters as one row apart, share excluding them),
    the total distinct bytes seen by ``saved_tensors_hooks`` (parameters excluded), and the output.
    """
    param_keys = {_storage_key(p) for p in block.parameters()}
    packed: dict[tuple, tuple[int, str]] = {}
    module_stack: list[str] = []
    handles = []

    def enter(_module, _args, label: str) -> None:
        module_stack.append(label)

    def leave(_module, _args, _out) -> None:
        module_stack.pop()

    for name, module in block.named_modules():
        handles.append(module.register_forward_pre_hook(partial(enter, label=name or "block")))
        handles.append(module.register_forward_hook(leave))

    def pack(t: Tensor) -> Tensor:
        packed.setdefault(_storage_key(t), (t.untyped_storage().nbytes(), module_stack[-1]))
        return t

    autocast = (torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype is not None
                else nullcontext())
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
            out = block(x, positions)
    finally:
        for handle in handles:
            handle.remove()
    by_storage = _saved_by_node(out.grad_fn)
    rows: dict[tuple[str, str], list[int]] = {}
    for key, (_, op, nbytes) in by_storage.items():
        name = (PARAMETERS, "") if key in param_keys else (op, packed.get(key, (0, "?"))[1])
        rec = rows.setdefault(name, [0, 0])
        rec[0] += 1
        rec[1] += nbytes
    df = pd.DataFrame([{"op": op, "module": module, "tensors": n, "MiB": b / 2**20}
                       for (op, module), (n, b) in rows.items()])
    activations = df["op"] != PARAMETERS
    df["share_pct"] = (100 * df["MiB"] / df.loc[activations, "MiB"].sum()).where(activations)
    df = df.sort_values("MiB", ascending=False, ignore_index=True)
    hooked = sum(b for k, (b, _) in packed.items() if k not in param_keys)
    return df, hooked, out


def gradient_bytes(block: nn.Module, out: Tensor) -> int:
    """Run backward of ``out`` with a random upstream gradient; bytes of the block's parameter grads."""
    block.zero_grad(set_to_none=True)
    out.backward(torch.randn_like(out))
    return sum(p.grad.nbytes for p in block.parameters() if p.grad is not None)


def block_report(config: ModelConfig, dtype: str = "fp32", device: str = "cuda") -> dict:
    """Saved-for-backward table of block 0 and the gradient size, with the analytic expectations."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    torch.manual_seed(0)
    model = build_model(config.with_(num_layers=1), device=device)
    block: TransformerBlock = model.layers[0]
    batch, seq = config.batch_size, config.context_length
    x = torch.randn(batch, seq, config.d_model, device=device, requires_grad=True)
    positions = torch.arange(seq, device=device)
    table, hooked_bytes, out = saved_breakdown(block, x, positions, DTYPES[dtype])
    grads = gradient_bytes(block, out)
    return {
        "table": table,
        "saved_hooks_MiB": hooked_bytes / 2**20,
        "saved_graph_MiB": float(table.loc[table["op"] != PARAMETERS, "MiB"].sum()),
        "expected_fp32_MiB": block_activation_bytes(config, batch, seq) / 2**20,
        "grad_MiB": grads / 2**20,
        "expected_grad_MiB": 4 * block_parameter_count(config) / 2**20,
    }

