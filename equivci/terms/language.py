"""The egglog language of tensor terms: the term constructors, the static tables the loader seeds
(equivci.terms.load), the relations, and the pattern variables the rules (equivci.terms.rules) use."""

from __future__ import annotations

from egglog import (
    Expr,
    String,
    StringLike,
    function,
    i64,
    i64Like,
    relation,
    vars_,
)


class TList(Expr):
    """Argument lists of opaque ops."""

    @classmethod
    def nil(cls) -> TList: ...

    @classmethod
    def cons(cls, head: T, tail: TList) -> TList: ...


class T(Expr):
    """A tensor as a function of the reference inputs."""

    @classmethod
    def param(cls, index: i64Like) -> T: ...

    @classmethod
    def handle(cls, number: i64Like) -> T:
        """The term the loader numbered `number`: how later terms and checks name it (one table for
        all of them; a `let` per term made every egglog command cost time in the number of terms)."""

    @classmethod
    def const(cls, key: StringLike, dtype: StringLike) -> T: ...

    @classmethod
    def iota(cls, key: StringLike) -> T: ...

    def slice(self, dim: i64Like, start: i64Like, stop: i64Like) -> T: ...

    @classmethod
    def concat(cls, a: T, b: T, dim: i64Like) -> T: ...

    @classmethod
    def unary(cls, op: StringLike, x: T) -> T: ...

    @classmethod
    def binary(cls, op: StringLike, x: T, y: T) -> T: ...

    @classmethod
    def ternary(cls, op: StringLike, x: T, y: T, z: T) -> T: ...

    @classmethod
    def dot(cls, spec: StringLike, x: T, y: T) -> T: ...

    @classmethod
    def reduce(cls, op: StringLike, key: StringLike, x: T) -> T: ...

    @classmethod
    def bcast(cls, spec: StringLike, x: T) -> T: ...

    @classmethod
    def reshape(cls, spec: StringLike, x: T) -> T: ...

    @classmethod
    def transpose(cls, perm: StringLike, x: T) -> T: ...

    @classmethod
    def aligned(cls, key: StringLike, x: T, y: T) -> T: ...

    @classmethod
    def opaque(cls, key: StringLike, args: TList) -> T: ...

    @classmethod
    def gte(cls, index: i64Like, x: T) -> T: ...

    # HLO dynamic-slice / dynamic-update-slice along one dim from a start known only as a term (a
    # loop counter), whole along the other dims; the start is clamped as in HLO.
    @classmethod
    def dslice(cls, dim: i64Like, size: i64Like, x: T, start: T) -> T: ...

    @classmethod
    def dupdate(cls, dim: i64Like, x: T, update: T, start: T) -> T: ...


@function
def dim(x: T, k: i64Like) -> i64: ...


# Static tables, seeded from Python for every spec that occurs (equivci.terms.load).
@function
def dot_lhs_out(spec: StringLike, k: i64Like) -> i64: ...  # lhs free dim -> output dim
@function
def dot_rhs_out(spec: StringLike, k: i64Like) -> i64: ...  # rhs free dim -> output dim
@function
def dot_out_lhs(spec: StringLike, o: i64Like) -> i64: ...
@function
def dot_out_rhs(spec: StringLike, o: i64Like) -> i64: ...
@function
def dot_batch(spec: StringLike, k: i64Like) -> i64: ...  # lhs batch dim -> rhs batch dim
@function
def dot_batch_out(spec: StringLike, k: i64Like) -> i64: ...  # lhs batch dim -> output dim
@function
def dot_contract(spec: StringLike, k: i64Like) -> i64: ...  # lhs contracting dim -> rhs contracting dim
@function
def reduce_out(key: StringLike, k: i64Like) -> i64: ...  # kept operand dim -> output dim
@function
def reduce_in(key: StringLike, o: i64Like) -> i64: ...


reduced = relation("reduced", String, i64)  # (key, operand dim) is reduced


@function
def bcast_out(spec: StringLike, k: i64Like) -> i64: ...  # operand dim -> output dim
@function
def bcast_in(spec: StringLike, o: i64Like) -> i64: ...
@function
def bcast_new(spec: StringLike, o: i64Like) -> i64: ...  # size of a new output dim
@function
def bcast_shrink(spec: StringLike, o: i64Like, size: i64Like) -> String: ...  # same with new dim o resized
@function
def perm_out(perm: StringLike, k: i64Like) -> i64: ...
@function
def perm_in(perm: StringLike, o: i64Like) -> i64: ...
@function
def rs_lead_out(spec: StringLike, k: i64Like) -> i64: ...  # leading input dim of a group -> leading output dim
@function
def rs_lead_in(spec: StringLike, o: i64Like) -> i64: ...
@function
def rs_in_tail(spec: StringLike, k: i64Like) -> i64: ...  # element count of the group's input dims after k
@function
def rs_out_tail(spec: StringLike, k: i64Like) -> i64: ...  # element count of the group's output dims after the lead
@function
def rs_fixed(spec: StringLike, o: i64Like) -> i64: ...  # size of a non-leading output dim
@function
def rs_inverse(spec: StringLike) -> String: ...  # ReshapeSpec.inverse: the reshape back
@function
def rs_narrow_out(spec: StringLike, o: i64Like, size: i64Like) -> String: ...  # ReshapeSpec.narrowed_second
@function
def rs_narrow_in(spec: StringLike, k: i64Like, size: i64Like) -> String: ...  # ReshapeSpec.narrowed_second
@function
def aligned_lhs(key: StringLike, k: i64Like) -> i64: ...  # aligned lhs dim -> output dim
@function
def aligned_rhs(key: StringLike, k: i64Like) -> i64: ...  # aligned rhs dim -> output dim
@function
def aligned_rhs_alone(key: StringLike, k: i64Like) -> i64: ...  # aligned rhs dim with no lhs partner -> output dim
@function
def aligned_fixed(key: StringLike, o: i64Like) -> i64: ...  # size of an output dim set by the op's attributes
@function
def repeat_dim(reshape: StringLike, bcast: StringLike) -> i64: ...  # reshape(bcast(y)) repeats y along this dim
@function
def repeat_count(reshape: StringLike, bcast: StringLike) -> i64: ...  # ... this many times (spec.repeat_form)


repeat_window = relation("repeat_window", i64, i64, i64)  # (n, width, c): 0 <= c <= n - width, for repeat counts n


related = relation("related", T)  # equal to a slice of a reference value
reference = relation("reference", T)  # a value the reference program computes (or its input)
# a float constant that is one nonzero power of two at every element (load.py seeds the splats)
power_of_two_splat = relation("power_of_two_splat", T)
# (op, x[a:b along d], y[a:b along d], x op y, d, a, b): both operands of an existing elementwise op
# have a window of the same range; the first join of elementwise/binary_lift_nested (a rule's seed).
# (egglog types relations of up to 4 columns: the ignores below.)
operand_windows = relation("operand_windows", String, T, T, T, i64, i64, i64)  # type: ignore[call-overload]
# (spec, dot(x[a:b along k], y[a:b along j]), x, y, k, a, b) for a contraction pair (k, j) of spec:
# one piece of a split contraction; the seed of dots/contraction_merge.
contraction_piece = relation("contraction_piece", String, T, T, T, i64, i64, i64)  # type: ignore[call-overload]
# (z, x, y, d, c, g, n, m): z = concat(x[c:g along d], y[n:m along d]; d); the seed of concats/lift_nested.
concat_windows = relation("concat_windows", T, T, T, i64, i64, i64, i64, i64)  # type: ignore[call-overload]
# (d, a, b, d2, c, g, n, m): some value of size n along d and m along d2 has the window
# [a:b along d][c:g along d2] (d != d2); the seed of layouts/bcast_as_slice_nested.
nested_window = relation("nested_window", i64, i64, i64, i64, i64, i64, i64, i64)  # type: ignore[call-overload]

x, y, z, w, e, v = vars_("x y z w e v", T)
d, d2, a, b, c, g, n, m, o, k, j, s1, s2 = vars_("d d2 a b c g n m o k j s1 s2", i64)
op, spec, spec2, spec3, key = vars_("op spec spec2 spec3 key", String)
