#!/usr/bin/env python
"""Independent numeric oracle for the blind splits (shares no code with equivci).

For every model of blind/<split>/equivci.yaml it runs the reference (one device, jitted) and the
distributed entrypoint (jitted on a fake CPU mesh built from the manifest's `mesh`, with that mesh
set as the current mesh and passed as `mesh=` when the signature asks for it) on the same random
inputs, and checks the label of blind/<split>/expected.yaml:

- equivalent: on every seed, every output leaf has the reference's shape and dtype, and
  max|dist - ref| / max|ref| <= tol (tol is 1e-4, or 5e-2 when the reference computes in bfloat16
  anywhere; integer and bool leaves must match exactly);
- buggy: on at least one seed some leaf differs clearly: another shape/dtype/tree, or a relative
  difference >= 5 * tol.

Integer inputs are drawn uniformly from the model's `int_range: [lo, hi)` in expected.yaml (its
valid range, e.g. token ids below the vocabulary size). Each mesh size runs in its own child process
because the fake device count is fixed when JAX starts.

Usage: blind/oracle.py --split split1 [--model NAME ...] [--seeds 3] [--json]
Exit status 0 when every selected label is confirmed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

BLIND_DIR = Path(__file__).resolve().parent
F32_TOL = 1e-4
BF16_TOL = 5e-2
CLEAR_FACTOR = 5.0


@dataclass
class Case:
    name: str
    folder: str
    reference: str
    distributed: str
    inputs: str
    mesh: dict[str, int]
    equivalent: bool
    int_range: tuple[int, int] | None

    @property
    def devices(self) -> int:
        return math.prod(self.mesh.values())


@dataclass
class Verdict:
    name: str
    equivalent: bool
    confirmed: bool
    tol: float
    rel_per_seed: list[float]
    note: str


def load_cases(split: str) -> list[Case]:
    folder = BLIND_DIR / split
    manifest = yaml.safe_load((folder / "equivci.yaml").read_text())
    expected = yaml.safe_load((folder / "expected.yaml").read_text())
    cases = []
    for m in manifest["models"]:
        label = expected[m["name"]]
        rng = label.get("int_range")
        cases.append(Case(name=m["name"], folder=str(folder), reference=m["reference"],
                          distributed=m["distributed"], inputs=m["inputs"], mesh=dict(m["mesh"]),
                          equivalent=bool(label["equivalent"]),
                          int_range=tuple(rng) if rng else None))
    return cases


def resolve(folder: str, spec: str):
    target, func = spec.rsplit(":", 1)
    if target.endswith(".py"):
        path = Path(folder) / target
        mod_name = "blind_case_" + "_".join(path.with_suffix("").parts[-3:])
        module = sys.modules.get(mod_name)
        if module is None:
            loader = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(loader)
            sys.modules[mod_name] = module
            loader.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, func)


def random_args(case: Case, abstract, seed: int):
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)

    def draw(s):
        dtype = np.dtype(s.dtype)
        if dtype == np.bool_:
            return jnp.asarray(rng.random(s.shape) < 0.7)
        if np.issubdtype(dtype, np.integer):
            if case.int_range is None:
                raise SystemExit(f"{case.name}: integer input but no int_range in expected.yaml")
            lo, hi = case.int_range
            return jnp.asarray(rng.integers(lo, hi, size=s.shape), dtype=s.dtype)
        return jnp.asarray(rng.standard_normal(s.shape, dtype=np.float32)).astype(s.dtype)

    return jax.tree_util.tree_map(draw, abstract)


def relative_difference(ref_out, dist_out) -> tuple[float, str]:
    """max over leaves of max|d - r| / max|r|; inf for a structural, shape or dtype difference."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    ref_leaves, ref_tree = jax.tree_util.tree_flatten(ref_out)
    dist_leaves, dist_tree = jax.tree_util.tree_flatten(dist_out)
    if ref_tree != dist_tree:
        return math.inf, f"output trees differ: {ref_tree} vs {dist_tree}"
    worst, note = 0.0, ""
    for i, (r, d) in enumerate(zip(ref_leaves, dist_leaves)):
        if r.shape != d.shape or r.dtype != d.dtype:
            return math.inf, f"leaf {i}: {d.dtype}{d.shape} vs reference {r.dtype}{r.shape}"
        r64, d64 = np.asarray(r, np.float64), np.asarray(d, np.float64)
        if not jnp.issubdtype(r.dtype, jnp.inexact):
            rel = math.inf if np.any(r64 != d64) else 0.0
        elif not (np.all(np.isfinite(r64)) and np.all(np.isfinite(d64))):
            same = np.array_equal(np.isfinite(r64), np.isfinite(d64))
            rel = 0.0 if same and np.allclose(r64, d64, equal_nan=True) else math.inf
        else:
            rel = float(np.max(np.abs(d64 - r64), initial=0.0) / (np.max(np.abs(r64), initial=0.0) + 1e-12))
        if rel > worst:
            worst, note = rel, f"leaf {i} {r.dtype}{r.shape}"
    return worst, note


def computes_in_bf16(fn, args) -> bool:
    import jax
    return "bf16" in str(jax.make_jaxpr(fn)(*args))


def check_case(case: Case, seeds: int) -> Verdict:
    import jax

    reference = resolve(case.folder, case.reference)
    distributed = resolve(case.folder, case.distributed)
    abstract = resolve(case.folder, case.inputs)()
    mesh = jax.make_mesh(tuple(case.mesh.values()), tuple(case.mesh),
                         axis_types=(jax.sharding.AxisType.Auto,) * len(case.mesh))
    dist_fn = distributed
    if "mesh" in inspect.signature(distributed).parameters:
        def dist_fn(*args):
            return distributed(*args, mesh=mesh)
    rels, note, tol = [], "", F32_TOL
    for seed in range(seeds):
        args = random_args(case, abstract, seed)
        if seed == 0 and computes_in_bf16(reference, args):
            tol = BF16_TOL
        ref_out = jax.jit(reference)(*args)
        with jax.set_mesh(mesh):
            dist_out = jax.jit(dist_fn)(*args)
        rel, leaf = relative_difference(ref_out, dist_out)
        rels.append(rel)
        note = note or (leaf if rel > tol else "")
    if case.equivalent:
        confirmed = all(r <= tol for r in rels)
    else:
        confirmed = any(r >= CLEAR_FACTOR * tol for r in rels)
    return Verdict(case.name, case.equivalent, confirmed, tol, rels, note)


def run_child(split: str, names: list[str], seeds: int) -> None:
    cases = {c.name: c for c in load_cases(split)}
    for name in names:
        try:
            verdict = check_case(cases[name], seeds)
        except Exception as exc:  # noqa: BLE001 - user model code may raise anything; reported as unconfirmed
            verdict = Verdict(name, cases[name].equivalent, False, math.nan, [],
                              f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
        print("ORACLE " + json.dumps(asdict(verdict)), flush=True)


def run_split(split: str, only: list[str], seeds: int) -> list[Verdict]:
    cases = [c for c in load_cases(split) if not only or c.name in only]
    by_devices: dict[int, list[str]] = {}
    for c in cases:
        by_devices.setdefault(c.devices, []).append(c.name)
    verdicts: dict[str, Verdict] = {}
    for devices, names in sorted(by_devices.items()):
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                   JAX_PLATFORMS="cpu")
        proc = subprocess.run([sys.executable, __file__, "--split", split, "--seeds", str(seeds),
                               "--child", *names], env=env, capture_output=True, text=True,
                              check=False)
        for line in proc.stdout.splitlines():
            if line.startswith("ORACLE "):
                v = Verdict(**json.loads(line[len("ORACLE "):]))
                verdicts[v.name] = v
        for name in names:
            if name not in verdicts:
                label = next(c.equivalent for c in cases if c.name == name)
                verdicts[name] = Verdict(name, label, False, math.nan, [],
                                         f"child failed: {proc.stderr.strip()[-300:]}")
    return [verdicts[c.name] for c in cases]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", required=True, help="folder under blind/, e.g. split1")
    ap.add_argument("--model", action="append", default=[], help="check only this model")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        run_child(args.split, args.child, args.seeds)
        return 0
    verdicts = run_split(args.split, args.model, args.seeds)
    if args.json:
        print(json.dumps([asdict(v) for v in verdicts], indent=1))
    else:
        print(f"{'model':40} {'label':10} {'tol':>7} {'max rel diff per seed':32} confirmed")
        for v in verdicts:
            rels = " ".join(f"{r:.2e}" for r in v.rel_per_seed)
            label = "equiv" if v.equivalent else "buggy"
            print(f"{v.name:40} {label:10} {v.tol:7.0e} {rels:32} {'yes' if v.confirmed else 'NO'}"
                  + (f"  ({v.note})" if v.note and not v.confirmed else ""))
        ok = sum(v.confirmed for v in verdicts)
        print(f"confirmed {ok}/{len(verdicts)} labels "
              f"({sum(v.equivalent for v in verdicts)} equivalent, "
              f"{sum(not v.equivalent for v in verdicts)} buggy) over {args.seeds} seeds")
    return 0 if all(v.confirmed for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
