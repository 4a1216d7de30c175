"""The fastest full training step of the 8B model on two GPUs, composed from the workspace packages.

Entry point: ``apps/leaderboard/train.py`` / ``python -m leaderboard.cli`` (``cli``: options, launching,
report). One rank's work: ``worker`` (timing loop, ablation), ``check`` (equivalence with the reference).
Trainers: ``baseline`` (torch-native), ``optimized`` (ours), both over ``trainer.Trainer``; their pieces:
``recipes`` (named configurations), ``attention`` (kernel choice), ``fused_cross_entropy``, ``fused_adamw``,
``checkpoint_plan`` (what to recompute), ``sharding`` (FSDP2 and checkpoint wrappers), ``metrics``.
"""
