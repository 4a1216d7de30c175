"""Every command of the project answers ``--help`` at once: arguments are parsed before torch-heavy imports.

Commands are found, not listed: every module under ``packages/*/src`` and ``apps/*/src`` that runs as
``python -m <package>.<module>`` (it has a ``__main__`` block), and the app's ``train.py``. The limit is
generous so that a loaded CI machine does not flake; the target is under 2 s.
"""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 10.0


def _commands() -> list[list[str]]:
    found = []
    for source in sorted([*ROOT.glob("packages/*/src"), *ROOT.glob("apps/*/src")]):
        for path in sorted(source.rglob("*.py")):
            if re.search(r'^if __name__ == "__main__":', path.read_text(), re.MULTILINE):
                module = ".".join(path.relative_to(source).with_suffix("").parts)
                found.append(["-m", module])
    found += [[str(p.relative_to(ROOT))] for p in sorted(ROOT.glob("apps/*/train.py"))]
    return found


COMMANDS = _commands()


def test_commands_are_found():
    names = {" ".join(c) for c in COMMANDS}
    assert {"-m profiling.bench", "-m parallel_bench.ddp", "-m analysis.report"} <= names, names


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[-1])
def test_help_answers_at_once(command):
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *command, "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage:") and "--help" in result.stdout, result.stdout[:500]
    assert seconds < LIMIT_S, f"{' '.join(command)} --help took {seconds:.1f} s (target: under 2 s)"
