"""Numeric oracle for the corpus labels: run reference and distributed on the same random inputs.

    .venv/bin/python corpus/numeric_check.py [--model NAME ...] [--seeds N]

For every model of corpus/equivci.yaml, a child process per device count (XLA_FLAGS set before
jax is imported) draws random inputs from `inputs()` (floats ~ N(0, 1); integers uniform in
[0, 32), below every vocabulary here), runs the reference under jit on one device and the
distributed entrypoint under jit on a fake CPU mesh of Auto axes that is also the current mesh,
and reports per seed the largest relative difference over output leaves,
max|dist - ref| / max(max|ref|, 1). A label is confirmed when an `equivalent` model stays within
the rounding tolerance on every seed and a buggy model exceeds 100x that tolerance on every
seed. The tolerance follows the lowest floating precision among the inputs and outputs
(float32: 1e-4; bfloat16 or float16: 2e-2), since the entrypoints compute in their input dtypes.
Exit status 1 if any label is not confirmed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "equivci.yaml"
EXPECTED = HERE / "expected.yaml"
SEPARATION = 100.0
INT_HIGH = 32


@dataclass(frozen=True)
class Result:
    name: str
    equivalent: bool
    rel_diffs: tuple[float, ...]  # one per seed
    tolerance: float
    error: str | None = None

    @property
    def confirmed(self) -> bool:
        if self.error or not self.rel_diffs:
            return False
        if self.equivalent:
            return all(d <= self.tolerance for d in self.rel_diffs)
        return all(d > SEPARATION * self.tolerance for d in self.rel_diffs)


def load_models() -> list[dict]:
    return yaml.safe_load(MANIFEST.read_text())["models"]


def load_expected() -> dict[str, dict]:
    return yaml.safe_load(EXPECTED.read_text())


# ---- child: runs in a process whose device count was fixed before jax started -----------------

def _entry(spec: str):
    import importlib
    file, func = spec.split(":")
    return getattr(importlib.import_module(Path(file).stem), func)


def _random_inputs(specs, seed):
    import jax
    import jax.numpy as jnp
    leaves, tree = jax.tree.flatten(specs)
    keys = jax.random.split(jax.random.key(seed), max(len(leaves), 1))
    out = []
    for key, s in zip(keys, leaves):
        if jnp.issubdtype(s.dtype, jnp.integer):
            out.append(jax.random.randint(key, s.shape, 0, INT_HIGH, s.dtype))
        else:
            out.append(jax.random.normal(key, s.shape, jnp.float32).astype(s.dtype))
    return jax.tree.unflatten(tree, out)


def _tolerance(arrays) -> float:
    import jax
    import jax.numpy as jnp
    low = [a.dtype for a in jax.tree.leaves(arrays)
           if jnp.issubdtype(a.dtype, jnp.floating) and jnp.finfo(a.dtype).bits <= 16]
    return 2e-2 if low else 1e-4


def _rel_diff(ref, dist) -> float:
    import jax
    import numpy as np
    worst = 0.0
    for r, d in zip(jax.tree.leaves(ref), jax.tree.leaves(dist), strict=True):
        r, d = np.asarray(r, np.float64), np.asarray(d, np.float64)
        if r.shape != d.shape:
            return math.inf
        diff = np.max(np.abs(d - r)) if r.size else 0.0
        if not np.isfinite(diff):
            return math.inf
        worst = max(worst, float(diff / max(float(np.max(np.abs(r))) if r.size else 0.0, 1.0)))
    return worst


def _entrypoints(model: dict):
    """reference, distributed (mesh bound if it asks for one), input specs and the mesh, as
    equivci's contract builds them."""
    import functools
    import inspect

    import jax
    from jax.sharding import AxisType

    reference, distributed = _entry(model["reference"]), _entry(model["distributed"])
    names, sizes = tuple(model["mesh"]), tuple(model["mesh"].values())
    mesh = jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(names),
                         devices=jax.devices()[:math.prod(sizes)])
    if "mesh" in inspect.signature(distributed).parameters:
        distributed = functools.partial(distributed, mesh=mesh)
    return reference, distributed, _entry(model["inputs"])(), mesh


def _trace_one(model: dict) -> dict:
    """Abstract evaluation only: both entrypoints trace and give the same output shapes."""
    import jax

    reference, distributed, specs, mesh = _entrypoints(model)
    ref = jax.eval_shape(reference, *specs)
    with jax.set_mesh(mesh):
        dist = jax.eval_shape(jax.jit(distributed), *specs)
    strip = lambda tree: str(jax.tree.map(lambda s: (s.shape, str(s.dtype)), tree))
    return {"name": model["name"], "reference": strip(ref), "distributed": strip(dist)}


def _check_one(model: dict, seeds: int) -> dict:
    import jax

    reference, distributed, specs, mesh = _entrypoints(model)
    diffs, tolerance = [], 1e-4
    for seed in range(seeds):
        args = _random_inputs(specs, seed)
        ref = jax.jit(reference)(*args)
        with jax.set_mesh(mesh):
            dist = jax.jit(distributed)(*args)
        tolerance = max(_tolerance((args, ref)), tolerance)
        diffs.append(_rel_diff(ref, dist))
    return {"name": model["name"], "rel_diffs": diffs, "tolerance": tolerance}


def _child(names: list[str], seeds: int, trace_only: bool) -> None:
    sys.path.insert(0, str(HERE))
    models = {m["name"]: m for m in load_models()}
    for name in names:
        try:
            row = _trace_one(models[name]) if trace_only else _check_one(models[name], seeds)
        except Exception as exc:  # noqa: BLE001 -- any failure is this model's row; the parent reports it
            row = {"name": name, "error": f"{type(exc).__name__}: {exc}"[:500]}
        print(json.dumps(row), flush=True)


# ---- parent -----------------------------------------------------------------------------------

def run_children(models: list[dict], flags: list[str]) -> dict[str, dict]:
    """One child per device count; the JSON row each child printed per model, by name."""
    by_count: dict[int, list[str]] = {}
    for m in models:
        by_count.setdefault(math.prod(m["mesh"].values()), []).append(m["name"])
    rows: dict[str, dict] = {}
    for count, group in sorted(by_count.items()):
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={count}", JAX_PLATFORMS="cpu")
        proc = subprocess.run([sys.executable, __file__, "--child", *flags, *group],
                              check=False, env=env, capture_output=True, text=True, timeout=1800)
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                rows[row["name"]] = row
        for name in group:
            rows.setdefault(name, {"name": name, "error": f"child exited {proc.returncode}: {proc.stderr[-500:]}"})
    return rows


def trace(names: list[str] | None = None) -> dict[str, dict]:
    """Trace every (named) model's entrypoints abstractly; rows with output shapes or an error."""
    return run_children([m for m in load_models() if names is None or m["name"] in names], ["--trace"])


def check(names: list[str] | None = None, seeds: int = 3) -> list[Result]:
    """Run the oracle for the named models (all by default)."""
    expected = load_expected()
    models = [m for m in load_models() if names is None or m["name"] in names]
    rows = run_children(models, ["--seeds", str(seeds)])
    return [Result(name=m["name"], equivalent=expected[m["name"]]["equivalent"],
                   rel_diffs=tuple(rows[m["name"]].get("rel_diffs", ())),
                   tolerance=rows[m["name"]].get("tolerance", 1e-4), error=rows[m["name"]].get("error"))
            for m in models]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*")
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.models + args.model
    if args.child:
        _child(names, args.seeds, args.trace)
        return 0
    results = check(names or None, args.seeds)
    print(f"{'model':42} {'label':11} {'tolerance':>9} {'max rel diff over seeds':>24}  confirmed")
    for r in results:
        figures = r.error or " ".join(f"{d:.2e}" for d in r.rel_diffs)
        label = "equivalent" if r.equivalent else "different"
        print(f"{r.name:42} {label:11} {r.tolerance:9.0e} {figures:>24}  {'yes' if r.confirmed else 'NO'}")
    bad = [r.name for r in results if not r.confirmed]
    print(f"{len(results) - len(bad)}/{len(results)} labels confirmed" + (f"; not confirmed: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
