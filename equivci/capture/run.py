"""Parent side of capture: start the child with the fake device count the mesh needs."""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from equivci.capture import partitioned, server
from equivci.capture.types import CapturedModel, LeafPlacement
from equivci.errors import EquivciError
from equivci.git import repo_root
from equivci.manifest import Manifest, ModelSpec


def child_env(num_devices: int, extra_flags: str = "") -> dict[str, str]:
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={num_devices} {extra_flags}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


def _leaves(rows: list[dict]) -> tuple[LeafPlacement, ...]:
    return tuple(
        LeafPlacement(
            path=r["path"],
            shape=tuple(r["shape"]),
            dtype=r["dtype"],
            device_slices=tuple(tuple(tuple(s) for s in dev) for dev in r["device_slices"]),
        )
        for r in rows
    )


def _stop(proc: server.ServedChild) -> None:
    proc.kill()
    proc.wait()


def _how(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = ", which is what the kernel does when memory runs out" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    return f"exit code {returncode}"


def _address_space_hint() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return ""
    return (
        f" equivci runs under a `ulimit -v` (RLIMIT_AS) of {soft / 2**30:.1f} GiB, which the capture inherits; "
        "JAX and XLA reserve more address space than they use, so raise or remove that limit."
    )


def capture_model(
    model: ModelSpec,
    manifest: Manifest,
    debug: bool = False,
    memo: dict | None = None,
    on_compile: Callable[[], None] | None = None,
) -> CapturedModel:
    """`memo`: {"fingerprint", "repo_root", "cache_dir" (or None), "known": {key: loc digest or None}}
    asks the child for the content key and sources, and to stop before compiling when the key is
    known (then the result has cached=True and no HLO). `on_compile()` runs here while the child
    compiles (the result will have to be verified): work the parent can do meanwhile.
    A model given as HLO files is read here, without a child (capture/hlo_files.py)."""
    if model.hlo is not None:
        # lazy: numpy and the HLO parser, which a run of JAX models answered from the memo never needs
        from equivci.capture import hlo_files

        return hlo_files.capture_model(model, manifest, memo)
    with tempfile.TemporaryDirectory(prefix="equivci-capture-") as tmp:
        request, result_path, dump_dir = Path(tmp, "request.json"), Path(tmp, "result.json"), Path(tmp, "dump")
        fields: dict[str, object] = {"manifest": str(manifest.path), "model": model.name}
        if memo is not None:
            fields["memo"] = memo
        env = child_env(
            model.num_devices,
            f"--xla_dump_to={dump_dir} {partitioned.DUMP_FLAGS}",
        )
        env["EQUIVCI_DUMP_DIR"] = str(dump_dir)
        compiling, compiling_w = os.pipe()
        fields["spawned_at"] = time.time()
        request.write_text(json.dumps(fields))
        timeout = model.capture_timeout
        deadline = time.monotonic() + timeout
        # Output to files, not pipes: nothing the user's code prints can fill a pipe and stall
        # the child while this process waits for the compile signal.
        with open(Path(tmp, "out"), "wb") as out, open(Path(tmp, "err"), "w+b") as err:
            try:
                proc = server.start_child(
                    "equivci.capture.child",
                    [str(request), str(result_path)],
                    env=env,
                    stdout=out,
                    stderr=err,
                    cwd=str(manifest.root),
                    signal_fd=compiling_w,
                )
            finally:
                os.close(compiling_w)
            try:
                # A line when the compile starts; end of file when the child exits without one.
                if select.select([compiling], [], [], timeout)[0] and os.read(compiling, 64) and on_compile:
                    on_compile()
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired as exc:
                _stop(proc)
                raise EquivciError(
                    f"capturing model '{model.name}' took longer than {timeout:g} s and was stopped; "
                    "check that inputs() returns jax.ShapeDtypeStruct leaves (no real arrays) and that the "
                    "entrypoints do no work at import time, or allow more time with `capture_timeout:` "
                    "on the model in the manifest or --capture-timeout SECONDS."
                ) from exc
            except BaseException:  # interrupted (Ctrl-C, SIGTERM): no child left writing into the folder
                _stop(proc)
                raise
            finally:
                os.close(compiling)
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        if not result_path.exists():
            tail = "\n".join(stderr.strip().splitlines()[-5:])
            said = f"its last output was:\n{tail}" if tail else "it printed nothing on stderr"
            raise EquivciError(
                f"the capture process for model '{model.name}' ended ({_how(proc.returncode)}) before "
                f"reporting; {said}.{_address_space_hint()} Run `equivci dump --model {model.name} --debug` to see it fail."
            )
        try:
            result = json.loads(result_path.read_text())
        except (OSError, ValueError) as exc:
            raise EquivciError(
                f"the capture process for model '{model.name}' left an answer that cannot be read ({exc}); "
                f"check the free space of the temporary folder {Path(tmp).parent}."
            ) from None
    if "error" in result:
        message = result["error"]
        if any(
            sign in message
            for sign in (
                "MemoryError",
                "bad_alloc",
                "pthread_create",
                "can't start new thread",  # Python's word for a pthread_create that failed
                "Cannot allocate memory",
                "Resource temporarily unavailable",
            )
        ):
            message += _address_space_hint()
        if debug:
            message += "\n\n" + result.get("traceback", "")
        raise EquivciError(message)
    cached = bool(result.get("cached"))
    return CapturedModel(
        name=model.name,
        mesh=model.mesh,
        reference_hlo="" if cached else result["reference_hlo"],
        distributed_hlo="" if cached else result["distributed_hlo"],
        inputs=() if cached else _leaves(result["inputs"]),
        outputs=() if cached else _leaves(result["outputs"]),
        repo_root=str(repo_root(manifest.root)),
        timings=tuple((str(stage), float(seconds)) for stage, seconds in result.get("timings", ())),
        content_key=result.get("content_key", ""),
        loc_digest=result.get("loc_digest", ""),
        sources=tuple(result.get("sources", ())),
        cached=cached,
        partitioned_early=bool(result.get("partitioned_early")),
    )
