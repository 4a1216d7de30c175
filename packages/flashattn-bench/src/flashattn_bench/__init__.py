"""Benchmarks, tuning and compile reports of flashattn's kernels: commands run as ``python -m
flashattn_bench.<module>`` (``bench``, ``features``, ``pytorch_attention``, ``tune``, ``sm90``,
``compile_report``), outside the library's import path."""
