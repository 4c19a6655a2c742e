"""Layout ops (broadcast, transpose, reshape): slices pass through them, and a broadcast is constant
along its new dims."""

from __future__ import annotations

from egglog import eq, i64, ne, union

from equivci.terms.language import (
    T,
    a,
    b,
    bcast_in,
    bcast_new,
    bcast_out,
    bcast_shrink,
    c,
    d,
    d2,
    dim,
    e,
    g,
    k,
    m,
    n,
    nested_window,
    o,
    op,
    perm_in,
    perm_out,
    power_of_two_splat,
    reference,
    rs_fixed,
    rs_in_tail,
    rs_inverse,
    rs_lead_in,
    rs_lead_out,
    rs_narrow_in,
    rs_narrow_out,
    rs_out_tail,
    s1,
    s2,
    spec,
    spec2,
    spec3,
    v,
    w,
    x,
    y,
    z,
)
from equivci.terms.rules.registry import family, named

# e = bcast(y) along a new dim d at size b - a, where some value x of size n along d has the window
# [a:b] (w); spec2 is e's broadcast widened to n there.
NARROW_BCAST = (
    eq(e).to(T.bcast(spec, y)),
    eq(w).to(x.slice(d, a, b)),
    eq(b - a).to(bcast_new(spec, d)),
    eq(n).to(dim(x, d)),
    eq(spec2).to(bcast_shrink(spec, d, n)),
)

LAYOUTS = family(
    "layouts",
    named(
        "layouts/bcast_lift",
        "bcast(x[a:b]) = bcast(x)[a:b along the operand dim's output dim]",
        eq(e).to(T.bcast(spec, x.slice(k, a, b))),
        eq(o).to(bcast_out(spec, k)),
    ).then(union(e).with_(T.bcast(spec, x).slice(o, a, b))),
    named(
        "layouts/bcast_push",
        "bcast(x)[a:b along an operand dim's output dim] = bcast(x[a:b])",
        eq(e).to(T.bcast(spec, x).slice(o, a, b)),
        eq(k).to(bcast_in(spec, o)),
    ).then(union(e).with_(T.bcast(spec, x.slice(k, a, b)))),
    named(
        "layouts/bcast_shrink",
        "bcast(x)[a:b along a new dim] = bcast(x) to size b - a there",
        eq(e).to(T.bcast(spec, x).slice(o, a, b)),
        eq(spec2).to(bcast_shrink(spec, o, b - a)),
    ).then(union(e).with_(T.bcast(spec2, x))),
    # A broadcast is constant along its new dims: where a slice of the same size exists, the
    # narrow broadcast is that slice of the wider one (so ops mixing both lift like any slice).
    # Only onto a wider broadcast the reference computes (a mask or table over all heads): a
    # device's own broadcasts along a size-1 dim (one KV head) would otherwise get a copy at every
    # offset of every width-1 slice, and the lifts multiply the copies (a GQA layer with RoPE ran
    # out of memory).
    named(
        "layouts/bcast_as_slice",
        "bcast(y) to size b - a along a new dim = (the reference's wider bcast(y))[a:b]",
        *NARROW_BCAST,
        eq(z).to(T.bcast(spec2, y)),
        reference(z),
    ).then(union(e).with_(z.slice(d, a, b))),
    # The reference's wider broadcast may hold the builder's constant factor in front, c * bcast(y)
    # (a LayerNorm mean `sum / D` broadcast over the features): the broadcast under it is then the
    # one a device's narrower broadcast of its psum-ed sum is a window of. Same identity, only the
    # guard reads the scaled value (a power of two: the builder's exact factors of a count).
    named(
        "layouts/bcast_as_slice_scaled",
        "bcast(y) to size b - a along a new dim = (wider bcast(y))[a:b], where c * (wider bcast(y)) is a reference value",
        *NARROW_BCAST,
        eq(z).to(T.binary("multiply", T.bcast(spec2, y), v)),
        power_of_two_splat(v),
        reference(z),
    ).then(union(e).with_(T.bcast(spec2, y).slice(d, a, b))),
    # The same along two new dims at once (a mask over an FSDP device's batch rows and a TP device's
    # heads): the broadcast narrowed along one of them only is no reference value, so the rule
    # above cannot take the two windows one at a time. The windows are any value's (the device's
    # window positions), recorded once by their offsets and sizes: joined with every broadcast, the
    # search went through every two-dim window of the program at every iteration.
    named(
        "layouts/bcast_as_slice_nested",
        "bcast(y) narrow along new dims d and d2 = (the reference's wider bcast(y))[a:b along d][c:g along d2]",
        eq(e).to(T.bcast(spec, y)),
        nested_window(d, a, b, d2, c, g, n, m),
        eq(b - a).to(bcast_new(spec, d)),
        eq(g - c).to(bcast_new(spec, d2)),
        eq(spec2).to(bcast_shrink(spec, d, n)),
        eq(spec3).to(bcast_shrink(spec2, d2, m)),
        eq(z).to(T.bcast(spec3, y)),
        reference(z),
    )
    .seeded(
        nested_window(d, a, b, d2, c, g, n, m),
        eq(w).to(x.slice(d, a, b).slice(d2, c, g)),
        ne(d2).to(d),
        eq(n).to(dim(x, d)),
        eq(m).to(dim(x, d2)),
    )
    .then(union(e).with_(z.slice(d, a, b).slice(d2, c, g))),
    # A broadcast to a smaller size along a new dim than the reference's broadcast of the same value
    # is its leading window (a shard repeating its KV head fewer times than the reference does).
    named(
        "layouts/bcast_onto_reference",
        "bcast(y) to size k < n along a new dim = (the reference's bcast(y) to n)[0:k]",
        eq(e).to(T.bcast(spec, y)),
        eq(x).to(T.bcast(spec2, y)),
        reference(x),
        eq(spec).to(bcast_shrink(spec2, o, k)),
        eq(n).to(bcast_new(spec2, o)),
        k < n,
    ).then(union(e).with_(x.slice(o, 0, k))),
    named(
        "layouts/transpose_lift",
        "transpose(x[a:b along k]) = transpose(x)[a:b along k's output dim]",
        eq(e).to(T.transpose(spec, x.slice(k, a, b))),
        eq(o).to(perm_out(spec, k)),
    ).then(union(e).with_(T.transpose(spec, x).slice(o, a, b))),
    named(
        "layouts/transpose_push",
        "transpose(x)[a:b along o] = transpose(x[a:b along p[o]])",
        eq(e).to(T.transpose(spec, x).slice(o, a, b)),
        eq(k).to(perm_in(spec, o)),
    ).then(union(e).with_(T.transpose(spec, x.slice(k, a, b)))),
    # Partial results transposed on each device are summed after the transpose (the gradient of
    # x @ w): the sum of transposes is the transpose of the sum, where the split dot merges.
    named(
        "layouts/binary_transpose_lift",
        "transpose(x) op transpose(y) = transpose(x op y), one permutation",
        eq(e).to(T.binary(op, T.transpose(spec, x), T.transpose(spec, y))),
    ).then(union(e).with_(T.transpose(spec, T.binary(op, x, y)))),
    named(
        "layouts/reshape_lift",
        "reshape(x[a:b along a group's lead]) = reshape(x)[a*s1/s2 : b*s1/s2 along its output lead], divisible",
        eq(e).to(T.reshape(spec, x.slice(k, a, b))),
        eq(o).to(rs_lead_out(spec, k)),
        eq(s1).to(rs_in_tail(spec, k)),
        eq(s2).to(rs_out_tail(spec, k)),
        eq((a * s1) % s2).to(i64(0)),
        eq((b * s1) % s2).to(i64(0)),
    ).then(union(e).with_(T.reshape(spec, x).slice(o, a * s1 / s2, b * s1 / s2))),
    named(
        "layouts/reshape_push",
        "reshape(x)[a:b along a group's output lead] = reshape(x[a*s2/s1 : b*s2/s1 along its input lead]), divisible",
        eq(e).to(T.reshape(spec, x).slice(o, a, b)),
        eq(k).to(rs_lead_in(spec, o)),
        eq(s1).to(rs_in_tail(spec, k)),
        eq(s2).to(rs_out_tail(spec, k)),
        eq((a * s2) % s1).to(i64(0)),
        eq((b * s2) % s1).to(i64(0)),
    ).then(union(e).with_(T.reshape(spec, x.slice(k, a * s2 / s1, b * s2 / s1)))),
    # The push above leaves a reshape under the one that undoes it: a flat buffer's window cut back
    # into rows (FSDP's flat gradient, reduce-scattered, then reshaped into the weight's rows) is
    # reshape(reshape(g[a:b])) after the push, the rows g[a:b] themselves. The builder composes
    # reshapes it makes; this one the rules made.
    named(
        "layouts/reshape_undone",
        "reshape(reshape(x)) = x where the outer reshape is the inner one's inverse (each group's sides swapped)",
        eq(e).to(T.reshape(spec2, T.reshape(spec, x))),
        eq(spec2).to(rs_inverse(spec)),
    ).then(union(e).with_(x)),
    # A device's heads within one group: q [b, t, 8 * hd] split by the reference into [2 groups, 4
    # heads, hd] and by a device holding heads 0-1 into [1, 2, hd]. The device's window is the
    # reference's split narrowed along two dims, which reshape_lift (lead windows only) cannot
    # reach. Only onto a split of x that exists (the group sizes come from its spec); the merge
    # below is the same fact read the other way (a device's [1, 2, hd] heads flattened).
    named(
        "layouts/reshape_lift_in_group",
        "reshape(x[a:b along a group's lead]) split as [1, m, ...] = (the [G, M, ...] split of x)"
        "[g:g+1][h:h+m] when [a:b) is m rows of lead g's block from row h",
        eq(e).to(T.reshape(spec2, x.slice(k, a, b))),
        eq(spec2).to(rs_narrow_out(spec, o, m)),
        eq(z).to(T.reshape(spec, x)),
        eq(k).to(rs_lead_in(spec, o - 1)),
        eq(s1).to(rs_in_tail(spec, k)),
        eq(s2).to(rs_out_tail(spec, k)),
        eq(n).to(rs_fixed(spec, o)),
        eq((a * s1) % (s2 / n)).to(i64(0)),
        eq((b - a) * s1).to(m * (s2 / n)),
        ((a * s1) % s2) / (s2 / n) + m <= n,
    ).then(
        union(e).with_(
            z.slice(o - 1, (a * s1) / s2, (a * s1) / s2 + 1).slice(
                o, ((a * s1) % s2) / (s2 / n), ((a * s1) % s2) / (s2 / n) + m
            )
        )
    ),
    named(
        "layouts/reshape_merge_in_group",
        "reshape(x[c:c+1 along a group's input lead][a:a+m along the next dim]) merged as [1, m, ...] = (the"
        " merge of x)[(c*M + a)*t : (c*M + a + m)*t] along the group's output lead, divisible",
        eq(e).to(T.reshape(spec2, x.slice(k, c, g).slice(d, a, b))),
        eq(d).to(k + 1),
        eq(g).to(c + 1),
        eq(spec2).to(rs_narrow_in(spec, d, b - a)),
        eq(z).to(T.reshape(spec, x)),
        eq(o).to(rs_lead_out(spec, k)),
        eq(s1).to(rs_in_tail(spec, k)),
        eq(s2).to(rs_out_tail(spec, k)),
        eq(n).to(dim(x, d)),
        eq(((c * n + a) * (s1 / n)) % s2).to(i64(0)),
        eq(((c * n + b) * (s1 / n)) % s2).to(i64(0)),
    ).then(union(e).with_(z.slice(o, (c * n + a) * (s1 / n) / s2, (c * n + b) * (s1 / n) / s2))),
)
