"""The shared measuring and reporting layer: timing, environment header, results writer, trace export,
and the error budgets the test suites share. Imports only torch, numpy, pandas and matplotlib, so every
package's benchmarks and tests may use it while the libraries stay free of it."""
