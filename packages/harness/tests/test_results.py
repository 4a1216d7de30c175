import json
import os

import pandas as pd
import pytest
from harness.environment import command_line, environment, header_markdown
from harness.results import atomic_path, atomic_write_text, save_figure, to_markdown, write_json, write_table


def _frame():
    return pd.DataFrame({"size": ["small", "xl"], "ms": [1.23456789, 97.0], "ok": [True, False]})


def test_atomic_write_replaces_and_leaves_nothing_behind(tmp_path):
    path = tmp_path / "sub" / "a.txt"
    atomic_write_text(path, "one")
    atomic_write_text(path, "two")
    assert path.read_text() == "two" and os.listdir(path.parent) == ["a.txt"]
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask  # like any new file, not mkstemp's private mode


def test_atomic_path_keeps_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "t.csv.gz"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError), atomic_path(path) as tmp:
        assert tmp.name.endswith(".csv.gz") and tmp.parent == tmp_path
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["t.csv.gz"]


def test_write_table_csv_markdown_json(tmp_path):
    df = _frame()
    header = {"device": "cpu", "steps": 3}
    paths = write_table(df, tmp_path / "bench", formats=("csv", "md", "json"), header=header)
    assert [p.name for p in paths] == ["bench.csv", "bench.md", "bench.json"]
    pd.testing.assert_frame_equal(pd.read_csv(paths[0]), df)
    assert paths[1].read_text() == df.to_markdown(index=False, floatfmt=".4g") + "\n"
    assert "1.235" in paths[1].read_text()
    payload = json.loads(paths[2].read_text())
    assert payload["header"] == header and payload["rows"][1] == {"size": "xl", "ms": 97.0, "ok": False}
    with pytest.raises(ValueError, match="formats"):
        write_table(df, tmp_path / "x", formats=("xlsx",))


def test_stem_with_dots_keeps_its_name(tmp_path):
    paths = write_table(_frame(), tmp_path / "memory-xl-0.5")
    assert [p.name for p in paths] == ["memory-xl-0.5.csv", "memory-xl-0.5.md"]


def test_to_markdown_floatfmt():
    assert to_markdown(_frame(), ".2f").splitlines()[2].startswith("| small  |  1.23 |")


def test_figure_beside_table(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    paths = write_table(_frame(), tmp_path / "fig", figure=fig)
    assert paths[-1].name == "fig.png" and paths[-1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig, _ = plt.subplots()
    assert save_figure(fig, tmp_path / "only.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(os.listdir(tmp_path)) == ["fig.csv", "fig.md", "fig.png", "only.png"]


def test_write_json_and_environment(tmp_path):
    env = environment(command="python -m demo --steps 3")
    for key in ("date", "python", "torch", "triton", "cuda", "cudnn", "nccl", "device", "command"):
        assert isinstance(env[key], str) and env[key], key
    assert env["date"].endswith("UTC") and env["command"] == "python -m demo --steps 3"
    assert json.loads(write_json(tmp_path / "e.json", env).read_text()) == env
    line = header_markdown(env)
    assert env["device"] in line and "`python -m demo --steps 3`" in line


def test_command_line_quotes_arguments():
    assert command_line(["/x/demo.py", "--name", "a b"]).endswith("--name 'a b'")


def test_to_markdown_can_keep_text_cells_as_written():
    df = pd.DataFrame({"error": ["1.0e-16", "17"], "math": ["$x$", "0.10"]})
    text = to_markdown(df, disable_numparse=True)
    assert "1.0e-16" in text and "0.10" in text
    assert "1e-16" in to_markdown(df)  # without it tabulate reads the text as numbers
