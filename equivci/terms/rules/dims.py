"""The dimensions of the terms rules create: each fact states `dim(e, k)`, the size of dim k of e,
from its operands' sizes and the op's static tables. Rules only build terms whose sizes follow."""

from __future__ import annotations

from egglog import eq, ne, set_

from equivci.terms.language import (
    T,
    a,
    aligned_fixed,
    aligned_lhs,
    aligned_rhs,
    b,
    bcast_new,
    bcast_out,
    d,
    dim,
    dot_batch_out,
    dot_lhs_out,
    dot_rhs_out,
    e,
    k,
    key,
    m,
    n,
    o,
    op,
    perm_out,
    reduce_out,
    rs_fixed,
    rs_in_tail,
    rs_lead_out,
    rs_out_tail,
    s1,
    s2,
    spec,
    x,
    y,
    z,
)
from equivci.terms.rules.registry import family, named

DIMS = family(
    "dims",
    named("dims/slice_sliced", "dim(x[a:b along d], d) = b - a", eq(e).to(x.slice(d, a, b)), eq(n).to(dim(x, d))).then(
        set_(dim(e, d)).to(b - a)
    ),
    named(
        "dims/slice_other",
        "dim(x[a:b along d], k) = dim(x, k) for k != d",
        eq(e).to(x.slice(d, a, b)),
        eq(n).to(dim(x, k)),
        ne(k).to(d),
    ).then(set_(dim(e, k)).to(n)),
    named("dims/unary", "dim(op(x), k) = dim(x, k)", eq(e).to(T.unary(op, x)), eq(n).to(dim(x, k))).then(
        set_(dim(e, k)).to(n)
    ),
    named("dims/binary", "dim(x op y, k) = dim(x, k)", eq(e).to(T.binary(op, x, y)), eq(n).to(dim(x, k))).then(
        set_(dim(e, k)).to(n)
    ),
    named(
        "dims/ternary", "dim(op(x, y, z), k) = dim(y, k)", eq(e).to(T.ternary(op, x, y, z)), eq(n).to(dim(y, k))
    ).then(set_(dim(e, k)).to(n)),
    named(
        "dims/concat_along",
        "dim(concat(x, y; d), d) = dim(x, d) + dim(y, d)",
        eq(e).to(T.concat(x, y, d)),
        eq(n).to(dim(x, d)),
        eq(m).to(dim(y, d)),
    ).then(set_(dim(e, d)).to(n + m)),
    named(
        "dims/concat_other",
        "dim(concat(x, y; d), k) = dim(x, k) for k != d",
        eq(e).to(T.concat(x, y, d)),
        eq(n).to(dim(x, k)),
        ne(k).to(d),
    ).then(set_(dim(e, k)).to(n)),
    named(
        "dims/dot_lhs_free",
        "a free lhs dim of a dot keeps its size at its output dim",
        eq(e).to(T.dot(spec, x, y)),
        eq(n).to(dim(x, k)),
        eq(o).to(dot_lhs_out(spec, k)),
    ).then(set_(dim(e, o)).to(n)),
    named(
        "dims/dot_rhs_free",
        "a free rhs dim of a dot keeps its size at its output dim",
        eq(e).to(T.dot(spec, x, y)),
        eq(n).to(dim(y, k)),
        eq(o).to(dot_rhs_out(spec, k)),
    ).then(set_(dim(e, o)).to(n)),
    named(
        "dims/dot_batch",
        "a batch dim of a dot keeps its size at its output dim",
        eq(e).to(T.dot(spec, x, y)),
        eq(n).to(dim(x, k)),
        eq(o).to(dot_batch_out(spec, k)),
    ).then(set_(dim(e, o)).to(n)),
    named(
        "dims/reduce_kept",
        "a kept dim of a reduce keeps its size at its output dim",
        eq(e).to(T.reduce(op, key, x)),
        eq(n).to(dim(x, k)),
        eq(o).to(reduce_out(key, k)),
    ).then(set_(dim(e, o)).to(n)),
    named(
        "dims/bcast_operand",
        "an operand dim of a broadcast keeps its size at its output dim",
        eq(e).to(T.bcast(spec, x)),
        eq(n).to(dim(x, k)),
        eq(o).to(bcast_out(spec, k)),
    ).then(set_(dim(e, o)).to(n)),
    named(
        "dims/bcast_new",
        "a new dim of a broadcast has the size its spec names",
        eq(e).to(T.bcast(spec, x)),
        eq(n).to(bcast_new(spec, o)),
    ).then(set_(dim(e, o)).to(n)),
    named(
        "dims/transpose",
        "dim(transpose(x; p), o) = dim(x, p[o])",
        eq(e).to(T.transpose(spec, x)),
        eq(n).to(dim(x, k)),
        eq(o).to(perm_out(spec, k)),
    ).then(set_(dim(e, o)).to(n)),
    named(
        "dims/reshape_lead",
        "a reshape group's leading output dim is its element count over the output tail",
        eq(e).to(T.reshape(spec, x)),
        eq(n).to(dim(x, k)),
        eq(o).to(rs_lead_out(spec, k)),
        eq(s1).to(rs_in_tail(spec, k)),
        eq(s2).to(rs_out_tail(spec, k)),
    ).then(set_(dim(e, o)).to(n * s1 / s2)),
    named(
        "dims/reshape_fixed",
        "a reshape's non-leading output dims have the sizes its spec names",
        eq(e).to(T.reshape(spec, x)),
        eq(n).to(rs_fixed(spec, o)),
        eq(m).to(dim(x, 0)),
    ).then(set_(dim(e, o)).to(n)),
    named(
        "dims/aligned_lhs",
        "an aligned lhs dim keeps its size at its output dim",
        eq(e).to(T.aligned(key, x, y)),
        eq(n).to(dim(x, k)),
        eq(o).to(aligned_lhs(key, k)),
    ).then(set_(dim(e, o)).to(n)),
    named(
        "dims/aligned_rhs",
        "an aligned rhs dim keeps its size at its output dim",
        eq(e).to(T.aligned(key, x, y)),
        eq(n).to(dim(y, k)),
        eq(o).to(aligned_rhs(key, k)),
    ).then(set_(dim(e, o)).to(n)),
    named(
        "dims/aligned_fixed",
        "an aligned op's other output dims have the sizes its attributes name",
        eq(e).to(T.aligned(key, x, y)),
        eq(n).to(aligned_fixed(key, o)),
    ).then(set_(dim(e, o)).to(n)),
    named("dims/dslice_along", "dim(dslice(x, start; d, n), d) = n", eq(e).to(T.dslice(d, n, x, y))).then(
        set_(dim(e, d)).to(n)
    ),
    named(
        "dims/dslice_other",
        "dim(dslice(x, start; d, n), k) = dim(x, k) for k != d",
        eq(e).to(T.dslice(d, n, x, y)),
        eq(m).to(dim(x, k)),
        ne(k).to(d),
    ).then(set_(dim(e, k)).to(m)),
    named(
        "dims/dupdate",
        "dim(dupdate(x, u, start; d), k) = dim(x, k)",
        eq(e).to(T.dupdate(d, x, y, z)),
        eq(n).to(dim(x, k)),
    ).then(set_(dim(e, k)).to(n)),
)
