import argparse
import subprocess
import sys
import time

import pytest
from harness import cli


def _parser():
    p = cli.command_parser("python -m demo", "Demo benchmark.\n\nMore text that is not the description.")
    cli.add_list(p, "--seqs", int, [512, 1024], "sequence lengths")
    cli.add_steps(p, steps=10, warmup=3)
    cli.add_dtypes(p, ["fp32", "bf16"])
    cli.add_out(p)
    cli.add_device(p)
    return p


def test_defaults_and_repeated_values():
    args = _parser().parse_args([])
    assert (args.seqs, args.steps, args.warmup, args.dtypes, args.out, args.device) == (
        [512, 1024],
        10,
        3,
        ["fp32", "bf16"],
        "results",
        "auto",
    )
    argv = ["--seqs", "17", "97", "1", "--dtypes", "fp16", "--steps", "1", "--warmup", "0"]
    args = _parser().parse_args(argv)
    assert args.seqs == [17, 97, 1] and args.dtypes == ["fp16"] and (args.steps, args.warmup) == (1, 0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seqs", "512,1024"], "separated by spaces: --seqs 512 1024"),
        (["--steps", "0"], "expected a positive integer, got '0'"),
        (["--warmup", "-1"], "expected an integer >= 0"),
        (["--steps", "abc"], "--steps"),
        (["--dtypes", "fp8"], "invalid choice: 'fp8'"),
    ],
)
def test_bad_values_name_the_flag_and_what_was_expected(argv, message, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(argv)
    assert message in capsys.readouterr().err


def test_checked_types():
    assert cli.positive_int("7") == 7 and cli.positive_float("0.5") == 0.5
    for bad in ("0", "-3", "1.5"):
        with pytest.raises(Exception, match="positive integer"):
            cli.positive_int(bad)
    for bad in ("0", "-1", "inf", "nan", "x"):
        with pytest.raises(Exception, match="positive finite"):
            cli.positive_float(bad)


def test_parsed_by_keeps_the_text_and_reports_the_parser_s_error(capsys):
    def window(text):
        left, right = text.split(",")  # a ValueError when there is no single comma
        if int(left) < 0 or int(right) < 0:
            raise ValueError(f"window sides must be >= 0, got {text!r}")
        return int(left), int(right)

    p = cli.command_parser("python -m demo", None)
    p.add_argument("--window", type=cli.parsed_by(window))
    assert p.parse_args(["--window", "17,0"]).window == "17,0"
    with pytest.raises(SystemExit):
        p.parse_args(["--window", "3,-1"])
    assert "--window: window sides must be >= 0, got '3,-1'" in capsys.readouterr().err


def test_help_shows_description_and_defaults(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "Demo benchmark." in out and "More text" not in out and "(default: [512, 1024])" in out


def test_resolve_device():
    import torch

    assert cli.resolve_device("cpu") == "cpu"
    assert cli.resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    visible = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"--device cuda:{visible}: {visible} CUDA GPU"):
        cli.resolve_device(f"cuda:{visible}")


def test_device_names_are_checked_when_parsed(capsys):
    parser = argparse.ArgumentParser()
    cli.add_device(parser)
    assert parser.parse_args(["--device", "cuda:1"]).device == "cuda:1"
    with pytest.raises(SystemExit):
        parser.parse_args(["--device", "tpu"])
    assert "expected auto, cpu, cuda or cuda:N, got 'tpu'" in capsys.readouterr().err


def test_cli_module_imports_nothing_heavy():
    code = "import sys, harness.cli, harness.progress; print(sorted({'torch', 'pandas'} & set(sys.modules)))"
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    assert time.perf_counter() - start < 10


def test_launch_arguments_and_backend():
    import torch
    from harness.cli import add_launch, resolve_backend

    p = cli.command_parser("python -m demo", None)
    add_launch(p, timeout=60)
    args = p.parse_args([])
    assert (args.backend, args.timeout) == ("auto", 60)
    assert resolve_backend("gloo", 3) == "gloo"
    assert resolve_backend("auto", 1) == ("nccl" if torch.cuda.is_available() else "gloo")
    with pytest.raises(ValueError, match="need 1000 GPUs"):
        resolve_backend("nccl", 1000)


def test_output_paths_are_checked_when_parsed(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert cli.writable_folder(str(tmp_path / "new" / "deeper")) == str(tmp_path / "new" / "deeper")
    assert cli.writable_file(str(tmp_path / "table.md")) == str(tmp_path / "table.md")
    for check, text, message in ((cli.writable_folder, a_file, "is a file, expected a folder"),
                                 (cli.writable_file, tmp_path, "is a folder, expected a file"),
                                 (cli.writable_folder, a_file / "out", f"{a_file} is a file, so it cannot"),
                                 (cli.writable_file, a_file / "x.md", f"{a_file} is a file, so it cannot")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            check(str(text))
