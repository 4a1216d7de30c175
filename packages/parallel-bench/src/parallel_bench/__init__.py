"""Benchmarks and figures of the ``parallel`` library, outside its import path: commands run as ``python -m
parallel_bench.<module>`` (``collectives``, ``ddp``, ``zero``, ``zero_modes``, ``fsdp``, ``checkpoint``,
``checkpoint_verify``, ``trace_plot``). They build the reference model of ``cs336_basics`` and report with
``harness``."""
