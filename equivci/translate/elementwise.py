"""Handlers of elementwise ops (unary, binary, compare, select, clamp, convert): folded when their
operands are constants, with constant factors pulled in front, and the guards that cannot change
their operand (logsumexp's max(x, -inf)) dropped.
"""

from __future__ import annotations

import functools

import numpy as np

from equivci.hlo.ir import FLOATS, Instruction, Shape
from equivci.terms import semantics
from equivci.terms.ir import Term, bcast_form, inserted_unit_dims
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import BcastSpec, DotSpec, compare_text, parse_transpose, swapped_dot, transpose_text
from equivci.translate import (
    bounds,
    collectives,
    constant_selects,
    cumsums,
    log_quotients,
    masks,
    one_hot_columns,
    pieces,
    roundings,
    shifts,
    signed_sums,
    squeezes,
    unrolled_picks,
)
from equivci.translate.arrays import all_equal
from equivci.translate.builder import Builder
from equivci.translate.reductions import dot_term
from equivci.translate.shapes import broadcast_term

UNARY = {
    "abs",
    "ceil",
    "cos",
    "exp",
    "exponential",
    "exponential-minus-one",
    "floor",
    "log",
    "log-plus-one",
    "logistic",
    "negate",
    "not",
    "rsqrt",
    "sign",
    "sine",
    "cosine",
    "sqrt",
    "tanh",
    "erf",
    "cbrt",
    "round-nearest-even",
    "round-nearest-afz",
    "is-finite",
    "tan",
    "popcnt",
    "real",
    "imag",
}
BINARY = {
    "add",
    "subtract",
    "multiply",
    "divide",
    "maximum",
    "minimum",
    "power",
    "remainder",
    "and",
    "or",
    "xor",
    "atan2",
    "shift-left",
    "shift-right-arithmetic",
    "shift-right-logical",
}


SHIFTS = {"multiply": shifts.rescaled_product, "add": shifts.sorted_sum, "maximum": shifts.sorted_max}


def convert(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    """convert and bitcast-convert: a convert to the same dtype is its operand; bitcasts are not folded."""
    op, shape = inst.opcode, inst.shape
    if args[0].dtype == shape.dtype and op == "convert":
        return args[0]
    x = args[0]
    if op == "convert" and {x.dtype, shape.dtype} <= FLOATS and x.op in ("reshape", "transpose", "concat"):
        # Rounding is elementwise: the rounding of a relayout or of a concatenation is the relayout
        # or the concatenation of the roundings, built with the convert below those ops, so that a
        # value cast before a reshape and one cast after it (a bf16 image patchified, or its patches
        # cast) are one term, dots see through the relayouts of their operands, and a time shard
        # joined with its neighbours' frames, then cast, is made of the casts of windows of the input.
        def rounded(y: Term) -> Term:
            return convert(ev, Instruction(inst.name, op, Shape(shape.dtype, y.shape), (), {}), [y], device)

        if x.op == "reshape":
            pushed = ev.reshape_term(rounded(x.args[0]), shape)
        elif x.op == "transpose":
            pushed = ev.transpose_term(rounded(x.args[0]), parse_transpose(x.attrs[0]))
        else:
            pushed = ev.concat([rounded(y) for y in x.args], x.attrs[0])
        # The rounding as written stays stated beside it: facts that read a relayout of a dot (a
        # device's one KV head, its projection's output reshaped to [b, s, 1, hd], then cast to f32
        # for RoPE) find the relayout right above the dot there only.
        if x.op != "reshape" or inserted_unit_dims(x.args[0].shape, x.shape) is None:
            return pushed
        if (written := _as_written(ev, op, args, shape)) is not pushed:
            ev.equal_terms.append([written, pushed])
        return written
    return _as_written(ev, op, args, shape)


def _as_written(ev: Builder, op: str, args: list, shape: Shape) -> Term:
    x = args[0]
    if op == "convert" and shape.dtype == "bf16" and (v := splat_number(ev, x)) is not None and _bf16_exact(v):
        # (numpy has no bf16 to fold with: a splat bf16 holds exactly, zeros that pad a shard, is that splat)
        return ev.const(np.full(shape.dims, v, np.float32), shape.dtype)
    exact = op == "convert" and shape.dtype in NP_DTYPES  # bitcasts are not folded
    term = _built(ev, "unary", (op,), args, shape, lambda v: v.astype(NP_DTYPES[shape.dtype]) if exact else None)
    return roundings.scaled_out(ev, term) or term


def _bf16_exact(v: np.generic) -> bool:
    """Whether the number v is a bfloat16 (an f32 whose low 16 bits are zero)."""
    f = np.float32(v)
    return bool(f == v) and int(f.view(np.uint32)) & 0xFFFF == 0


def unary(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    return unary_terms(ev, inst.opcode, args, inst.shape)


def unary_terms(ev: Builder, op: str, args: list, shape: Shape) -> Term:
    if (plain := without_guard(ev, op, args)) is not None:
        return plain
    on = lambda xs, sh: unary_of(ev, op, xs, sh)  # noqa: E731
    if (outside := unit_reshaped(ev, args, shape, on)) is not None:
        one_wide_written(ev, outside, "unary", op, args, shape)
        return outside
    if (outside := broadcast_outside(ev, args, shape, on)) is not None:
        return outside
    term = _built(ev, "unary", (op,), args, shape, lambda v: semantics.apply(semantics.UNARY, op, v))
    if op == "negate" and (form := signed_sums.one_form(ev, term)) is not None:
        ev.equal_terms.append([term, form])
    if op == "exponential" and ev.folded(term) is None:
        quotient = log_quotients.exp_quotient(
            ev,
            args[0],
            shape,
            lambda u, sh: unary_terms(ev, op, [u], sh),
            lambda o, xs, sh: binary_terms(ev, o, xs, sh),
        )
        if quotient is not None:
            ev.equal_terms.append([term, quotient])  # softmax as exp(x - lse), beside its quotient form
    return term


def splat_number(ev: Builder, t: Term) -> np.generic | None:
    """The one number every element of `t` folds to (a numpy scalar of its dtype), None when `t`
    is not such a constant: a splat is the same in every layout and under every reshape."""
    value = ev.folded(t)
    if value is None or not value.size or not all_equal(value):
        return None
    return value.flat[0]


def unary_of(ev: Builder, op: str, args: list, shape: Shape) -> Term:
    return _built(ev, "unary", (op,), args, shape, lambda v: semantics.apply(semantics.UNARY, op, v))


def unit_reshaped(ev: Builder, args: list, shape: Shape, op_on, quotients: bool = True) -> Term | None:
    """op(reshape(a), reshape(b)) as reshape(op(a, b)) when the reshapes only add or drop size-1
    dims of operands of one shape (a constant of one value everywhere is reshaped to it, a constant
    factor in front of a reshape goes inside it): an elementwise op reads and writes each element
    in place, and such a reshape keeps every element's order. keepdims code (`m = s.max(-1,
    keepdims=True)`, online softmax's running max and sum kept as [..., 1]) then meets the facts
    about the reductions themselves (a running max of reduce-maxima, a sum of shifted exponentials
    rescaled). None when no operand is such a reshape, and on integers and predicates: index
    arithmetic keeps its written form, which the facts about indices (bounds, offsets, one-hot
    picks) read operand by operand. `quotients`: a scaled operand read in its quotient form
    (`_quotient_reshaped`)."""
    found = _outside(ev, args, "reshape", quotients)
    if found is None:
        return None
    _, dims, inner = found
    if [n for n in dims if n != 1] != [n for n in shape.dims if n != 1] or dims == shape.dims:
        return None
    return ev.reshape_term(op_on(inner, Shape(shape.dtype, dims)), shape)


def broadcast_outside(ev: Builder, args: list, shape: Shape, op_on) -> Term | None:
    """op(bcast(a), bcast(b)) as bcast(op(a, b)) when every operand is the same broadcast of an
    operand of one shape (a constant of one value everywhere is made that shape, a constant factor
    in front of a broadcast goes inside it): an elementwise op computes each element from its
    operands' elements at the same index, and a broadcast's element is its operand's at the
    index's projection, so every element is op of the same numbers either way: exact in floats. A
    statistic broadcast before its last ops (LayerNorm's variance broadcast over the features, then
    `+ eps` and `sqrt` on every copy) then meets the statistic finished before the broadcast. None
    on integers and predicates, whose written forms the index facts read."""
    found = _outside(ev, args, "bcast")
    if found is None:
        return None
    (spec,), dims, inner = found
    out_dims = tuple(o for o, _ in sorted(BcastSpec.parse(spec).operand_dims(), key=lambda pair: pair[1]))
    return broadcast_term(ev, op_on(inner, Shape(shape.dtype, dims)), shape, out_dims)


def _outside(
    ev: Builder, args: list, op: str, quotients: bool = True
) -> tuple[tuple, tuple[int, ...], list[Term]] | None:
    """(attrs, operand shape, operands) when every float operand of an elementwise op is an `op`
    (reshape or bcast) with the same attrs of an operand of one shape, up to a constant factor in
    front (moved inside), or a constant of one value everywhere (made that shape); else None, and
    when every operand folds (constants are folded as they are). `quotients`: a scaled reshape read
    in its quotient form, `_quotient_reshaped`."""
    if any(a.dtype not in FLOATS for a in args) or all(ev.folded(a) is not None for a in args):
        return None
    numbers = [splat_number(ev, a) for a in args]
    layouts = [ev.scale_of(_quotient_reshaped(ev, a) if op == "reshape" and quotients else a) for a in args]
    written = {
        (base.attrs, base.args[0].shape) for (_, base), n in zip(layouts, numbers) if base.op == op and n is None
    }
    if len(written) != 1:
        return None
    ((attrs, dims),) = written
    inner = []
    for a, (factor, base), number in zip(args, layouts, numbers):
        moved: Term | None
        if number is not None:
            moved = ev.const(np.broadcast_to(number, dims), a.dtype)
        elif base.op == op:  # the one written (attrs, shape): every other is in `written` too
            moved = ev.scaled(base.args[0], factor)
        elif op == "reshape" and base.op == "bcast" and (viewed := _unit_viewed(ev, base, dims)) is not None:
            moved = ev.scaled(viewed, factor)
        else:
            return None
        if moved is None:
            return None
        inner.append(moved)
    return attrs, dims, inner


def _quotient_reshaped(ev: Builder, a: Term) -> Term:
    """A scaled reshape by its quotient form, the reshape of a quotient (reciprocals.py), so that an
    op on it is built on the quotient the reference divides by: dot_product_attention's scores
    `c * s` with a unit dim inserted, the reference's `s / q`."""
    quotient = ev.quotients.get(a)
    return quotient if quotient is not None and quotient.op == "reshape" and ev.scale_of(a)[1].op == "reshape" else a


def _unit_viewed(ev: Builder, b: Term, dims: tuple[int, ...]) -> Term | None:
    """The broadcast `b` laid out as `dims`, the same numbers in the same order with size-1 dims only
    inserted or dropped (b is its reshape): an output dim dropped takes its size-1 operand dim with
    it, an output dim inserted is a new one. A row statistic broadcast back over a value that
    carries a unit dim (dot_product_attention's [1, B, N, T, S] probabilities) is then the
    broadcast over the value without it. None when b's non-unit dims are not dims', and when b
    has no unit dims that dims lacks."""
    shape = b.shape
    if inserted_unit_dims(dims, shape) is None:
        # only where the op's reshapes insert unit dims: a row squeezed out of a batch keeps the op
        # as written (squeezes.py states it as the squeeze of the op on the row)
        return None
    ns = [o for o, n in enumerate(shape) if n != 1]
    nd = [p for p, n in enumerate(dims) if n != 1]
    if [shape[o] for o in ns] != [dims[p] for p in nd]:
        return None
    x = b.args[0]
    parts = BcastSpec.parse(b.attrs[0]).parts
    dropped = sorted(value for o, (kind, value) in enumerate(parts) if shape[o] == 1 and kind == "i")
    out_dims: list[int] = [0] * (len(x.shape) - len(dropped))
    for o, p in zip(ns, nd):
        kind, k = parts[o]
        if kind == "i":
            out_dims[k - sum(1 for d in dropped if d < k)] = p
    if dropped:
        x = ev.reshape_term(x, Shape(x.dtype, tuple(n for k, n in enumerate(x.shape) if k not in dropped)))
    return broadcast_term(ev, x, Shape(b.dtype, dims), tuple(out_dims))


def one_wide_written(ev: Builder, outside: Term, kind: str, op: str, args: list, shape: Shape) -> None:
    """State beside an elementwise op's unit-reshaped form (`outside`) the op on its operands as
    written, where an operand is a broadcast that keeps a size-1 dim of its operand, or such an op's
    result: that dim is a one-wide window of a wider dim of the other program (a device's one head of
    the reference's per-head slopes, `-r[h0:h0 + 1][None, :, None, None] * log1p(d[:, None])`), and
    the broadcast as written is the window of the other program's broadcast there, which the
    squeezed form is not. An operand reshaped only to insert size-1 dims is written as that
    broadcast (the same elements, `bcast_form`): the one-wide window of the other program's
    broadcast along them. An op on its own operands is the op: exact."""
    if not any(
        a in ev.one_wide
        or a.op == "bcast"
        and any(kind == "i" and a.args[0].shape[v] == 1 for kind, v in BcastSpec.parse(a.attrs[0]).parts)
        for a in args
    ):
        return
    written = []
    for a in args:
        form = bcast_form(a) if a.op == "reshape" and a not in ev.one_wide else None
        written.append(a if form is None else ev.mk("bcast", (form[0],), [form[1]], Shape(a.dtype, a.shape)))
    ev.one_wide[outside] = ev.mk(kind, (op,), written, shape)
    ev.equal_terms.append([outside, ev.one_wide[outside]])


def binary(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    return binary_terms(ev, inst.opcode, args, inst.shape)


def binary_terms(ev: Builder, op: str, args: list, shape: Shape) -> Term:
    """The binary op's term, with the facts stated beside it (its signed sum in one form, its
    pieces when an operand is a concatenation)."""
    if (plain := without_guard(ev, op, args)) is not None:
        return plain
    if (cancelled := offset_cancelled(ev, op, args)) is not None:
        return cancelled
    if (merged := offset_merged(ev, op, args, shape)) is not None:
        return merged
    on = lambda xs, sh: binary_terms(ev, op, xs, sh)  # noqa: E731
    # a product moves its operands' constant factors in front (Builder.factored): an operand's
    # factor read as a quotient would hide it inside, where the other program's product of the
    # same values keeps it in front (a shard's `0.001 * g * g` of a psum-ed gradient, no reshape)
    quotients = op != "multiply"
    if (outside := unit_reshaped(ev, args, shape, on, quotients)) is not None:
        one_wide_written(ev, outside, "binary", op, args, shape)
        return outside
    if (outside := broadcast_outside(ev, args, shape, on)) is not None:
        return outside
    if (shifted := SHIFTS[op](ev, *args) if op in SHIFTS else None) is not None:
        return shifted  # online softmax's exponentials rescaled to the newest shift, its blocks in order
    if op == "add" and (joined := pieces.padded_sum(ev, *args)) is not None:
        return joined
    if op == "multiply" and (kept := constant_selects.product_by_mask(ev, args[0], args[1], True)) is not None:
        return kept  # a product by a constant mask along one dim: x's windows and zeros
    fn = lambda a, b: semantics.apply(semantics.BINARY, op, a, b)  # noqa: E731
    if (moved := through_transpose(ev, op, args, shape, fn)) is not None:
        return moved
    term = _built(ev, "binary", (op,), args, shape, fn)
    if ev.folded(term) is None and (moved := transposed_with_broadcast(ev, op, args, shape)) is not None:
        ev.equal_terms.append([term, moved])
    if op == "multiply" and (same := idempotent_product(ev, args, shape)) is not None:
        ev.equal_terms.append([term, same])
    if op == "divide" and ev.folded(term) is None and (product := reciprocal_root_product(ev, args, shape)) is not None:
        ev.equal_terms.append([term, product])
    if op == "add" and ev.folded(term) is None:
        for k in (0, 1):
            if ev.uniform(args[k]) == 0 and args[1 - k].shape == term.shape and args[1 - k].dtype == term.dtype:
                # x + 0 = x, stated beside the add that one device keeps (plus_zero drops it only when
                # every device adds zero): shard 0 adds no earlier shards' totals to its running sum
                ev.equal_terms.append([term, args[1 - k]])
    if op == "add" and ev.folded(term) is None:
        if (total := cumsums.merged_totals(ev, term)) is not None:
            ev.equal_terms.append([term, total])  # the earlier shards' totals added out of order
        collectives.regrouped_by_device(ev, term, *args)
        if (choices := unrolled_picks.summed_choices(ev, term)) is not None:
            ev.equal_terms.append([term, choices])  # a top-k's choices weighted and added one by one
    # Where the builder moved a constant factor in front, x * (c * s) = (x * s) * c, the facts of
    # the op are stated for the op under the factor too: the other program may apply c elsewhere
    # (YaRN's attention factor on the cos/sin table, or on the rotated sum), and only that op meets.
    factor, base = ev.scale_of(term)
    under = factor != 1 and base.op == "binary" and base.attrs == (op,) and ev.folded(base) is None
    for whole, operands in ((term, args), *([(base, list(base.args))] if under else [])):
        beside(ev, op, whole, operands, shape)
    return term


def beside(ev: Builder, op: str, term: Term, args: list, shape: Shape) -> None:
    """State the elementwise binary op's facts beside its term: its signed sum in one form, and its
    pieces when an operand is a concatenation."""
    if (form := signed_sums.one_form(ev, term) or signed_sums.plain_form(ev, term)) is not None:
        ev.equal_terms.append([term, form])  # (a product's factor may fold into a sum)
    if ev.folded(term) is None:

        def piece(parts: list[Term]) -> Term:
            return binary_terms(ev, op, parts, Shape(shape.dtype, parts[0].shape))

        if (joined := pieces.elementwise_pieces(ev, args, piece)) is not None and joined is not term:
            ev.equal_terms.append([term, joined])
            ev.piecewise[term] = joined


def reciprocal_root_product(ev: Builder, args: list, shape: Shape) -> Term | None:
    """x / sqrt(v) as x * rsqrt(v), and 1 / sqrt(v) as rsqrt(v), the root under the same broadcasts
    and reshapes: rsqrt is the reciprocal of the square root, so they are one value over the reals
    (NaN for v < 0 and an infinity at v = 0 on both sides; XLA's simplifier itself rewrites the
    quotient into the product). The two roundings differ by an ulp or two, which the contract leaves
    free as it does a sum's order. A LayerNorm written `(x - mu) / jnp.sqrt(jnp.var(x) + eps)` then
    meets one written `(x - mu) * lax.rsqrt(var + eps)`."""
    x, root = args
    layout = []
    while root.op in ("bcast", "reshape"):
        layout.append(root)
        root = root.args[0]
    if x.dtype not in FLOATS or root.op != "unary" or root.attrs != ("sqrt",):
        return None
    moved = unary_terms(ev, "rsqrt", list(root.args), Shape(root.dtype, root.shape))
    for t in reversed(layout):
        laid = Shape(t.dtype, t.shape)
        moved = ev.reshape_term(moved, laid) if t.op == "reshape" else ev.mk("bcast", t.attrs, [moved], laid)
    if ev.uniform(x) == 1:
        return moved
    return binary_terms(ev, "multiply", [x, moved], shape)


def idempotent_product(ev: Builder, args: list, shape: Shape) -> Term | None:
    """(c - m) * m as (c - 1) * m (and c + m as c + 1) for m a converted predicate: m is 0 or 1, so
    m * m = m. A token's queue position in its expert's buffer, `(cumsum(m) - m) * m` or
    `(cumsum(m) - 1) * m`, is one value."""
    for k in (0, 1):
        s, m = args[k], args[1 - k]
        if not (m.op == "unary" and m.attrs[0] == "convert" and m.args[0].dtype == "pred"):
            continue
        if s.op != "binary" or s.attrs[0] not in ("add", "subtract") or s.args[1] is not m or s.shape != m.shape:
            continue
        one = ev.const(np.ones(s.shape, NP_DTYPES[s.dtype]), s.dtype)
        sub_fn = lambda a, b, op=s.attrs[0]: semantics.apply(semantics.BINARY, op, a, b)  # noqa: E731
        moved = _built(ev, "binary", s.attrs, [s.args[0], one], Shape(s.dtype, s.shape), sub_fn)
        mul_fn = lambda a, b: semantics.apply(semantics.BINARY, "multiply", a, b)  # noqa: E731
        return _built(ev, "binary", ("multiply",), [moved, m] if k == 0 else [m, moved], shape, mul_fn)
    return None


def compare(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    return compare_terms(ev, inst.attrs["direction"], args[0], args[1], inst.shape)


# a < b is b > a (and so on), NaN included: every direction is false on NaN on both sides
MIRRORED = {"EQ": "EQ", "NE": "NE", "LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}


def compare_terms(ev: Builder, direction: str, a: Term, b: Term, shape: Shape) -> Term:
    decided = bounds.decide(ev, direction, a, b, shape)
    if decided is not None:
        return decided
    if ev.folded(a) is not None and ev.folded(b) is None:
        # a constant on the right, as `ids == targets[..., None]` and `targets[..., None] == ids`
        # are one one-hot (and `lo <= ids` the range test `ids >= lo`)
        direction, a, b = MIRRORED[direction], b, a
    if (moved := offset_moved(ev, direction, a, b)) is not None:
        direction, a, b = moved
    term = _compare(ev, direction, a, b, shape)
    if ev.folded(term) is None and (strict := half_open(ev, direction, b)) is not None:
        # stated beside the written test, which other facts read as written (a group's rows
        # `starts <= b < ends`, permutations.py)
        ev.equal_terms.append([term, _compare(ev, strict[0], a, strict[1], shape)])
    if ev.folded(term) is None and (ordered := ordered_difference(ev, direction, a, b, shape)) is not None:
        ev.equal_terms.append([term, ordered])
    one_hot_columns.record(ev, term, direction, a, b)
    if ev.folded(term) is None and (found := one_hot_columns.columns(ev, term, direction, a, b)):
        ev.equal_terms.append([term, *found])
    return term


def ordered_difference(ev: Builder, direction: str, a: Term, b: Term, shape: Shape) -> Term | None:
    """An order test of two integer values in one form, `y < x` or `y <= x`: `x - y cmp 0` as
    `x cmp y` where x's and y's bounds keep x - y inside the dtype (exact there: the difference is
    the one over the integers, and its sign orders x and y), and `x > y` as `y < x`. A rolling
    cache's validity `pos - age >= 0` then meets `age <= pos`, for positions whose range is known.
    None when the test is no such order test or the difference may wrap."""
    if direction not in ("LT", "LE", "GT", "GE") or a.dtype[0] not in "su":
        return None
    if ev.uniform(b) == 0 and a.op == "binary" and a.attrs == ("subtract",):
        x, y = a.args
        if ev.folded(x) is not None or ev.folded(y) is not None or not _difference_fits(ev, x, y):
            return None
    elif ev.folded(a) is None and ev.folded(b) is None and direction in ("GT", "GE"):
        x, y = a, b
    else:
        return None
    if direction in ("LT", "LE"):
        return _compare(ev, direction, x, y, shape)
    return _compare(ev, MIRRORED[direction], y, x, shape)


def _difference_fits(ev: Builder, x: Term, y: Term) -> bool:
    """Whether x - y lies inside the dtype for every value of x's and y's bounds."""
    found = [ev.bounds_of(x), ev.bounds_of(y)]
    np_dtype = NP_DTYPES.get(x.dtype)
    if np_dtype is None or any(r is None or not np.all(np.isfinite(r)) for r in found):
        return False
    (lx, hx), (ly, hy) = [(int(r[0]), int(r[1])) for r in found if r is not None]
    info = np.iinfo(np_dtype)
    return info.min <= lx - hy and hx - ly <= info.max


def _compare(ev: Builder, direction: str, a: Term, b: Term, shape: Shape) -> Term:
    name = compare_text(direction, a.dtype)
    return ev.fold_or("binary", (name,), [a, b], shape, lambda x, y: semantics.COMPARE[direction](x, y))


def offset_moved(ev: Builder, direction: str, a: Term, b: Term) -> tuple[str, Term, Term] | None:
    """x - c cmp k as x cmp k + c, x + c cmp k as x cmp k - c and c - x cmp k as x cmp' c - k (cmp'
    mirrored), for integers, constant c and k, also under broadcasts and reshapes of the sum when c
    is one number. `==` and `!=` are exact, overflow included (adding c is one-to-one modulo
    2^bits): a shard's `one_hot(t - lo, n)` is then `t == lo + arange(n)`, the window of the
    reference's `t == arange(V)`. An order test is exact only where neither side wraps: the bounds
    of x must keep x ± c inside the dtype, and k ± c must fit it (a decode window's distance
    `(start + arange(t))[:, None] - arange(s) >= 0` is the reference's `arange(s) <= start + arange(t)`)."""
    k = ev.folded(b)
    if k is None or ev.folded(a) is not None or a.dtype[0] not in "su":
        return None
    layout: list[Term] = []
    inner = a
    while inner.op in ("bcast", "reshape"):
        layout.append(inner)
        inner = inner.args[0]
    if inner.op != "binary" or inner.attrs[0] not in ("add", "subtract"):
        return None
    # the constant on the right (x + c, x - c), or on the left of a subtraction (c - x)
    for j in (1, 0) if inner.attrs[0] == "subtract" else (1,):
        x, c_term = inner.args[1 - j], inner.args[j]
        c = ev.folded(c_term)
        if c is None or x.shape != inner.shape or ev.folded(x) is not None:
            continue
        negated = j == 1 and inner.attrs[0] == "add"  # x + c cmp k: x cmp k - c
        if masks.scalar_int(ev, c_term) is not None:
            # c - x cmp k: x cmp' c - k (k negated, c added); else k -+ c
            scalar = int(c.flat[0])
            moved_layout, moved = _offset_const(ev, b, scalar if j == 0 else -scalar if negated else scalar, j == 0)
            moved = _relaid(ev, moved_layout, moved)
        elif not layout and (kb := masks.scalar_int(ev, b)) is not None:
            # c varies along x's elements (a key position's arange): c's table moved by k
            moved_layout, moved = _offset_const(ev, c_term, -kb if j == 0 else kb, negated)
            moved = _relaid(ev, moved_layout, moved)
        else:
            continue
        if direction not in ("EQ", "NE") and not _exact_order(ev, x, c, k, inner.attrs[0], j, inner.dtype):
            return None
        return direction if j == 1 else MIRRORED[direction], _relaid(ev, layout, x), moved
    return None


def half_open(ev: Builder, direction: str, b: Term) -> tuple[str, Term] | None:
    """(x <= k as x < k + 1, x > k as x >= k + 1): the direction and constant of the half-open form
    of a test of integers against a constant k below the dtype's largest value (exact: no integer
    lies between k and k + 1), so that a window written `d <= w - 1` and one written `d < w` meet."""
    k = ev.folded(b)
    if direction not in ("LE", "GT") or k is None or b.dtype[0] not in "su" or not k.size:
        return None
    np_dtype = NP_DTYPES.get(b.dtype)
    if np_dtype is None or int(k.max()) >= np.iinfo(np_dtype).max:
        return None
    return {"LE": "LT", "GT": "GE"}[direction], _relaid(ev, *_offset_const(ev, b, 1))


def _exact_order(ev: Builder, x: Term, c: np.ndarray, k: np.ndarray, op: str, j: int, dtype: str) -> bool:
    """Whether neither x op c (c - x for j == 0) nor the moved constant wraps around in `dtype`,
    by x's bounds: an order test of integers is then the same test of the unwrapped values."""
    found = ev.bounds_of(x)
    np_dtype = NP_DTYPES.get(dtype)
    if found is None or not np.all(np.isfinite(found)) or np_dtype is None:
        return False
    info = np.iinfo(np_dtype)
    lo, hi = int(found[0]), int(found[1])
    cs, ks = c.astype(object), k.astype(object)
    cmin, cmax, kmin, kmax = int(cs.min()), int(cs.max()), int(ks.min()), int(ks.max())
    if j == 0:
        ends = (cmin - hi, cmax - lo, cmin - kmax, cmax - kmin)
    elif op == "add":
        ends = (lo + cmin, hi + cmax, kmin - cmax, kmax - cmin)
    else:
        ends = (lo - cmax, hi - cmin, kmin + cmin, kmax + cmax)
    return all(info.min <= e <= info.max for e in ends)


def _offset_const(ev: Builder, b: Term, c: int, negate: bool = False) -> tuple[list[Term], Term]:
    """(b's broadcasts and reshapes, outermost first; the constant under them plus c, negated first
    if `negate`): the offset added where the table is smallest, so that it is still found as a
    window of a known table (a shard's `lo + arange(n)` of the reference's `arange(V)`)."""
    layout: list[Term] = []
    while b.op in ("bcast", "reshape") and ev.folded(b.args[0]) is not None:
        layout.append(b)
        b = b.args[0]
    value = ev.folded(b)
    assert value is not None
    with np.errstate(all="ignore"):
        moved = ((-value if negate else value) + np.asarray(c)).astype(value.dtype)
    return layout, ev.const(moved, b.dtype)


def _relaid(ev: Builder, layout: list[Term], x: Term) -> Term:
    """x under the layout ops `layout` (outermost first), each built again on the new operand."""
    for t in reversed(layout):
        shape = Shape(t.dtype, t.shape)
        if t.op == "reshape":
            x = ev.reshape_term(x, shape)
            continue
        # a broadcast table stays a broadcast, its value kept for folding (shapes.broadcast_term)
        value = ev.folded(x)
        x = ev.mk("bcast", t.attrs, [x], shape)
        if value is not None and np.prod(t.shape) <= ev.budgets.fold_elements:
            ev.values[x] = semantics.broadcast(value, t.attrs[0], t.shape)
    return x


def select(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    return select_terms(ev, args, inst.shape)


def select_terms(ev: Builder, args: list, shape: Shape) -> Term:
    if (plain := without_guard(ev, "select", args)) is not None:
        return plain
    # all three constant: fold (a table the program computes, such as sin(θ) with its zeros chosen
    # where θ = 0, is a constant like any other, found again as a window of the reference's)
    chosen = None if all(ev.folded(a) is not None for a in args) else constant_selects.select_by_constant(ev, *args)
    if chosen is not None:
        return chosen
    if (outside := unit_reshaped_select(ev, args, shape)) is not None:
        return outside
    args = constant_branch_last(ev, *args)
    term = _built(ev, "ternary", ("select",), args, shape, lambda p, a, b: np.where(p, a, b))
    p, a, b = args
    chosen = ev.scale_of(term)[1]
    if chosen is not term and chosen.op == "ternary" and chosen.attrs == ("select",):
        # the builder moved a branch's constant factor in front, f * select(p, x, 0): the fact
        # below is stated for the select itself, which the sums and dots over it read
        p, a, b = chosen.args
    if ev.folded(chosen) is None and a.dtype in FLOATS and p.shape == a.shape and ev.uniform(b) == 0:
        # select(p, x, 0) = x * p over the reals: a one-hot picks by `where(ids == t, x, 0)` or
        # by `x * one_hot(t)` (an infinite x is where they part: inf * 0 is NaN)
        ev.equal_terms.append(
            [chosen, ev.binary("multiply", a, ev.normal("unary", ("convert",), [p], Shape(a.dtype, p.shape)))]
        )
    return term


def unit_reshaped_select(ev: Builder, args: list, shape: Shape) -> Term | None:
    """select(p, reshape(a), reshape(b)) as reshape(select(p', a, b)) when the reshapes only add or
    drop size-1 dims (unit_reshaped's, on the branches) and p is the reshape or broadcast of a
    predicate p' laid out as a and b: select reads and writes each element in place, as any
    elementwise op. A causal mask applied to scores that carry a unit dim (dot_product_attention's
    [1, B, N, T, S]) is then the reference's mask on its [B, N, T, S] scores, reshaped."""
    p, *branches = args
    found = _outside(ev, branches, "reshape")
    if found is None:
        return None
    _, dims, inner = found
    if [n for n in dims if n != 1] != [n for n in shape.dims if n != 1] or dims == shape.dims:
        return None
    if p.op == "reshape" and p.args[0].shape == dims:
        viewed: Term | None = p.args[0]
    elif p.op == "bcast":
        viewed = _unit_viewed(ev, p, dims)
    else:
        return None
    if viewed is None:
        return None
    return ev.reshape_term(select_terms(ev, [viewed, *inner], Shape(shape.dtype, dims)), shape)


def constant_branch_last(ev: Builder, p: Term, a: Term, b: Term) -> list[Term]:
    """select(p, c, x) as select(not p, x, c) for a constant predicate p, a constant c and an x
    that is not: exact (each element takes the same branch's value), so that a mask written as
    `where(triu(k=1), -big, s)` meets the reference's `where(tril, s, -big)`."""
    value = ev.folded(p)
    if value is None or ev.folded(a) is None or ev.folded(b) is not None:
        return [p, a, b]
    return [_negated(ev, p, value), b, a]


def _negated(ev: Builder, p: Term, value: np.ndarray) -> Term:
    """not p for a constant predicate, negated under its broadcast (a mask over [q, k] broadcast over
    batch and heads stays the broadcast of the [q, k] table, as the reference's is)."""
    if p.op == "bcast" and (inner := ev.folded(p.args[0])) is not None:
        table = ev.const(np.logical_not(inner), p.dtype)
        return ev.normal("bcast", p.attrs, [table], Shape(p.dtype, p.shape))
    return ev.const(np.logical_not(value), p.dtype)


def clamp(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    lo, x, hi = (ev.folded(a) for a in args)
    if lo is not None and hi is not None and x is None and (plain := bounds.unclamped(ev, lo, args[1], hi)) is not None:
        return plain
    return _built(ev, "ternary", ("clamp",), args, inst.shape, lambda lo, x, hi: np.clip(x, lo, hi))


def _built(ev: Builder, kind: str, attrs: tuple, args: list, shape: Shape, fn) -> Term:
    """The op folded when its operands are constants, else in normal form (and, on squeezed
    operands, known as the squeeze of the op on the unsqueezed ones)."""
    term = ev.fold_or(kind, attrs, args, shape, fn)
    if ev.folded(term) is None:
        squeezes.note(ev, term)
        squeezes.product_as_dot(ev, term, functools.partial(dot_term, ev))
    return term


def plus_zero(ev: Builder, inst: Instruction, ops: list[list]) -> list | None:
    """x + 0 as x, when every device adds zero: an accumulator that starts at zero (a loop over
    microbatches, unrolled) then carries the constant factors of its terms, and sums of them meet
    the reference's. (A device that adds a non-zero offset keeps the add on every device, so
    that localization compares the same op across devices.)"""
    if inst.opcode != "add" or len(ops) != 2:
        return None
    for k in (0, 1):
        others = ops[1 - k]
        if all(
            isinstance(v, Term)
            and isinstance(z, Term)
            and ev.uniform(z) == 0
            and v.shape == inst.shape.dims
            and v.dtype == inst.shape.dtype
            for z, v in zip(ops[k], others)
        ):
            return others
    return None


def without_guard(ev: Builder, op: str, args: list) -> Term | None:
    """The operand of an op that cannot change it (logsumexp's guards): max(x, -inf),
    min(x, inf), abs(x) of a non-negative x; and select(is_finite(x), x, c), which is x over
    the reals (the identities every rule is checked against)."""
    if op in ("maximum", "minimum"):
        neutral = -np.inf if op == "maximum" else np.inf
        for k in (0, 1):
            value = ev.folded(args[k])
            if value is not None and value.size and np.all(value == neutral) and args[1 - k].shape == args[k].shape:
                return args[1 - k]
    if op == "abs" and _nonnegative(args[0]):
        return args[0]
    if op == "select" and args[0].op == "unary" and args[0].attrs == ("is-finite",) and args[0].args[0] is args[1]:
        return args[1]
    return None


def through_transpose(ev: Builder, op: str, args: list, shape: Shape, fn) -> Term | None:
    """transpose(x) op c = transpose(x op c) when c is one number everywhere (relu's zero on slots
    laid out [groups, experts, ...] where the reference's are [experts, groups, ...]): the op then
    meets the one on the untransposed value. Exact: a splat is the same in every layout. (A
    product or quotient by a splat is a constant factor, which the builder keeps in front.)"""
    if op in ("multiply", "divide"):
        return None
    for k in (0, 1):
        t, c = args[k], args[1 - k]
        number = splat_number(ev, c)
        if t.op != "transpose" or number is None:
            continue
        moved = _op_under(ev, op, k, t.args[0], t.attrs[0], number, c.dtype, shape, fn)
        if t.args[0].op == "dot":
            # the loader knows transpose(dot(x, y)) also as a transpose of dot(y, x): keep that
            # form for the op too (the reference may have the operands the other way round)
            spec, composed = swapped_dot(DotSpec.parse(t.args[0].attrs[0]), parse_transpose(t.attrs[0]))
            dims = [0] * len(shape.dims)
            for o, n in zip(composed, shape.dims):
                dims[o] = n
            x, y = t.args[0].args
            swapped = ev.mk("dot", (spec.text(),), [y, x], Shape(t.dtype, tuple(dims)))
            other = _op_under(ev, op, k, swapped, transpose_text(composed), number, c.dtype, shape, fn)
            ev.equal_terms.append([moved, other])
        return moved
    return None


def transposed_with_broadcast(ev: Builder, op: str, args: list, shape: Shape) -> Term | None:
    """transpose(x, p) op bcast(y) as transpose(x op bcast'(y), p), bcast' the same broadcast laid
    out as x (a broadcast of a transpose of z read as one broadcast of z): exact, both sides pair
    the same two elements. A context summed over key shards and transposed to [b, q, h, d], divided
    by its denominator swapped to [b, q, h], then meets the reference's division before the
    transpose. None unless one operand is a transpose and the other a broadcast of a computed value
    (a splat is through_transpose's, a constant table stays in the written layout)."""
    for k in (0, 1):
        t, c = args[k], args[1 - k]
        form = bcast_form(c)
        if t.op != "transpose" or form is None or ev.folded(c) is not None:
            continue
        perm = parse_transpose(t.attrs[0])
        spec, y = form
        at = {i: o for o, i in BcastSpec.parse(spec).operand_dims()}  # y's dim -> its dim in t's layout
        dims = [perm[at[i]] for i in range(len(y.shape))]  # ... in x's layout
        if y.op == "transpose":
            inner = parse_transpose(y.attrs[0])  # y's dim i is z's dim inner[i]
            dims = [dims[inner.index(j)] for j in range(len(inner))]
            y = y.args[0]
        x = t.args[0]
        if any(x.shape[o] != n for o, n in zip(dims, y.shape)):
            return None  # (a layout that does not fit x's sizes states nothing)
        spread = broadcast_term(ev, y, Shape(c.dtype, x.shape), tuple(dims))
        pair = [x, spread] if k == 0 else [spread, x]
        return ev.transpose_term(binary_terms(ev, op, pair, Shape(shape.dtype, x.shape)), perm)
    return None


def _op_under(ev: Builder, op: str, k: int, x: Term, perm: str, number, dtype: str, shape: Shape, fn) -> Term:
    """transpose(x op splat(number), perm), the splat the k-th operand."""
    splat = ev.const(np.broadcast_to(np.asarray(number), x.shape), dtype)
    term = _built(ev, "binary", (op,), [x, splat] if k == 0 else [splat, x], Shape(shape.dtype, x.shape), fn)
    if parse_transpose(perm) == tuple(range(len(x.shape))):
        return term
    attrs = (perm,)
    return ev.factored("transpose", attrs, [term], shape) or ev.mk("transpose", attrs, [term], shape)


def offset_cancelled(ev: Builder, op: str, args: list) -> Term | None:
    """x for (x + c) - c and (x - c) + c on integers (exact, overflow wraps back): an index made
    with an offset and taken back (a group count minus one) meets the index itself."""
    a, b = args
    signs = {"add": 1, "subtract": -1}
    if op not in signs or a.op != "binary" or a.attrs[0] not in signs or a.dtype[0] not in "su":
        return None
    x, inner = a.args
    c1, c2 = ev.uniform(inner), ev.uniform(b)
    if c1 is None or c2 is None or x.shape != a.shape or signs[a.attrs[0]] * c1 + signs[op] * c2 != 0:
        return None
    return x


def offset_merged(ev: Builder, op: str, args: list, shape: Shape) -> Term | None:
    """(x + c) + k as x + (k + c) for integers, a scalar constant c and a non-uniform constant k
    (also c + x, x - c, and x + c under broadcasts and reshapes): exact, overflow included (integer
    addition is associative modulo 2^bits). A device's positions `(start + d * n) + arange(n)` are then
    `start + (d * n + arange(n))`, whose constant is the window [d * n, d * n + n) of the reference's
    `start + arange(N)`."""
    if op != "add" or shape.dtype[0] not in "su":
        return None
    for k in (0, 1):
        a, b = args[1 - k], args[k]
        # k varies (a shard's arange): a uniform k is an offset of its own, which offsets.py reads
        # off a start as it is written (a window of the reference's dynamic slice at s + c)
        if ev.folded(b) is None or ev.uniform(b) is not None or ev.folded(a) is not None:
            continue
        layout: list[Term] = []
        inner = a
        while inner.op in ("bcast", "reshape"):
            layout.append(inner)
            inner = inner.args[0]
        signs = {"add": 1, "subtract": -1}
        if inner.op != "binary" or inner.attrs[0] not in signs or ev.folded(inner) is not None:
            continue
        # the offset on either side of an add (d * n + start), on the right of a subtraction
        j = 0 if inner.attrs[0] == "add" and masks.scalar_int(ev, inner.args[0]) is not None else 1
        c = masks.scalar_int(ev, inner.args[j])
        if c is None or inner.args[1 - j].shape != inner.shape:
            continue
        x = _relaid(ev, layout, inner.args[1 - j])
        moved = _relaid(ev, *_offset_const(ev, b, signs[inner.attrs[0]] * c))
        fn = lambda u, v: semantics.apply(semantics.BINARY, "add", u, v)  # noqa: E731
        return _built(ev, "binary", ("add",), [moved, x] if k == 0 else [x, moved], shape, fn)
    return None


def _nonnegative(t: Term) -> bool:
    """Whether every element of `t` is >= 0 (or NaN) by its form: exponentials, and sums,
    products and layout changes of such."""
    if t.op == "unary" and t.attrs[0] in ("exponential", "abs"):
        return True
    if (t.op == "binary" and t.attrs[0] in ("add", "multiply", "maximum")) or (
        t.op == "reduce" and t.attrs[0] in ("add", "multiply")
    ):
        return all(_nonnegative(a) for a in t.args)  # (an empty reduce-max would be -inf)
    return t.op in ("reshape", "bcast", "slice", "transpose", "concat") and all(_nonnegative(a) for a in t.args)


HANDLERS = {
    **{op: unary for op in UNARY},
    **{op: binary for op in BINARY},
    "convert": convert,
    "bitcast-convert": convert,
    "compare": compare,
    "select": select,
    "clamp": clamp,
}
