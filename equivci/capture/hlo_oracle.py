"""The numeric check of a model given as HLO files (`kind: hlo`): both programs as the capture
rewrote them (capture/hlo_files.py) compiled by XLA for fake CPU devices and run on the same random
inputs, in a child process that has the device count the mesh needs.

The distributed program is run as N replicas of the per-device program (XLA's CPU backend runs
several partitions only through its own SPMD partitioner), so its device index is read from
`replica-id`. Each device's output blocks are compared with the same blocks of the reference's
outputs, by the oracle's comparison (capture/oracle.py): a difference beyond rounding on any
device is a counterexample.

Runs as `python -m equivci.capture.hlo_oracle REQUEST.json RESULT.json`, forked by the capture
server (server.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from equivci.capture import server
from equivci.capture.oracle import (
    DEFAULT_SEEDS,
    NumericComparison,
    Ranges,
    compare_outputs,
    random_inputs,
    tolerance_for,
)
from equivci.capture.run import child_env
from equivci.capture.types import CapturedModel, LeafPlacement
from equivci.errors import EquivciError
from equivci.options import Budgets


def compare_hlo_in_child(
    captured: CapturedModel,
    ranges: Ranges | None = None,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    timeout: float = Budgets.oracle_timeout_seconds,
) -> NumericComparison:
    """`ranges`: input index -> [lo, hi), for integer inputs the proof took to be valid indices."""
    with tempfile.TemporaryDirectory(prefix="equivci-hlo-oracle-") as tmp:
        request, result = Path(tmp, "request.json"), Path(tmp, "result.json")
        request.write_text(
            json.dumps(
                {
                    "reference": captured.reference_hlo,
                    "distributed": captured.distributed_hlo,
                    "inputs": [_leaf(x) for x in captured.inputs],
                    "outputs": [_leaf(x) for x in captured.outputs],
                    "devices": captured.num_devices,
                    "seeds": list(seeds),
                    "ranges": {str(k): list(r) for k, r in (ranges or {}).items()},
                }
            )
        )
        try:
            child = server.run(
                "equivci.capture.hlo_oracle",
                [str(request), str(result)],
                env=child_env(captured.num_devices),
                cwd=os.getcwd(),
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise EquivciError(f"running the HLO programs on random inputs took longer than {timeout:g} s") from None
        if not result.exists():
            tail = (child.stderr.strip().splitlines() or ["no message"])[-1]
            raise EquivciError(f"running the HLO programs on random inputs failed ({tail})")
        answer = json.loads(result.read_text())
    if "error" in answer:
        raise EquivciError(answer["error"])
    return NumericComparison.from_json(answer["comparison"])


def _leaf(leaf: LeafPlacement) -> dict:
    return {
        "path": leaf.path,
        "shape": list(leaf.shape),
        "dtype": leaf.dtype,
        "device_slices": [[list(s) for s in dev] for dev in leaf.device_slices],
    }


def _run(request: dict) -> NumericComparison:
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax
    import jax._src.lib as jaxlib
    from jax._src import xla_bridge
    from jax._src.lib import xla_client
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    backend = xla_bridge.get_backend("cpu")
    n = request["devices"]
    devices = jax.devices()[:n]

    def compile_(text: str, replicas: int):
        proto = jaxlib.hlo.hlo_module_from_text(text).as_serialized_hlo_module_proto()
        options = xla_client.CompileOptions()
        build = options.executable_build_options
        build.num_replicas, build.num_partitions = replicas, 1
        build.device_assignment = xla_client.DeviceAssignment.create(np.arange(replicas).reshape(replicas, 1))
        module = xla_client._xla.mlir.hlo_to_stablehlo(proto)
        return backend.compile_and_load(module, xla_client._xla.DeviceList(tuple(devices[:replicas])), options)

    def run(executable, per_device: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
        """Per output, per device: the values, from per-device arguments (any values per device:
        the replicated sharding only carries the buffers)."""
        count = len(per_device)
        mesh = Mesh(np.array(devices[:count]), ("d",))
        args = [
            jax.make_array_from_single_device_arrays(
                np.shape(per_device[0][k]),
                NamedSharding(mesh, PartitionSpec()),
                [jax.device_put(per_device[d][k], devices[d]) for d in range(count)],
            )
            for k in range(len(per_device[0]))
        ]
        outs = executable.execute_sharded(args).disassemble_into_single_device_arrays()
        return [[np.asarray(x) for x in out] for out in outs]

    reference = compile_(request["reference"], 1)
    # Run as replicas: the device index is the replica id, and a `replica-id` the program reads
    # is 0, as in an SPMD program of one replica (and as the verifier reads it).
    distributed = compile_(
        request["distributed"].replace("replica-id()", "constant(0)").replace("partition-id()", "replica-id()"), n
    )
    inputs, outputs = request["inputs"], request["outputs"]
    abstract = [
        jax.ShapeDtypeStruct(
            tuple(x["shape"]), np.dtype(x["dtype"]) if x["dtype"] != "bfloat16" else jax.numpy.bfloat16
        )
        for x in inputs
    ]
    ranges = {int(k): (int(lo), int(hi)) for k, (lo, hi) in request["ranges"].items()}
    ref_outs: dict[int, dict[str, np.ndarray]] = {}
    dist_outs: dict[int, dict[str, np.ndarray]] = {}
    for seed in request["seeds"]:
        args = [np.asarray(a) for a in random_inputs(abstract, seed, ranges)]
        ref = [values[0] for values in run(reference, [args])]
        blocks = [
            [a[tuple(slice(lo, hi) for lo, hi in x["device_slices"][d])] for a, x in zip(args, inputs)]
            for d in range(n)
        ]
        dist = run(distributed, blocks)
        ref_outs[seed], dist_outs[seed] = {}, {}
        for k, leaf in enumerate(outputs):
            for d in range(n):
                name = f"{leaf['path']} on device {d}"
                ref_outs[seed][name] = ref[k][tuple(slice(lo, hi) for lo, hi in leaf["device_slices"][d])]
                dist_outs[seed][name] = dist[k][d]
    return compare_outputs(
        ref_outs,
        dist_outs,
        request["seeds"],
        tolerance=tolerance_for(_narrowest_float(request["reference"] + request["distributed"])),
    )


# Float types, narrowest first, as HLO prints them, with their numpy names.
FLOATS = (
    ("f8e", "float8_e4m3fn"),
    ("bf16[", "bfloat16"),
    ("f16[", "float16"),
    ("f32[", "float32"),
    ("f64[", "float64"),
)


def _narrowest_float(text: str) -> str:
    """The narrowest float type the programs compute in: a correct program that computes in bf16
    moves an f32 output by bf16 roundings, so the tolerance is bf16's (the JAX oracle measures
    this by re-rounding; here the programs are only run)."""
    return next((name for token, name in FLOATS if token in text), "float32")


def main(argv: list[str]) -> int:
    request_path, result_path = argv
    request = json.loads(Path(request_path).read_text())
    answer: dict[str, object]
    try:
        answer = {"comparison": _run(request).to_json()}
    except Exception as exc:  # noqa: BLE001 - XLA's errors have no common type; the parent says the check did not run
        answer = {
            "error": f"XLA could not run the HLO programs: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
        }
    Path(result_path).write_text(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
