"""The command probe runs commands in a fresh interpreter and says how each ended and whether torch loaded."""

import pytest
from harness.command_probe import probe_commands


def test_help_of_a_command_that_needs_no_torch():
    result = probe_commands("json", ["tool"])
    assert result["import loads torch"] is False
    tool = result["commands"]["tool"]
    assert (tool["exit"], tool["torch"]) == ("0", False) and tool["stdout"].startswith("usage:")


def test_a_package_that_does_not_import_is_an_error():
    with pytest.raises(RuntimeError, match="no_such_package"):
        probe_commands("no_such_package", ["tool"])
