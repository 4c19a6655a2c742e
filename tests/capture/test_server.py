"""The capture server (equivci/capture/server.py): a capture forked from it is a fresh capture child's
(the same HLO text, source locations and stack frames included, leaves and flags), a numeric check
forked from it is a fresh oracle child's (the same comparison, field for field), and a model's
side effects, crash or hang stay that model's."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import model_package
import pytest

from equivci.capture import oracle, run, server
from equivci.capture.oracle import compare_many_in_child
from equivci.capture.run import capture_model
from equivci.errors import EquivciError
from equivci.manifest import load_manifest
from equivci.testing.zoo import REPO

NEAR_MISS = REPO / "tests/soundness/near_miss.yaml"
PRECISION = REPO / "tests/data/precision/equivci.yaml"


def _fields(captured) -> dict:
    return {f.name: getattr(captured, f.name) for f in dataclasses.fields(captured) if f.name != "timings"}


def _fresh_child(module, args, *, env, stdout, stderr, cwd, signal_fd=None):
    """What capture_model and the oracle started before the server: `python -m MODULE` of its own."""
    fds = () if signal_fd is None else (signal_fd,)
    return subprocess.Popen(
        [sys.executable, "-m", module, *args, *map(str, fds)],
        env=env, stdout=stdout, stderr=stderr, cwd=cwd, pass_fds=fds,
    )


def test_a_served_capture_is_a_fresh_capture(monkeypatch):
    manifest = load_manifest(NEAR_MISS)
    # one model partitioned in the capture's compile (jit's SPMD dump read back), one not; 2 and 1 devices
    models = [m for m in manifest.models if m.name in ("embed-gt-drops-first", "concat-straddle")]
    with ThreadPoolExecutor(2) as pool:  # two at once from one server
        served = list(pool.map(lambda m: capture_model(m, manifest), models))
    first = server._server["proc"].pid
    with monkeypatch.context() as patched:
        patched.setattr(run.server, "start_child", _fresh_child)
        fresh = [capture_model(m, manifest) for m in models]
    assert {c.partitioned_early for c in fresh} == {True, False}
    for a, b in zip(served, fresh):
        assert _fields(a) == _fields(b), a.name
    # another environment: a server started under it (jax reads some variables at import)
    monkeypatch.setenv("EQUIVCI_SERVER_TEST", "1")
    again = capture_model(models[0], manifest)
    assert server._server["proc"].pid != first and _fields(again) == _fields(fresh[0])


def test_a_served_numeric_check_is_a_fresh_one(monkeypatch):
    """The oracle's comparisons are the same, bit for bit, from the server as from a fresh `python -m
    equivci.capture.oracle`: its device count (2 for the near miss, 4 for the bf16 models) and the
    precision flag reach XLA in the child, and the seeded draws are the same."""
    cases = [
        (NEAR_MISS, ["embed-gt-drops-first"]),  # a mismatch near miss
        (PRECISION, ["bf16-mlp-tp", "bf16-mlp-tp-wrong-shard"]),  # bf16: agrees within rounding / differs
    ]
    served = [compare_many_in_child(path, names, seeds=(0, 1)) for path, names in cases]
    assert server._server, "the numeric check did not go through the server"
    with monkeypatch.context() as patched:
        patched.setattr(oracle.server, "start_child", _fresh_child)
        fresh = [compare_many_in_child(path, names, seeds=(0, 1)) for path, names in cases]
    near_miss, precision = served
    assert not near_miss["embed-gt-drops-first"].equal
    assert precision["bf16-mlp-tp"].equal and not precision["bf16-mlp-tp-wrong-shard"].equal
    assert precision["bf16-mlp-tp"].precision == "bfloat16" and precision["bf16-mlp-tp"].max_abs_diff > 0
    for a, b in zip(served, fresh):
        assert {n: r.to_json() for n, r in a.items()} == {n: r.to_json() for n, r in b.items()}


MODELS = textwrap.dedent(
    """\
    import os
    import signal
    import time

    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import shared

    shared.IMPORTS += 1


    def inputs():
        return (jax.ShapeDtypeStruct((8, 16), jnp.float32),)


    def clean_inputs():
        # what an earlier model's capture did must not be seen here
        assert shared.IMPORTS == 1 and "EQUIVCI_LEAKED" not in os.environ and not jax.config.jax_enable_x64
        return inputs()


    def leaky_inputs():
        os.environ["EQUIVCI_LEAKED"] = "1"
        jax.config.update("jax_enable_x64", True)
        return inputs()


    def crash_inputs():
        os.kill(os.getpid(), signal.SIGSEGV)


    def exit_inputs():
        raise SystemExit(3)


    def hang_inputs():
        with open("hang.pid", "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)


    def reference(x):
        return jnp.sin(x) * 2


    def distributed(x, *, mesh):
        body = lambda x: jnp.sin(x) * 2
        return jax.shard_map(body, mesh=mesh, in_specs=P("tp"), out_specs=P("tp"))(x)
    """
)


def _entry(name: str, inputs: str, tp: int, extra: str = "") -> str:
    return (f"  - {{name: {name}, reference: m.py:reference, distributed: m.py:distributed, "
            f"inputs: m.py:{inputs}, mesh: {{tp: {tp}}}{extra}}}\n")


MANIFEST = "version: 1\nmodels:\n" + "".join([
    _entry("leaky", "leaky_inputs", 2),
    _entry("clean", "clean_inputs", 4),
    _entry("crash", "crash_inputs", 2),
    _entry("hang", "hang_inputs", 2, ", capture_timeout: 3"),
    _entry("exit", "exit_inputs", 2),
])


def test_a_model_s_side_effects_crash_and_hang_stay_its_own(tmp_path):
    (tmp_path / "shared.py").write_text("IMPORTS = 0\n")
    manifest = model_package.write_package(tmp_path, "m.py", MODELS, MANIFEST)
    model = {m.name: m for m in manifest.models}
    assert capture_model(model["leaky"], manifest).inputs[0].device_slices == (((0, 4), (0, 16)), ((4, 8), (0, 16)))
    with pytest.raises(EquivciError, match="killed by SIGSEGV"):
        capture_model(model["crash"], manifest)
    with pytest.raises(EquivciError, match="longer than 3 s"):
        capture_model(model["hang"], manifest)
    pid = int((tmp_path / "hang.pid").read_text())
    with pytest.raises(ProcessLookupError):  # killed and reaped before capture_model raised
        os.kill(pid, 0)
    # the same server, unharmed: a model after them sees none of it, on its own device count
    served_by = server._server["proc"].pid
    clean = capture_model(model["clean"], manifest)
    assert server._server["proc"].pid == served_by
    assert [len(leaf.device_slices) for leaf in clean.inputs] == [4]
    assert "f32[2,16]" in clean.distributed_hlo
    # the numeric check: a child of the same server (one per run), which sees none of it either
    assert compare_many_in_child(manifest.path, ["clean"])["clean"].equal
    assert server._server["proc"].pid == served_by


def test_a_numeric_check_s_crash_exit_and_hang_are_reported_as_a_fresh_child_s(tmp_path):
    (tmp_path / "shared.py").write_text("IMPORTS = 0\n")
    manifest = model_package.write_package(tmp_path, "m.py", MODELS, MANIFEST)
    crash = compare_many_in_child(manifest.path, ["crash"])["crash"]
    assert isinstance(crash, EquivciError) and "exited with code -11 before reporting 'crash'" in str(crash)
    exited = compare_many_in_child(manifest.path, ["exit"])["exit"]
    assert isinstance(exited, EquivciError) and "exited with code 3 before reporting 'exit'" in str(exited)
    hang = compare_many_in_child(manifest.path, ["hang"], timeout=3)["hang"]
    assert isinstance(hang, EquivciError) and "did not finish within 3 s" in str(hang)
    with pytest.raises(ProcessLookupError):  # killed and reaped before the check returned
        os.kill(int((tmp_path / "hang.pid").read_text()), 0)


def test_the_server_ends_with_the_process_that_started_it(tmp_path):
    """A process that captured and exited (killed, no clean-up) leaves no server behind."""
    probe = textwrap.dedent(
        f"""\
        import os, sys
        from equivci.capture import run
        from equivci.manifest import load_manifest
        manifest = load_manifest({str(NEAR_MISS)!r})
        run.capture_model(next(m for m in manifest.models if m.name == "concat-straddle"), manifest)
        print(run.server._server["proc"].pid, flush=True)
        os._exit(0)  # no atexit: the kernel closes the server's control socket
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":  # ended, not yet reaped by init
            return
        time.sleep(0.1)
    raise AssertionError(f"the capture server {pid} outlived the process that started it")
