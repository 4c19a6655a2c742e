"""An argmax over consecutive pieces, combined from each piece's own max and argmax:

    take(concat_v(argmax_e(w_i) + c_i), argmax_v(concat_v(max_e(w_i))))  =  c_0 + argmax_e(concat_e(w_i))

where every piece w_i has n elements along e and c_i = c_0 + i * n, and both argmaxes keep the
first position of the largest value (jnp.argmax's ties, `orders.first_on_ties`): the winner i* is
the first piece holding the largest value, every earlier piece's values are smaller, so the whole's
first largest value sits at i* * n + argmax_e(w_i*). A vocabulary-sharded greedy step takes each
shard's max and argmax, offsets the argmax by the shard's first id, all-gathers both, and picks the
id at the argmax of the maxima: the reference's argmax over the whole vocabulary.

The same winner taken the other way, by the largest maximum and the smallest offset id among the
pieces that hold it:

    min_i where(max_e(w_i) == max_j max_e(w_j), argmax_e(w_i) + c_i, b)  =  c_0 + argmax_e(concat_e(w_i))

over the reals for any b (some piece's maximum is the largest one, exactly): every piece before the
first that holds it offers only b, and the pieces after it offer larger ids. A vocabulary-parallel
greedy step combines with `pmax` and `pmin` over the shards' offset argmaxes.
"""

from __future__ import annotations

import numpy as np

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import GatherDims, ReduceSpec, bcast_spec
from equivci.translate import literals, picks
from equivci.translate.builder import Builder, concat_parts


def combined_argmax(ev: Builder, x: Term, idx: Term, dims: GatherDims, out: Shape) -> Term | None:
    """The gather x[lanes, idx[lanes]] as c_0 + argmax_e(concat_e(w_i)) (module docstring) when x
    concatenates along the lane dim v the pieces' offset argmaxes and idx is the first argmax along
    v of the concatenation of the same pieces' maxima; None otherwise."""
    v = picks.lane_dim(x, idx, dims, out)
    while idx.op == "reshape":  # a reshape keeps the elements
        idx = idx.args[0]
    if v is None or idx not in ev.first_argmaxes or idx.shape != out.dims or ev.argmaxes[idx][1] != v:
        return None
    maxima, ids = concat_parts(ev.argmaxes[idx][0], v), concat_parts(x, v)
    if len(maxima) < 2 or len(ids) != len(maxima) or any(p.shape[v] != 1 for p in maxima + ids):
        return None
    found = [_piece(ev, m, p, out) for m, p in zip(maxima, ids)]
    if any(f is None for f in found):
        return None
    pieces = [f for f in found if f is not None]
    (w0, e, a0, c0), n = pieces[0], pieces[0][0].shape[pieces[0][1]]
    if any(w.shape != w0.shape or d != e or c != c0 + i * n for i, (w, d, _, c) in enumerate(pieces)):
        return None
    whole = ev.concat([w for w, *_ in pieces], e)
    positions = _positions_like(ev, a0.args[1], whole.shape, e)
    first = ev.mk("aligned", a0.attrs, (whole, positions), Shape(a0.dtype, out.dims))
    return _offset(ev, first, c0)


def owner_min(ev: Builder, members: list[Term]) -> Term | None:
    """The elementwise minimum of the members (in group order) as c_0 + argmax_e(concat_e(w_i))
    (module docstring) when member i is where(max_e(w_i) == M, argmax_e(w_i) + c_i, b), M the
    maximum over e of the concatenation of all the w_i (its reduce, or the members' maxima combined
    by `maximum` in order); None otherwise."""
    found = [_candidate(ev, m) for m in members]
    if len(found) < 2 or any(f is None for f in found):
        return None
    pieces = [f for f in found if f is not None]
    (w0, e, a0, c0, top), n = pieces[0], pieces[0][0].shape[pieces[0][1]]
    if any(
        w.shape != w0.shape or d != e or c != c0 + i * n or t is not top for i, (w, d, _, c, t) in enumerate(pieces)
    ):
        return None
    whole = ev.concat([w for w, *_ in pieces], e)
    maxima = [
        ev.normal("reduce", ("maximum", ReduceSpec(len(w.shape), (e,)).text()), [w], Shape(w.dtype, a0.shape))
        for w, *_ in pieces
    ]
    if (
        not (
            top.op == "reduce"
            and top.attrs[0] == "maximum"
            and top.args[0] is whole
            and ReduceSpec.parse(top.attrs[1]).dims == (e,)
        )
        and _maxima_of(top) != maxima
    ):
        return None
    return _offset(
        ev,
        ev.mk("aligned", a0.attrs, (whole, _positions_like(ev, a0.args[1], whole.shape, e)), Shape(a0.dtype, a0.shape)),
        c0,
    )


def _maxima_of(t: Term) -> list[Term]:
    """The operands a chain of elementwise `maximum`s combines, in order."""
    if t.op == "binary" and t.attrs == ("maximum",):
        return [leaf for arg in t.args for leaf in _maxima_of(arg)]
    return [t]


def _candidate(ev: Builder, t: Term) -> tuple[Term, int, Term, int, Term] | None:
    """(w, e, argmax_e(w), c, M) when t is where(max_e(w) == M, argmax_e(w) + c, b) (the compare's
    operands in either order) for an argmax that keeps the first position of the largest value."""
    if t.op != "ternary" or t.attrs != ("select",) or ev.uniform(t.args[2]) is None:
        return None
    test, offered, _ = t.args
    if test.op != "binary" or not test.attrs[0].startswith("compare-EQ:"):
        return None
    r, c = _unshifted(ev, offered)
    if r not in ev.first_argmaxes:
        return None
    w, e = ev.argmaxes[r]
    for local, top in (test.args, test.args[::-1]):
        if (
            local.op == "reduce"
            and local.attrs[0] == "maximum"
            and local.args[0] is w
            and ReduceSpec.parse(local.attrs[1]).dims == (e,)
        ):
            return w, e, r, c, top
    return None


def _offset(ev: Builder, first: Term, c0: int) -> Term | None:
    """first + c0 (an integer), its number broadcast as the broadcast handler writes one; None
    where c0 is no number of the dtype."""
    if c0 == 0:
        return first
    dtype = NP_DTYPES[first.dtype]
    if not np.iinfo(dtype).min <= c0 <= np.iinfo(dtype).max:
        return None  # the pieces' offsets wrapped around
    scalar = ev.const(np.asarray(c0, dtype=dtype), first.dtype)
    offset = ev.mk("bcast", (bcast_spec(0, first.shape, ()),), [scalar], Shape(first.dtype, first.shape))
    return ev.binary("add", first, offset)


def _unshifted(ev: Builder, t: Term) -> tuple[Term, int]:
    """(u, c) when t is u plus integers the same everywhere, added one by one, c their sum; (t, 0)
    when it adds none."""
    total = 0
    while t.op == "binary" and t.attrs == ("add",) and t.dtype[0] in "su":
        for a, b in (t.args, t.args[::-1]):
            if (c := ev.uniform(b)) is not None and c.denominator == 1:
                t, total = a, total + int(c)
                break
        else:
            break
    return t, total


def _positions_like(ev: Builder, local: Term, shape: tuple[int, ...], e: int) -> Term:
    """The positions along e of a value of `shape` in the form of a piece's argmax's own (the
    broadcast of a line, as the broadcast handler keeps an iota's, or the folded constant)."""
    if local.op != "bcast" or len(local.args[0].shape) != 1:
        return literals.positions(ev, Shape(local.dtype, shape), e)
    line = ev.const(np.arange(shape[e], dtype=NP_DTYPES[local.dtype]), local.dtype)
    return ev.mk("bcast", (bcast_spec(1, shape, (e,)),), [line], Shape(local.dtype, shape))


def _piece(ev: Builder, m: Term, p: Term, out: Shape) -> tuple[Term, int, Term, int] | None:
    """(w, e, argmax_e(w), c) when m is max_e(w) with a unit dim inserted and p is argmax_e(w) + c
    (c an integer, 0 when absent) with the same unit dim, for one argmax that keeps the first
    position of the largest value; None otherwise."""
    if m.op != "reshape" or m.args[0].shape != out.dims or p.shape != m.shape:
        return None
    p, before = _unshifted(ev, p)  # offsets added before the unit dim is inserted, or after
    r, after = _unshifted(ev, ev.reshape_term(p, Shape(p.dtype, out.dims)))
    shift = before + after
    r_max = m.args[0]
    if r_max.op != "reduce" or r_max.attrs[0] != "maximum" or r not in ev.first_argmaxes:
        return None
    w, e = ev.argmaxes[r]
    if r_max.args[0] is not w or ReduceSpec.parse(r_max.attrs[1]).dims != (e,):
        return None
    return w, e, r, shift
