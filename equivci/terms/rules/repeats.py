"""Repeats (jnp.repeat: reshape(bcast(y)) with each index of y along d repeated n times in a row).

A window inside one group of a repeat is one element of y along d, repeated: it is any window of
the same width inside the same group of a reference repeat of y with another count (a shard's KV
head repeated for its query heads is the reference's KV heads repeated for all of them, at the
shard's query heads). One element of y along d is such a window too (a shard with one query head
does not repeat its KV head). The rules match only repeat forms (tables seeded from Python) and
only reference values as targets; each match adds one window per offset c in the group.
"""

from __future__ import annotations

from egglog import eq, i64, ne, union

from equivci.terms.language import (
    T,
    a,
    b,
    c,
    d,
    e,
    k,
    key,
    m,
    n,
    reference,
    repeat_count,
    repeat_dim,
    repeat_window,
    spec,
    spec2,
    spec3,
    x,
    y,
)
from equivci.terms.rules.registry import family, named

REPEATS = family(
    "repeats",
    named(
        "repeats/shift",
        "repeat(y, n)[a:b] inside one group = repeat(y, m)[(a/n)*m + c : ... + b - a] for m != n",
        eq(e).to(T.reshape(spec, T.bcast(spec2, y)).slice(d, a, b)),
        eq(d).to(repeat_dim(spec, spec2)),
        eq(n).to(repeat_count(spec, spec2)),
        eq(a / n).to((b - 1) / n),
        eq(x).to(T.reshape(spec3, T.bcast(key, y))),
        reference(x),
        eq(d).to(repeat_dim(spec3, key)),
        eq(m).to(repeat_count(spec3, key)),
        ne(m).to(n),
        eq(k).to(b - a),
        repeat_window(m, k, c),
    ).then(union(e).with_(x.slice(d, (a / n) * m + c, (a / n) * m + c + k))),
    named(
        "repeats/one_row",
        "y[a:a+1] = repeat(y, m)[a*m + c : a*m + c + 1] for 0 <= c < m",
        eq(e).to(y.slice(d, a, b)),
        eq(b).to(a + 1),
        eq(x).to(T.reshape(spec, T.bcast(spec2, y))),
        reference(x),
        eq(d).to(repeat_dim(spec, spec2)),
        eq(m).to(repeat_count(spec, spec2)),
        repeat_window(m, i64(1), c),
    ).then(union(e).with_(x.slice(d, a * m + c, a * m + c + 1))),
)
