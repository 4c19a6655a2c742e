"""Run the verifier in a forked child with a memory cap and a time limit.

Equality saturation can grow without bound on programs the rules do not fit; an out-of-memory
abort would kill equivci itself and a runaway run would hang a CI job. The child answers with
the ModelResult; a child that runs out of time or memory becomes `unproven` with the reason.
"""

from __future__ import annotations

import dataclasses
import importlib
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
    # Not imported by the parent's `import equivci.pipeline`: a run whose results all come from
    # the memo never needs the verifier's modules.
    # lazy: numpy, the terms, the translation
    from equivci.diagnose import numeric

    numeric.JAX_FORKED = "jaxlib" in sys.modules

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
    limit = options.verify_timeout_seconds
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child, args=(send, model, manifest, captured, memo, options, os.getpid()), daemon=True)
    child.start()
    send.close()
    answer = _answer(receive, t0 + limit, on_layer)
    if answer is None:
        child.kill()
    child.join()
    if answer is None and child.exitcode in (None, -9) and time.perf_counter() - t0 >= limit:
        return _unproven(model, t0, f"the proof search exceeded its time limit ({limit:g} s, EQUIVCI_VERIFY_TIMEOUT)")
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


def _answer(receive, deadline: float, on_layer) -> tuple | None:
    """The child's answer, passing its layer progress on; None if it died or ran out of time."""
    while receive.poll(max(0.0, deadline - time.perf_counter())):
        try:
            kind, payload = receive.recv()
        except EOFError:  # the child died without answering (killed when over the memory cap)
            return None
        if kind != "layer":
            return kind, payload
        if on_layer is not None:
            on_layer(*payload)
    return None


def _unproven(model: ModelSpec, t0: float, reason: str) -> ModelResult:
    finding = Finding(None, None, "error", None, f"not proven: {reason}; the rules do not fit this program yet")
    return ModelResult(model.name, Status.UNPROVEN, time.perf_counter() - t0, LayerCounts(1, 0, 0), (finding,))
