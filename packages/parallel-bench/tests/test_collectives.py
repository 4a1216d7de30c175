"""The collective benchmark: correct collectives, bandwidth formulas, merged result files (gloo on CPU)."""

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from parallel.launch import spawn
from parallel_bench import collectives as bc
from parallel_bench import collectives_calls as calls


def _collectives_compute_the_right_thing(rank, world_size, numel):
    for collective in bc.COLLECTIVES:
        buffers = calls.buffers(collective, numel, world_size, torch.device("cpu"))
        source = buffers[-1].double()
        everyone = [torch.empty_like(source) for _ in range(world_size)]
        dist.all_gather(everyone, source)
        calls.call(collective, buffers)
        if collective == "all_reduce":
            want = torch.stack(everyone).sum(0)
        elif collective == "all_gather":
            want = torch.cat(everyone)
        else:
            want = torch.stack(everyone).sum(0).chunk(world_size)[rank]
        torch.testing.assert_close(buffers[0].double(), want, rtol=1e-5, atol=1e-5, msg=collective)


@pytest.mark.parametrize(("world_size", "numel"), [(2, 97), (3, 130)])
def test_timed_collectives_compute_sums_and_gathers(world_size, numel):
    spawn(_collectives_compute_the_right_thing, world_size, numel, timeout=60)


def test_bandwidth_columns_follow_nccl_tests_definitions():
    pytest.importorskip("analysis.collectives")
    df = pd.DataFrame(
        dict(
            collective=["all_reduce", "all_gather", "reduce_scatter"],
            processes=[4, 3, 6],
            size_bytes=[2**30, 3 * 10**6, 6 * 10**6],
            median_ms=[3.3, 0.1, 0.2],
        )
    )
    got = bc.bandwidth_columns(df)
    algbw = df["size_bytes"] / (df["median_ms"] / 1e3) / 1e9
    factor = pd.Series([2 * 3 / 4, 2 / 3, 5 / 6])
    torch.testing.assert_close(torch.tensor(got["algbw_GBps"].values), torch.tensor(algbw.values))
    torch.testing.assert_close(torch.tensor(got["busbw_GBps"].values), torch.tensor((algbw * factor).values))


def _timed_calls_on_every_rank(rank, world_size, steps):
    x = calls.buffers("all_reduce", 1000, world_size, torch.device("cpu"))
    seconds = calls.time_calls("all_reduce", x, warmup=1, steps=steps)
    assert len(seconds) == steps and all(s > 0 for s in seconds)


def test_time_calls_gives_one_positive_time_per_call():
    spawn(_timed_calls_on_every_rank, 2, 7, timeout=60)


def test_command_merges_rows_and_draws_figures(tmp_path, monkeypatch):
    pytest.importorskip("analysis.collectives")
    monkeypatch.chdir(tmp_path)  # the default --out is ./results: the tracked docs/ stay untouched
    csv, figures = tmp_path / "results" / "collectives.csv", tmp_path / "results" / "figures"
    common = ["--backend", "gloo", "--steps", "20", "--warmup", "1"]
    bc.main(["--world-sizes", "2", "--sizes-mib", "0.01", "0.1", *common])
    bc.main(["--world-sizes", "2", "3", "--sizes-mib", "0.1", "--collectives", "all_reduce", *common])
    df = pd.read_csv(csv)
    # 6 rows from the first run; the second replaces the 2-process all-reduce at 0.1 MiB and adds 3 processes.
    assert len(df) == 7
    assert set(df["processes"]) == {2, 3}
    assert df.duplicated(bc.KEY).sum() == 0
    assert (df["median_ms"] > 0).all() and (df["p10_ms"] <= df["p90_ms"]).all()
    assert (figures / "collectives-gloo.png").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [
        "collectives-gloo.png",
        "collectives.csv",
    ]


@pytest.mark.parametrize(
    "bad", [["--steps", "5"], ["--world-sizes", "1"], ["--sizes-mib", "0"], ["--sizes-mib", "1,10"]]
)
def test_bad_arguments_are_refused(bad, capsys):
    with pytest.raises(SystemExit):
        bc.main(["--backend", "gloo", *bad])
    assert bad[0] in capsys.readouterr().err
