"""The capture server: one process that has imported jax, forking a child per capture or numeric check.

Starting Python and importing jax is most of a small model's capture, and of the numeric oracle's
run of it; `equivci verify` captures (and checks) one model after another. The server (started by
the first child of a run, ended with it) imports jax once, without starting its backend, and for
every child forks a worker, which forks the child and reports how it ended. The child runs the
module it is asked for (`equivci.capture.child`, `equivci.capture.oracle`) as `python -m` would
(runpy, sys.argv, sys.path[0] its folder) in the folder, environment and standard streams it is
given, so it is a fresh child in everything that decides the captured programs and the oracle's
numbers:
- the backend starts in the child, which is when XLA reads XLA_FLAGS (the fake device count, the
  dump folder, the oracle's precision flag); the server never starts it;
- a model's imports and side effects (modules, os.environ, jax.config) live and die in its child;
- jax reads some variables at import: the server is started under the environment a child would
  import jax in, and a child under another environment starts a new server;
- a crash or hang is the child's: its worker reports the exit status, and kills the child when the
  process that asked says so (its timeout, Ctrl-C) or goes away;
- the server's frames above runpy are kept out of JAX's source locations, so the stacks in the HLO
  are a fresh child's (tests/capture/test_server.py compares the programs byte for byte, and the
  oracle's comparisons field for field).

Each child is a message on the server's control socket carrying, as file descriptors, the child's
own socket, its stdout and stderr and, for a capture, the write end of the pipe the child signals
the compile on (the child gets that pipe's descriptor number as its last argument). On the child's
socket the parent writes the request (module, arguments, environment, folder: one JSON line), then
anything it writes, or its closing, kills the child; the worker writes the exit status there.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO

_NOT_KEYS = ("PYTEST_CURRENT_TEST",)  # changed at every test by pytest; jax never reads it


class ServedChild:
    """A child of the server, as much of subprocess.Popen as capture/run.py and the oracle use."""

    def __init__(self, args: list[str], connection: socket.socket) -> None:
        self.args = args
        self.returncode: int | None = None
        self._connection = connection
        self._said = b""

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code (negative: the signal); None when the server went away without saying."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._connection.fileno() >= 0:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._connection], [], [], left)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            try:
                data = self._connection.recv(64)
            except ConnectionResetError:
                data = b""
            self._said += data
            if not data:
                self._connection.close()
                if self._said.strip().lstrip(b"-").isdigit():
                    self.returncode = int(self._said)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self._connection.send(b"k")


def start_child(
    module: str,
    args: list[str],
    *,
    env: dict[str, str],
    stdout: IO[bytes],
    stderr: IO[bytes],
    cwd: str,
    signal_fd: int | None = None,
) -> ServedChild:
    """`python -m MODULE ARGS [FD]`, forked by the server, where FD is the child's descriptor of
    `signal_fd` (a pipe's write end) when there is one. `env` is the child's whole environment."""
    mine, theirs = socket.socketpair()
    fds = [theirs.fileno(), stdout.fileno(), stderr.fileno(), *([] if signal_fd is None else [signal_fd])]
    with _lock:
        try:
            socket.send_fds(_running(env), [b"child"], fds)
        except OSError:  # the server ended (killed from outside): a new one
            _stop()
            socket.send_fds(_running(env), [b"child"], fds)
        finally:
            theirs.close()
    # On the child's own socket, which any size fits (the control socket's messages have a limit).
    request = {"module": module, "args": args, "env": env, "cwd": str(cwd)}
    mine.sendall(json.dumps(request).encode() + b"\n")
    return ServedChild([module, *args], mine)


@dataclasses.dataclass(frozen=True)
class Finished:
    """How a child run to its end by `run` ended: its exit code (negative: the signal; None when the
    server went away without saying) and what it wrote on stdout and stderr."""

    returncode: int | None
    stdout: str
    stderr: str


def run(module: str, args: list[str], *, env: dict[str, str], cwd: str, timeout: float) -> Finished:
    """`python -m MODULE ARGS` forked by the server, waited for. Raises subprocess.TimeoutExpired
    after `timeout` seconds, the child killed; an interruption (Ctrl-C) kills it too."""
    # Output to files, not pipes: nothing the user's code prints can fill a pipe and stall the child.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = start_child(module, args, env=env, stdout=out, stderr=err, cwd=cwd)
        try:
            child.wait(timeout=timeout)
        except BaseException:  # the timeout, or interrupted (Ctrl-C, SIGTERM): no child left running
            child.kill()
            child.wait()
            raise
        out.seek(0)
        err.seek(0)
        return Finished(child.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"))


def server_environment(child_env: dict[str, str]) -> dict[str, str]:
    """What the server imports jax under for a child given `child_env`: the child's environment but
    for what each capture sets for its backend (XLA_FLAGS) and its dump (EQUIVCI_DUMP_DIR)."""
    return {k: v for k, v in child_env.items() if k not in ("XLA_FLAGS", "EQUIVCI_DUMP_DIR")}


_lock = threading.Lock()
_server: dict = {}  # "proc", "control", "key": this process's running server


def _running(child_env: dict[str, str]) -> socket.socket:
    env = server_environment(child_env)
    key = {k: v for k, v in env.items() if k not in _NOT_KEYS}
    if _server and (_server["key"] != key or _server["proc"].poll() is not None):
        _stop()
    if not _server:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            # A script, not `-m`: no frames of runpy under the child's own (see _child); `-P`: no folder
            # of this file on sys.path (its types.py would hide the standard library's).
            proc = subprocess.Popen(
                [sys.executable, "-P", __file__, str(theirs.fileno())],
                env=env,
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        _server.update(proc=proc, control=mine, key=key)
    return _server["control"]


@atexit.register
def _stop() -> None:
    if _server:
        _server["control"].close()  # end of requests: the server exits
        proc = _server["proc"]
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        _server.clear()


# -- the server side -----------------------------------------------------------------------------------
def _serve(control: socket.socket) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the children take it
    try:
        import jax  # noqa: F401  # lazy: once for every capture (each child starts its own backend)

        import equivci.capture.child  # noqa: F401  # lazy: and what the child imports, after jax as there
    except Exception:  # noqa: BLE001 - then each child imports them again and reports the error as a fresh one would
        pass
    workers: set[int] = set()
    while True:
        message, fds, _, _ = socket.recv_fds(control, 64, 4)
        if not message:  # the process that started the server closed its end, or ended
            for worker in workers:  # (their children's time then counts as the server's, and its parent's)
                os.waitpid(worker, 0)
            return 0
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            control.close()
            _work(*fds)
        workers.add(pid)
        for fd in fds:
            os.close(fd)
        for worker in list(workers):
            if os.waitpid(worker, os.WNOHANG)[0]:
                workers.discard(worker)


def _work(connection_fd: int, out: int, err: int, compiling: int | None = None) -> None:
    """In a worker: read the request, fork the child, report its exit status, kill it when asked.
    Never returns."""
    try:
        connection = socket.socket(fileno=connection_fd)
        said = b""
        while b"\n" not in said:
            data = connection.recv(1 << 16)
            if not data:  # the process that asked is gone
                return
            said += data
        line, early = said.split(b"\n", 1)  # `early`: a kill request already (a timeout while the server started)
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            connection.close()
            _child(request, out, err, compiling)
        for fd in (out, err, compiling):  # the child's only now: end of file on the pipe when it ends
            if fd is not None:
                os.close(fd)
        killed = False
        if early:
            os.kill(pid, signal.SIGKILL)
            killed = True
        while True:
            if killed:
                time.sleep(0.02)
            elif select.select([connection], [], [], 0.02)[0]:  # a kill request, or the asker's end
                with contextlib.suppress(OSError):
                    connection.recv(64)  # read: a socket closed with unread data resets, losing the status
                os.kill(pid, signal.SIGKILL)  # not reaped yet: the pid is still the child's
                killed = True
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                with contextlib.suppress(OSError):
                    connection.sendall(str(os.waitstatus_to_exitcode(status)).encode())
                break
    finally:
        os._exit(0)


def _child(request: dict, out: int, err: int, compiling: int | None) -> None:
    """In the child: become `python -m MODULE ARGS [FD]`, and end as it does (the exit code of a
    SystemExit, the traceback of an exception), without the interpreter's teardown. Never returns."""
    code = 1
    try:
        import runpy  # lazy: the child's only
        import traceback  # lazy: the child's only

        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [sys.executable, *request["args"], *([] if compiling is None else [str(compiling)])]
        sys.path.insert(0, request["cwd"])  # what `python -m` puts first
        sys.modules.pop(request["module"], None)  # runpy runs it as __main__, and warns when it is imported
        if "jax" in sys.modules:
            from jax._src import source_info_util  # lazy: jax is imported by now, or not at all

            source_info_util.register_exclusion(__file__)
        try:
            runpy._run_module_as_main(request["module"])  # type: ignore[attr-defined]  # as `-m` does
            code = 0
        except SystemExit as exc:
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:  # noqa: BLE001 - on stderr, as the interpreter says it
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    code = _serve(socket.socket(fileno=int(sys.argv[1])))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as the child does: no interpreter teardown (a quarter of a second of CPU with jax loaded)
