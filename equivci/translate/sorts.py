"""Handlers of sort and topk. A stable sort along one dim sorts every lane along that dim on its own,
whatever the comparator, so each output is an aligned map over the other dims (a slice of the lanes
sorts to the same slice: rules/aligned.py); its numpy model is terms/semantics.sort_lanes. A topk
is the first k of the stable descending sort of (x, iota), so that a top-k and a sort-based top-k
(approx_max_k on CPU) are one term.

A stable ascending sort by -x is the stable descending sort by x, its sorted keys negated:

    sort_LT(-x, y) = (-sort_GT(x, y)[0], sort_GT(x, y)[1])

over the reals, since negation reverses every strict order and keeps ties, which both sorts leave
in place. So `argsort(-p)[..., :k]` is `top_k(p)`'s indices, ties in index order alike (in floats,
XLA's top_k ranks 0.0 above -0.0 and a NaN first, where argsort(-p) ties the zeros and puts the
NaN last: they differ only there). The sort is built in that one form.

The first k of a stable sort of pieces concatenated in order are the first k of the sort of the
pieces' own first k_i >= k, concatenated alike (`merged_top`: a top-k over vocabulary shards, each
shard's top-k gathered, then the top-k of the candidates):

    sort(concat_i x_i, concat_i y_i)[:k] = sort(concat_i sort(x_i, y_i)[:k_i], concat_i sort(x_i, y_i)[1][:k_i])[:k]

for the keys and the payload, whenever k <= every k_i: an element past its piece's first k_i has
k_i >= k elements of its own piece before it in the whole order too, and the candidates keep the
whole's tie order (pieces in order, each piece's ties in its own order, which its stable sort
keeps). A payload piece shifted by a number, `sort(x_i, y_i)[1] + c` (a shard's local indices made
global), is the payload y_i + c carried through that sort, since a sort only moves the payload.
"""

from __future__ import annotations

import numpy as np

from equivci.hlo.ir import FLOATS, Instruction, Shape
from equivci.terms.ir import Term, sort_map
from equivci.terms.semantics import NP_DTYPES, sort_lanes
from equivci.terms.spec import AlignedMap
from equivci.translate import literals, orders
from equivci.translate.attributes import called, dims_attr, fingerprint
from equivci.translate.builder import Builder, Value, concat_parts
from equivci.translate.opaque import opaque


def sort(ev: Builder, inst: Instruction, args: list, device: int) -> Value:
    """A stable sort of one or two operands along one dim (a single operand is paired with itself).
    An unstable sort may order ties by more than the lane: it stays opaque."""
    dims = dims_attr(inst.attrs.get("dimensions"))
    if inst.attrs.get("is_stable") != "true" or len(dims) != 1 or len(args) > 2 or args[0].shape != args[-1].shape:
        return opaque(ev, inst, args)
    comp = called(ev.module, inst, "to_apply")
    order = (
        orders.sort_direction(ev.module, comp.name, len(args), args[0].dtype)
        or f"cmp-{fingerprint(comp.name, ev.module)}"
    )
    elements = inst.shape.elements if inst.shape.is_tuple else (inst.shape,)
    out = sorted_lanes(ev, args[0], args[-1], dims[0], order, [e.dtype for e in elements])
    return tuple(out) if inst.shape.is_tuple else out[0]


def top_k(ev: Builder, inst: Instruction, args: list, device: int) -> Value:
    """Along the last dim, the k largest (or smallest) values and their indices, ties in index order."""
    x, dim = args[0], len(args[0].shape) - 1
    values, indices = inst.shape.elements
    order = "GT" if inst.attrs.get("largest", "true") == "true" else "LT"
    ordered = sorted_lanes(
        ev, x, literals.positions(ev, Shape(indices.dtype, x.shape), dim), dim, order, [values.dtype, indices.dtype]
    )
    k = int(inst.attrs["k"])
    values_term, indices_term = (ev.slice_term(t, dim, 0, k) for t in ordered)
    # The indices stay positions among the candidates: a pick at them is what carries a payload
    # through the merge (picks.sorted_pick).
    merged = merged_top(ev, x, None, dim, order, [values.dtype, indices.dtype], k)
    return (values_term if merged is None else ev.slice_term(merged[0], dim, 0, k)), indices_term


def merged_top(
    ev: Builder, x: Term, y: Term | None, dim: int, order: str, dtypes: list[str], stop: int
) -> list[Term] | None:
    """The sort of (x, y) along `dim`, valid in its first `stop` elements, as the sort of the
    pieces x's candidates were taken from (module docstring), where x concatenates along `dim`
    the first k_i >= stop of stable sorts by `order` and y the payloads of those very sorts
    (each maybe shifted by a number); y None: the keys only are asked for (they do not depend on
    the payload). None otherwise."""
    if order not in FLIPPED:
        return None
    keys = [_sorted_piece(p, dim, order, 0) for p in concat_parts(x, dim)]
    if len(keys) < 2 or any(piece is None for piece in keys):
        return None
    pieces = [piece for piece in keys if piece is not None]
    if stop > min(k for _, k in pieces):
        return None
    whole = ev.concat([s.args[0] for s, _ in pieces], dim)
    if y is None:
        payload = literals.positions(ev, Shape(dtypes[1], whole.shape), dim)
    else:
        held = concat_parts(y, dim)
        if len(held) != len(pieces):
            return None
        shifted = [_shifted_payload(ev, h, piece, dim, order) for h, piece in zip(held, pieces)]
        if any(t is None for t in shifted):
            return None
        parts = [t for t in shifted if t is not None]
        values = [v for v in map(ev.folded, parts) if v is not None]
        payload = (  # shard offsets made global: positions, as a constant
            ev.const(np.concatenate(values, axis=dim), parts[0].dtype)
            if len(values) == len(parts)
            else ev.concat(parts, dim)
        )
    return sorted_lanes(ev, whole, payload, dim, order, dtypes)


def _sorted_piece(t: Term, dim: int, order: str, output: int) -> tuple[Term, int] | None:
    """(the sort, k) when t is output `output` of a stable sort by `order` along `dim` cut to its
    first k elements there (k its size when uncut); None otherwise."""
    k = t.shape[dim]
    if t.op == "slice":
        if t.attrs[0] != dim or t.attrs[1] != 0:
            return None
        t = t.args[0]
    if t.op != "aligned" or AlignedMap.op_key(t.attrs[0]) != f"sort:{order}:{dim}:{output}":
        return None
    return t, k


def _shifted_payload(ev: Builder, t: Term, piece: tuple[Term, int], dim: int, order: str) -> Term | None:
    """The payload y + c that t carries through the sort of the key piece (sort of (x, y), k):
    t is that very sort's payload output cut to the same k, plus an integer c or nothing; None
    otherwise."""
    shift = None
    if t.op == "binary" and t.attrs == ("add",) and t.dtype[0] in "su":
        for a, b in (t.args, t.args[::-1]):
            if (c := ev.uniform(b)) is not None:
                t, shift = a, c
                break
    held = _sorted_piece(t, dim, order, 1)
    if held is None or held[1] != piece[1] or any(u is not v for u, v in zip(held[0].args, piece[0].args)):
        return None
    y = piece[0].args[1]
    if shift is None:
        return y
    value = ev.folded(y)
    if value is None:
        return None
    with np.errstate(over="ignore"):
        moved: np.ndarray = (value.astype(np.int64) + int(shift)).astype(NP_DTYPES[y.dtype])
    return ev.const(moved, y.dtype)


def sorted_lanes(ev: Builder, x: Term, y: Term, dim: int, order: str, dtypes: list[str]) -> list[Term]:
    """The outputs of a stable sort of (x, y) along `dim` by comparator `order` (LT, GT, or the
    digest of another comparator, which has no numpy model and is never folded)."""
    if literals.holds_positions(ev, y, dim):
        y = literals.positions(ev, Shape(y.dtype, y.shape), dim)
    if order in FLIPPED and x.op == "unary" and x.attrs == ("negate",) and x.dtype in FLOATS:
        flipped = sorted_lanes(ev, x.args[0], y, dim, FLIPPED[order], dtypes)
        return [ev.normal("unary", ("negate",), [flipped[0]], Shape(x.dtype, x.shape)), *flipped[1:]]
    aligned = sort_map(len(x.shape), dim, x.shape[dim])
    out = []
    for k, dtype in enumerate(dtypes):
        op_key = f"sort:{order}:{dim}:{k}"
        fold = (lambda a, b, key=op_key: sort_lanes(a, b, key)) if order in ("LT", "GT") else (lambda a, b: None)
        term = ev.fold_or("aligned", (aligned.key(op_key),), [x, y], Shape(dtype, x.shape), fold)
        ev.bound(term, (x, y)[k])  # a permutation of each lane of operand k
        out.append(term)
    return out


FLIPPED = {"LT": "GT", "GT": "LT"}


HANDLERS = {"sort": sort, "topk": top_k}
