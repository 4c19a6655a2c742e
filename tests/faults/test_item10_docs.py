"""Issue 15, item 10: the README's command table names only options the commands have, and the
statuses and exit codes it documents are all of them."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from equivci.cli import _register_commands, app
from equivci.results import Status

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def command_options() -> dict[str, set[str]]:
    _register_commands([])
    group = typer.main.get_command(app)
    return {name: {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)} for name, cmd in group.commands.items()}


def test_command_table_names_real_options_only() -> None:
    options = command_options()
    rows = re.findall(r"^\| `equivci (\w+) ([^`]*)` \|", README, flags=re.MULTILINE)
    assert {name for name, _ in rows} == set(options)
    for name, usage in rows:
        named = set(re.findall(r"--[a-z][a-z-]*", usage))
        assert named <= options[name], f"README lists {sorted(named - options[name])} for `equivci {name}`"
    assert "--format" not in options["ci"] and "--format" in options["verify"]


def test_every_status_and_exit_code_is_documented() -> None:
    for status in Status:
        assert f"| `{status.value}` |" in README
    for code in ("`0`", "`1`", "`2`", "`128+N`"):
        assert f"| {code} |" in README
    assert "Add `.equivci/` to your `.gitignore`" in README
