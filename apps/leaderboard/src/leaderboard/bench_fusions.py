"""One Transformer block's forward + backward with and without each fusion of ``leaderboard.fused_block``.

    python -m leaderboard.bench_fusions                       # the 8B block: 32 768 tokens, bf16, SDPA cuDNN
    python -m leaderboard.bench_fusions --device cpu --tokens 512 --preset tiny --d-ff 704

Variants, each a ``cs336_basics.TransformerBlock`` with the same weights: ``unfused`` (the optimized step
without ``fused_block``: RMSNorm, RoPE and SwiGLU compiled as one region each), each fusion alone on top
of it, and the default step's block (``STEP_FUSIONS``). The timed step is
``block(x, positions).backward(grad)`` on one sequence; the variants take turns step by step (in
alternating order), so slow drift of the clocks falls on all of them alike; the table gives each one's
median, its ratio to ``unfused`` and the time it saves, beside the saving predicted from the bytes of the
passes it removes (``PREDICTED_PASSES``, at ``--bandwidth``). ``saved_mib``: what the forward keeps for
backward (CUDA allocator; the block's input and output not counted). ``--recompute ffn`` puts every
variant's SwiGLU in the checkpoint wrapper, as the 8B step's plan does for most blocks.
Writes ``fusions.csv`` / ``.md`` / ``.json`` into ``--out``.
"""

from __future__ import annotations

import functools
import statistics

from harness import cli

VARIANTS = {"unfused": (), "+ rope": ("rope",), "+ norm": ("norm",), "+ swiglu": ("swiglu",),
            "step (rope, norm, swiglu)": ("rope", "norm", "swiglu")}  # fmt: skip
# (forward, backward) passes over one (tokens, d_model) tensor that each fusion removes per block, with
# cuDNN attention: rope: the copy of the attention output to (tokens, d_model) / the copies of the q, k
# and output gradients; norm: one read of the sum / the residual-gradient sum there (read 2, write 1,
# less the one extra read); swiglu: the sum of the two input-gradient matmuls (written and read once fewer).
PREDICTED_PASSES = {"rope": (2, 6), "norm": (1, 2), "swiglu": (0, 2)}


def parse_args(argv=None):
    p = cli.command_parser("python -m leaderboard.bench_fusions", __doc__)
    p.add_argument("--tokens", type=cli.positive_int, default=32_768, help="sequence length (one sequence)")
    p.add_argument("--preset", default="leaderboard-8b",
                   help="cs336_basics preset whose block shape is the default (default: leaderboard-8b)")
    p.add_argument("--d-model", type=cli.positive_int, help="model width (default: the preset's)")
    p.add_argument("--heads", type=cli.positive_int, help="attention heads (default: the preset's)")
    p.add_argument("--d-ff", type=cli.positive_int, help="SwiGLU width (default: the preset's)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--attention", choices=("auto", "cudnn", "flash", "math"), default="auto",
                   help="SDPA backend; auto: cudnn on CUDA, math on a CPU")  # fmt: skip
    p.add_argument("--bandwidth", type=cli.positive_float, default=4.3,
                   help="TB/s for the predicted savings (H200 device-to-device copy)")  # fmt: skip
    p.add_argument("--recompute", choices=("none", "ffn"), default="none",
                   help="ffn: recompute the SwiGLU in backward (checkpoint wrapper)")  # fmt: skip
    cli.add_steps(p, steps=10, warmup=2)
    cli.add_device(p)
    cli.add_out(p, "results/fusions")
    args = p.parse_args(argv)
    from cs336_basics.presets import get_preset

    try:
        preset = get_preset(args.preset)
    except ValueError as err:
        p.error(f"--preset: {err}")
    args.d_model = args.d_model or preset.d_model
    args.heads = args.heads or preset.num_heads
    args.d_ff = args.d_ff or preset.d_ff
    if args.d_model % args.heads or (args.d_model // args.heads) % 2:
        p.error(f"--d-model {args.d_model} must split into --heads {args.heads} heads of even size")
    return args


def build_variants(args, device, dtype) -> dict:
    """One block per variant, all with the first one's weights, fused and compiled as the step does."""
    import torch
    from cs336_basics import RotaryEmbedding, TransformerBlock

    from .attention import sdpa
    from .fused_block import fuse_block
    from .sharding import recomputed

    backend = args.attention if args.attention != "auto" else ("cudnn" if device.type == "cuda" else "math")
    attention = sdpa(backend)
    blocks, state = {}, None
    for name, fusions in VARIANTS.items():
        torch.manual_seed(0)
        rope = RotaryEmbedding(10000.0, args.d_model // args.heads, args.tokens)
        block = TransformerBlock(args.d_model, args.heads, args.d_ff, rope, attention, device, dtype)
        state = state or block.state_dict()
        block.load_state_dict(state)
        unfused = fuse_block(block, fusions) + ([] if "rope" in fusions else [rope])
        for module in unfused:  # as the step does: one region per unfused module
            module.compile()
        if args.recompute == "ffn":
            block.ffn = recomputed(block.ffn)
        blocks[name] = block
    return blocks


def measure(args) -> tuple[list[dict], dict]:
    import torch
    from harness.progress import progress
    from harness.timing import synchronize, timed_step

    device = torch.device(cli.resolve_device(args.device))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    blocks = build_variants(args, device, dtype)
    x = torch.randn(1, args.tokens, args.d_model, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    positions = torch.arange(args.tokens, device=device)

    def step(block):
        block.zero_grad(set_to_none=True)
        x.grad = None
        block(x, positions).backward(grad)

    saved_mib = {}
    for name in progress(blocks, "compile + warm up"):
        for _ in range(max(args.warmup, 1)):
            step(blocks[name])
        synchronize(device)
        if device.type == "cuda":
            before = torch.cuda.memory_allocated(device)
            out = blocks[name](x, positions)
            saved_mib[name] = (torch.cuda.memory_allocated(device) - before - out.nbytes) / 2**20
            del out
    times = {name: [] for name in blocks}
    names = list(blocks)
    for r in progress(range(args.steps), "timed rounds"):
        for name in names if r % 2 == 0 else reversed(names):
            times[name].append(timed_step(functools.partial(step, blocks[name]), device)[0])
    base = statistics.median(times["unfused"])
    tensor_bytes = args.tokens * args.d_model * dtype.itemsize
    rows = []
    for name, fusions in VARIANTS.items():
        median = statistics.median(times[name])
        passes = sum(sum(PREDICTED_PASSES[f]) for f in fusions)
        predicted_ms = passes * tensor_bytes / (args.bandwidth * 1e12) * 1e3
        rows.append({
            "variant": name, "median_ms": median * 1e3, "min_ms": min(times[name]) * 1e3,
            "x_unfused": median / base, "saved_ms": (base - median) * 1e3,
            "predicted_passes": passes, "predicted_saved_ms": predicted_ms,
            "saved_mib": saved_mib.get(name, float("nan")),
        })  # fmt: skip
    config = {k: v for k, v in vars(args).items() if k not in ("out", "device")}  # the header has the device
    return rows, {**config, "torch_device": str(device), "tensor_mib": tensor_bytes / 2**20}


def main(argv=None) -> None:
    args = parse_args(argv)
    import pandas as pd
    from harness.environment import environment, header_markdown
    from harness.results import to_markdown, write_table

    rows, config = measure(args)
    env = environment()
    table = pd.DataFrame(rows)
    paths = write_table(table, f"{args.out}/fusions", formats=("csv", "md", "json"), header={**env, **config})
    print(header_markdown(env))
    print(f"one block, {args.tokens} tokens, d_model {args.d_model}, {args.heads} heads, d_ff {args.d_ff}, "
          f"{args.dtype}; one (tokens, d_model) tensor = {config['tensor_mib']:.0f} MiB")  # fmt: skip
    print(to_markdown(table, ".4g"))
    print("wrote", ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
