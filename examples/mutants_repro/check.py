"""Run both programs of each model in equivci.yaml on inputs that hold the integer ids the
numeric oracle never draws (it draws ids below min(64, smallest float dim)): the outputs differ.

    ../../.venv/bin/python check.py
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # before jax starts
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from equivci.capture import entrypoints  # noqa: E402
from equivci.capture.oracle import compare_outputs, random_inputs  # noqa: E402
from equivci.manifest import load_manifest  # noqa: E402

# Valid indices at which the narrowed copy wraps negative (int8: 128, int16: 32768).
IDS = {"narrowed-id-mask": [128], "xent-tp-int16-ignore-index": [5, 100, 16500, 32768]}


def main() -> int:
    manifest = load_manifest(HERE / "equivci.yaml")
    os.chdir(HERE)
    differs = 0
    for model in manifest.models:
        loaded = entrypoints.load_model(model, manifest.root)
        floats, _ = random_inputs(loaded.args, 0)
        args = (floats, jnp.asarray(IDS[model.name], dtype=jnp.int32))
        ref = {0: jax.device_get(jax.jit(loaded.reference)(*args))}
        with jax.set_mesh(loaded.mesh):
            dist = {0: jax.device_get(jax.jit(loaded.distributed)(*args))}
        result = compare_outputs(ref, dist, (0,))
        differs += not result.equal
        print(f"{model.name}: ids {IDS[model.name]}: {result.describe()}")
    return 0 if differs == len(manifest.models) else 1


if __name__ == "__main__":
    sys.exit(main())
