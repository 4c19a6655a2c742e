"""Terms in the normal form every evaluated op gets, and what evaluation learned about them.

The op handlers (elementwise, shapes, reductions, collectives, literals) build their terms through
a `Builder`, which keeps the terms normal: constants folded (`values`), non-uniform constants found
again by content and as windows of one another (`constants`), constant scalar factors pulled in
front, slices composed, reshapes of reshapes merged, and the integer bounds of index values
(`bounds`), which fold range checks. The driver (evaluator.py) is a Builder that also runs the
instructions.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

from equivci.hlo.ir import Instruction, Module, Shape
from equivci.options import Budgets
from equivci.terms import semantics
from equivci.terms.ir import Term, TermTable, gather_map
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import (
    BcastSpec,
    GatherDims,
    bcast_spec,
    parse_compare,
    parse_transpose,
    reshape_groups,
    reshape_spec,
    transpose_text,
)
from equivci.translate import cumsums, gathers, masks, relaid, tiles, windows
from equivci.translate.arrays import all_equal, distinct
from equivci.translate.constants import ConstantPool, Window

# Float dtypes whose constants numpy holds exactly: constant scalar factors are pulled out of these.
SCALABLE = {"f16", "f32", "f64"}
_ONE = Fraction(1)  # scale_of's factor of most terms: one object, not one per call


# One device's value of an instruction: a term, or a tuple of them (a tuple-shaped op).
Value = Term | tuple


def concat_parts(t: Term, dim: int) -> list[Term]:
    """The pieces a (nested, binary) concatenation along `dim` joins, in order (t alone if it is none)."""
    if t.op == "concat" and t.attrs[0] == dim:
        return [p for arg in t.args for p in concat_parts(arg, dim)]
    return [t]


def moves_unit_dims_only(shape: tuple[int, ...], perm: Sequence[int]) -> bool:
    """Whether transposing a value of this shape by perm moves only size-1 dims (the others keep
    their order): such a transpose moves no element, it is a reshape."""
    kept = [d for d in perm if shape[d] != 1]
    return kept == sorted(kept)


def power_of_two(f: Fraction) -> Fraction:
    """The power of two in a nonzero rational: f / power_of_two(f) has an odd numerator and denominator."""
    num, den = abs(f.numerator), f.denominator
    return Fraction(num & -num, den & -den)


def significand(f: Fraction) -> Fraction:
    """f over its power of two, scaled into [1, 2): f = significand(f) * 2^e. A float's significand
    is a number of its dtype, and a product's power of two is then near the product's magnitude."""
    num, den = abs(f.numerator), f.denominator
    e = num.bit_length() - den.bit_length()
    m = abs(f) / Fraction(2) ** e
    return (m if m >= 1 else 2 * m) * (1 if f > 0 else -1)


class Unsupported(Exception):
    """A construct the evaluator cannot translate faithfully; the caller answers `unproven`."""


class Builder:
    def __init__(self, module: Module, table: TermTable, num_devices: int, budgets: Budgets = Budgets()):
        self.module = module
        self.table = table
        self.n = num_devices
        self.budgets = budgets
        self.values: dict[Term, np.ndarray] = {}  # folded constant terms -> their value
        self._uniform: dict[int, tuple[np.ndarray, Fraction | None]] = {}  # uniform()'s answers by id(value)
        self.constants = ConstantPool()  # non-uniform constants, by content and as windows
        self.equal_terms: list[list[Term]] = []  # groups of terms known equal by evaluation
        # Values a handler builds inside one op that are values of the program all the same (a
        # convolution's zero-padded input): in the reference, reference values like its ops' results,
        # onto which a device's narrower values are windows.
        self.inner_values: list[Term] = []
        self.bounds: dict[Term, tuple[float, float]] = {}  # integer terms -> [lo, hi] of their elements
        self.window_sums: dict[Term, tuple] = {}  # opaque reduce-window sums -> (sizes, padding)
        self.window_forms: dict[tuple[Term, int], windows.Window | None] = {}  # windows.window_form's walks
        self.row_scatters: dict[Term, str] = {}  # opaque out[idx[b]] op= update[b] -> "add" or "set"
        self.masked_rows: dict[Term, masks.MaskedRows] = {}  # window lookups -> the full table's rows
        self.collective_sums: set[Term] = set()  # the devices' values added by an all-reduce (signed_sums.py)
        # an all-reduce's sum of values each rounded to a narrower float -> their sum rounded once
        # (collectives.py; roundings.py finds a power of two inside it)
        self.rounded_sums: dict[Term, Term] = {}
        # an all-reduce's sum of the devices' sums -> the sum, term by term, of their all-reduces
        # (collectives._sums_summed; signed_sums.plain_form reads its terms as atoms)
        self.regrouped_sums: dict[Term, Term] = {}
        # a sum over dims of a signed sum -> the sum of its negation in one form, which it negates
        # (reductions.reduction; collectives.combine adds the devices' shares up negated)
        self.negated_sums: dict[Term, Term] = {}
        # a window of a sum over devices (an all-reduce's, or such sums added) -> (each device's term,
        # in group order; the window (dim, start, stop) of their sum, None for all of it)
        # (collectives.regrouped_by_device)
        self.device_sums: dict[Term, tuple[tuple[Term, ...], tuple[int, int, int] | None]] = {}
        self._inputs: dict[Term, tuple[int, ...]] = {}  # inputs_of, memoized
        # argmax positions along one dim -> (the value they are the argmax of, that dim) (orders.py)
        self.argmaxes: dict[Term, tuple[Term, int]] = {}
        # those of them whose reducer keeps the first position of the largest value (orders.first_on_ties)
        self.first_argmaxes: set[Term] = set()
        # integers -> their one-hots (x[..., None] == arange(N)) and the one-hot's new dim (one_hot_columns.py)
        self.one_hots: dict[Term, list[tuple[Term, int]]] = {}
        # elementwise terms in unit-reshaped form -> the op as written on a one-wide window, stated
        # equal (elementwise.one_wide_written)
        self.one_wide: dict[Term, Term] = {}
        # elementwise terms -> the term of the unsqueezed shape whose squeeze they equal (squeezes.py)
        self.unsqueezed: dict[Term, Term] = {}
        # a dot of rows gathered at an index -> the gather of the dense dot there, stated equal
        # (gathered_dots.py, reductions.dot)
        self.gathered: dict[Term, Term] = {}
        # gathered_dots.lane_form's answers, None included: (dense value, index, gather dims)
        self.lane_forms: dict[Term, tuple[Term, Term, GatherDims] | None] = {}
        # tiles as written (a reshape of a broadcast) -> their copies concatenated, stated equal (tiles.py)
        self.tiled: dict[Term, Term] = {}
        # x * c, c the dtype's rounded reciprocal of q -> x / q, stated equal (reciprocals.py)
        self.quotients: dict[Term, Term] = {}
        # elementwise terms with an operand concatenated along a dim -> the concatenation of the op
        # on the pieces, stated equal to them (pieces.py)
        self.piecewise: dict[Term, Term] = {}
        # tables computed from the iota along their first dim -> their rows at an index (row_tables.py)
        self.row_recipes: dict[Term, Callable[[Term], Term | None]] = {}
        # ops on a value split in groups along its leading dim -> the op on the unsplit value (regroup.py)
        self.regrouped: dict[Term, Term] = {}
        # a lifted op's result on the flat rows -> (its instruction, operands, handler, device, which
        # output), so that a group's rows of it are the op on the group's rows (regroup.py)
        self.row_ops: dict[Term, tuple] = {}
        # a group's piece of a value computed group by group -> (that value, the piece's box of it)
        self.boxes: dict[Term, tuple[Term, relaid.Box]] = {}
        # (gather index, size of the dim it indexes, the gather and the calls it is in, innermost first)
        self.index_uses: list[tuple[Term, int, tuple[Instruction, ...]]] = []
        self.calls: list[Instruction] = []  # the calls being evaluated, outermost first
        self.reads: dict[Term, int] = {}  # terms -> the reference inputs they read, as bits (relayouts.reads)
        self._relaying = False  # building relaid_windows' concatenation
        self.relaid_layouts: dict = {}  # relaid.windows' answers by layout

    def const(self, value: np.ndarray, dtype: str) -> Term:
        value = np.asarray(value)
        if all_equal(value):
            # Held as its one element broadcast (a view): a splat of an activation's shape, the
            # constant operand of an op moved inside a reshape, was kept whole for the whole
            # translation, 6.8 GB at fused_qkv's 405B shapes.
            value = np.broadcast_to(np.asarray(value.flat[0]), value.shape)
            scalar = self.table.make("const", (repr(value.flat[0].item()),), (), (), dtype)
            self.values[scalar] = np.asarray(value.flat[0])
            if value.ndim == 0:
                return scalar
            term = self.table.make("bcast", (bcast_spec(0, value.shape, ()),), (scalar,), value.shape, dtype)
        elif (term := self.constants.seen(value, dtype)) is None:
            if (same := self.constants.relaid(value, dtype)) is not None:
                # One table laid out with other unit dims (a reference's [1, 1, d] frequencies
                # squeezed in a vmapped body, a device's own [d]): the reshape of that table, the
                # very term the other program's reshape of it is.
                term = self.reshape_term(same, Shape(dtype, value.shape))
                self.constants.add(term, value, dtype, source=False)
            else:
                term = self._new_constant(value, dtype)
        self.values[term] = value
        return term

    def _new_constant(self, value: np.ndarray, dtype: str) -> Term:
        """A constant no known table holds as it is: a window of known ones, else a table of its own."""
        windows = self.constants.windows(value, dtype, self.budgets.constant_sources) or self.constants.two_dim_windows(
            value, dtype, self.budgets.constant_sources
        )
        if not windows and (iota := self.constants.iota_window(value, dtype)) is not None:
            windows = [iota]
        if windows:
            # Device-local tables (RoPE angles at a shard's positions, a mask's rows) are windows
            # of the reference's tables; saying so relates them. One that repeats along the dim
            # (a mask broadcast over heads) is every such window.
            slices = [self.window_term(w, value, dtype) for w in windows]
            if len(slices) > 1:
                self.equal_terms.append(slices)
            term = slices[0]
        else:
            digest = hashlib.sha256(value.tobytes()).hexdigest()[:16]
            term = self.table.make("const", (f"{digest}:{value.shape}",), (), value.shape, dtype)
        self.constants.add(term, value, dtype, source=not windows)
        return term

    def window_term(self, window: Window, value: np.ndarray, dtype: str) -> Term:
        """The term of a constant pool window that holds `value` (laid out differently in unit dims
        only): a slice of that very source (slice_term would move it to the oldest constant holding
        it, and windows of several sources are stated equal to relate those sources)."""
        source, stop = window.source, window.start + window.width
        if window.across is not None:  # the window along the second dim, then this one's
            across, start, width = window.across
            dims = tuple(width if k == across else n for k, n in enumerate(source.shape))
            source = self.table.make("slice", (across, start, start + width), (source,), dims, dtype)
            self.values[source] = np.take(self.values[window.source], range(start, start + width), axis=across)
        dims = tuple(window.width if k == window.dim else n for k, n in enumerate(source.shape))
        term = self.table.make("slice", (window.dim, window.start, stop), (source,), dims, dtype)
        self.values[term] = value.reshape(dims)
        return self.reshape_term(term, Shape(dtype, value.shape)) if window.reshaped else term

    def folded(self, term: Term) -> np.ndarray | None:
        return self.values.get(term)

    # -- constant scalar factors ------------------------------------------------------------
    # A term times a constant scalar is kept as `multiply(base, broadcast(c))` with the factor
    # pulled out of dots, sums, slices and layout ops, and products of factors folded (exactly, as
    # rationals). Programs that scale at different places (a data-parallel mean: 1/64 on a shard,
    # then a halving pmean, against the reference's 1/128) then build the same term.
    def uniform(self, t: Term) -> Fraction | None:
        """The value of a constant whose elements are all one finite number."""
        value = self.folded(t)
        if value is None or value.size == 0:
            return None
        # Asked of every operand of every op built: a few dozen constants, asked 10^5 times at 405B.
        # Kept by the array itself (held, so that its id is not another's), never by the term.
        key = id(value)
        known = self._uniform.get(key)
        if known is not None:
            return known[1]
        held = distinct(value)
        answer = Fraction(float(held.flat[0])) if np.all(held == held.flat[0]) and np.isfinite(held.flat[0]) else None
        self._uniform[key] = (value, answer)
        return answer

    def inputs_of(self, t: Term) -> tuple[int, ...]:
        """The reference inputs `t` reads, in order: the same for a reference value and a device's
        window, partial sum or copy of it."""
        stack = [t]
        while stack:
            u = stack[-1]
            if u in self._inputs:
                stack.pop()
                continue
            missing = [a for a in u.args if a not in self._inputs]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            found = {u.attrs[0]} if u.op == "param" else set()
            for a in u.args:
                found.update(self._inputs[a])
            self._inputs[u] = tuple(sorted(found))
        return self._inputs[t]

    def scale_of(self, t: Term) -> tuple[Fraction, Term]:
        """`t` as factor * base (factor 1 when there is none)."""
        if t.op == "binary" and t.attrs == ("multiply",) and t.dtype in SCALABLE and self.folded(t.args[0]) is None:
            factor = self.uniform(t.args[1])
            if factor is not None:
                return factor, t.args[0]
        return _ONE, t

    def quotient_scale(self, t: Term) -> tuple[Fraction, Term]:
        """`t` as factor * base, a quotient by a constant, (a * x) / c (a mean over a count with an
        odd part, `divided`'s form), read as the factor a / c of x too: exact over the reals."""
        if t.op == "binary" and t.attrs == ("divide",) and t.dtype in SCALABLE and (c := self.uniform(t.args[1])):
            factor, base = self.scale_of(t.args[0])
            if self.folded(base) is None:
                return factor / c, base
        return self.scale_of(t)

    def rescaled(self, base: Term, factor: Fraction) -> Term | None:
        """factor * base, as `scaled` where the factor is a number of the dtype, else in `divided`'s
        form (a * base) / b; None when neither is."""
        return self.scaled(base, factor) or self.divided(base, factor, Shape(base.dtype, base.shape))

    def scaled(self, base: Term, factor: Fraction) -> Term | None:
        """factor * base; None when the factor is not exactly a number of base's dtype."""
        if factor == 1:
            return base
        if base.dtype not in SCALABLE:
            return None
        splat = self.splat(factor, Shape(base.dtype, base.shape))
        if splat is None:
            return None
        return self.table.make("binary", ("multiply",), (base, splat), base.shape, base.dtype)

    def times(self, base: Term, *factors: Fraction) -> Term | None:
        """base times the product of `factors`. Where the product is no number of the dtype (GELU's
        0.797 times 0.0447 times a loss scale), each factor's significand (in [1, 2), `significand`)
        multiplies the base, smallest first, and the rest of the product, a power of two, goes in
        front: scalings by powers of two at other places (1/8 on a shard and 1/4 after the psum,
        against the reference's 1/32) leave one base. The power of two in front is near the
        product's own size, so it stays a number of the dtype where the product's odd part would
        take it out of range (a mean's 1/16 times GELU's constants squared through a gradient: 2^-164
        beside odd parts of 2^46). Exact over the reals, as every factor pulled out; None when a part
        is no number either."""
        product = math.prod(factors, start=Fraction(1))
        if (term := self.scaled(base, product)) is not None or product == 0 or base.dtype not in SCALABLE:
            return term
        if product.denominator & (product.denominator - 1):
            # an odd part in the denominator (a quotient's factor, `quotient_scale`): divided's form
            return self.divided(base, product, Shape(base.dtype, base.shape))
        inner, front = base, product
        for part in sorted(significand(f) for f in factors if significand(f) != 1):
            splat = self.splat(part, Shape(base.dtype, base.shape))
            if splat is None:
                return None
            inner = self.table.make("binary", ("multiply",), (inner, splat), base.shape, base.dtype)
            front /= part
        return self.scaled(inner, front)

    def divided(self, base: Term, ratio: Fraction, shape: Shape) -> Term | None:
        """ratio * base where the ratio is no number of the dtype (1/3, 1/6): (a * base) / b with b the
        odd part of its denominator, one form however the program wrote it ((0.5 * x) / 3 and x / 6,
        (0.2 * x) / 6 and (0.1 * x) / 3: a mean gradient's scale, then a division by the count of
        microbatches, or once by the count of microbatches and devices); None when a or b is no
        number of the dtype either."""
        odd = ratio.denominator // (ratio.denominator & -ratio.denominator)
        numerator, divisor = self.scaled(base, ratio * odd), self.splat(Fraction(odd), shape)
        if odd == 1 or numerator is None or divisor is None:
            return None
        return self.mk("binary", ("divide",), [numerator, divisor], shape)

    def splat(self, value: Fraction, shape: Shape) -> Term | None:
        """The constant `value` at every element of `shape`; None when it is not exactly a number of
        the dtype."""
        with np.errstate(over="ignore"):
            scalar: np.ndarray = np.asarray(float(value), dtype=NP_DTYPES[shape.dtype])
        if not np.isfinite(scalar) or Fraction(float(scalar)) != value:
            return None
        return self.const(np.broadcast_to(scalar, shape.dims), shape.dtype)

    def factored(self, kind: str, attrs: tuple, args: list[Term], shape: Shape) -> Term | None:
        """The op with its operands' constant factors pulled in front, if any (else None)."""
        if kind == "ternary" and attrs == ("select",):
            return self.factored_select(args, shape)
        if shape.dtype not in SCALABLE or any(isinstance(a, tuple) or a.dtype != shape.dtype for a in args):
            return None
        # (a reduce names its reducer: a product reduce is no binary multiply of two operands)
        op = attrs[0] if kind in ("binary", "unary") else f"reduce-{attrs[0]}" if kind == "reduce" else kind
        scales = [self.scale_of(a) for a in args]
        factors, bases = [f for f, _ in scales], [b for _, b in scales]
        if op == "multiply":
            for k in (0, 1):  # a constant operand joins the other's factor, a quotient's too
                value = self.uniform(args[k])
                if value is not None:
                    factor, base = self.quotient_scale(args[1 - k])
                    return self.times(base, value, factor) or self.times(bases[1 - k], value, factors[1 - k])
            return self.times(self.mk(kind, attrs, bases, shape), *factors) if factors != [1, 1] else None
        if op == "divide":
            value = self.uniform(args[1])
            if value:
                factor, base = self.quotient_scale(args[0])
                return self.rescaled(base, factor / value) or self.rescaled(bases[0], factors[0] / value)
            numerator = self.uniform(args[0])
            if numerator and (numerator != 1 or factors[1] != 1):  # c / (f * x) = (c / f) * (1 / x)
                one = self.const(np.ones(shape.dims, NP_DTYPES[shape.dtype]), shape.dtype)
                return self.scaled(self.mk(kind, attrs, [one, bases[1]], shape), numerator / factors[1])
            return (
                self.scaled(self.mk(kind, attrs, [bases[0], args[1]], shape), factors[0]) if factors[0] != 1 else None
            )
        if op == "dot" and factors != [1, 1]:
            return self.times(self.mk(kind, attrs, bases, shape), *factors)
        linear = op in ("add", "subtract", "negate", "reduce-add") or kind in ("concat", "transpose")
        # a zero operand takes any factor: f * a beside zeros (a gradient padded into a flat
        # parameter vector) is f * (a beside zeros)
        held = {f for f, a in zip(factors, args) if self.uniform(a) != 0}
        if linear and len(held) == 1 and (factor := held.pop()) != 1:
            return self.scaled(self.mk(kind, attrs, bases, shape), factor)
        # quotients by one constant summed (each device's mean over a count with an odd part,
        # psummed): sum_d (a * x_d) / c = (a * sum_d x_d) / c, exact over the reals
        quotients = [self.quotient_scale(a) for a in args]
        held = {f for (f, _), a in zip(quotients, args) if self.uniform(a) != 0}
        if linear and len(held) == 1 and (factor := held.pop()).denominator & (factor.denominator - 1):
            return self.rescaled(self.mk(kind, attrs, [b for _, b in quotients], shape), factor)
        if op in ("add", "subtract") and 1 not in factors and 0 not in factors:
            # f * a + g * b = f * (a + (g / f) * b) when g / f is exact: sums scaled alike up to one
            # ratio meet (a gradient's two terms, each with the loss's scale, in a shard's and the
            # whole batch's)
            second = self.scaled(bases[1], factors[1] / factors[0])
            if second is not None:
                return self.scaled(self.mk(kind, attrs, [bases[0], second], shape), factors[0])
            # else f * a + g * b = p * ((f / p) * a + (g / p) * b), p the power of two in f: sums
            # scaled by one power of two more (a shard's loss scale) meet
            front = power_of_two(factors[0])
            first, second = (self.times(b, f / front) for f, b in zip(factors, bases))
            if front != 1 and first is not None and second is not None:
                return self.scaled(self.mk(kind, attrs, [first, second], shape), front)
        return None

    def factored_select(self, args: list[Term], shape: Shape) -> Term | None:
        """select(p, f * a, f * b) = f * select(p, a, b), a zero branch taking any factor (a
        gradient's guarded branch, select(s >= 0, c / s, 0), with the loss's scale in c); a splat c
        beside a zero branch is c * 1, so select(p, c, 0) = c * select(p, 1, 0) (the cotangent
        `jnp.where` hands a mean loss's branches, 1/n on a shard of n rows, 1/N in the reference)."""
        p, *branches = args
        if shape.dtype not in SCALABLE or any(b.dtype != shape.dtype for b in branches):
            return None
        scales = [(Fraction(0), b) if self.uniform(b) == 0 else self.scale_of(b) for b in branches]
        if sorted(f for f, _ in scales) == [0, 1] and any(self.uniform(b) == 0 for b in branches):
            scales = [self._splat_scale(f, b) for f, b in scales]
        factors = {f for f, _ in scales if f != 0}
        if len(factors) != 1 or (factor := factors.pop()) == 1:
            return None
        bases = [base for _, base in scales]
        return self.scaled(self.mk("ternary", ("select",), (p, *bases), shape), factor)

    def _splat_scale(self, factor: Fraction, t: Term) -> tuple[Fraction, Term]:
        """A non-zero splat c as c * ones (exact: c * 1 is c in every dtype); else as it was."""
        c = self.uniform(t)
        if factor == 0 or not c:
            return factor, t
        return c, self.const(np.ones(t.shape, NP_DTYPES[t.dtype]), t.dtype)

    def normal(self, kind: str, attrs: tuple, args, shape: Shape) -> Term:
        """The term in the normal form every evaluated op gets (constant factors in front), so a
        term built elsewhere (routing.py's dense terms) meets the reference's own."""
        return self.factored(kind, attrs, list(args), shape) or self.mk(kind, attrs, args, shape)

    def mk(self, op: str, attrs: tuple, args: Sequence[Term], shape: Shape) -> Term:
        return self.table.make(op, attrs, tuple(args), shape.dims, shape.dtype)

    def elementwise(self, kind: str, attrs: tuple, args: list[Term], shape: Shape) -> Term:
        """A unary or binary op on terms built beside the program's (gathered_dots' dense values),
        in normal form; the evaluator builds it as its handler builds a written op, so that the
        dense value meets a device's op on the same values in that op's form (relu's zero moved
        under a transpose)."""
        return self.normal(kind, attrs, args, shape)

    def binary(self, op: str, a: Term, b: Term, dtype: str | None = None) -> Term:
        shape = Shape(dtype or a.dtype, a.shape)
        return self.factored("binary", (op,), [a, b], shape) or self.mk("binary", (op,), [a, b], shape)

    def fold_or(self, kind: str, attrs: tuple, args: list, shape: Shape, fn) -> Term:
        values = [self.folded(a) for a in args]
        if all(v is not None for v in values) and np.prod(shape.dims) <= self.budgets.fold_elements:
            try:
                with np.errstate(all="ignore"):
                    result = fn(*values)
            except (TypeError, ValueError, KeyError):
                result = None
            if result is not None:
                return self.const(np.asarray(result).astype(NP_DTYPES.get(shape.dtype, np.float32)), shape.dtype)
        return self.normal(kind, attrs, args, shape)

    # -- layout ----------------------------------------------------------------------------
    def slice_term(self, x: Term, dim: int, start: int, stop: int) -> Term:
        if start == 0 and stop == x.shape[dim]:
            return x
        shape = list(x.shape)
        shape[dim] = stop - start
        value = self.folded(x)
        if value is not None:
            index = [slice(None)] * len(x.shape)
            index[dim] = slice(start, stop)
            window = value[tuple(index)]
            if all_equal(window):
                return self.const(window, x.dtype)
            # A window of a table the program made itself (a device's rows of a longer RoPE table)
            # that a constant known before it holds (the reference's table) is that constant's.
            moved = self.constants.older_windows(window, x.dtype, x) if x.op == "const" else []
            if moved:
                return self.window_term(moved[0], window, x.dtype)
        factor, base = self.scale_of(x)
        if factor != 1 and (term := self.scaled(self.slice_term(base, dim, start, stop), factor)) is not None:
            return term
        if x.op == "opaque" and x.dtype in SCALABLE:
            total = cumsums.last_total(self, x, dim, start, stop)
            if total is not None:  # the last running sum is the total
                return total
        if x.op == "bcast" and value is None and stop - start == 1 and self._only_new_dim(x, dim):
            # a unit window of a broadcast along the one dim it adds holds its operand's elements in
            # order: a reshape (a device's slot of its count broadcast over the slots, psummed)
            return self.reshape_term(x.args[0], Shape(x.dtype, tuple(shape)))
        if x.op == "concat" and x.attrs[0] == dim:  # a window of a concatenation is windows of its parts
            left, right = x.args
            n = left.shape[dim]
            if stop <= n:
                return self.slice_term(left, dim, start, stop)
            if start >= n:
                return self.slice_term(right, dim, start - n, stop - n)
            return self.concat([self.slice_term(left, dim, start, n), self.slice_term(right, dim, 0, stop - n)], dim)
        if x.op == "slice" and x.attrs[0] == dim:  # compose, so slices stay one level deep per dim
            inner_start = x.attrs[1]
            return self.slice_term(x.args[0], dim, inner_start + start, inner_start + stop)
        if (
            x.op in ("slice", "reshape")
            and value is None
            and (term := self.reshaped_window(x, Shape(x.dtype, tuple(shape)), (dim, start, stop))) is not None
        ):
            return term
        if x.op == "transpose" and value is None:
            # A window of a transpose is the transpose of the window, so that transposes move out
            # to the dot that absorbs them (relayouts.through_transposes): q = qkv[0] of a fused
            # projection laid out [3, b, s, h, k] is then a transpose of a window of the dot.
            perm = parse_transpose(x.attrs[0])
            inner = self.slice_term(x.args[0], perm[dim], start, stop)
            out = Shape(x.dtype, tuple(shape))
            term = self.factored("transpose", x.attrs, [inner], out) or self.mk("transpose", x.attrs, [inner], out)
            self.equal_terms.append([term, self.table.make("slice", (dim, start, stop), (x,), tuple(shape), x.dtype)])
            return term
        term = self.table.make("slice", (dim, start, stop), (x,), tuple(shape), x.dtype)
        if value is not None:
            self.values[term] = window
        elif term not in self.bounds:
            # A window's elements are elements of the whole: a device's shard of the ids keeps the
            # bounds the reference's gathers give the ids (whatever made the window: an input's
            # placement, a collective, an HLO slice).
            self.bound(term, x)
        return term

    @staticmethod
    def _only_new_dim(x: Term, dim: int) -> bool:
        """Whether the broadcast x adds `dim` and no other dim, its operand's dims in order."""
        parts = BcastSpec.parse(x.attrs[0]).parts
        kept = [value for o, (kind, value) in enumerate(parts) if o != dim]
        return (
            parts[dim][0] == "n"
            and all(kind == "i" for o, (kind, _) in enumerate(parts) if o != dim)
            and (kept == sorted(kept))
        )

    def slice_nd(self, x: Term, ranges) -> Term:
        for dim, (start, stop) in enumerate(ranges):
            x = self.slice_term(x, dim, start, stop)
        return x

    def concat(self, parts: list[Term], dim: int) -> Term:
        regathered = self.concat_of_reshapes(parts, dim)
        if regathered is not None:
            return regathered
        if len(parts) > 1 and all(p.op == "transpose" and p.attrs == parts[0].attrs for p in parts):
            # Values transposed alike, concatenated, are their concatenation transposed (along the
            # dim the transpose moves to `dim`): the transpose stays outside, where the dot that
            # reads the value absorbs it, and the blocks of a transposed attention output that an
            # all-to-all joins are windows of the untransposed value, which merge.
            perm = parse_transpose(parts[0].attrs[0])
            return self.transpose_term(self.concat([p.args[0] for p in parts], perm[dim]), perm)
        acc = parts[0]
        for p in parts[1:]:
            if acc.op == p.op == "slice" and acc.args[0] is p.args[0] and acc.attrs[0] == p.attrs[0] == dim:
                if acc.attrs[2] == p.attrs[1]:  # adjacent windows of one value are one window
                    acc = self.slice_term(acc.args[0], dim, acc.attrs[1], p.attrs[2])
                    continue
            shape = list(acc.shape)
            shape[dim] += p.shape[dim]
            pair = (dim,), [acc, p], Shape(acc.dtype, tuple(shape))
            acc = self.factored("concat", *pair) or self.mk("concat", *pair)
        return acc

    def concat_of_reshapes(self, parts: list[Term], dim: int) -> Term | None:
        """concat(reshape(y_1), ..., reshape(y_n); dim) as reshape(concat(y_1, ..., y_n; k)) when that
        is the same layout: a flat FSDP shard all-gathered is the flattened gather of the shards.

        The layout identity is checked exactly, on labels (every element of the y's numbered), for
        each dim k along which the y's can be concatenated."""
        if len(parts) < 2 or any(p.op != "reshape" for p in parts):
            return None
        inner = [p.args[0] for p in parts]
        if len({len(y.shape) for y in inner}) != 1:
            return None
        rank = len(inner[0].shape)
        total = sum(int(np.prod(y.shape)) for y in inner)
        if total > self.budgets.layout_labels:
            return None
        out_shape = list(parts[0].shape)
        out_shape[dim] = sum(p.shape[dim] for p in parts)
        # Where stacking along a size-1 dim and joining along a real one give the same layout (a
        # layer's row of an FSDP-sharded stack, [1, rows/n, d] per device), the real dim is where the
        # value was cut: its parts are windows that merge back into the whole.
        for k in sorted(range(rank), key=lambda k: all(y.shape[k] == 1 for y in inner)):
            if any(y.shape[:k] + y.shape[k + 1 :] != inner[0].shape[:k] + inner[0].shape[k + 1 :] for y in inner):
                continue
            whole = np.arange(total).reshape(*inner[0].shape[:k], -1, *inner[0].shape[k + 1 :])
            bounds = np.cumsum([0] + [y.shape[k] for y in inner])
            pieces = [np.take(whole, np.arange(lo, hi), axis=k) for lo, hi in zip(bounds[:-1], bounds[1:])]
            gathered = np.concatenate([piece.reshape(p.shape) for piece, p in zip(pieces, parts)], axis=dim)
            if np.array_equal(gathered, whole.reshape(out_shape)):
                return self.reshape_term(self.concat(inner, k), Shape(parts[0].dtype, tuple(out_shape)))
        return None

    def reshape_term(self, operand: Term, shape: Shape) -> Term:
        if operand.op == "reshape":  # a reshape of a reshape is one reshape
            operand = operand.args[0]
        elif operand in self.unsqueezed:  # and so is a reshape of a squeeze
            operand = self.unsqueezed[operand]
        elif operand in self.regrouped:  # or of an op on a value split in groups
            operand = self.regrouped[operand]
        if operand.shape == shape.dims:
            return operand
        value = self.folded(operand)
        if value is not None and (value.size <= 1 or all_equal(value)):
            return self.const(value.reshape(shape.dims), shape.dtype)
        factor, base = self.scale_of(operand)
        if factor != 1 and (term := self.scaled(self.reshape_term(base, shape), factor)) is not None:
            return term
        if operand.op == "unary" and operand.args[0].op == "reshape":
            # An elementwise op commutes with a reshape: reshape(op(reshape(y))) is op(one reshape
            # of y), so a reshape undone around a log (logsumexp's keepdims) leaves log(y).
            inner = self.reshape_term(operand.args[0], Shape(operand.args[0].dtype, shape.dims))
            return self.normal("unary", operand.attrs, [inner], Shape(operand.dtype, shape.dims))
        if value is None and (term := self.reshaped_window(operand, shape)) is not None:
            # The written form stays stated beside it: a device holding one KV group finds its k
            # slot (slab[..., G, :] of [b, t, 1, G + 2, hd]) to be one window of its columns, where
            # the reference's slot of every group is not one; the window rules relate the two
            # only through the written squeeze of the slot.
            self.equal_terms.append(
                [term, self.mk("reshape", (reshape_spec(operand.shape, shape.dims),), [operand], shape)]
            )
            return term
        if value is None and (term := self.relaid_windows(operand, shape)) is not None:
            return term
        if value is None and (splits := tiles.tile_dims(operand, shape.dims, self.budgets.layout_labels)) is not None:
            # A tile is its copies concatenated (tiles.py), the form a reference that writes
            # `concatenate([y] * r)` builds, stated beside the written broadcast, which stays the
            # term: the facts the builder reads (a data shard's expert counts tiled over its
            # groups, gemma-moe-dp) read the broadcast, and lost their proof to the concatenation.
            part = list(shape.dims)
            for d, copies in splits:
                part[d] //= copies
            term = self.reshape_term(operand.args[0], Shape(shape.dtype, tuple(part)))
            for d, copies in reversed(splits):
                term = self.concat([term] * copies, d)
            written = self.mk("reshape", (reshape_spec(operand.shape, shape.dims),), [operand], shape)
            self.equal_terms.append([written, term])
            self.tiled[written] = term
            return written
        if (
            value is None
            and operand.op == "transpose"
            and (term := self.transposed_reshape(operand, shape)) is not None
        ):
            # The written form stays stated beside it: a device's unit dim (one head per device)
            # moved by the transpose leaves a plain reshape, where the reference's several heads
            # keep the transpose, and the window rules relate the two in the written form.
            spec = (reshape_spec(operand.shape, shape.dims),)
            self.equal_terms.append([term, self.mk("reshape", spec, [operand], shape)])
            return term
        # Tables stay symbolic (a device's table is a window of the reference's); the value is
        # kept so that index arithmetic on it still folds.
        term = self.mk("reshape", (reshape_spec(operand.shape, shape.dims),), [operand], shape)
        if value is None and operand.op == "concat" and (joined := self.reshaped_parts(operand, shape)) is not None:
            # Stated beside the written form: a device holding one KV group builds its rotated
            # heads already split ([b, s, 1, G, hd], the halves joined along hd), where the
            # reference joins the halves of all heads, then splits them ([b, s, K, G, hd]).
            self.equal_terms.append([term, joined])
        if value is not None:
            self.values[term] = value.reshape(shape.dims)
        return term

    def reshaped_parts(self, joined: Term, shape: Shape) -> Term | None:
        """reshape(concat(x_1, ..., x_n; d)) as concat(reshape(x_1), ..., reshape(x_n); d') where the
        pieces, in row-major order, are runs of whole slabs along the output dim d' (`parts_dim`);
        None otherwise. Joined as written: `concat` would gather the reshapes back into
        reshape(concat(...))."""
        d = joined.attrs[0]
        parts = concat_parts(joined, d)
        found = self.parts_dim(joined, parts, shape.dims)
        if found is None:
            return None
        out, sizes = found
        acc: Term | None = None
        for part, size in zip(parts, sizes):
            dims = list(shape.dims)
            dims[out] = size
            piece = self.reshape_term(part, Shape(shape.dtype, tuple(dims)))
            if acc is not None:
                dims[out] += acc.shape[out]
                piece = self.mk("concat", (out,), [acc, piece], Shape(shape.dtype, tuple(dims)))
            acc = piece
        return acc

    def parts_dim(self, joined: Term, parts: list[Term], out: tuple[int, ...]) -> tuple[int, list[int]] | None:
        """(d', sizes): the output dim along which reshape(joined) is the concatenation of its parts
        reshaped, and their sizes there. Cheaply where the reshape leaves the joined dim d itself
        alone (it acts on the dims before d and those after it apart: an output dim of d's size
        whose leading dims hold as many elements as d's); else, where it splits or merges d, checked
        on labels (every element numbered): the parts must be runs of whole slabs along d' in
        row-major order, as a scan's states of shape [b, 1, c] stacked along b and read [t, b, c]."""
        d = joined.attrs[0]
        before = int(np.prod(joined.shape[:d]))
        for j in range(len(out)):
            if out[j] == joined.shape[d] and int(np.prod(out[:j])) == before:
                return j, [p.shape[d] for p in parts]
        total = int(np.prod(joined.shape))
        if total == 0 or total > self.budgets.layout_labels:
            return None
        whole = np.arange(total).reshape(joined.shape)
        bounds = np.cumsum([0] + [p.shape[d] for p in parts])
        pieces = [np.take(whole, np.arange(lo, hi), axis=d) for lo, hi in zip(bounds[:-1], bounds[1:])]
        for j in range(len(out)):
            if any(piece.size * out[j] % total for piece in pieces):
                continue
            sizes = [piece.size * out[j] // total for piece in pieces]
            dims = [tuple(out[:j]) + (size,) + tuple(out[j + 1 :]) for size in sizes]
            joined_labels = np.concatenate([piece.reshape(dim) for piece, dim in zip(pieces, dims)], axis=j)
            if np.array_equal(joined_labels, whole.reshape(out)):
                return j, sizes
        return None

    def transposed_reshape(self, operand: Term, shape: Shape) -> Term | None:
        """reshape(transpose(y, p)) as transpose(reshape(y), q), when each group of dims the reshape
        splits or merges comes from consecutive dims of y in the same order (row-major, a run of y's
        dims is then split or merged alike): the transpose moves out, where the dot that reads the
        value absorbs it (relayouts.through_transposes), so `dot(x, w).reshape(..).transpose(..)`
        and a dot of the other operand order meet. Size-1 dims the reshape adds lead the group after
        them (trailing ones follow the group before). None when a group's dims are not such a run."""
        y, p = operand.args[0], parse_transpose(operand.attrs[0])
        groups = reshape_groups(operand.shape, shape.dims, singletons=True)
        if groups is None:
            return None
        runs = [[p[i] for i in gi] for gi, _ in groups]
        if any(run and run != list(range(run[0], run[0] + len(run))) for run in runs):
            return None
        keys = []
        key = (-1, 0)
        for g, run in enumerate(runs):
            later = next((r for r in runs[g:] if r), None)
            # a size-1 dim leads the split it stands before ([b, s, 1, 2, hd] of [b, s, 2 * hd] is
            # a device's one group of heads, the reference's [groups, heads, hd] split of its
            # columns); trailing ones follow the group before them
            key = (run[0], 0) if run else (later[0], g - len(runs)) if later else (key[0], key[1] + 1)
            keys.append(key)
        order = sorted(range(len(groups)), key=keys.__getitem__)
        dims = [j for g in order for j in groups[g][1]]  # out dims in the order of y's runs
        inner = self.reshape_term(y, Shape(y.dtype, tuple(shape.dims[j] for j in dims)))
        perm = tuple(dims.index(j) for j in range(len(shape.dims)))
        if perm == tuple(range(len(perm))):
            return inner
        attrs = (transpose_text(perm),)
        return self.factored("transpose", attrs, [inner], shape) or self.mk("transpose", attrs, [inner], shape)

    def reshaped_window(self, operand: Term, shape: Shape, last: tuple[int, int, int] | None = None) -> Term | None:
        """reshape(slices and reshapes of y) as (a reshape of) one window of y, when it is one: a
        microbatch taken as reshape(x, (m, b, d))[k] is the rows x[k*b:(k+1)*b]. `last`: a window
        (dim, start, stop) of the operand taken after the chain (a slice of a reshape of a window:
        one KV head of a fused [k|v] projection viewed [.., 2, kv_heads, head_dim], the kv rows
        taken before the head and the k after it, is one window of the projection).

        Checked exactly on labels (every element of y numbered) through the chain of ops."""
        chain: list[Term] = []
        base = operand
        while base.op in ("slice", "reshape") and len(chain) < 8:
            chain.append(base)
            base = base.args[0]
        if (
            not any(t.op == "reshape" for t in chain)
            or not any(t.op == "slice" for t in chain)
            or int(np.prod(base.shape)) > self.budgets.layout_labels
        ):
            return None
        labels = np.arange(int(np.prod(base.shape))).reshape(base.shape)
        for t in reversed(chain):
            if t.op == "reshape":
                labels = labels.reshape(t.shape)
            else:
                dim, start, stop = t.attrs
                labels = np.take(labels, np.arange(start, stop), axis=dim)
        if last is not None:
            dim, start, stop = last
            labels = np.take(labels, np.arange(start, stop), axis=dim)
        coords = np.unravel_index(labels.ravel(), base.shape)
        box = tuple((int(c.min()), int(c.max()) + 1) for c in coords) if labels.size else None
        if box is None or int(np.prod([b - a for a, b in box])) != labels.size:
            return None
        whole = np.arange(int(np.prod(base.shape))).reshape(base.shape)
        if not np.array_equal(whole[tuple(slice(a, b) for a, b in box)].ravel(), labels.ravel()):
            return None
        return self.reshape_term(self.slice_nd(base, box), shape)

    def relaid_windows(self, operand: Term, shape: Shape) -> Term | None:
        """reshape(operand) as the concatenation of windows of the values it was moved from, when it
        is one (an all-to-all resharding rows to columns; relaid.py checks it on labels). Not
        re-entered: the concatenation built here is already in that form."""
        found = self.relaid_pieces(operand, shape)
        if found is None:
            return None
        self._relaying = True
        try:
            return self.concat(found[1], found[0])
        finally:
            self._relaying = False

    def relaid_pieces(self, operand: Term, shape: Shape) -> tuple[int, list[Term]] | None:
        """(dim, pieces) when reshape(operand) is the concatenation of the pieces along dim, each a
        window of a value it was moved from (relaid.py); None otherwise, or while building them."""
        if self._relaying:
            return None
        found = relaid.windows(operand, shape.dims, self.budgets.layout_labels, self.boxes, self.relaid_layouts)
        if found is None:
            return None
        dim, runs = found
        self._relaying = True
        try:
            parts = []
            for source, perm, box, length in runs:
                run = list(shape.dims)
                run[dim] = length
                window = self.slice_nd(self.transpose_term(source, perm), box)
                parts.append(self.reshape_term(window, Shape(shape.dtype, tuple(run))))
            return dim, parts
        finally:
            self._relaying = False

    def one_window(self, moved: Term) -> Term | None:
        """`moved` (slices, reshapes, transposes and concatenations of group pieces: an all-to-all's
        value) as one window of the value the pieces are boxes of, when its labels show it is one."""
        found = relaid.windows(moved, moved.shape, self.budgets.layout_labels, self.boxes, self.relaid_layouts)
        if found is None or len(found[1]) != 1 or not any(found[1][0][0] is whole for whole, _ in self.boxes.values()):
            return None
        ((whole, perm, box, _),) = found[1]
        window = self.slice_nd(self.transpose_term(whole, perm), box)
        return self.reshape_term(window, Shape(moved.dtype, moved.shape))

    def transpose_term(self, x: Term, perm: tuple[int, ...]) -> Term:
        """transpose(x, perm) (output dim o is x's dim perm[o]). A transpose of a transpose is one
        transpose by the composed permutation: XLA fuses the pair in one program but not where a
        sharding constraint's copy sits between them in the other, and both must meet in one form."""
        if x.op == "transpose":
            inner = parse_transpose(x.attrs[0])
            x, perm = x.args[0], tuple(inner[q] for q in perm)
        if perm == tuple(range(len(perm))):
            return x
        shape = Shape(x.dtype, tuple(x.shape[k] for k in perm))
        value = self.folded(x)
        if value is not None:
            return self.const(value.transpose(perm), shape.dtype)
        attrs = (transpose_text(perm),)
        term = self.factored("transpose", attrs, [x], shape) or self.mk("transpose", attrs, [x], shape)
        if (joined := self.transposed_parts(x, perm)) is not None:
            self.equal_terms.append([term, joined])
        return term

    def transposed_parts(self, x: Term, perm: tuple[int, ...]) -> Term | None:
        """transpose(concat(x_1, ..., x_n; d)) as concat(transpose(x_1), ..., transpose(x_n); d') with d'
        the output dim d moves to, a part's transpose that moves only size-1 dims read as the reshape
        it is (row-major order unchanged); also for a reshape of a concatenation that is one of its
        parts reshaped (`reshaped_parts`). A scan's states stacked along time and swapped to
        batch-major, `hs.swapaxes(0, 1)`, are then the states joined along the dim time moved to, as
        a program that stacks them there writes them. Joined as written (`concat` would regather)."""
        if x.op == "reshape" and x.args[0].op == "concat":
            x = self.reshaped_parts(x.args[0], Shape(x.dtype, x.shape)) or x
        if x.op != "concat":
            return None
        d = x.attrs[0]
        out = perm.index(d)
        acc: Term | None = None
        for part in concat_parts(x, d):
            dims = tuple(part.shape[k] for k in perm)
            piece = (
                self.reshape_term(part, Shape(part.dtype, dims))
                if moves_unit_dims_only(part.shape, perm)
                else self.transpose_term(part, perm)
            )
            if acc is not None:
                joined = list(dims)
                joined[out] += acc.shape[out]
                piece = self.mk("concat", (out,), [acc, piece], Shape(part.dtype, tuple(joined)))
            acc = piece
        return acc

    def gather_term(self, x: Term, idx: Term, dims: GatherDims, out: Shape) -> Term | None:
        aligned = gather_map(dims, len(x.shape), len(idx.shape), len(out.dims))
        if aligned is None:
            return None
        key = (aligned.key(dims.key()),)
        factor, base = self.scale_of(x)  # rows picked from a scaled value are the scaled rows
        if factor != 1 and (term := self.scaled(self.mk("aligned", key, (base, idx), out), factor)) is not None:
            return term
        return gathers.through_broadcast(self, x, idx, dims, out) or self.mk("aligned", key, (x, idx), out)

    # -- bounds of integer values (folds range checks such as a gather's index validation) ---------
    def bounds_of(self, term: Term) -> tuple[float, float] | None:
        value = self.folded(term)
        if value is not None and value.size and term.dtype[0] in "su":
            return float(value.min()), float(value.max())
        found = self.bounds.get(term)
        if found is None and term.op == "reshape":  # its elements are its operand's (one built inside a fact)
            return self.bounds_of(term.args[0])
        return found

    def bound(self, term: Term, *sources: Term) -> None:
        """`term`'s elements are elements of `sources`."""
        found = [b for s in sources if (b := self.bounds_of(s)) is not None]
        if len(found) == len(sources):
            self._set_bounds(term, min(b[0] for b in found), max(b[1] for b in found))

    def _set_bounds(self, term: Term, lo: float, hi: float) -> None:
        # Only where term's own dtype holds [lo, hi]: a narrowing convert (ids.astype(int8)) wraps
        # the values past its range, and bounds kept across it folded a `>= 0` test away (unsound).
        np_dtype = NP_DTYPES.get(term.dtype)
        if term.dtype[0] not in "su" or np_dtype is None or self.folded(term) is not None:
            return
        info = np.iinfo(np_dtype)
        if info.min <= lo and hi <= info.max:
            self.bounds[term] = (lo, hi)

    def numeric(self, t: Term, args: list[np.ndarray]) -> np.ndarray | None:
        """The value of `t` from its operands' values, for the ops index arithmetic uses."""
        at = t.attrs
        with np.errstate(all="ignore"):
            if t.op == "bcast":
                pairs = BcastSpec.parse(at[0]).operand_dims()
                dims = tuple(o for o, _ in pairs)
                order = [k for _, k in pairs]
                x = np.transpose(args[0], order) if order else args[0]
                x = x.reshape([t.shape[o] if o in dims else 1 for o in range(len(t.shape))])
                return np.broadcast_to(x, t.shape)
            if t.op == "reshape":
                return args[0].reshape(t.shape)
            if t.op == "transpose":
                return np.transpose(args[0], list(parse_transpose(at[0])))
            if t.op == "slice":
                index = [slice(None)] * len(t.shape)
                index[at[0]] = slice(at[1], at[2])
                return args[0][tuple(index)]
            if t.op == "concat":
                return np.concatenate(args, axis=at[0])
            if t.op == "unary" and at[0] == "convert" and t.dtype in NP_DTYPES:
                return args[0].astype(NP_DTYPES[t.dtype])
            if t.op == "unary":
                return semantics.apply(semantics.UNARY, at[0], args[0])
            compare = parse_compare(at[0]) if t.op == "binary" else None
            if compare is not None:
                return semantics.COMPARE[compare[0]](*args)
            if t.op == "binary":
                return semantics.apply(semantics.BINARY, at[0], args[0], args[1])
            if t.op == "ternary" and at[0] == "select":
                return np.where(*args)
            if t.op == "opaque" and t in self.window_sums:
                sizes, pads = self.window_sums[t]
                x = np.pad(args[0], pads)
                view = np.lib.stride_tricks.sliding_window_view(x, sizes)
                return view.sum(axis=tuple(range(-len(sizes), 0))).astype(args[0].dtype)
        return None
