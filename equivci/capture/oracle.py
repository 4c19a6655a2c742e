"""Numeric oracle: run reference and distributed on the same random inputs and compare.

This is the cross-check behind every `mismatch` counterexample and every verdict of the test
zoo. It is not a proof: equal outputs on a few random inputs only make equivalence likely,
while a difference beyond the dtype's tolerance is a concrete counterexample.

Child entry (the parent never imports jax with the wrong device count), forked by the capture
server (server.py) as if it were started as

    python -m equivci.capture.oracle --manifest PATH --model NAME [--model NAME2 ...] [--seeds 0,1,2]

prints one JSON line per model on stdout: `{"model": NAME, "comparison": {...}}` or
`{"model": NAME, "error": "..."}`. Parent side: `compare_in_child` (one model) and
`compare_many_in_child` (many models of a manifest in one child process).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import ml_dtypes
import numpy as np

from equivci.capture import entrypoints, rounding, server
from equivci.capture.index_ranges import index_ranges
from equivci.errors import EquivciError
from equivci.manifest import load_manifest
from equivci.options import Budgets

DEFAULT_SEEDS = (0, 1, 2)

# Integer inputs are drawn in [0, n) with n the smallest dimension (>= 2) of any floating-point
# input, so that an integer used as an index into any axis of any input is in bounds; capped.
INT_RANGE_DEFAULT = 8
INT_RANGE_MAX = 64
# flat input leaf index -> integers [lo, hi) to draw it from
Ranges = dict[int, tuple[int, int]]

# How many times the rounding floor (rounding.py) a difference may reach before it is a
# counterexample: the floor is one draw of the moves re-association can make, and moves of
# other elements, with other signs, can add up to a few times more.
NOISE_MARGIN = 4.0


@dataclasses.dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float  # relative to the leaf's magnitude (max |reference| of the leaf, at least 1)


def tolerance_for(dtype: Any) -> Tolerance:
    """Per-dtype tolerance. Integers and booleans must match exactly."""
    name = np.dtype(dtype).name if not str(dtype).startswith("bfloat16") else "bfloat16"
    if name == "bfloat16":
        return Tolerance(rtol=2e-2, atol=1e-2)
    if name == "float16":
        return Tolerance(rtol=2e-3, atol=1e-3)
    if name in ("float32", "complex64"):
        return Tolerance(rtol=1e-4, atol=1e-5)
    if name in ("float64", "complex128"):
        return Tolerance(rtol=1e-9, atol=1e-10)
    if "float8" in name or "float4" in name:
        return Tolerance(rtol=1.5e-1, atol=1e-1)
    return Tolerance(rtol=0.0, atol=0.0)


@dataclasses.dataclass(frozen=True)
class NumericComparison:
    """Outcome of running both programs on the same random inputs.

    max_abs_diff / max_rel_diff: the largest |dist - ref| and |dist - ref| / |ref| over every
    output element of every seed. worst_leaf / worst_index / ref_value / dist_value: the element
    furthest outside its tolerance (or closest to it when all are within), with worst_leaf a
    jax.tree_util.keystr path into the outputs ("" for a single array output). equal: every
    element of every seed is within tolerance (|d - r| <= atol * scale + rtol * |r|, scale =
    max(1, max |ref| of the leaf)); integers and booleans exactly. failing_seeds: the seeds
    with a difference beyond tolerance. note: why the comparison failed structurally, if it did
    (different output structure, shapes or dtypes), or why seeds that differ are no counterexample.
    excused_seeds: seeds that differ beyond tolerance but on which a discrete decision of the
    reference was within rounding of a tie (not counted as failing).
    """

    max_abs_diff: float
    max_rel_diff: float
    worst_leaf: str
    worst_index: tuple[int, ...]
    ref_value: float | None
    dist_value: float | None
    seeds: tuple[int, ...]
    equal: bool
    worst_seed: int | None = None
    failing_seeds: tuple[int, ...] = ()
    note: str = ""
    # At the worst element: how far rounding can move it (the dtype's tolerance plus
    # NOISE_MARGIN times the rounding floor of rounding.py) and its difference over that (> 1:
    # beyond what rounding explains). With the narrowest float type the reference computes in
    # and how many of its rounding points the floor moved.
    noise_floor: float = 0.0
    ratio: float = 0.0
    precision: str = ""
    rounding_points: int = 0
    excused_seeds: tuple[int, ...] = ()

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        for key in ("max_abs_diff", "max_rel_diff", "ref_value", "dist_value", "noise_floor", "ratio"):
            d[key] = _json_float(d[key])
        d["worst_index"] = list(self.worst_index)
        d["seeds"] = list(self.seeds)
        d["failing_seeds"] = list(self.failing_seeds)
        d["excused_seeds"] = list(self.excused_seeds)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "NumericComparison":
        return cls(
            max_abs_diff=float(d["max_abs_diff"]),  # never None: to_json writes a number or 'inf'/'nan'
            max_rel_diff=float(d["max_rel_diff"]),
            worst_leaf=d["worst_leaf"],
            worst_index=tuple(d["worst_index"]),
            ref_value=_from_json_float(d["ref_value"]),
            dist_value=_from_json_float(d["dist_value"]),
            seeds=tuple(d["seeds"]),
            equal=bool(d["equal"]),
            worst_seed=d.get("worst_seed"),
            failing_seeds=tuple(d.get("failing_seeds", ())),
            note=d.get("note", ""),
            noise_floor=_from_json_float(d.get("noise_floor")) or 0.0,
            ratio=_from_json_float(d.get("ratio")) or 0.0,
            precision=d.get("precision", ""),
            rounding_points=int(d.get("rounding_points", 0)),
            excused_seeds=tuple(d.get("excused_seeds", ())),
        )

    def describe(self) -> str:
        """One line for reports: where the programs differ, or that they agree."""
        if self.note and not self.equal:
            return self.note
        where = f"output{self.worst_leaf}[{', '.join(map(str, self.worst_index))}]"
        if self.equal:
            tie = f"; {self.note}" if self.note else ""
            return f"equal on seeds {list(self.seeds)} (max |diff| {self.max_abs_diff:.3g}){tie}"
        return (
            f"{where} differs on seed {self.worst_seed}: reference {self.ref_value:.6g}, "
            f"distributed {self.dist_value:.6g} ({self.figures()})"
        )

    def figures(self) -> str:
        """The difference at the worst element against what rounding explains there."""
        diff = abs((self.dist_value or 0.0) - (self.ref_value or 0.0))
        computed = f"; the reference computes in {self.precision}" if self.precision else ""
        return f"|diff| {diff:.3g}, rounding explains up to {self.noise_floor:.3g}{computed}: {self.ratio:.3g}x that"


def _json_float(x: float | None) -> Any:
    if x is None:
        return None
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return repr(x)  # 'nan', 'inf', '-inf': JSON has no literal for them
    return x


def _from_json_float(x: Any) -> float | None:
    return None if x is None else float(x)


# --- random inputs -------------------------------------------------------------------------------


def _kind(dtype: Any) -> str:
    """numpy's kind letter of a dtype, ml_dtypes' narrow types (kind "V") read as floats or ints."""
    dt = np.dtype(dtype)
    return dt.kind if dt.kind != "V" else ("i" if dt.name.startswith(("int", "uint")) else "f")


def float_shapes(leaves: Iterable[tuple[Sequence[int], Any]]) -> list[Sequence[int]]:
    """The shapes of the (real or complex) floating leaves among (shape, dtype) pairs."""
    return [shape for shape, dtype in leaves if _kind(dtype) in "fc"]


def default_int_high(float_shapes: Iterable[Sequence[int]]) -> int:
    """The top (excluded) of the integer inputs the oracle draws where nothing states their range:
    the floats' smallest dim of size >= 2, so a small id indexes any of them."""
    dims = [int(d) for shape in float_shapes for d in shape if int(d) >= 2]
    return min(min(dims), INT_RANGE_MAX) if dims else INT_RANGE_DEFAULT


def random_inputs(args_abstract: Sequence[Any], seed: int, ranges: Ranges | None = None) -> tuple:
    """Concrete arguments for one seed (see draw_leaves), in the arguments' tree."""
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax

    leaves, treedef = jax.tree_util.tree_flatten(tuple(args_abstract))
    return jax.tree_util.tree_unflatten(
        treedef, draw_leaves(seed, [(leaf.shape, leaf.dtype) for leaf in leaves], ranges)
    )


def draw_leaves(
    seed: int, leaves: Sequence[tuple[Sequence[int], Any]], ranges: Ranges | None = None
) -> list[np.ndarray]:
    """Draw `seed` of the flat input leaves (shape, dtype): integer leaf i in `ranges`[i] where stated,
    else in [0, default_int_high of the float leaves)."""
    high = default_int_high(float_shapes(leaves))
    return [
        draw_leaf(seed, i, tuple(shape), dtype, (ranges or {}).get(i, (0, high)))
        for i, (shape, dtype) in enumerate(leaves)
    ]


def draw_leaf(seed: int, index: int, shape: tuple[int, ...], dtype: Any, ints: tuple[int, int]) -> np.ndarray:
    """Input leaf `index` on draw `seed`: normal floats, fair booleans, integers in `ints` = [lo, hi)
    (the values valid as the reference's indices, see index_ranges.py and the proof's own assumption,
    or else small and non-negative). numpy, one stream per (seed, leaf), and no jax: jax's random
    functions compile once per shape, about a quarter of a CPU second per distinct input shape in
    every fresh process (the oracle's child, the verifier), and its runtime does not survive the
    verifier's fork."""
    dt, kind = np.dtype(dtype), _kind(dtype)
    rng = np.random.default_rng((seed, index))
    if kind == "b":
        return rng.random(shape) < 0.5
    if kind in "iu":
        info = ml_dtypes.iinfo(dt)
        # [lo, hi) up to the dtype's own max included (a 256-row table indexed by uint8 ids); the draw
        # is int32, whose max bounds the range
        lo, hi = ints
        return rng.integers(
            max(lo, int(info.min)), min(hi, int(info.max) + 1, 2**31 - 1), size=shape, dtype=np.int32
        ).astype(dt)
    if kind == "c":
        real, imag = rng.standard_normal((2, *shape), dtype=np.float32)
        return (real + 1j * imag).astype(dt)
    if kind == "f":
        return rng.standard_normal(shape, dtype=np.float32).astype(dt)
    raise EquivciError(f"the numeric check cannot draw random values of dtype {dt} (input leaf {index})")


# --- comparison ------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Worst:
    score: float = -1.0  # |d - r| / tolerance (inf when outside an exact tolerance)
    leaf: str = ""
    index: tuple[int, ...] = ()
    ref: float | None = None
    dist: float | None = None
    seed: int | None = None
    floor: float = 0.0


def _is_inexact(dtype) -> bool:
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax.numpy as jnp

    return bool(jnp.issubdtype(dtype, jnp.inexact))


def _scalar(x) -> float:
    x = np.asarray(x)
    if np.iscomplexobj(x):
        return float(abs(x))
    return float(x.astype(np.float64))


def _compare_leaf(ref, dist, tol: Tolerance, floor=None):
    """Return (max_abs, max_rel, score array, allowance array, within-tolerance flag) for one
    output leaf. `floor`: the absolute amount rounding alone may move each element (rounding.py),
    allowed NOISE_MARGIN times on top of the dtype's tolerance."""
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax.numpy as jnp

    r = np.asarray(ref).astype(np.complex128 if np.iscomplexobj(ref) else np.float64)
    d = np.asarray(dist).astype(r.dtype)
    both_nan = np.isnan(r) & np.isnan(d)
    same_inf = np.isinf(r) & np.isinf(d) & (r == d)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.abs(d - r)
        diff = np.where(both_nan | same_inf, 0.0, diff)
        diff = np.where(np.isnan(diff), np.inf, diff)
        finite_ref = np.abs(r[np.isfinite(r)])
        scale = max(1.0, float(finite_ref.max())) if finite_ref.size else 1.0
        allowed = tol.atol * scale + tol.rtol * np.where(np.isfinite(r), np.abs(r), 0.0)
        if floor is not None:
            allowed = allowed + NOISE_MARGIN * floor
        if not np.any(allowed):
            score = np.where(diff > 0, np.inf, 0.0)
        else:
            score = np.where(diff == 0, 0.0, diff / np.where(allowed > 0, allowed, np.inf))
        # Relative to |ref|, floored at the leaf's magnitude times the dtype's epsilon so that
        # an exact zero in the reference does not make the ratio infinite.
        eps = float(jnp.finfo(np.asarray(ref).dtype).eps) if _is_inexact(np.asarray(ref).dtype) else 1.0
        rel = diff / np.maximum(np.where(np.isfinite(r), np.abs(r), 0.0), eps * scale)
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float(np.where(diff == 0, 0.0, rel).max()) if diff.size else 0.0
    return max_abs, max_rel, score, allowed, bool(np.all(score <= 1.0))


def _structural(seeds, note: str, leaf: str = "") -> NumericComparison:
    return NumericComparison(
        max_abs_diff=math.inf,
        max_rel_diff=math.inf,
        worst_leaf=leaf,
        worst_index=(),
        ref_value=None,
        dist_value=None,
        seeds=tuple(seeds),
        equal=False,
        worst_seed=seeds[0] if seeds else None,
        failing_seeds=tuple(seeds),
        note=note,
    )


def rounding_floor(ref, shadow) -> float:
    """How far rounding alone may move any element of one output leaf: the largest move of the
    shadow reference anywhere in the leaf (a flipped rounding lands on other elements in the other
    program)."""
    moved = np.abs(np.asarray(shadow).astype(np.float64) - np.asarray(ref).astype(np.float64))
    moved = moved[np.isfinite(moved)]
    return float(moved.max()) if moved.size else 0.0


def compare_outputs(
    ref_outs: dict,
    dist_outs: dict,
    seeds: Sequence[int],
    shadow_outs: dict | None = None,
    tolerance: Tolerance | None = None,
) -> NumericComparison:
    """Compare {seed: output pytree} of both programs (concrete arrays). `shadow_outs` (same
    form) are the reference's outputs with its roundings moved as re-association may move them
    (see rounding.py); `tolerance` replaces the per-dtype one (the manifest's `oracle` key)."""
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax
    from jax.tree_util import keystr

    seeds = tuple(seeds)
    max_abs = max_rel = 0.0
    worst = _Worst()
    failing: list[int] = []
    for seed in seeds:
        ref_leaves, ref_tree = jax.tree_util.tree_flatten_with_path(ref_outs[seed])
        dist_leaves, dist_tree = jax.tree_util.tree_flatten_with_path(dist_outs[seed])
        if ref_tree != dist_tree:  # type: ignore[operator]  # jaxlib's PyTreeDef stub declares no __ne__
            return _structural(
                seeds, f"the outputs have different structures: reference {ref_tree}, distributed {dist_tree}"
            )
        seed_ok = True
        shadow_leaves = jax.tree_util.tree_leaves(shadow_outs[seed]) if shadow_outs else [None] * len(ref_leaves)
        for (path, r), (_, d), sh in zip(ref_leaves, dist_leaves, shadow_leaves):
            name = keystr(path)
            r_shape, d_shape = tuple(np.shape(r)), tuple(np.shape(d))
            if r_shape != d_shape:
                return _structural(
                    seeds,
                    f"output{name} has shape {r_shape} in the reference but {d_shape} in the distributed program",
                    name,
                )
            r_dtype, d_dtype = np.asarray(r).dtype, np.asarray(d).dtype
            if r_dtype != d_dtype:
                return _structural(
                    seeds,
                    f"output{name} has dtype {r_dtype} in the reference but {d_dtype} in the distributed program",
                    name,
                )
            floor = None if sh is None else rounding_floor(r, sh)
            leaf_abs, leaf_rel, score, allowed, ok = _compare_leaf(r, d, tolerance or tolerance_for(r_dtype), floor)
            max_abs, max_rel = max(max_abs, leaf_abs), max(max_rel, leaf_rel)
            seed_ok &= ok
            if score.size:
                flat = int(np.argmax(score))
                s = float(score.reshape(-1)[flat])
                if s > worst.score:
                    index = tuple(int(i) for i in np.unravel_index(flat, r_shape)) if r_shape else ()
                    at = float(np.broadcast_to(allowed, r_shape)[index])
                    worst = _Worst(
                        s, name, index, _scalar(np.asarray(r)[index]), _scalar(np.asarray(d)[index]), seed, at
                    )
        if not seed_ok:
            failing.append(seed)
    return NumericComparison(
        max_abs_diff=max_abs,
        max_rel_diff=max_rel,
        worst_leaf=worst.leaf,
        worst_index=worst.index,
        ref_value=worst.ref,
        dist_value=worst.dist,
        seeds=seeds,
        equal=not failing,
        worst_seed=worst.seed,
        failing_seeds=tuple(failing),
        noise_floor=worst.floor,
        ratio=max(worst.score, 0.0),
    )


def _run_and_compare(
    reference,
    bound,
    args_abstract,
    mesh,
    seeds,
    ref_name="reference",
    dist_name="distributed",
    tolerance: Tolerance | None = None,
    index_ranges: Ranges | None = None,
):
    """jit both, run them on one random draw per seed (the distributed one under the mesh), compare."""
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax

    ref_fn, dist_fn = jax.jit(reference), jax.jit(bound)
    shadow = None if tolerance else rounding.shadow_reference(reference, tuple(args_abstract))
    ref_outs, dist_outs, shadow_outs = {}, {}, {}
    near_ties: list[int] = []
    for seed in seeds:
        args = random_inputs(args_abstract, seed, index_ranges)
        try:
            ref_outs[seed] = jax.device_get(ref_fn(*args))
            if shadow:
                shadow_outs[seed], tie = jax.device_get(shadow.run(*args))
                if tie:
                    near_ties.append(seed)
        except EquivciError:
            raise
        except Exception as exc:
            raise EquivciError(_run_failure("reference", ref_name, exc)) from exc
        try:
            with jax.set_mesh(mesh):
                dist_outs[seed] = jax.device_get(dist_fn(*args))
        except EquivciError:
            raise
        except Exception as exc:
            raise EquivciError(_run_failure("distributed", dist_name, exc)) from exc
    if shadow is None:
        return compare_outputs(ref_outs, dist_outs, seeds, tolerance=tolerance)
    comparison = compare_outputs(ref_outs, dist_outs, seeds, shadow_outs)
    comparison = dataclasses.replace(comparison, precision=shadow.narrowest, rounding_points=shadow.rounding_points)
    return without_near_ties(comparison, near_ties)


def without_near_ties(comparison: NumericComparison, near_ties: Sequence[int]) -> NumericComparison:
    """A seed on which a discrete decision of the reference was within rounding of a tie is no
    counterexample: rounding alone could have made the other program decide otherwise."""
    excused = [s for s in comparison.failing_seeds if s in near_ties]
    if not excused:
        return comparison
    failing = tuple(s for s in comparison.failing_seeds if s not in near_ties)
    note = (
        f"on seed{'s' if len(excused) > 1 else ''} {', '.join(map(str, excused))} a comparison, argmax, top_k or "
        "sort of the reference was within rounding of a tie, so the difference there is not a counterexample"
    )
    return dataclasses.replace(
        comparison, failing_seeds=failing, equal=not failing, note=note, excused_seeds=tuple(excused)
    )


# --- child process ---------------------------------------------------------------------------------


def _run_failure(side: str, spec: str, exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "site-packages" not in f.filename]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"running the {side} entrypoint {spec} on random inputs failed{where}: {type(exc).__name__}: {first}"


def _compare_model(model, root: Path, seeds: tuple[int, ...], assumed: Ranges) -> NumericComparison:
    """`assumed`: the integer inputs the proof took to be valid indices and their [lo, hi); the
    draw stays inside them too (a position whose window reaches before the cache's start is no
    more an input of the oracle than of the proof), unless the oracle has inputs of its own."""
    reference_ep, distributed_ep, inputs_ep = model.entrypoints()
    reference = entrypoints.load_function(reference_ep, root)
    distributed = entrypoints.load_function(distributed_ep, root)
    inputs = model.oracle.inputs or inputs_ep
    args = entrypoints.abstract_inputs(entrypoints.load_function(inputs, root), inputs)
    mesh = entrypoints.build_mesh(model)
    bound = entrypoints.bind_distributed(distributed, mesh)
    ranges = {i: (0, n) for i, n in index_ranges(reference, tuple(args)).items()}
    if model.oracle.inputs is None:
        ranges = narrowed(ranges, assumed)
    tolerance = Tolerance(model.oracle.rtol or 0.0, model.oracle.atol or 0.0) if model.oracle.tolerance_set else None
    return _run_and_compare(
        reference,
        bound,
        args,
        mesh,
        seeds,
        reference_ep.spec,
        distributed_ep.spec,
        tolerance=tolerance,
        index_ranges=ranges,
    )


def _without_device_count(flags: str) -> str:
    return " ".join(f for f in flags.split() if not f.startswith("--xla_force_host_platform_device_count"))


def _parse_seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes comma-separated integers, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds needs at least one seed")
    return seeds


def _parse_ranges(text: str) -> dict[str, Ranges]:
    return {
        name: {int(k): (int(lo), int(hi)) for k, (lo, hi) in leaves.items()}
        for name, leaves in json.loads(text).items()
    }


def narrowed(ranges: Ranges, assumed: Ranges) -> Ranges:
    """Each leaf's range inside both; a leaf whose ranges do not meet keeps the first (no draw
    can satisfy both, and the proof then assumed nothing the oracle could honour)."""
    out = dict(ranges)
    for i, (lo, hi) in assumed.items():
        was_lo, was_hi = out.get(i, (lo, hi))
        if max(lo, was_lo) < min(hi, was_hi):
            out[i] = (max(lo, was_lo), min(hi, was_hi))
    return out


def child_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m equivci.capture.oracle", description=__doc__.split("\n")[0])
    parser.add_argument("--manifest", required=True, type=Path)
    parser.add_argument("--model", action="append", required=True, help="repeatable")
    parser.add_argument("--seeds", type=_parse_seeds, default=DEFAULT_SEEDS)
    parser.add_argument("--ranges", type=_parse_ranges, default={}, help="JSON: model -> leaf -> [lo, hi)")
    opts = parser.parse_args(argv)

    if "jax" in sys.modules:
        from jax._src import xla_bridge  # lazy: imported by now (the capture server imports jax, never its backend)

        if xla_bridge.backends_are_initialized():
            raise RuntimeError("equivci.capture.oracle child: jax's backend started before the device count was set")

    try:
        manifest = load_manifest(opts.manifest)
    except EquivciError as exc:
        for name in opts.model:
            print(json.dumps({"model": name, "error": str(exc)}), flush=True)
        return 2
    by_name = {m.name: m for m in manifest.models}
    devices = max([by_name[n].num_devices for n in opts.model if n in by_name] or [1])
    flags = _without_device_count(os.environ.get("XLA_FLAGS", ""))
    # Both programs round exactly where their code says: XLA may otherwise keep a value wider than
    # its type inside a fusion in one program and not in the other.
    os.environ["XLA_FLAGS"] = (
        f"{flags} --xla_force_host_platform_device_count={devices} --xla_allow_excess_precision=false"
    ).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.chdir(manifest.root)  # entrypoints.abstract_inputs reports paths relative to the cwd
    # Our JSON lines own stdout; whatever the user's code prints goes to stderr.
    sys.stdout.flush()
    rows_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    status = 0
    for name in opts.model:
        model = by_name.get(name)
        if model is None:
            row = {
                "model": name,
                "error": f"{opts.manifest}: no model named '{name}'; the manifest defines {', '.join(by_name)}",
            }
            status = 2
        else:
            try:
                t0 = time.perf_counter()
                comparison = _compare_model(model, manifest.root, opts.seeds, opts.ranges.get(name, {}))
                row = {"model": name, "comparison": comparison.to_json(), "seconds": round(time.perf_counter() - t0, 3)}
            except EquivciError as exc:
                row, status = {"model": name, "error": str(exc)}, 2
            except Exception as exc:  # noqa: BLE001 - one broken model must not hide the others
                row, status = {"model": name, "error": _run_failure("model", name, exc)}, 2
        print(json.dumps(row), file=rows_out, flush=True)
    return status


# --- parent side -------------------------------------------------------------------------------------


def compare_many_in_child(
    manifest_path: Path | str,
    model_names: Sequence[str],
    seeds: Sequence[int] = DEFAULT_SEEDS,
    timeout: float = Budgets.oracle_timeout_seconds,
    ranges: Mapping[str, Ranges] | None = None,
) -> dict[str, NumericComparison | EquivciError]:
    """Compare several models of one manifest in one child process (device count = the largest
    mesh among them), forked by the capture server (server.py: a fresh child that skips importing
    jax). Returns per model a NumericComparison, or the EquivciError that stopped it.
    `ranges`: per model, the integer inputs its proof assumed valid indices, drawn inside them."""
    names = list(model_names)
    if not names:
        return {}
    args = [
        "--manifest",
        str(Path(manifest_path).absolute()),
        "--seeds",
        ",".join(str(int(s)) for s in seeds),
        "--ranges",
        json.dumps({m: {str(k): list(r) for k, r in leaves.items()} for m, leaves in (ranges or {}).items()}),
    ]
    for name in names:
        args += ["--model", name]
    env = dict(os.environ)
    # The child picks its own device count from the manifest before its backend starts. The rest as
    # a capture child's (run.child_env): the same server serves both.
    env["XLA_FLAGS"] = _without_device_count(env.get("XLA_FLAGS", ""))
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        child = server.run("equivci.capture.oracle", args, env=env, cwd=os.getcwd(), timeout=timeout)
    except subprocess.TimeoutExpired:
        late = EquivciError(f"the numeric check of {', '.join(names)} did not finish within {timeout:.0f} s")
        return {name: late for name in names}
    results: dict[str, NumericComparison | EquivciError] = {}
    for line in child.stdout.splitlines():
        line = line.strip()
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or "model" not in row:
            continue
        if "comparison" in row:
            results[row["model"]] = NumericComparison.from_json(row["comparison"])
        else:
            results[row["model"]] = EquivciError(row.get("error", "unknown error"))
    tail = (child.stderr.strip().splitlines() or ["no output"])[-1]
    for name in names:
        if name not in results:
            results[name] = EquivciError(
                f"the numeric check child exited with code {child.returncode} before reporting '{name}': {tail}"
            )
    return results


def compare_in_child(
    manifest_path: Path | str,
    model_name: str,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    timeout: float = Budgets.oracle_timeout_seconds,
    ranges: Ranges | None = None,
) -> NumericComparison:
    """Run the numeric comparison of one manifest model in a child process with the fake device
    count its mesh needs. Raises EquivciError if the model cannot be loaded or run."""
    result = compare_many_in_child(manifest_path, [model_name], seeds, timeout, {model_name: ranges or {}})[model_name]
    if isinstance(result, EquivciError):
        raise result
    return result


if __name__ == "__main__":
    sys.exit(child_main())
