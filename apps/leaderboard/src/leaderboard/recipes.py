"""The named recipes, each a plain function returning its ``Recipe``; the command line overrides them field
by field (``recipe.parse_override``) and the resolved recipe is printed and saved with every result.

    ``leaderboard-8b``  the 8B model (vocab 151 936, d_model 4096, 34 layers, 32 heads, d_ff 11 008) at
                        context 32 768, global batch 2: one sequence per GPU on two GPUs.
    ``large-8k``        the ``large`` preset (d_model 1280, 36 layers) at context 8192, global batch 2:
                        the local analogue that also fits on one GPU.
    ``tiny``            a 2-layer model at context 128, global batch 4, for CPUs and tests.
    ``proxy-8b``        a single-GPU proxy of one rank of ``leaderboard-8b`` on 2 GPUs: 17 of the 34 blocks
                        (unsharded, with the whole embedding and LM head), one sequence of 32 768 tokens,
                        planned as that rank and holding back the memory the rank's other 17 blocks and
                        its smaller state leave over (``proxy.RankProxy``: ``3 (S_r - S_p) + D`` bytes,
                        -6.96 GiB plus the other blocks' saved activations ``D``). Its step time is the
                        proxy's, never the 8B step's.
"""

from __future__ import annotations

from collections.abc import Callable

from .recipe import ActivationCheckpoint, Benchmark, Model, Parallelism, Recipe, Training


def leaderboard_8b() -> Recipe:
    # headroom: the root unit's gathered embedding + head (2.5 GB bf16), their gradients and fp32 reduction
    # buffers (7.5 GB), one fp32 loss chunk of 4096 x 151 936 (2.5 GB) and its softmax temporaries, plus
    # room for the caching allocator: planned to 16 GiB, the step ran at 138 of 139.8 GiB reserved and
    # stalled on allocator retries; planned to 24 GiB the single-GPU proxy still retried 4 times a step and
    # was slower than at 32 GiB, where the offload tier then gained 3% more (docs/leaderboard.md, proxy).
    return Recipe(
        "leaderboard-8b",
        Model("leaderboard-8b", context_length=32_768),
        Training(batch_size=2, steps=4),
        activation_checkpoint=ActivationCheckpoint(memory_headroom_gib=32.0, offload_blocks=-1),
    )


def large_8k() -> Recipe:
    return Recipe("large-8k", Model("large", context_length=8192), Training(batch_size=2, steps=5))


def tiny() -> Recipe:
    return Recipe(
        "tiny",
        Model("tiny", context_length=128, loss_chunk_tokens=97, compile_regions=False, fused_block=False),
        Training(batch_size=4, steps=5),
        activation_checkpoint=ActivationCheckpoint(memory_headroom_gib=0.0),
        benchmark=Benchmark(warmup=1),
    )


def proxy_8b() -> Recipe:
    # one rank of leaderboard-8b on 2 GPUs, on one GPU (proxy.py): the same headroom as the rank, whose
    # root unit (embedding + head), loss chunks and gradient buffers the proxy has too
    return Recipe(
        "proxy-8b",
        Model("leaderboard-8b", context_length=32_768),
        Training(batch_size=1, steps=3),
        parallelism=Parallelism(proxy_ranks=2),
        activation_checkpoint=ActivationCheckpoint(memory_headroom_gib=32.0, offload_blocks=-1),
        benchmark=Benchmark(warmup=1),
    )


RECIPES: dict[str, Callable[[], Recipe]] = {
    "leaderboard-8b": leaderboard_8b, "large-8k": large_8k, "tiny": tiny, "proxy-8b": proxy_8b,
}  # fmt: skip


def get_recipe(name: str) -> Recipe:
    try:
        return RECIPES[name]()
    except KeyError:
        raise ValueError(f"unknown recipe {name!r}; choose one of {', '.join(RECIPES)}") from None


def default_recipe_name(gpus: int, gpu_memory_bytes: int) -> str:
    """leaderboard-8b on >= 2 GPUs; on one GPU the largest recipe whose fp32 params, grads and AdamW
    moments (16 bytes per parameter) leave 20 GiB for activations; tiny on a CPU."""
    if gpus == 0:
        return "tiny"
    if gpus >= 2:
        return "leaderboard-8b"
    for name in ("leaderboard-8b", "large-8k"):
        if 16 * get_recipe(name).model_config().parameter_count + 20 * 2**30 < gpu_memory_bytes:
            return name
    return "tiny"
