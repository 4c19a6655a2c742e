"""The `equivci` command line: a thin Typer app; each command lives in equivci/commands/<name>.py."""

from __future__ import annotations

import importlib
import sys
import time
import traceback

# Before the imports below: `--timings` counts them in the start-up.
_LOADED = time.perf_counter()

import typer  # noqa: E402

from equivci import __version__  # noqa: E402
from equivci.errors import EquivciError  # noqa: E402

# Modules that may be absent (written separately) are skipped; each defines register(app).
COMMANDS = ("verify", "dump", "ci", "precommit", "merge")

app = typer.Typer(
    name="equivci",
    help="Prove on a CPU that sharded JAX entrypoints compute the same function as their references.",
    no_args_is_help=True,
    add_completion=False,
    # Errors are rendered by run(): one paragraph, traceback only with --debug.
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"equivci {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Keeps `equivci COMMAND` a command group even while only one command is registered."""


def _register_commands(args: list[str]) -> None:
    """Register the command named in `args`, or every command (help, --version, a typo): each
    command module imports what it needs (ci: the GitHub client, HTTP and email modules), which
    the other commands should not pay for at start-up."""
    requested = next((a for a in args if not a.startswith("-")), None)
    for name in (requested,) if requested in COMMANDS else COMMANDS:
        if name in _registered:
            continue
        module_name = f"equivci.commands.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        module.register(app)
        _registered.add(name)
    # In the order of COMMANDS (help lists them so), whichever ran first in this process.
    app.registered_commands.sort(key=lambda c: COMMANDS.index(c.name))


_registered: set[str] = set()


def run(argv: list[str] | None = None, started: float | None = None) -> int:
    """Run the CLI and return its exit code (2 for usage, manifest and capture errors). `started`:
    the time.perf_counter() the run counts from (default: now)."""
    args = list(sys.argv[1:] if argv is None else argv)
    _register_commands(args)
    try:
        app(args=args, prog_name="equivci", obj={"started": time.perf_counter() if started is None else started})
    except SystemExit as exc:  # standalone click always ends this way, help and usage errors included
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 2
    except EquivciError as err:
        if "--debug" in args:
            traceback.print_exc()
        print(f"equivci: error: {err}", file=sys.stderr)
        return 2
    return 0


def main() -> None:
    sys.exit(run(started=_LOADED))
