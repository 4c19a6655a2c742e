"""The `equivci` command line: a thin Typer app; each command lives in equivci/commands/<name>.py."""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
import traceback

# Before the imports below: `--timings` counts them in the start-up.
_LOADED = time.perf_counter()

import typer  # noqa: E402

from equivci import __version__  # noqa: E402
from equivci.errors import EquivciError  # noqa: E402
from equivci.options import ENV_SATURATION_ITERATIONS, ENV_SATURATION_NODES  # noqa: E402

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
    stopped: list[signal.Signals] = []
    restore = _on_signals(stopped)
    try:
        _check_environment()
        _register_commands(args)
        app(args=args, prog_name="equivci", obj={"started": time.perf_counter() if started is None else started})
    except SystemExit as exc:  # standalone click always ends this way, help and usage errors included
        if stopped:  # Typer turns the KeyboardInterrupt of a signal into an exit
            return _stopped(stopped[0])
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 2
    except EquivciError as err:
        if "--debug" in args:
            traceback.print_exc()
        print(f"equivci: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _stopped(stopped[0] if stopped else signal.SIGINT)
    except Exception as exc:  # a bug in equivci: one paragraph unless --debug
        if "--debug" in args:
            raise
        print(
            f"equivci: internal error: {type(exc).__name__}: {exc}. This is a bug in equivci; rerun with "
            "--debug for the traceback and report it.",
            file=sys.stderr,
        )
        return 2
    finally:
        restore()
    return 0


# Environment variables read as numbers deep inside a run: a bad value is a usage error up front.
NUMERIC_ENVIRONMENT = {
    "EQUIVCI_VERIFY_TIMEOUT": (float, "a number of CPU seconds for each proof search, e.g. 900"),
    "EQUIVCI_VERIFY_MEMORY": (int, "a whole number of bytes the proof search may use, e.g. 8000000000"),
    ENV_SATURATION_ITERATIONS: (int, "a whole number of iterations for each equality saturation, e.g. 400"),
    ENV_SATURATION_NODES: (int, "a whole number of e-graph nodes each equality saturation may reach, e.g. 8000000"),
}


def _check_environment() -> None:
    for name, (kind, meaning) in NUMERIC_ENVIRONMENT.items():
        value = os.environ.get(name)
        if not value:
            continue
        try:
            ok = 0 < kind(value) < float("inf")
        except ValueError:
            ok = False
        if not ok:
            raise EquivciError(f"{name}={value!r} is not valid; set it to {meaning}, or unset it.")


def _stopped(signum: signal.Signals) -> int:
    # Every `with` and `finally` on the way has run: capture children stopped, temporary folders gone.
    print(f"equivci: stopped by {signum.name}; no verdict.", file=sys.stderr)
    return 128 + signum.value


def _on_signals(stopped: list[signal.Signals]):
    """SIGINT and SIGTERM (a cancelled CI job, `kill`) unwind as a KeyboardInterrupt, so cleanups
    run, and are remembered; returns what puts the previous handlers back."""

    def handler(signum: int, _frame) -> None:
        stopped.append(signal.Signals(signum))
        raise KeyboardInterrupt

    previous = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) in (signal.SIG_IGN, None):  # e.g. SIGINT of a background job
                continue
            previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread: leave signals alone
        pass
    return lambda: [signal.signal(signum, old) for signum, old in previous.items()]


def main() -> None:
    sys.exit(run(started=_LOADED))
