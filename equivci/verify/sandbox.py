"""Run the verifier in a forked child with a memory cap and a time limit.

Equality saturation can grow without bound on programs the rules do not fit; an out-of-memory
abort would kill equivci itself and a runaway run would hang a CI job. The child answers with
the ModelResult; a child that runs out of time or memory becomes `unproven` with the reason.

The time limit counts the child's CPU time (user + system, RLIMIT_CPU), not the wall clock: other
jobs on the same cores slow a proof in wall time only, and a verdict must not depend on how busy
the machine is. The wall clock bounds only a child that stops running: one whose CPU time does not
advance for longer than any wait of the verifier lasts (a hang; on Linux, where /proc shows it).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import multiprocessing
import os
import resource
import signal
import sys
import time
import traceback

from equivci.capture.types import CapturedModel
from equivci.errors import EquivciError
from equivci.manifest import Manifest, ModelSpec
from equivci.options import Options
from equivci.results import Finding, LayerCounts, ModelResult, Status

# Wall seconds, past the longest the verifier waits for another process (its numeric check's time
# limit) or its own CPU limit, that a child may use no CPU time at all before it is taken as stalled:
# a busy machine slows a runnable process, it does not stop it for a minute.
STALL_MARGIN = 60.0
# Seconds of CPU past the limit (SIGXCPU, which ends the child) at which the kernel sends SIGKILL.
_CPU_GRACE = 5


class VerifierCrash(RuntimeError):
    """An exception inside the verifier child, with its type name and traceback for --debug."""

    def __init__(self, type_name: str, message: str, child_traceback: str):
        super().__init__(message)
        self.type_name = type_name
        self.child_traceback = child_traceback

    def __str__(self) -> str:
        return f"{super().__str__()}\n\nin the verifier process:\n{self.child_traceback}"


def memory_cap(wanted: int) -> tuple[int, str]:
    """The child's address-space cap and what set it: EQUIVCI_VERIFY_MEMORY (`wanted`, default ¾ of
    RAM), or a lower `ulimit -v` equivci itself runs under, which no child may exceed."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        return (
            soft,
            f"the `ulimit -v` (RLIMIT_AS) equivci runs under, below EQUIVCI_VERIFY_MEMORY's {wanted / 2**30:.1f} GiB",
        )
    return wanted, "EQUIVCI_VERIFY_MEMORY"


def cpu_cap(wanted: float) -> tuple[int, str]:
    """The child's CPU-time limit in whole seconds (RLIMIT_CPU counts whole seconds; `wanted` is
    rounded up) and what set it: EQUIVCI_VERIFY_TIMEOUT, or a lower `ulimit -t` equivci runs under."""
    seconds = max(1, math.ceil(wanted))
    soft, _hard = resource.getrlimit(resource.RLIMIT_CPU)
    if soft != resource.RLIM_INFINITY and soft < seconds:
        return soft, f"the `ulimit -t` (RLIMIT_CPU) equivci runs under, below EQUIVCI_VERIFY_TIMEOUT's {seconds} s"
    return seconds, "EQUIVCI_VERIFY_TIMEOUT"


def _limit_cpu(seconds: int) -> None:
    """End this process with SIGXCPU once it has used `seconds` of CPU (a fork starts at zero), and
    with SIGKILL shortly after should that not end it; no core file."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    ceiling = seconds + _CPU_GRACE if hard == resource.RLIM_INFINITY else min(hard, seconds + _CPU_GRACE)
    resource.setrlimit(resource.RLIMIT_CPU, (min(seconds, ceiling), ceiling))
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)


def _die_with_parent(parent: int) -> None:
    """End this child when its parent ends, however it ends: a verify killed by a CI timeout or a
    scorer's SIGKILL never tells a fork-context child (daemon children only die on a clean exit),
    which would go on proving, and hold the capture server's control socket open, for minutes."""
    if sys.platform.startswith("linux"):
        import ctypes  # lazy: the child's only

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent ended before the request took effect
        os._exit(1)


def _child(
    conn, model: ModelSpec, manifest: Manifest, captured: CapturedModel, memo, options: Options, parent: int
) -> None:
    _die_with_parent(parent)
    cap, _ = memory_cap(options.verify_memory_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    _limit_cpu(cpu_cap(options.verify_timeout_seconds)[0])

    def layer_done(done: int, total: int) -> None:
        conn.send(("layer", (done, total)))

    try:
        t0 = time.perf_counter()
        engine = importlib.import_module("equivci.verify.engine")  # inside: a broken install is reported too
        imported = (("import the verifier", time.perf_counter() - t0),)

        def answer(result: ModelResult) -> None:
            conn.send(("ok", dataclasses.replace(result, timings=imported + result.timings)))
            conn.close()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)

        _at_return(engine.verify_model, answer)
        answer(
            engine.verify_model(
                model, manifest, captured, memo, layer_done, options.saturation_iterations, options.budgets
            )
        )
    except EquivciError as err:
        conn.send(("user", str(err)))
    except MemoryError:
        conn.send(("memory", ""))
    except BaseException as exc:  # reported to the parent, which decides (internal error or --debug)
        conn.send(("internal", (type(exc).__name__, str(exc), traceback.format_exc())))
    finally:
        conn.close()


def _at_return(function, callback) -> None:
    """Call `callback(value)` when `function` returns `value`, before its frame lets go of its
    locals. The verifier's terms, tables and e-graphs are millions of objects, whose freeing one by
    one took 0.8 s at 405B shapes before the answer could be sent; the child ends in `callback`,
    and the exit frees them at once. Where no monitoring tool id is free (a debugger or profiler
    holds them), the answer is sent after the return, as before."""
    monitoring = sys.monitoring
    for tool in (3, 4):  # the ids Python leaves free of debuggers, coverage, profilers and optimizers
        try:
            monitoring.use_tool_id(tool, "equivci")
        except ValueError:
            continue
        monitoring.register_callback(tool, monitoring.events.PY_RETURN, lambda code, offset, value: callback(value))
        monitoring.set_local_events(tool, function.__code__, monitoring.events.PY_RETURN)
        return


def verify_isolated(
    model: ModelSpec,
    manifest: Manifest,
    captured: CapturedModel,
    memo=None,
    on_layer=None,
    options: Options | None = None,
) -> ModelResult:
    """verify_model in a child with the time and memory limits of `options` (default: from the
    environment); layer proofs go through `memo` (an equivci.cache.Memo; the child writes new
    ones to its folder); `on_layer(done, total)` as the child proves layers."""
    options = options or Options.from_env()
    limit, limit_source = cpu_cap(options.verify_timeout_seconds)
    stall = max(limit, options.budgets.oracle_timeout_seconds) + STALL_MARGIN
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(send, model, manifest, captured, memo, options, os.getpid()), daemon=True)
    child.start()
    send.close()
    assert child.pid is not None  # set by start()
    answer, used = _answer(receive, child.pid, stall, on_layer)
    if answer is None:
        child.kill()
    child.join()
    raise_it = (
        f"set EQUIVCI_VERIFY_TIMEOUT={2 * limit} to raise it"
        if limit_source == "EQUIVCI_VERIFY_TIMEOUT"
        else "raise that `ulimit -t` to raise it"
    )
    if answer is None and child.exitcode == -signal.SIGXCPU:
        return _unproven(
            model, t0, f"the proof search exceeded its time limit of {limit} s of CPU time ({limit_source}); {raise_it}"
        )
    if answer is None and used is not None:
        return _unproven(
            model,
            t0,
            f"the proof search stalled: it used no CPU time for {stall:g} s of wall time, after {used:.1f} s of "
            f"its limit of {limit} s of CPU time ({limit_source}), waiting on something that never came; "
            "this is a bug in equivci, rerun with --debug and report it",
        )
    if answer is None or answer[0] == "memory":
        cap, source = memory_cap(options.verify_memory_bytes)
        return _unproven(
            model,
            t0,
            f"the proof search ran out of memory or crashed (exit code {child.exitcode}; "
            f"memory cap {cap / 2**30:.1f} GiB, {source})",
        )
    kind, payload = answer
    if kind == "ok":
        return payload
    if kind == "user":
        raise EquivciError(payload)
    raise VerifierCrash(*payload)


def _answer(receive, pid: int, stall: float, on_layer) -> tuple[tuple | None, float | None]:
    """(the child's answer, None), passing its layer progress on; (None, None) if it died (killed
    when over its CPU limit or memory cap), (None, its CPU seconds) if it stalled: its CPU time did
    not advance for `stall` seconds of wall time."""
    used, since = _cpu_seconds(pid), time.perf_counter()
    while True:
        if not receive.poll(1.0):
            now = _cpu_seconds(pid)
            if now is None or now != used:
                used, since = now, time.perf_counter()
            elif time.perf_counter() - since >= stall:
                return None, used
            continue
        try:
            kind, payload = receive.recv()
        except EOFError:  # the child died without answering
            return None, None
        if kind != "layer":
            return (kind, payload), None
        if on_layer is not None:
            on_layer(*payload)


def _cpu_seconds(pid: int) -> float | None:
    """The user + system CPU time of process `pid` so far, from /proc (Linux); None elsewhere, where
    only the CPU limit ends a child."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _unproven(model: ModelSpec, t0: float, reason: str) -> ModelResult:
    finding = Finding(None, None, "error", None, f"not proven: {reason}; the rules do not fit this program yet")
    return ModelResult(
        model.name, Status.UNPROVEN, time.perf_counter() - t0, LayerCounts(1, 0, 0), (finding,), limited=True
    )
