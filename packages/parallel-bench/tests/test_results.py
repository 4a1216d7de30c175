"""The sharding benchmarks' result files and tables, and their argument parsing, without a GPU."""

import json

import pandas as pd
import pytest
from harness.command_probe import probe_commands
from parallel_bench import fsdp, zero
from parallel_bench.results import write_results


def test_write_results_header_then_every_table(tmp_path):
    df = pd.DataFrame({"impl": ["ours", "fsdp2"], "step_ms": [17.25, 19.5]})
    more = pd.DataFrame({"rank": [0, 1], "gathers": [97, 97]})
    paths = write_results(df, tmp_path / "fsdp", more)
    assert sorted(p.name for p in paths) == ["fsdp.csv", "fsdp.json", "fsdp.md"]
    assert pd.read_csv(tmp_path / "fsdp.csv").equals(df)
    payload = json.loads((tmp_path / "fsdp.json").read_text())
    assert payload["rows"] == df.to_dict(orient="records") and "device" in payload["header"]
    header, first, second = (tmp_path / "fsdp.md").read_text().strip().split("\n\n")
    assert header.startswith("Measured on ") and "17.25" in first and "97" in second
    assert not list(tmp_path.glob(".*tmp*")), "a temporary file was left behind"


def test_fsdp_tables_take_the_slower_rank_of_each_step():
    def rank(ours, fsdp2, late):
        gathers = [{"unit": i, "phase": "forward", "late_ms": x} for i, x in enumerate(late)]
        return [{"times": ours, "peak": 3 * 2**30, "gathers": gathers}, {"times": fsdp2, "peak": 4 * 2**30}]

    per_rank = [rank([1.0, 5.0, 3.0], [2.0, 2.0, 2.0], [-0.5, 0.25]),
                rank([4.0, 1.0, 3.0], [3.0, 1.0, 2.0], [1.0])]  # fmt: skip
    df, gathers = fsdp._tables("small", 4, 2, per_rank)
    ours, fsdp2 = df.set_index("impl").loc["ours"], df.set_index("impl").loc["fsdp2"]
    assert ours["step_ms"] == 4.0 and fsdp2["step_ms"] == 2.0  # medians of (4, 5, 3) and (3, 2, 2)
    assert ours["vs_fsdp2_time"] == pytest.approx(2.0) and ours["vs_fsdp2_memory"] == pytest.approx(0.75)
    summary = fsdp.gather_summary(gathers).set_index("rank")
    assert summary.loc[0, "finished_before_needed"] == 1 and summary.loc[0, "total_stall_ms"] == 0.25
    assert summary.loc[1, "max_late_ms"] == 1.0


def test_help_imports_no_torch():
    commands = ["fsdp", "zero", "zero_modes", "checkpoint", "checkpoint_verify", "ddp", "collectives",
                "trace_plot"]
    result = probe_commands("parallel_bench", commands)
    assert result["import loads torch"] is False
    for command, outcome in result["commands"].items():
        assert (outcome["exit"], outcome["torch"]) == ("0", False), (command, outcome)
        assert "--out" in outcome["stdout"], command
    assert all("--steps" in result["commands"][c]["stdout"] for c in ("fsdp", "zero", "ddp"))


def test_bad_arguments_are_refused_before_any_work(capsys):
    with pytest.raises(SystemExit):
        zero.main(["--steps", "0"])
    assert "--steps" in capsys.readouterr().err
