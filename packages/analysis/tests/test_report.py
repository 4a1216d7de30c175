"""The report command: arguments, bandwidth source, and a complete document written atomically."""

import pytest
from analysis import report


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        report.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option in ("--out", "--collectives-csv", "--bandwidth-gbps", "--matmul-tflops", "--max-ring"):
        assert option in text


def test_bus_bandwidth_read_from_benchmark_csv(tmp_path):
    table = tmp_path / "collectives.csv"
    table.write_text(
        "op,world_size,size_bytes,busbw\n"
        "all_reduce,2,1048576,20.5\nall_reduce,2,1073741824,301.0\nall_reduce,4,1073741824,250.0\n"
        "reduce_scatter,2,1073741824,999.0\n"
    )
    busbw, source = report.read_bus_bandwidth(table)
    assert busbw == pytest.approx(301e9)
    assert "1024 MiB on 2 GPUs" in source
    assert report.read_bus_bandwidth(tmp_path / "missing.csv") is None


def test_bus_bandwidth_from_the_parallel_benchmark_layout(tmp_path):
    table = tmp_path / "collectives.csv"
    table.write_text(
        "backend,processes,collective,size_mib,size_bytes,median_ms,busbw_GBps\n"
        "gloo,2,all_reduce,1024,1073741824,900.0,1.2\n"
        "nccl,4,all_reduce,1024,1073741824,5.0,322.0\n"
        "nccl,4,all_reduce,100,104857600,0.6,250.0\n"
        "nccl,4,all_gather,1024,1073741824,2.0,500.0\n"
    )
    busbw, source = report.read_bus_bandwidth(table)
    assert busbw == pytest.approx(322e9)
    assert "on 4 GPUs" in source
    table.write_text("backend,processes,collective,size_bytes,busbw_GBps\ngloo,2,all_reduce,1024,1.0\n")
    assert report.read_bus_bandwidth(table) is None
    table.write_text("name,value\nx,1\n")
    with pytest.raises(ValueError, match="cannot read"):
        report.read_bus_bandwidth(table)


def test_report_is_written_with_every_section(tmp_path):
    table = tmp_path / "collectives.csv"
    table.write_text("op,world_size,size_bytes,busbw\nall_reduce,2,1073741824,100.0\n")
    out = tmp_path / "docs" / "analysis.md"
    report.main(["--out", str(out), "--collectives-csv", str(table), "--max-ring", "3"])
    text = out.read_text()
    for heading in ("## Ring collectives", "### DP", "### FSDP", "### TP", "### FSDP x TP",
                    "## Tensor-parallel backward, checked", "## How many H200s make sense",
                    "## Accounting of the model presets", "## Activation checkpointing"):  # fmt: skip
        assert heading in text
    assert "W = 100 GB/s" in text and "collectives.csv" in text
    assert r"\frac{S \left(N - 1\right)}{W}" in text  # the alternate all-reduce, printed by sympy
    assert [p.name for p in out.parent.iterdir()] == ["analysis.md"]  # no temporary file left behind


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        report.parse_args(["--max-ring", "1"])
    with pytest.raises(SystemExit):
        report.parse_args(["--bandwidth-gbps", "-3"])


def test_default_output_is_a_results_folder_and_the_tracked_table_found_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = report.parse_args([])
    assert args.out == report.Path("results/analysis.md")  # relative to where it runs: never ./docs/
    assert args.collectives_csv == report.REPOSITORY_COLLECTIVES
    assert (report.REPOSITORY_COLLECTIVES.parent.parent / "packages" / "analysis").is_dir()
