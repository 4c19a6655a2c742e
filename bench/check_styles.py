"""Numeric check of the benchmark's implementation styles: every style's distributed program,
run on a fake CPU mesh at a tiny size (bench/styles/kit.py: TINY) on random float32 inputs,
must give its reference's outputs up to float32 rounding (the sums across shards re-associate).

    python bench/check_styles.py                 # all styles; exit 1 if any differs
    python bench/check_styles.py --styles scan,moe_ep
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE / "styles")]

from run_bench import STYLES  # noqa: E402

# Fake devices exist only if set before JAX starts.
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={max(math.prod(s.mesh.values()) for s in STYLES.values())}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, Mesh  # noqa: E402
from kit import TINY  # noqa: E402

RELATIVE_TOLERANCE = 1e-4


def programs(name: str):
    """(reference, distributed, inputs) of a style, each taking the Config first."""
    module = importlib.import_module(Path(STYLES[name].file).stem)
    if name == "llama_tp":  # the original benchmark model: entrypoints per shape, no style protocol
        return (module.decoder, lambda cfg, *a, mesh: module.decoder_tp(cfg, *a, mesh),
                lambda cfg, dtype: module.model_inputs(cfg, module.layer_shapes(cfg, dtype), dtype))
    if name == "train_step":  # the gradients: in the updated weights, the weights' own rounding hides them
        from llama_tp import decoder, decoder_tp

        return (lambda cfg, *a: module.loss_and_grads(lambda x, p: decoder(cfg, x, p), *a),
                lambda cfg, *a, mesh: module.loss_and_grads(lambda x, p: decoder_tp(cfg, x, p, mesh), *a),
                module.inputs)
    return module.reference, module.distributed, module.inputs


def random_like(spec, key, vocab: int):
    if jnp.issubdtype(spec.dtype, jnp.integer):  # token ids
        return jax.random.randint(key, spec.shape, 0, vocab, spec.dtype)
    if spec.ndim == 1:  # norm weights, around 1
        return 1.0 + 0.1 * jax.random.normal(key, spec.shape, spec.dtype)
    fan_in = spec.shape[-2] if spec.ndim > 2 else spec.shape[0]
    return jax.random.normal(key, spec.shape, spec.dtype) / np.sqrt(fan_in)


def check(name: str) -> float:
    """The largest difference between the two programs' outputs, relative to the largest output."""
    reference, distributed, inputs = programs(name)
    specs = inputs(TINY, jnp.float32)
    leaves, tree = jax.tree.flatten(specs)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    args = jax.tree.unflatten(tree, [random_like(s, k, TINY.vocab) for s, k in zip(leaves, keys, strict=True)])
    shape = STYLES[name].mesh
    devices = np.array(jax.devices()[: math.prod(shape.values())]).reshape(tuple(shape.values()))
    mesh = Mesh(devices, tuple(shape), axis_types=(AxisType.Auto,) * len(shape))
    want = jax.jit(lambda *a: reference(TINY, *a))(*args)
    with jax.set_mesh(mesh):
        got = jax.jit(lambda *a: distributed(TINY, *a, mesh=mesh))(*args)
    worst = 0.0
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
        w, g = np.asarray(w, np.float64), np.asarray(g, np.float64)
        assert w.shape == g.shape, f"{name}: output shapes differ: {w.shape} vs {g.shape}"
        worst = max(worst, float(np.max(np.abs(w - g)) / max(np.max(np.abs(w)), 1e-30)))
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--styles", default=",".join(STYLES))
    names = [n for n in ap.parse_args().styles.split(",") if n]
    failed = []
    for name in names:
        worst = check(name)
        ok = worst <= RELATIVE_TOLERANCE
        print(f"{name:10} max |distributed - reference| / max |reference| = {worst:.2e}  {'ok' if ok else 'DIFFERENT'}")
        if not ok:
            failed.append(name)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
