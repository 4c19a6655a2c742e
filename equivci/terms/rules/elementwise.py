"""Elementwise ops commute with slices and reshapes, and commutative ops with their operands' order."""

from __future__ import annotations

from egglog import eq, ne, union

from equivci.terms.language import (
    T,
    a,
    b,
    bcast_shrink,
    c,
    d,
    d2,
    dim,
    e,
    g,
    n,
    op,
    operand_windows,
    power_of_two_splat,
    spec,
    spec2,
    v,
    w,
    x,
    y,
    z,
)
from equivci.terms.rules.registry import family, named

COMMUTATIVE = ("add", "multiply", "maximum", "minimum", "and", "or", "xor")
FLOAT_TYPES = ("f32", "bf16", "f16", "f64")

ELEMENTWISE = family(
    "elementwise",
    named("elementwise/unary_lift", "op(x[a:b]) = op(x)[a:b]", eq(e).to(T.unary(op, x.slice(d, a, b)))).then(
        union(e).with_(T.unary(op, x).slice(d, a, b))
    ),
    named("elementwise/unary_push", "op(x)[a:b] = op(x[a:b])", eq(e).to(T.unary(op, x).slice(d, a, b))).then(
        union(e).with_(T.unary(op, x.slice(d, a, b)))
    ),
    named(
        "elementwise/binary_lift",
        "x[a:b] op y[a:b] = (x op y)[a:b] where x and y have the same size along d",
        eq(e).to(T.binary(op, x.slice(d, a, b), y.slice(d, a, b))),
        eq(dim(x, d)).to(dim(y, d)),
        eq(z).to(T.binary(op, x, y)),
    ).then(union(e).with_(z.slice(d, a, b))),
    named(
        "elementwise/binary_push", "(x op y)[a:b] = x[a:b] op y[a:b]", eq(e).to(T.binary(op, x, y).slice(d, a, b))
    ).then(union(e).with_(T.binary(op, x.slice(d, a, b), y.slice(d, a, b)))),
    # A window over two dims (an FSDP device's batch rows and a TP device's heads, then RoPE's half of
    # each head) is a slice under a slice: the one-dim lift above needs the inner pair already
    # combined, which nothing builds when only the whole pair occurs in the reference. Read from the
    # existing x op y (the reference's) and the windows of its operands: joined from the device's
    # pair, the search paired every slice chain of one operand with every chain of the other, and cost
    # seconds an iteration on a training step's backward pass even when nothing matched.
    named(
        "elementwise/binary_lift_nested",
        "x[a:b along d][c:g along d2] op y[a:b along d][c:g along d2] = (x op y)[a:b along d][c:g along d2] "
        "where x and y have the same size along d and d2",
        operand_windows(op, w, v, z, d, a, b),
        eq(e).to(T.binary(op, w.slice(d2, c, g), v.slice(d2, c, g))),
        ne(d2).to(d),
        eq(dim(w, d2)).to(dim(v, d2)),
    )
    .seeded(
        operand_windows(op, w, v, z, d, a, b),
        eq(z).to(T.binary(op, x, y)),
        eq(w).to(x.slice(d, a, b)),
        eq(v).to(y.slice(d, a, b)),
        eq(dim(x, d)).to(dim(y, d)),
    )
    .then(union(e).with_(z.slice(d, a, b).slice(d2, c, g))),
    # A broadcast along a new dim is the same at every offset of that dim: it is the slice of the
    # wider broadcast the unsliced operand pairs with (bcast_shrink only pairs new-dim sizes).
    named(
        "elementwise/binary_bcast_lift_left",
        "x[a:b] op bcast(y) = (x op bcast(y) widened along d)[a:b]",
        eq(e).to(T.binary(op, x.slice(d, a, b), T.bcast(spec, y))),
        eq(n).to(dim(x, d)),
        eq(spec2).to(bcast_shrink(spec, d, n)),
    ).then(union(e).with_(T.binary(op, x, T.bcast(spec2, y)).slice(d, a, b))),
    named(
        "elementwise/binary_bcast_lift_right",
        "bcast(y) op x[a:b] = (bcast(y) widened along d op x)[a:b]",
        eq(e).to(T.binary(op, T.bcast(spec, y), x.slice(d, a, b))),
        eq(n).to(dim(x, d)),
        eq(spec2).to(bcast_shrink(spec, d, n)),
    ).then(union(e).with_(T.binary(op, T.bcast(spec2, y), x).slice(d, a, b))),
    # The same under a slice of another dim: canonical slice order buries the window along the
    # broadcast's new dim (a device's heads) beneath a window of a later dim (RoPE's half of each head).
    named(
        "elementwise/binary_bcast_lift_nested_left",
        "x[a:b along d][c:g along d2] op bcast(y) = (x[c:g along d2] op bcast(y) widened along d)[a:b along d]",
        eq(e).to(T.binary(op, x.slice(d, a, b).slice(d2, c, g), T.bcast(spec, y))),
        ne(d2).to(d),
        eq(n).to(dim(x, d)),
        eq(spec2).to(bcast_shrink(spec, d, n)),
    ).then(union(e).with_(T.binary(op, x.slice(d2, c, g), T.bcast(spec2, y)).slice(d, a, b))),
    named(
        "elementwise/binary_bcast_lift_nested_right",
        "bcast(y) op x[a:b along d][c:g along d2] = (bcast(y) widened along d op x[c:g along d2])[a:b along d]",
        eq(e).to(T.binary(op, T.bcast(spec, y), x.slice(d, a, b).slice(d2, c, g))),
        ne(d2).to(d),
        eq(n).to(dim(x, d)),
        eq(spec2).to(bcast_shrink(spec, d, n)),
    ).then(union(e).with_(T.binary(op, T.bcast(spec2, y), x.slice(d2, c, g)).slice(d, a, b))),
    # x op y is y op x for a commutative op: only between terms that both exist (one side wrote
    # `gate * y`, the other `y * gate`), so the rule joins e-classes and never adds terms.
    *[
        named(
            f"elementwise/commute_{c}",
            f"x {c} y = y {c} x, between existing terms",
            eq(e).to(T.binary(c, x, y)),
            eq(w).to(T.binary(c, y, x)),
        ).then(union(e).with_(w))
        for c in COMMUTATIVE
    ],
    # Sums regrouped onto a grouping that exists already (a residual added before or after a bias:
    # (x + psum(partial)) + b against x + (dot + b)); only onto existing terms, so that regrouping
    # never enumerates the groupings of a long sum.
    named(
        "elementwise/add_regroup_right",
        "(x + y) + z = x + (y + z), where y + z is a term already",
        eq(e).to(T.binary("add", T.binary("add", x, y), z)),
        eq(w).to(T.binary("add", y, z)),
    ).then(union(e).with_(T.binary("add", x, w))),
    named(
        "elementwise/add_regroup_left",
        "x + (y + z) = (x + y) + z, where x + y is a term already",
        eq(e).to(T.binary("add", x, T.binary("add", y, z))),
        eq(w).to(T.binary("add", x, y)),
    ).then(union(e).with_(T.binary("add", w, z))),
    # A difference from a sum, regrouped onto the difference that exists already (either addend
    # first), also with the sum broadcast (a broadcast is linear): a log-softmax written
    # z - bcast(log s + m) or z - bcast(m + log s) (a vocabulary-parallel device's global lse, keepdims)
    # against jax's (z - bcast(m)) - bcast(log s). Only onto existing terms, as the regroupings above.
    *[
        named(
            f"elementwise/subtract_sum_{side}",
            f"x - (y + z) = (x - {kept}) - {other}, where x - {kept} is a term already",
            eq(e).to(T.binary("subtract", x, T.binary("add", y, z))),
            eq(w).to(T.binary("subtract", x, kept_term)),
        ).then(union(e).with_(T.binary("subtract", w, other_term)))
        for side, kept, other, kept_term, other_term in (("right", "z", "y", z, y), ("left", "y", "z", y, z))
    ],
    *[
        named(
            f"elementwise/subtract_bcast_sum_{side}",
            f"x - bcast(y + z) = (x - bcast({kept})) - bcast({other}), where x - bcast({kept}) is a term already",
            eq(e).to(T.binary("subtract", x, T.bcast(spec, T.binary("add", y, z)))),
            eq(w).to(T.binary("subtract", x, T.bcast(spec, kept_term))),
        ).then(union(e).with_(T.binary("subtract", w, T.bcast(spec, other_term))))
        for side, kept, other, kept_term, other_term in (("right", "z", "y", z, y), ("left", "y", "z", y, z))
    ],
    # A scaling by a power of two undone: x * c = y * c gives x = y (exact in floats away from the
    # ends of the exponent range: only the exponent moves). A value proved equal only with the
    # builder's factor in front (a per-token loss, 2^-23 times its terms) is then equal without it,
    # as the sum that reduces it (its mean over the batch) needs.
    named(
        "elementwise/cancel_power_of_two",
        "x * c = y * c implies x = y, for c a nonzero power of two at every element",
        eq(e).to(T.binary("multiply", x, w)),
        eq(e).to(T.binary("multiply", y, w)),
        power_of_two_splat(w),
    ).then(union(x).with_(y)),
    named(
        "elementwise/power_of_two_splat",
        "a broadcast of a power-of-two splat is one",
        power_of_two_splat(x),
        eq(e).to(T.bcast(spec, x)),
    ).then(power_of_two_splat(e)),
    # A negated difference written as the difference the other way round (a loss -(x - lse) against
    # lse - x); only onto an existing term, as commuting is.
    # (A unary op's name carries its dtype: one rule per float type; exact, rounding is symmetric.)
    *[
        named(
            f"elementwise/negate_subtract_{t}",
            "-(x - y) = y - x, where y - x is a term already",
            eq(e).to(T.unary(f"negate:{t}", T.binary("subtract", x, y))),
            eq(w).to(T.binary("subtract", y, x)),
        ).then(union(e).with_(w))
        for t in FLOAT_TYPES
    ],
    # A sum of negations is the negation of the sum (exact in floats too: rounding to nearest is
    # symmetric): microbatch losses -mean(pick) accumulated in a loop meet the reference's one
    # negated mean, whose sum the device's partial sums then form.
    *[
        named(
            f"elementwise/negate_add_{t}",
            "(-x) + (-y) = -(x + y)",
            eq(e).to(T.binary("add", T.unary(f"negate:{t}", x), T.unary(f"negate:{t}", y))),
        ).then(union(e).with_(T.unary(f"negate:{t}", T.binary("add", x, y))))
        for t in FLOAT_TYPES
    ],
    # Elementwise ops commute with reshapes: same spec and same output shape imply same input shape.
    named(
        "elementwise/unary_reshape_lift", "op(reshape(x)) = reshape(op(x))", eq(e).to(T.unary(op, T.reshape(spec, x)))
    ).then(union(e).with_(T.reshape(spec, T.unary(op, x)))),
    # An elementwise op reads each element alone and a broadcast copies elements: the op of a
    # broadcast is the broadcast of the op (a mask broadcast then converted, `where(valid[..., None],
    # h, 0)` read as `h * valid`, meets one converted then broadcast, `valid.astype(f32)[..., None]`).
    # Lift only: the op on the smaller operand, never a broadcast pushed into every op.
    named("elementwise/unary_bcast_lift", "op(bcast(x)) = bcast(op(x))", eq(e).to(T.unary(op, T.bcast(spec, x)))).then(
        union(e).with_(T.bcast(spec, T.unary(op, x)))
    ),
    named(
        "elementwise/binary_reshape_lift",
        "reshape(x) op reshape(y) = reshape(x op y), one spec",
        eq(e).to(T.binary(op, T.reshape(spec, x), T.reshape(spec, y))),
    ).then(union(e).with_(T.reshape(spec, T.binary(op, x, y)))),
    named(
        "elementwise/ternary_lift",
        "op(x[a:b], y[a:b], z[a:b]) = op(x, y, z)[a:b] where the sizes along d agree",
        eq(e).to(T.ternary(op, x.slice(d, a, b), y.slice(d, a, b), z.slice(d, a, b))),
        eq(dim(x, d)).to(dim(y, d)),
        eq(dim(y, d)).to(dim(z, d)),
    ).then(union(e).with_(T.ternary(op, x, y, z).slice(d, a, b))),
    named(
        "elementwise/ternary_push",
        "op(x, y, z)[a:b] = op(x[a:b], y[a:b], z[a:b]) where the sizes along d agree",
        eq(e).to(T.ternary(op, x, y, z).slice(d, a, b)),
        eq(dim(x, d)).to(dim(y, d)),
        eq(dim(y, d)).to(dim(z, d)),
    ).then(union(e).with_(T.ternary(op, x.slice(d, a, b), y.slice(d, a, b), z.slice(d, a, b)))),
)
