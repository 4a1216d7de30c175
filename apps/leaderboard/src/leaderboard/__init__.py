"""The fastest full training step of the 8B model on two GPUs, composed from the workspace packages, and
training runs on token files.

Entry point: ``apps/leaderboard/train.py`` / ``python -m leaderboard.cli``. The path of a run: ``cli``
(options) -> ``job`` (the planned, checked job; one rank's work) -> ``launching`` (where the ranks run) ->
``worker`` (timing loop, ablation), ``check`` (equivalence with the reference) or ``training`` (token files,
schedule, evaluation, sharded checkpoints) -> ``report``. Trainers: ``baseline`` (torch-native), ``optimized``
(ours), both ``trainer.Trainer``; their pieces: ``recipes`` (named configurations), ``attention`` (kernel
choice), ``fused_cross_entropy``, ``fused_adamw``, ``checkpoint_plan`` (what to recompute), ``sharding``
(FSDP2 and checkpoint wrappers), ``metrics``; ``tokens`` makes byte-level token files, ``token_file``
checks and reads them; ``save_lock`` keeps one run per ``--save`` folder.
"""
