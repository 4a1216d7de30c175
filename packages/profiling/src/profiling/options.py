"""The names the profiling commands accept, in a module that imports nothing heavy (``--help`` stays fast).

Model sizes are the presets of ``cs336_basics.presets``, checked when the model is built.
"""

MODES = ("forward", "forward-backward", "train")
ATTENTIONS = ("naive", "flash")
STRATEGY_NAMES = ("none", "block", "group:K", "sqrt", "bisect", "optimal")


def parse_strategy(spec: str) -> tuple[str, int]:
    """A checkpointing strategy (:mod:`profiling.checkpointing`): ``'group:4'`` -> ``('group', 4)``;
    ``'block'`` -> ``('group', 1)``; others -> ``(name, 0)``; a ValueError naming the choices otherwise."""
    if spec in ("none", "sqrt", "bisect", "optimal"):
        return spec, 0
    if spec == "block":
        return "group", 1
    if spec.startswith("group:"):
        try:
            k = int(spec.split(":", 1)[1])
        except ValueError:
            k = 0
        if k >= 1:
            return "group", k
    raise ValueError(
        f"checkpoint strategy must be one of {STRATEGY_NAMES} (K a positive integer), got {spec!r}"
    )
