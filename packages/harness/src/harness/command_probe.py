"""Run a package's commands in one fresh interpreter and report how each ended and whether torch got loaded.

The check behind "``--help`` answers without importing torch" and "a GPU command refuses a machine without
a GPU at once": CUDA is hidden from the interpreter, each command runs as ``python -m <package>.<command>``
(with ``--help``, or with no arguments when ``run``), and its output is captured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

_PROBE = """
import contextlib, importlib, io, json, runpy, sys
package, mode, commands = sys.argv[1], sys.argv[2], sys.argv[3:]
importlib.import_module(package)
result = {"import loads torch": "torch" in sys.modules, "commands": {}}
for command in commands:
    sys.argv = [command, *([] if mode == "run" else ["--help"])]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module(package + "." + command, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code
    result["commands"][command] = {"exit": str(code), "torch": "torch" in sys.modules,
                                   "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(result))
"""


def probe_commands(package: str, commands: Sequence[str], run: bool = False, timeout: float = 120) -> dict:
    """``{"import loads torch": bool, "commands": {command: {"exit", "torch", "stdout", "stderr"}}}`` for
    ``python -m <package>.<command> --help`` (or without arguments when ``run``), all in one interpreter
    without CUDA; ``exit`` is the exit code or message as text, ``torch`` whether torch was loaded by then."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    mode = "run" if run else "help"
    done = subprocess.run([sys.executable, "-c", _PROBE, package, mode, *commands], capture_output=True,
                          text=True, env=env, timeout=timeout)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"probing {package} commands {list(commands)} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)
