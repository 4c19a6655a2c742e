"""How far rounding alone can move the reference's outputs: the numeric oracle's noise floor.

A sharded program may re-associate the sums the reference computes (a contraction split over
shards, a reduction finished by an all-reduce). Over the reals that changes nothing; in floating
point it moves the result of each such sum by a few units in the last place of the precision it
is accumulated in. Those tiny moves matter only where the program later rounds to a narrower type
(an RMSNorm cast to bfloat16, a bf16 matmul input): an element lying close enough to a rounding
boundary of the narrow type may round the other way, and a whole unit of the narrow type then
propagates to the outputs. That is how correct bf16 code differs from its reference by 1e-2 on
float32 logits, and why an output-dtype tolerance calls it a counterexample.

`shadow_reference` builds, from the reference's jaxpr, a program that makes exactly those moves:
- every accumulation (dot_general, reduce_sum, cumsum, convolution) adds a relative error bound of
  LAMBDA * sqrt(n) * u to its result (the probabilistic bound of Higham and Mary, 2019: a sum of n
  terms in precision u is within that of the exact sum with overwhelming probability); elementwise
  ops carry the largest bound of their operands along (a worst-case forward analysis that adds
  bounds at every product compounds through deep residual stacks into bounds that explain any
  difference; the bound here only decides which roundings may flip);
- a narrowing float convert of a value with a non-zero bound rounds the other way every element
  that lies within that bound of a rounding boundary, and at least the FLIP_FRACTION of elements
  closest to one, so that the floor never rests on zero flips by chance;
- an accumulation whose result is itself narrow (a bf16 dot with a bf16 result) is computed wide
  and every element may round either way: sharded code sums partial results rounded to that type.
A sum of integer-valued terms is exact in any order while every partial sum stays within the
type's contiguous integers (|sum| <= 2 / eps): counts made by summing one-hot masks (capacity slots,
bincounts, cumsum positions) are the same in every program, so they carry no bound, and comparing
them with a capacity is no tie. Each value's largest possible magnitude is tracked where it is
known to be an integer (from booleans, iota, integer constants, and sums and products of those).
A rounding right after a scale by a constant (a normalizer, 1/sqrt(d), a temperature) may as well
sit before it in a correct program — `(x * s).astype(bf16)` against `x.astype(bf16) * s` — and
then differs in nearly every element by a unit of the narrow type, whatever the bounds: every
element of such a rounding may take either neighbour. Other arithmetic done in the narrow type
instead (a tanh, an all-reduce) computes another function and is not excused. Rounding of values
that no accumulation and no constant scale has touched (an input cast to bf16, sliced or gathered
first) is identical in both programs and is not perturbed, so a program that rounds where the
reference does not (an all-reduce in bf16 of f32 partial sums) still differs by more than the
floor. After a rounding that may flip, the value may differ by one unit of the narrow type, and
that is its bound from there on.

Discrete decisions (comparisons, argmax, top_k, sort, float-to-int) cannot be moved a little: a
correct program whose router logits differ in the last place may pick another expert. The shadow
reports whether any decision on a value with a bound was within that bound of a tie; on such a
seed a difference is not a counterexample (the oracle says so), since rounding could explain it.
Decisions inside loop bodies are not checked.

The floor of an output is the largest |shadow - reference| over the leaf; the re-association left
at a wide output itself is what its dtype's tolerance allows. Loop bodies (scan, while, cond) are
rewritten the same way, with the operands' largest bound.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

LAMBDA = 4.0
FLIP_FRACTION = 0.01

# Primitives that call one jaxpr with their own operands: evaluated inline.
_CALLS = {
    "jit",
    "pjit",
    "closed_call",
    "core_call",
    "custom_jvp_call",
    "custom_vjp_call",
    "custom_vjp_call_jaxpr",
    "remat",
    "checkpoint",
    "custom_lin",
}
_CALL_JAXPR_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
_ACCUMULATIONS = {"dot_general", "reduce_sum", "cumsum", "conv_general_dilated", "reduce_window_sum"}


@dataclasses.dataclass(frozen=True)
class Shadow:
    """The shadow program (same arguments and output tree as the reference)."""

    run: Callable[..., Any]  # -> (outputs, whether a discrete decision was within rounding of a tie)
    rounding_points: int  # narrowing rounds of computed values, and narrow accumulations
    narrowest: str  # the narrowest float type the reference computes in


def shadow_reference(reference: Callable, args_abstract: tuple) -> Shadow:
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax

    closed = jax.make_jaxpr(reference)(*args_abstract)
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(reference, *args_abstract))
    stats = _Stats()
    # A dry evaluation on abstract values counts the rounding points.
    jax.eval_shape(
        lambda *a: _Interpreter(stats).run(closed, list(a), [0.0] * len(a))[0],
        *jax.tree_util.tree_leaves(args_abstract),
    )

    def run(*args):
        # lazy: jax is heavy; equivci's parent process loads this module without it
        import jax.numpy as jnp

        leaves = jax.tree_util.tree_leaves(args)
        interpreter = _Interpreter(_Stats())
        outs = interpreter.run(closed, leaves, [0.0] * len(leaves))[0]
        tie = jnp.any(jnp.stack(interpreter.ties)) if interpreter.ties else jnp.asarray(False)
        return jax.tree_util.tree_unflatten(out_tree, outs), tie

    return Shadow(jax.jit(run), stats.points, stats.narrowest_name())


@dataclasses.dataclass
class _Stats:
    points: int = 0
    narrowest_eps: float = 0.0
    narrowest: str = ""

    def saw(self, dtype) -> None:
        eps = _eps(dtype)
        if eps is not None and eps > self.narrowest_eps:
            self.narrowest_eps, self.narrowest = eps, _dtype_name(dtype)

    def narrowest_name(self) -> str:
        return self.narrowest or "none"


def _dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def _eps(dtype) -> float | None:
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax.numpy as jnp

    if not jnp.issubdtype(dtype, jnp.floating):
        return None
    return float(jnp.finfo(dtype).eps)


class _Interpreter:
    """Evaluates a jaxpr with the shadow's moves; each value carries a static relative bound."""

    def __init__(self, stats: _Stats):
        self.stats = stats
        self.ties: list = []  # traced booleans: a decision on a value with a bound was near a tie

    def run(
        self,
        closed,
        args: list,
        bounds: list[float],
        integral: list[float | None] | None = None,
        computed: list[bool] | None = None,
    ) -> tuple[list, list[float], list[float | None], list[bool]]:
        """The outputs, their relative bounds, their magnitudes where they hold integers, and
        whether a constant scaled them since their last rounding."""
        jaxpr = closed.jaxpr
        env: dict = {}
        bound: dict = {}
        magnitude: dict = {}  # the largest |value| of an integer-valued value, where known
        fresh: dict = {}  # scaled by a constant since the value was last rounded
        constant: set = set(jaxpr.constvars)  # values computed from constants alone

        def read(v):
            if hasattr(v, "val"):  # a Literal
                return v.val, 0.0
            return env[v], bound[v]

        def integer_magnitude(v) -> float | None:
            return _constant_magnitude(v.val) if hasattr(v, "val") else magnitude.get(v)

        for v, c in zip(jaxpr.constvars, closed.consts):
            env[v], bound[v], magnitude[v], fresh[v] = c, 0.0, _constant_magnitude(c), False
        for k, (v, a, b) in enumerate(zip(jaxpr.invars, args, bounds)):
            env[v], bound[v], magnitude[v] = a, b, integral[k] if integral else None
            fresh[v] = bool(computed and computed[k])
        for eqn in jaxpr.eqns:
            vals, bs = zip(*(read(v) for v in eqn.invars)) if eqn.invars else ((), ())
            ms = [integer_magnitude(v) for v in eqn.invars]
            ins_fresh = [not hasattr(v, "val") and fresh[v] for v in eqn.invars]
            ins_constant = [hasattr(v, "val") or v in constant for v in eqn.invars]
            if all(ins_constant):
                constant.update(eqn.outvars)
            inner = _call_jaxpr(eqn) if eqn.primitive.name in _CALLS else None
            if inner is not None:  # evaluated inline, so that what it knows of its outputs comes back
                outs, out_bounds, out_ms, out_fresh = self.run(inner, list(vals), list(bs), ms, ins_fresh)
            else:
                out_ms = _integer_magnitudes(eqn, ms)
                outs, out_bounds = self.eqn(eqn, list(vals), list(bs), out_ms, any(ins_fresh))
                out_fresh = [_fresh_after(eqn, ins_fresh, ins_constant)] * len(outs)
            for v, o, b, m, f in zip(eqn.outvars, outs, out_bounds, out_ms, out_fresh):
                env[v], bound[v], magnitude[v], fresh[v] = o, b, m, f
        results = [read(v) for v in jaxpr.outvars]
        return (
            [r for r, _ in results],
            [b for _, b in results],
            [integer_magnitude(v) for v in jaxpr.outvars],
            [not hasattr(v, "val") and fresh[v] for v in jaxpr.outvars],
        )

    def eqn(
        self, eqn, vals: list, bounds: list[float], out_ms: list[float | None], fresh: bool
    ) -> tuple[list, list[float]]:
        name = eqn.primitive.name
        for v in eqn.outvars:
            self.stats.saw(v.aval.dtype)
        if any(_is_jaxpr(p) for p in _flat_params(eqn.params)):
            return self.higher_order(eqn, vals, bounds)
        if name == "convert_element_type":
            return self.convert(eqn, vals[0], bounds[0], fresh)
        if name in _ACCUMULATIONS:
            if max(bounds, default=0.0) == 0.0 and _exact_integers(out_ms[0], eqn.outvars[0].aval.dtype):
                return _bind(eqn, vals), [0.0]
            return self.accumulate(eqn, vals, bounds)
        if max(bounds, default=0.0) > 0 and name in _DECISIONS:
            self.ties.append(_DECISIONS[name](eqn, vals, max(bounds)))
        outs = _bind(eqn, vals)
        if not any(_eps(v.aval.dtype) for v in eqn.outvars):
            return outs, [0.0] * len(outs)
        return outs, [max(bounds, default=0.0)] * len(outs)

    def convert(self, eqn, x, b: float, fresh: bool) -> tuple[list, list[float]]:
        # lazy: jax is heavy; equivci's parent process loads this module without it
        import jax.numpy as jnp

        src, dst = eqn.invars[0].aval.dtype, eqn.params["new_dtype"]
        src_eps, dst_eps = _eps(src), _eps(dst)
        if src_eps is not None and dst_eps is None and b > 0:  # float -> int truncates
            self.ties.append(_near_integer(jnp.asarray(x), b))
        if src_eps is None or dst_eps is None or dst_eps <= src_eps or (b == 0.0 and not fresh):
            return _bind(eqn, [x]), [0.0 if dst_eps is None else b]
        self.stats.points += 1
        # A rounding right after a constant scale may as well sit before it in a correct program
        # (the scale applied after the cast instead of before): every element may round either way.
        either = max(b, dst_eps / 2) if fresh else b
        return [_round_either_way(jnp.asarray(x), dst, either)], [dst_eps]

    def accumulate(self, eqn, vals: list, bounds: list[float]) -> tuple[list, list[float]]:
        # lazy: jax is heavy; equivci's parent process loads this module without it
        import jax.numpy as jnp

        out_dtype = eqn.outvars[0].aval.dtype
        n = _terms(eqn)
        acc = jnp.float32 if (_eps(out_dtype) or 0) > float(jnp.finfo(jnp.float32).eps) else out_dtype
        if _eps(out_dtype) is None:
            return _bind(eqn, vals), [0.0]
        grown = max(bounds, default=0.0) + LAMBDA * math.sqrt(n) * float(jnp.finfo(acc).eps) / 2
        if acc == out_dtype:
            return _bind(eqn, vals), [grown]
        # A narrow accumulation: computed wide, every element may round either way.
        wide = [jnp.asarray(v).astype(jnp.float32) if _eps(jnp.asarray(v).dtype) else v for v in vals]
        params = dict(eqn.params)
        if "preferred_element_type" in params:
            params["preferred_element_type"] = jnp.float32
        out = eqn.primitive.bind(*wide, **params)
        self.stats.points += 1
        return [_round_either_way(out, out_dtype, 1.0)], [float(_eps(out_dtype) or 0.0)]

    def higher_order(self, eqn, vals: list, bounds: list[float]) -> tuple[list, list[float]]:
        """scan / while / cond: rewrite each body with every float input at the largest bound."""
        # lazy: jax is heavy; equivci's parent process loads this module without it
        import jax

        b = max(bounds, default=0.0)

        def rewrite(closed):
            stats = self.stats

            def body(*args):
                outs = _Interpreter(stats).run(closed, list(args), [b] * len(args))[0]
                return outs

            avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in closed.jaxpr.invars]
            return jax.make_jaxpr(body)(*avals)

        params = {k: _map_jaxprs(v, rewrite) for k, v in eqn.params.items()}
        outs = eqn.primitive.bind(*vals, **params)
        outs = list(outs) if eqn.primitive.multiple_results else [outs]
        return outs, [b if _eps(v.aval.dtype) else 0.0 for v in eqn.outvars]


# Ops whose integer-valued result is no larger than their largest (data) operand.
_SAME_MAGNITUDE = {
    "broadcast_in_dim", "reshape", "transpose", "slice", "squeeze", "expand_dims", "concatenate", "copy",
    "copy_p", "rev", "pad", "tile", "reduce_max", "reduce_min", "max", "min", "neg", "abs", "convert_element_type",
}  # fmt: skip
# Ops whose first operand is the data and the rest are indices.
_INDEXED = {"dynamic_slice", "gather"}

# Ops that compute no new float value from their operands' values: moving a rounding across them
# changes nothing, so they pass on whether their data was computed since it was last rounded.
_EXACT = (_SAME_MAGNITUDE - {"convert_element_type"}) | _INDEXED | {
    "select_n", "dynamic_update_slice", "scatter", "sign", "floor", "ceil", "round", "clamp",
    "stop_gradient", "optimization_barrier", "sharding_constraint",
}  # fmt: skip


def _fresh_after(eqn, ins_fresh: list[bool], ins_constant: list[bool]) -> bool:
    """Whether eqn's outputs hold floats scaled by a constant since their last rounding."""
    name = eqn.primitive.name
    if name == "convert_element_type":
        src, dst = _eps(eqn.invars[0].aval.dtype), _eps(eqn.params["new_dtype"])
        return dst is not None and src is not None and dst <= src and any(ins_fresh)
    if name in _ACCUMULATIONS or not any(_eps(v.aval.dtype) for v in eqn.outvars):
        return False
    if name in _EXACT:
        return any(ins_fresh)
    # A constant scale (a normalizer, 1/sqrt(d), a temperature) is what correct code moves across a
    # cast; other arithmetic in a narrower type (a tanh, an all-reduce in bf16) computes another function.
    return name in ("mul", "div") and any(ins_constant) and not all(ins_constant)


def _integer_magnitudes(eqn, ms: list[float | None]) -> list[float | None]:
    """For each output: its largest possible |value| if it is known to hold integers, else None."""
    name = eqn.primitive.name
    unknown: list[float | None] = [None] * len(eqn.outvars)
    if name == "convert_element_type" and eqn.invars[0].aval.dtype == bool:
        return [1.0]
    if name == "iota":
        return [float(max(eqn.params["shape"][eqn.params["dimension"]] - 1, 0))]
    data = (
        ms[1:]
        if name == "select_n"
        else ms[:1]
        if name in _INDEXED
        else ms[:2]
        if name == "dynamic_update_slice"
        else ms
    )
    if not data or any(m is None for m in data):
        return unknown
    known = [float(m) for m in data if m is not None]
    if name in _SAME_MAGNITUDE or name in _INDEXED or name in ("select_n", "dynamic_update_slice"):
        return [max(known)]
    if name in ("add", "sub"):
        return [known[0] + known[1]]
    if name == "mul":
        return [known[0] * known[1]]
    if name in ("reduce_sum", "cumsum"):
        return [_terms(eqn) * known[0]]
    if name == "dot_general":
        return [_terms(eqn) * known[0] * known[1]]
    return unknown


def _constant_magnitude(value) -> float | None:
    try:
        a = np.asarray(value)
    except Exception:  # an opaque constant (a key, a token): no integer
        return None
    if a.dtype.kind not in "biuf" or a.size == 0:
        return None
    if a.dtype.kind == "f" and not (np.all(np.isfinite(a)) and np.all(a == np.round(a))):
        return None
    return float(np.max(np.abs(a.astype(np.float64))))


def _exact_integers(magnitude: float | None, dtype) -> bool:
    """Integers up to `magnitude` are exact in `dtype`: every sum of them is computed exactly."""
    eps = _eps(dtype)
    return magnitude is not None and (eps is None or magnitude <= 2.0 / eps)


def _round_either_way(x, dtype, bound: float):
    """Round x to dtype; elements within `bound` (relative) of a rounding boundary, and at least
    the FLIP_FRACTION closest to one, take the other neighbour instead."""
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax.numpy as jnp

    wide = x.astype(jnp.float32)
    near = wide.astype(dtype)
    near_w = near.astype(jnp.float32)
    toward = jnp.where(near_w > wide, -jnp.inf, jnp.inf).astype(dtype)
    other = jnp.nextafter(near, toward)
    boundary = (near_w + other.astype(jnp.float32)) / 2
    distance = jnp.abs(wide - boundary) / jnp.maximum(jnp.abs(wide), jnp.finfo(jnp.float32).tiny)
    distance = jnp.where(jnp.isfinite(other.astype(jnp.float32)) & (near_w != wide), distance, jnp.inf)
    flat = distance.reshape(-1)
    threshold: Any  # an array, or the bound itself
    if flat.size:
        k = max(1, math.ceil(FLIP_FRACTION * flat.size))
        kth = jnp.sort(flat)[k - 1]
        threshold = jnp.maximum(bound, jnp.where(jnp.isfinite(kth), kth, 0.0))
    else:
        threshold = bound
    return jnp.where(distance <= threshold, other, near)


def _within(gap, scale, bound: float):
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax.numpy as jnp

    # An infinite gap (a comparison with the -inf of a mask) or a NaN one is never near a tie.
    gap = jnp.abs(gap)
    return jnp.any(jnp.isfinite(gap) & (gap <= bound * jnp.abs(scale)))


def _compare_tie(eqn, vals: list, bound: float):
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax.numpy as jnp

    a, c = (jnp.asarray(v).astype(jnp.float32) for v in vals[:2])
    gap = a - c
    # Sides equal to the bit are no accident of rounding: they are one value reached twice, as when
    # max's derivative compares each element with the max taken over it (a near-tie of that max
    # with its runner-up is what argmax's and top_k's checks see); random inputs make no others.
    return _within(jnp.where(gap == 0, jnp.inf, gap), jnp.maximum(jnp.abs(a), jnp.abs(c)), bound)


def _sorted_gaps(x, axis: int, count: int | None, bound: float):
    """Neighbouring values along `axis` (the largest `count`, or all) within `bound` of each other."""
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax.numpy as jnp

    ordered = -jnp.sort(-jnp.moveaxis(jnp.asarray(x).astype(jnp.float32), axis, -1), axis=-1)
    if count is not None:
        ordered = ordered[..., : count + 1]
    if ordered.shape[-1] < 2:
        return jnp.asarray(False)
    return _within(ordered[..., :-1] - ordered[..., 1:], ordered[..., :-1], bound)


def _near_integer(x, bound: float):
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax.numpy as jnp

    wide = x.astype(jnp.float32)
    return _within(wide - jnp.round(wide), jnp.maximum(jnp.abs(wide), 1.0), bound)


_DECISIONS: dict[str, Callable[..., Any]] = {
    **{op: _compare_tie for op in ("gt", "lt", "ge", "le", "eq", "ne")},
    "argmax": lambda eqn, vals, b: _sorted_gaps(vals[0], eqn.params["axes"][0], 1, b),
    "argmin": lambda eqn, vals, b: _sorted_gaps(-vals[0], eqn.params["axes"][0], 1, b),
    "top_k": lambda eqn, vals, b: _sorted_gaps(vals[0], eqn.params.get("axis", -1), eqn.params["k"], b),
    "sort": lambda eqn, vals, b: _sorted_gaps(vals[0], eqn.params["dimension"], None, b),
    **{op: lambda eqn, vals, b: _near_integer(vals[0], b) for op in ("floor", "ceil", "round", "sign")},
}


def _terms(eqn) -> int:
    """How many terms each output element of an accumulation sums."""
    name = eqn.primitive.name
    shape = eqn.invars[0].aval.shape
    if name == "dot_general":
        (contract, _), _ = eqn.params["dimension_numbers"]
        return max(1, math.prod(shape[d] for d in contract))
    if name == "reduce_sum":
        return max(1, math.prod(shape[d] for d in eqn.params["axes"]))
    if name == "cumsum":
        return max(1, shape[eqn.params["axis"]]) if shape else 1
    if name == "conv_general_dilated":
        return max(1, math.prod(eqn.invars[1].aval.shape) // max(1, eqn.invars[1].aval.shape[0]))
    return max(1, math.prod(eqn.params.get("window_dimensions", (1,))))


def _bind(eqn, vals: list) -> list:
    out = eqn.primitive.bind(*vals, **eqn.params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _is_jaxpr(p) -> bool:
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax.extend as jex

    return isinstance(p, jex.core.ClosedJaxpr)


def _flat_params(params: dict):
    for v in params.values():
        yield from (v if isinstance(v, tuple) else (v,))


def _map_jaxprs(value, fn):
    if isinstance(value, tuple):
        mapped = tuple(_map_jaxprs(v, fn) for v in value)
        # a params tuple of another type (scatter's dimension numbers, a NamedTuple) is kept as is
        return value if all(m is v for m, v in zip(mapped, value)) else mapped
    return fn(value) if _is_jaxpr(value) else value


def _call_jaxpr(eqn):
    # lazy: jax is heavy; equivci's parent process loads this module without it
    import jax.extend as jex

    for key in _CALL_JAXPR_PARAMS:
        p = eqn.params.get(key)
        if isinstance(p, jex.core.ClosedJaxpr):
            return p
        if isinstance(p, jex.core.Jaxpr):
            return jex.core.ClosedJaxpr(p, ())
    return None
