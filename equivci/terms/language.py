"""The egglog language of tensor terms, its static tables and its rewrite rules.

Every rewrite is an identity over the reals on well-typed terms; tests/test_rules_numeric.py
checks each family on random arrays. Rules only create terms whose dimensions are known, and
guards compare dimensions where a rule would otherwise build an ill-typed term.
"""

from __future__ import annotations

from egglog import (
    Expr,
    String,
    StringLike,
    eq,
    function,
    i64,
    i64Like,
    ne,
    relation,
    rule,
    ruleset,
    set_,
    union,
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


# Static tables, seeded from Python for every spec that occurs (see seed.py).
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
def aligned_lhs(key: StringLike, k: i64Like) -> i64: ...  # aligned lhs dim -> output dim
@function
def aligned_rhs(key: StringLike, k: i64Like) -> i64: ...  # aligned rhs dim -> output dim
@function
def aligned_fixed(key: StringLike, o: i64Like) -> i64: ...  # size of an output dim set by the op's attributes
@function
def repeat_dim(reshape: StringLike, bcast: StringLike) -> i64: ...  # reshape(bcast(y)) repeats y along this dim
@function
def repeat_count(reshape: StringLike, bcast: StringLike) -> i64: ...  # ... this many times (terms.repeat_form)
repeat_window = relation("repeat_window", i64, i64, i64)  # (n, width, c): 0 <= c <= n - width, for repeat counts n


related = relation("related", T)  # equal to a slice of a reference value
reference = relation("reference", T)  # a value the reference program computes (or its input)

x, y, z, w, e = vars_("x y z w e", T)
d, d2, a, b, c, g, n, m, o, k, j, s1, s2 = vars_("d d2 a b c g n m o k j s1 s2", i64)
op, spec, spec2, spec3, key = vars_("op spec spec2 spec3 key", String)
REDUCER_OF = {"add": "add", "maximum": "maximum", "minimum": "minimum"}
COMMUTATIVE = ("add", "multiply", "maximum", "minimum", "and", "or", "xor")

# -- dimensions of terms created by rules ------------------------------------------------------
dims = ruleset(
    rule(eq(e).to(x.slice(d, a, b)), eq(n).to(dim(x, d))).then(set_(dim(e, d)).to(b - a)),
    rule(eq(e).to(x.slice(d, a, b)), eq(n).to(dim(x, k)), ne(k).to(d)).then(set_(dim(e, k)).to(n)),
    rule(eq(e).to(T.unary(op, x)), eq(n).to(dim(x, k))).then(set_(dim(e, k)).to(n)),
    rule(eq(e).to(T.binary(op, x, y)), eq(n).to(dim(x, k))).then(set_(dim(e, k)).to(n)),
    rule(eq(e).to(T.ternary(op, x, y, z)), eq(n).to(dim(y, k))).then(set_(dim(e, k)).to(n)),
    rule(eq(e).to(T.concat(x, y, d)), eq(n).to(dim(x, d)), eq(m).to(dim(y, d))).then(set_(dim(e, d)).to(n + m)),
    rule(eq(e).to(T.concat(x, y, d)), eq(n).to(dim(x, k)), ne(k).to(d)).then(set_(dim(e, k)).to(n)),
    rule(eq(e).to(T.dot(spec, x, y)), eq(n).to(dim(x, k)), eq(o).to(dot_lhs_out(spec, k))).then(set_(dim(e, o)).to(n)),
    rule(eq(e).to(T.dot(spec, x, y)), eq(n).to(dim(y, k)), eq(o).to(dot_rhs_out(spec, k))).then(set_(dim(e, o)).to(n)),
    rule(eq(e).to(T.dot(spec, x, y)), eq(n).to(dim(x, k)), eq(o).to(dot_batch_out(spec, k))).then(set_(dim(e, o)).to(n)),
    rule(eq(e).to(T.reduce(op, key, x)), eq(n).to(dim(x, k)), eq(o).to(reduce_out(key, k))).then(set_(dim(e, o)).to(n)),
    rule(eq(e).to(T.bcast(spec, x)), eq(n).to(dim(x, k)), eq(o).to(bcast_out(spec, k))).then(set_(dim(e, o)).to(n)),
    rule(eq(e).to(T.bcast(spec, x)), eq(n).to(bcast_new(spec, o))).then(set_(dim(e, o)).to(n)),
    rule(eq(e).to(T.transpose(spec, x)), eq(n).to(dim(x, k)), eq(o).to(perm_out(spec, k))).then(set_(dim(e, o)).to(n)),
    rule(eq(e).to(T.reshape(spec, x)), eq(n).to(dim(x, k)), eq(o).to(rs_lead_out(spec, k)),
         eq(s1).to(rs_in_tail(spec, k)), eq(s2).to(rs_out_tail(spec, k))).then(set_(dim(e, o)).to(n * s1 / s2)),
    rule(eq(e).to(T.reshape(spec, x)), eq(n).to(rs_fixed(spec, o)), eq(m).to(dim(x, 0))).then(set_(dim(e, o)).to(n)),
    rule(eq(e).to(T.aligned(key, x, y)), eq(n).to(dim(x, k)), eq(o).to(aligned_lhs(key, k))).then(set_(dim(e, o)).to(n)),
    rule(eq(e).to(T.aligned(key, x, y)), eq(n).to(dim(y, k)), eq(o).to(aligned_rhs(key, k))).then(set_(dim(e, o)).to(n)),
    rule(eq(e).to(T.aligned(key, x, y)), eq(n).to(aligned_fixed(key, o))).then(set_(dim(e, o)).to(n)),
    rule(eq(e).to(T.dslice(d, n, x, y))).then(set_(dim(e, d)).to(n)),
    rule(eq(e).to(T.dslice(d, n, x, y)), eq(m).to(dim(x, k)), ne(k).to(d)).then(set_(dim(e, k)).to(m)),
    rule(eq(e).to(T.dupdate(d, x, y, z)), eq(n).to(dim(x, k))).then(set_(dim(e, k)).to(n)),
)

# -- slices: composition, canonical order, full slices ----------------------------------------
slices = ruleset(
    rule(eq(e).to(x.slice(d, a, b).slice(d, c, g))).then(union(e).with_(x.slice(d, a + c, a + g))),
    # Slices of different dims commute; the canonical order has the higher dim outside. (Keeping
    # both orders lets push and lift rules multiply windows: a Llama layer stopped saturating.)
    rule(eq(e).to(x.slice(d, a, b).slice(d2, c, g)), d2 < d).then(union(e).with_(x.slice(d2, c, g).slice(d, a, b))),
    rule(eq(e).to(x.slice(d, a, b)), eq(a).to(i64(0)), eq(b).to(dim(x, d))).then(union(e).with_(x)),
    # Re-base a slice on a wider slice of the same value that is a reference value (k from a fused
    # qkv is a window of the reference's k). Only onto reference values: re-basing onto every wider
    # slice multiplies the forms of each slice and, through the lifts, the terms of a layer.
    rule(eq(e).to(x.slice(d, a, b)), eq(w).to(x.slice(d, c, g)), reference(w), c <= a, b <= g, ne(w).to(e)).then(
        union(e).with_(w.slice(d, a - c, b - c))),
)

# -- elementwise ops commute with slices ------------------------------------------------------
elementwise = ruleset(
    rule(eq(e).to(T.unary(op, x.slice(d, a, b)))).then(union(e).with_(T.unary(op, x).slice(d, a, b))),
    rule(eq(e).to(T.unary(op, x).slice(d, a, b))).then(union(e).with_(T.unary(op, x.slice(d, a, b)))),
    rule(eq(e).to(T.binary(op, x.slice(d, a, b), y.slice(d, a, b))), eq(dim(x, d)).to(dim(y, d)),
         eq(z).to(T.binary(op, x, y))).then(union(e).with_(z.slice(d, a, b))),
    rule(eq(e).to(T.binary(op, x, y).slice(d, a, b))).then(
        union(e).with_(T.binary(op, x.slice(d, a, b), y.slice(d, a, b)))),
    # A broadcast along a new dim is the same at every offset of that dim: it is the slice of the
    # wider broadcast the unsliced operand pairs with (bcast_shrink only pairs new-dim sizes).
    rule(eq(e).to(T.binary(op, x.slice(d, a, b), T.bcast(spec, y))), eq(n).to(dim(x, d)),
         eq(spec2).to(bcast_shrink(spec, d, n))).then(union(e).with_(T.binary(op, x, T.bcast(spec2, y)).slice(d, a, b))),
    rule(eq(e).to(T.binary(op, T.bcast(spec, y), x.slice(d, a, b))), eq(n).to(dim(x, d)),
         eq(spec2).to(bcast_shrink(spec, d, n))).then(union(e).with_(T.binary(op, T.bcast(spec2, y), x).slice(d, a, b))),
    # The same under a slice of another dim: canonical slice order buries the window along the
    # broadcast's new dim (a device's heads) beneath a window of a later dim (RoPE's half of each head).
    rule(eq(e).to(T.binary(op, x.slice(d, a, b).slice(d2, c, g), T.bcast(spec, y))), ne(d2).to(d), eq(n).to(dim(x, d)),
         eq(spec2).to(bcast_shrink(spec, d, n))).then(
        union(e).with_(T.binary(op, x.slice(d2, c, g), T.bcast(spec2, y)).slice(d, a, b))),
    rule(eq(e).to(T.binary(op, T.bcast(spec, y), x.slice(d, a, b).slice(d2, c, g))), ne(d2).to(d), eq(n).to(dim(x, d)),
         eq(spec2).to(bcast_shrink(spec, d, n))).then(
        union(e).with_(T.binary(op, T.bcast(spec2, y), x.slice(d2, c, g)).slice(d, a, b))),
    # x op y is y op x for a commutative op: only between terms that both exist (one side wrote
    # `gate * y`, the other `y * gate`), so the rule joins e-classes and never adds terms.
    *[rule(eq(e).to(T.binary(c, x, y)), eq(w).to(T.binary(c, y, x))).then(union(e).with_(w)) for c in COMMUTATIVE],
    # Elementwise ops commute with reshapes: same spec and same output shape imply same input shape.
    rule(eq(e).to(T.unary(op, T.reshape(spec, x)))).then(union(e).with_(T.reshape(spec, T.unary(op, x)))),
    rule(eq(e).to(T.binary(op, T.reshape(spec, x), T.reshape(spec, y)))).then(
        union(e).with_(T.reshape(spec, T.binary(op, x, y)))),
    rule(eq(e).to(T.ternary(op, x.slice(d, a, b), y.slice(d, a, b), z.slice(d, a, b))),
         eq(dim(x, d)).to(dim(y, d)), eq(dim(y, d)).to(dim(z, d))).then(
        union(e).with_(T.ternary(op, x, y, z).slice(d, a, b))),
    rule(eq(e).to(T.ternary(op, x, y, z).slice(d, a, b)), eq(dim(x, d)).to(dim(y, d)), eq(dim(y, d)).to(dim(z, d))).then(
        union(e).with_(T.ternary(op, x.slice(d, a, b), y.slice(d, a, b), z.slice(d, a, b)))),
)

# -- concatenation ----------------------------------------------------------------------------
concats = ruleset(
    rule(eq(e).to(T.concat(x.slice(d, a, b), x.slice(d, b, c), d))).then(union(e).with_(x.slice(d, a, c))),
    rule(eq(e).to(T.concat(x, y, d).slice(d, a, b)), eq(n).to(dim(x, d)), b <= n).then(union(e).with_(x.slice(d, a, b))),
    rule(eq(e).to(T.concat(x, y, d).slice(d, a, b)), eq(n).to(dim(x, d)), a >= n).then(
        union(e).with_(y.slice(d, a - n, b - n))),
    rule(eq(e).to(T.concat(x, y, d).slice(d, a, b)), eq(n).to(dim(x, d)), a < n, b > n).then(
        union(e).with_(T.concat(x.slice(d, a, n), y.slice(d, 0, b - n), d))),
    rule(eq(e).to(T.concat(x, y, d).slice(k, a, b)), ne(k).to(d)).then(
        union(e).with_(T.concat(x.slice(k, a, b), y.slice(k, a, b), d))),
    rule(eq(e).to(T.concat(x.slice(k, a, b), y.slice(k, a, b), d)), ne(k).to(d), eq(dim(x, k)).to(dim(y, k))).then(
        union(e).with_(T.concat(x, y, d).slice(k, a, b))),
)

# -- dot_general: slices of free and batch dims pass through; split contractions merge ---------
dots = ruleset(
    rule(eq(e).to(T.dot(spec, x.slice(k, a, b), y)), eq(o).to(dot_lhs_out(spec, k))).then(
        union(e).with_(T.dot(spec, x, y).slice(o, a, b))),
    rule(eq(e).to(T.dot(spec, x, y.slice(k, a, b))), eq(o).to(dot_rhs_out(spec, k))).then(
        union(e).with_(T.dot(spec, x, y).slice(o, a, b))),
    rule(eq(e).to(T.dot(spec, x, y).slice(o, a, b)), eq(k).to(dot_out_lhs(spec, o))).then(
        union(e).with_(T.dot(spec, x.slice(k, a, b), y))),
    rule(eq(e).to(T.dot(spec, x, y).slice(o, a, b)), eq(k).to(dot_out_rhs(spec, o))).then(
        union(e).with_(T.dot(spec, x, y.slice(k, a, b)))),
    rule(eq(e).to(T.dot(spec, x.slice(k, a, b), y.slice(j, a, b))), eq(j).to(dot_batch(spec, k)),
         eq(o).to(dot_batch_out(spec, k)), eq(dim(x, k)).to(dim(y, j))).then(
        union(e).with_(T.dot(spec, x, y).slice(o, a, b))),
    rule(eq(e).to(T.binary("add", T.dot(spec, x.slice(k, a, b), y.slice(j, a, b)),
                           T.dot(spec, x.slice(k, b, c), y.slice(j, b, c)))), eq(j).to(dot_contract(spec, k))).then(
        union(e).with_(T.dot(spec, x.slice(k, a, c), y.slice(j, a, c)))),
)

# -- reductions -------------------------------------------------------------------------------
reductions = ruleset(
    rule(eq(e).to(T.reduce(op, key, x.slice(k, a, b))), eq(o).to(reduce_out(key, k))).then(
        union(e).with_(T.reduce(op, key, x).slice(o, a, b))),
    rule(eq(e).to(T.reduce(op, key, x).slice(o, a, b)), eq(k).to(reduce_in(key, o))).then(
        union(e).with_(T.reduce(op, key, x.slice(k, a, b)))),
    *[
        rule(eq(e).to(T.binary(r, T.reduce(r, key, x.slice(k, a, b)), T.reduce(r, key, x.slice(k, b, c)))),
             reduced(key, k)).then(union(e).with_(T.reduce(r, key, x.slice(k, a, c))))
        for r in REDUCER_OF
    ],
)

# -- aligned maps (variadic reduces, batched gathers): slices of aligned dims pass through -------
aligned = ruleset(
    rule(eq(e).to(T.aligned(key, x.slice(k, a, b), y.slice(j, a, b))), eq(o).to(aligned_lhs(key, k)),
         eq(o).to(aligned_rhs(key, j)), eq(dim(x, k)).to(dim(y, j))).then(
        union(e).with_(T.aligned(key, x, y).slice(o, a, b))),
)

# -- layout ops: broadcast, transpose, reshape ------------------------------------------------
layouts = ruleset(
    rule(eq(e).to(T.bcast(spec, x.slice(k, a, b))), eq(o).to(bcast_out(spec, k))).then(
        union(e).with_(T.bcast(spec, x).slice(o, a, b))),
    rule(eq(e).to(T.bcast(spec, x).slice(o, a, b)), eq(k).to(bcast_in(spec, o))).then(
        union(e).with_(T.bcast(spec, x.slice(k, a, b)))),
    rule(eq(e).to(T.bcast(spec, x).slice(o, a, b)), eq(spec2).to(bcast_shrink(spec, o, b - a))).then(
        union(e).with_(T.bcast(spec2, x))),
    # A broadcast is constant along its new dims: where a slice of the same size exists, the
    # narrow broadcast is that slice of the wider one (so ops mixing both lift like any slice).
    # Only onto a wider broadcast the reference computes (a mask or table over all heads): a
    # device's own broadcasts along a size-1 dim (one KV head) would otherwise get a copy at every
    # offset of every width-1 slice, and the lifts multiply the copies (a GQA layer with RoPE ran
    # out of memory).
    rule(eq(e).to(T.bcast(spec, y)), eq(w).to(x.slice(d, a, b)), eq(b - a).to(bcast_new(spec, d)),
         eq(n).to(dim(x, d)), eq(spec2).to(bcast_shrink(spec, d, n)), eq(z).to(T.bcast(spec2, y)), reference(z)).then(
        union(e).with_(z.slice(d, a, b))),
    # A broadcast to a smaller size along a new dim than the reference's broadcast of the same value
    # is its leading window (a shard repeating its KV head fewer times than the reference does).
    rule(eq(e).to(T.bcast(spec, y)), eq(x).to(T.bcast(spec2, y)), reference(x), eq(spec).to(bcast_shrink(spec2, o, k)),
         eq(n).to(bcast_new(spec2, o)), k < n).then(union(e).with_(x.slice(o, 0, k))),
    rule(eq(e).to(T.transpose(spec, x.slice(k, a, b))), eq(o).to(perm_out(spec, k))).then(
        union(e).with_(T.transpose(spec, x).slice(o, a, b))),
    rule(eq(e).to(T.transpose(spec, x).slice(o, a, b)), eq(k).to(perm_in(spec, o))).then(
        union(e).with_(T.transpose(spec, x.slice(k, a, b)))),
    # Partial results transposed on each device are summed after the transpose (the gradient of
    # x @ w): the sum of transposes is the transpose of the sum, where the split dot merges.
    rule(eq(e).to(T.binary(op, T.transpose(spec, x), T.transpose(spec, y)))).then(
        union(e).with_(T.transpose(spec, T.binary(op, x, y)))),
    rule(eq(e).to(T.reshape(spec, x.slice(k, a, b))), eq(o).to(rs_lead_out(spec, k)),
         eq(s1).to(rs_in_tail(spec, k)), eq(s2).to(rs_out_tail(spec, k)),
         eq((a * s1) % s2).to(i64(0)), eq((b * s1) % s2).to(i64(0))).then(
        union(e).with_(T.reshape(spec, x).slice(o, a * s1 / s2, b * s1 / s2))),
    rule(eq(e).to(T.reshape(spec, x).slice(o, a, b)), eq(k).to(rs_lead_in(spec, o)),
         eq(s1).to(rs_in_tail(spec, k)), eq(s2).to(rs_out_tail(spec, k)),
         eq((a * s2) % s1).to(i64(0)), eq((b * s2) % s1).to(i64(0))).then(
        union(e).with_(T.reshape(spec, x.slice(k, a * s2 / s1, b * s2 / s1)))),
)

# -- repeats (jnp.repeat: reshape(bcast(y)) with each index of y along d repeated n times in a row)
# A window inside one group of a repeat is one element of y along d, repeated: it is any window of
# the same width inside the same group of a reference repeat of y with another count (a shard's
# KV head repeated for its query heads is the reference's KV heads repeated for all of them, at
# the shard's query heads). One element of y along d is such a window too (a shard with one query
# head does not repeat its KV head). The rules match only repeat forms (tables seeded from Python)
# and only reference values as targets; each match adds one window per offset c in the group.
repeats = ruleset(
    rule(eq(e).to(T.reshape(spec, T.bcast(spec2, y)).slice(d, a, b)), eq(d).to(repeat_dim(spec, spec2)),
         eq(n).to(repeat_count(spec, spec2)), eq(a / n).to((b - 1) / n),
         eq(x).to(T.reshape(spec3, T.bcast(key, y))), reference(x), eq(d).to(repeat_dim(spec3, key)),
         eq(m).to(repeat_count(spec3, key)), ne(m).to(n), eq(k).to(b - a), repeat_window(m, k, c)).then(
        union(e).with_(x.slice(d, (a / n) * m + c, (a / n) * m + c + k))),
    rule(eq(e).to(y.slice(d, a, b)), eq(b).to(a + 1), eq(x).to(T.reshape(spec, T.bcast(spec2, y))), reference(x),
         eq(d).to(repeat_dim(spec, spec2)), eq(m).to(repeat_count(spec, spec2)), repeat_window(m, i64(1), c)).then(
        union(e).with_(x.slice(d, a * m + c, a * m + c + 1))),
)

# -- dynamic slices and updates: slices of the other dims pass through (the clamped start depends
# only on the sizes along the dynamic dim), so a device's window of a stacked weight or of a
# per-layer output buffer is the window of the reference's at the same counter ---------------
dynamic = ruleset(
    rule(eq(e).to(T.dslice(d, n, x.slice(k, a, b), y)), ne(k).to(d)).then(
        union(e).with_(T.dslice(d, n, x, y).slice(k, a, b))),
    rule(eq(e).to(T.dupdate(d, x.slice(k, a, b), y.slice(k, a, b), z)), ne(k).to(d), eq(dim(x, k)).to(dim(y, k))).then(
        union(e).with_(T.dupdate(d, x, y, z).slice(k, a, b))),
)

# `related` is for localization only (never for a verdict): a value is related when it is a slice,
# or a pure re-layout (reshape, transpose) of one, of some reference value.
relations = ruleset(
    rule(related(x), eq(e).to(x.slice(d, a, b))).then(related(e)),
    rule(related(x), eq(e).to(T.reshape(spec, x))).then(related(e)),
    rule(related(x), eq(e).to(T.transpose(spec, x))).then(related(e)),
)

REWRITES = slices | elementwise | concats | dots | reductions | aligned | layouts | repeats | dynamic

