"""The fastest full training step of the 8B model on two GPUs, composed from the workspace packages, and
training runs on token files.

Entry point: ``apps/leaderboard/train.py`` / ``python -m leaderboard.cli``. The path of a run, each module
once: ``cli`` (options, parsed once) -> ``job`` (the recipe resolved and validated once, files checked) ->
``launching`` (where the ranks run) -> ``modes`` (the job's mode on each rank: ``benchmark``, ``check``,
``ablation`` or ``training``) -> ``build`` (attention kernel -> ``model`` with its loss -> ``parallelize``:
fusions, compiled regions, activation plan, sharding -> optimizer -> ``trainer.Trainer``) -> the steps ->
``report`` (rank 0's result). Recipes: ``recipe`` (the type: nested sections, validation, ``--set``) and
``recipes`` (the named ones). Pieces: ``attention`` (kernel choice), ``fused_*`` (fused kernels),
``checkpoint_plan`` and ``measured_plan`` (what to recompute or offload), ``offload``, ``sharding`` (FSDP2,
our FSDP, checkpoint wrappers), ``baseline`` (the torch-native trainer), ``check_memory`` (the check's
reference sized to the device), ``train_state`` (training checkpoints and resume), ``ranks``,
``metrics``; ``tokens`` makes byte-level token files, ``token_file`` checks and reads them; ``save_lock``
keeps one run per ``--save`` folder.
"""
