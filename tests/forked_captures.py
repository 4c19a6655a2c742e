"""Captures for the tests and bench scripts, from one process that has imported jax once.

`equivci.capture.run.capture_model` starts `python -m equivci.capture.child` for every model; on a
small test model, starting Python and importing jax is about three quarters of the capture. Here a
server process imports jax once, without starting its backend (XLA reads XLA_FLAGS, the fake device
count and the dump folder, when the backend starts), and for each capture forks a worker that calls
the product's own `capture_model`, whose child is a fork of the worker running `python -m
equivci.capture.child` through runpy, in the folder and environment `capture_model` gives it.
The captured programs are the product's, byte for byte: the frames above `runpy` (this file and
`capture/run.py`) are kept out of JAX's source locations, so the stacks are a fresh child's.

Each capture runs in the environment of the process that asks (os.environ when it asks). The server
imported jax under the environment of the first request; a request under another one (a test that
changed a variable jax may read at import) restarts it, except for PYTEST_CURRENT_TEST, which pytest
changes at every test and jax never reads.

    python tests/forked_captures.py      # the server: requests on stdin, one JSON line per batch
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import equivci.capture.run as capture_run
from equivci.capture.types import CapturedModel
from equivci.manifest import Manifest, ModelSpec

_server: dict = {}  # "proc", "env", "folder": the running server of this process
_PER_TEST = "PYTEST_CURRENT_TEST"


def capture_all(jobs: list[tuple[ModelSpec, Manifest]], workers: int = 1) -> list[CapturedModel]:
    """capture_model(model, manifest) of each job, `workers` at a time; a capture error is raised as
    capture_model raises it."""
    if not jobs:
        return []
    proc, folder = _running_server()
    batch = []
    for k, job in enumerate(jobs):
        request = Path(tempfile.mkstemp(dir=folder, suffix=".job")[1])
        request.write_bytes(pickle.dumps((*job, os.getcwd(), dict(os.environ))))
        batch.append({"request": str(request), "result": f"{request}.result"})
    proc.stdin.write(json.dumps({"jobs": batch, "workers": workers}) + "\n")
    proc.stdin.flush()
    if not proc.stdout.readline():
        _server.clear()
        raise RuntimeError("the capture server ended without an answer (its error is on stderr above)")
    results = []
    for job in batch:
        path = Path(job["result"])
        if not path.exists():
            raise RuntimeError(f"the capture worker for {job['request']} died without an answer")
        outcome = pickle.loads(path.read_bytes())
        path.unlink()
        Path(job["request"]).unlink()
        if isinstance(outcome, BaseException):
            raise outcome
        results.append(outcome)
    return results


def capture(model: ModelSpec, manifest: Manifest) -> CapturedModel:
    return capture_all([(model, manifest)])[0]


def _running_server() -> tuple[subprocess.Popen, Path]:
    env = {k: v for k, v in os.environ.items() if k != _PER_TEST}
    if _server and (_server["env"] != env or _server["proc"].poll() is not None):
        _stop_server()
    if not _server:
        folder = Path(tempfile.mkdtemp(prefix="equivci-forked-captures-"))
        proc = subprocess.Popen(
            [sys.executable, "-P", __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=folder,
        )
        _server.update(proc=proc, env=env, folder=folder)
    return _server["proc"], _server["folder"]


@atexit.register
def _stop_server() -> None:
    if _server:
        proc = _server["proc"]
        with contextlib.suppress(OSError):
            proc.stdin.close()  # end of input: the server exits
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for path in Path(_server["folder"]).iterdir():
            path.unlink()
        Path(_server["folder"]).rmdir()
        _server.clear()


# -- the server side -----------------------------------------------------------------------------------
class _ForkedChild:
    """subprocess.Popen as `equivci.capture.run` uses it, for `python -m equivci.capture.child ARGS`: a
    fork of this process runs the module as `python -m` does (runpy), in the working folder,
    environment and standard streams it was given."""

    def __init__(self, argv: list[str], *, env: dict, stdout, stderr, cwd, pass_fds=()) -> None:
        if argv[1:3] != ["-m", "equivci.capture.child"]:
            raise ValueError(f"only the capture child starts by fork: {argv}")
        import runpy

        from jax._src import source_info_util

        self.args, self.returncode = argv, None
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.dup2(stdout.fileno(), 1)
                os.dup2(stderr.fileno(), 2)
                os.chdir(cwd)
                os.environ.clear()
                os.environ.update(env)
                sys.argv = [argv[0], *argv[3:]]
                sys.path.insert(0, str(cwd))  # what `python -m` puts first
                for frames_above_runpy in (__file__, capture_run.__file__):
                    source_info_util.register_exclusion(frames_above_runpy)
                runpy._run_module_as_main("equivci.capture.child")  # ends the process (os._exit)
            finally:
                os._exit(1)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            else:
                time.sleep(0.02)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, 9)


def _work(request: Path, result: Path) -> None:
    """In a worker: one capture_model call, its CapturedModel or its error pickled to `result`."""
    model, manifest, cwd, env = pickle.loads(request.read_bytes())
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)  # capture_model gives its child a copy
    try:
        outcome: object = capture_run.capture_model(model, manifest)
    except Exception as exc:  # noqa: BLE001 - raised again in the process that asked
        outcome = exc
    result.write_bytes(pickle.dumps(outcome))


def _serve() -> int:
    os.environ["JAX_PLATFORMS"] = "cpu"  # as capture.run.child_env sets it for every child; jax reads it at import
    import jax  # noqa: F401 - imported once for every capture; each child starts its own backend

    import equivci.capture.child  # noqa: F401 - and what the child imports

    capture_run.subprocess = types.SimpleNamespace(Popen=_ForkedChild, TimeoutExpired=subprocess.TimeoutExpired)
    for line in sys.stdin:
        spec = json.loads(line)
        waiting, running = list(spec["jobs"]), set()
        while waiting or running:
            while waiting and len(running) < spec["workers"]:
                job = waiting.pop(0)
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    try:
                        _work(Path(job["request"]), Path(job["result"]))
                    finally:
                        sys.stderr.flush()
                        os._exit(0)
                running.add(pid)
            running.discard(os.wait()[0])
        print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_serve())
