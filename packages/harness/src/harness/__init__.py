"""The shared measuring and reporting layer of the project's benchmarks.

Modules, each with one job (import the one you need; none is imported here, so ``harness.cli`` stays
light enough for ``--help`` to answer at once):

- :mod:`harness.cli`: one command-line grammar (lists as repeated values, ``--out``, ``--steps``,
  ``--warmup``, ``--dtypes``, ``--device``) and checked argument types;
- :mod:`harness.timing`: synchronization, timed steps, CUDA-event marks, ``triton.testing.do_bench``,
  paired ABBA rounds and their comparison;
- :mod:`harness.environment`: the header of every result (device, versions, date, command);
- :mod:`harness.results`: atomic writes, tables as CSV + Markdown (+ JSON), figures as PNG;
- :mod:`harness.trace`: profiler activities, named ranges, Chrome-trace export and loading;
- :mod:`harness.progress`: progress lines for long runs;
- :mod:`harness.command_probe`: a package's commands run in a fresh interpreter (for tests of ``--help``).

Imports only torch, numpy, pandas, matplotlib and tabulate (and triton, lazily), so every package's
benchmarks and tests may use it while the libraries stay free of it.
"""
