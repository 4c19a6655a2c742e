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
"""

from __future__ import annotations

from equivci.hlo.ir import FLOATS, Instruction, Shape
from equivci.terms.ir import Term, sort_map
from equivci.terms.semantics import sort_lanes
from equivci.translate import literals, orders
from equivci.translate.attributes import called, dims_attr, fingerprint
from equivci.translate.builder import Builder, Value
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
    return tuple(ev.slice_term(t, dim, 0, int(inst.attrs["k"])) for t in ordered)


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
