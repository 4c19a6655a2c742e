"""A dot of rows gathered from a stacked weight is the gather of the dense per-row dot.

A reference that runs each token through its own expert gathers the token's kernel first,
`W[idx]` ([T, ...] from W[E, ...]), and contracts it with the token's row in a dot batched over the
tokens (`einsum("td,tdf->tf", x, w1[idx])`). Each output row reads one expert's kernel, so

    dot(x, W[idx])[t, ...] = dot(x, W)[t, idx[t], ...]

the gather, at the same index, of the dot of x with every expert's kernel (the batch pair over the
tokens becomes a free dim of x, W's expert dim a free dim of W). An index lane the dot does not
batch, read by the gathered operand alone, stays a lane of the gather: a token's k choices at once,
idx [T, K], `einsum("td,tkdf->tkf", x, W[idx])`, are dot(x, W)[t, idx[t, k], ...], one dense dot
gathered at every choice (a lane summed over, or free on both operands, is no gather). When the other operand is itself
gathered at the same index, an expert's hidden rows `H[t, idx[t]]`, the expert dims pair up instead:

    dot(H[t, idx[t]], W[idx[t]]) = dot(H, W; batched over e)[idx[t], t, ...]

A gather picks elements and an elementwise op acts on each element alone, so values gathered at
one index with the same dims and combined elementwise (SwiGLU's `silu(a) * b`, constants
broadcast) are the gather of the op on the dense values: `lane_form` finds that dense value. The
expert-parallel programs compute the dense dots (every local expert on every token) and combine
them with a one-hot; the reference's gathered dot, stated equal to the gather of the dense dot,
meets them there (unrolled_picks.py, picks.weighted_pick). The dense dot is E times the gathered
one's size; it is built only where a dot reads a gathered operand.

Outside [0, E) a gather clamps its index; the dense form is the gather at the same index, so the
statement holds for every index, in range or not.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term
from equivci.terms.spec import AlignedMap, DotSpec, GatherDims
from equivci.translate.builder import Builder

Label = tuple[str, int]  # ("lane", index dim), ("e", 0) the gathered dim, (operand tag, dim) any other
EXPERT: Label = ("e", 0)


class LaneForm(NamedTuple):
    """A value that is gather(dense, idx) by `dims` (scalar indices, one gathered dim, the dense
    value's other dims batching dims or taken whole)."""

    dense: Term
    idx: Term
    dims: GatherDims


@dataclasses.dataclass(frozen=True)
class DenseDot:
    """The dense dot whose transpose by `perm`, gathered at `idx` by `dims`, is a written dot."""

    spec: DotSpec
    lhs: Term
    rhs: Term
    shape: Shape
    perm: tuple[int, ...]  # the transpose that lays the dot out expert-major
    idx: Term
    dims: GatherDims


def lane_form(ev: Builder, t: Term) -> LaneForm | None:
    """t as gather(dense, idx): a gather itself, a value stated equal to one (`ev.gathered`), or an
    elementwise op of values gathered at one index by the same dims and of splats; None otherwise."""
    if t not in ev.lane_forms:  # once per term: the walk down shared operands is a DAG's
        ev.lane_forms[t] = _lane_form(ev, t)
    found = ev.lane_forms[t]
    return None if found is None else LaneForm(*found)


def _lane_form(ev: Builder, t: Term) -> LaneForm | None:
    if t in ev.gathered:
        return lane_form(ev, ev.gathered[t])
    if t.op == "aligned" and AlignedMap.op_key(t.attrs[0]).startswith("gather:"):
        x, idx = t.args
        dims = GatherDims.from_key(AlignedMap.op_key(t.attrs[0]))
        if dims.vector_dim == len(idx.shape) - 1 and idx.shape[-1] == 1:  # one-coordinate index vectors
            idx = ev.reshape_term(idx, Shape(idx.dtype, idx.shape[:-1]))
            dims = dataclasses.replace(dims, vector_dim=len(idx.shape))
        form = LaneForm(x, idx, dims)
        return form if _labels(form, len(t.shape)) is not None else None
    if t.op == "unary" and (inner := lane_form(ev, t.args[0])) is not None:
        dense = ev.elementwise("unary", t.attrs, [inner.dense], Shape(t.dtype, inner.dense.shape))
        return LaneForm(dense, inner.idx, inner.dims)
    if t.op == "binary":
        forms = [lane_form(ev, a) for a in t.args]
        known = [f for f in forms if f is not None]
        if not known or any(
            (f.idx, f.dims, f.dense.shape) != (known[0].idx, known[0].dims, known[0].dense.shape) for f in known
        ):
            return None
        shape = known[0].dense.shape
        found = [f.dense if f is not None else _splat_on(ev, a, shape) for f, a in zip(forms, t.args)]
        dense_args = [d for d in found if d is not None]
        if len(dense_args) != len(found):
            return None
        dense = ev.elementwise("binary", t.attrs, dense_args, Shape(t.dtype, shape))
        return LaneForm(dense, known[0].idx, known[0].dims)
    return None


def _splat_on(ev: Builder, t: Term, shape: tuple[int, ...]) -> Term | None:
    """A broadcast scalar (a constant or any rank-0 value) broadcast onto `shape`; None otherwise."""
    if t.op == "bcast" and t.args[0].shape == ():
        return ev.mk("bcast", (",".join(f"n{n}" for n in shape),), t.args, Shape(t.dtype, shape))
    return None


def _labels(form: LaneForm, out_rank: int) -> tuple[list[Label], list[Label]] | None:
    """(labels of the dense value's dims, labels of the gather's output dims), when the gather reads
    scalar indices into one dim and takes every window dim whole; None otherwise."""
    dims, dense, idx = form.dims, form.dense, form.idx
    if dims.vector_dim != len(idx.shape) or len(dims.start_map) != 1 or dims.collapsed != dims.start_map:
        return None
    (u,) = dims.start_map
    window = [k for k in range(len(dense.shape)) if k != u and k not in dims.operand_batch]
    sizes = tuple(dense.shape[k] if k in window else 1 for k in range(len(dense.shape)))
    if dims.slice_sizes != sizes or len(dims.offset) != len(window) or out_rank != len(idx.shape) + len(window):
        return None
    dense_labels: list[Label] = [("dense", k) for k in range(len(dense.shape))]
    dense_labels[u] = EXPERT
    for k, j in zip(dims.operand_batch, dims.indices_batch):
        dense_labels[k] = ("lane", j)
    out_labels: list[Label] = []
    lanes, windows = iter(range(len(idx.shape))), iter(window)
    for o in range(out_rank):
        out_labels.append(dense_labels[next(windows)] if o in dims.offset else ("lane", next(lanes)))
    return dense_labels, out_labels


def dense_dot(ev: Builder, spec: DotSpec, lhs: Term, rhs: Term, out: Shape) -> DenseDot | None:
    """The dense dot whose gather is dot(lhs, rhs) by `spec`, when an operand is gathered at an index
    (lane_form), the other is gathered at the same index or is any value, and the dot batches
    exactly the index's lanes, each with the same lane of the other operand (a dim of a value that
    is not gathered takes the lane's place); None otherwise."""
    forms = [lane_form(ev, lhs), lane_form(ev, rhs)]
    known = [f for f in forms if f is not None]
    if not known or (len(known) == 2 and known[0].idx is not known[1].idx):
        return None
    idx = known[0].idx
    operands, dense_labels, out_labels = [], [], []
    for tag, t, form in (("lhs", lhs, forms[0]), ("rhs", rhs, forms[1])):
        if form is None:
            operands.append(t)
            dense_labels.append([(tag, k) for k in range(len(t.shape))])
            out_labels.append([(tag, k) for k in range(len(t.shape))])
            continue
        found = _labels(form, len(t.shape))
        if found is None:
            return None
        operands.append(form.dense)
        dense_labels.append([(tag, k) if label[0] == "dense" else label for k, label in enumerate(found[0])])
        out_labels.append([(tag, label[1]) if label[0] == "dense" else label for label in found[1]])
    # a written batch pair is one lane on both sides (a plain operand's dim takes the lane's label)
    for a, b in zip(spec.lhs_batch, spec.rhs_batch):
        la, lb = out_labels[0][a], out_labels[1][b]
        if la[0] == "lane" and lb[0] == "lane":
            if la != lb:
                return None
        elif la[0] == "lane" and forms[1] is None:
            dense_labels[1][b] = out_labels[1][b] = la
        elif lb[0] == "lane" and forms[0] is None:
            dense_labels[0][a] = out_labels[0][a] = lb
        else:
            return None
    # every row's own expert: the dot batches a lane (a dot with no lane batched, rows of a table
    # looked up and then multiplied, is another fact, and its dense form the whole table's product);
    # a lane it does not batch stays free, read on one operand only: a token's k choices
    # (`einsum("nd,nkdf->nkf", x, w[idx])`, idx [n, k]) are k gathers of one dense row
    batched = {out_labels[0][a] for a in spec.lhs_batch}
    if not batched or any(label[0] != "lane" for label in batched):
        return None
    contracted = [(out_labels[0][a], out_labels[1][b]) for a, b in zip(spec.lhs_contract, spec.rhs_contract)]
    if any(label[0] == "lane" for pair in contracted for label in pair):
        return None  # a lane summed over: no row's own expert
    # the dense dot: labels in both dense operands are batch pairs, the written contractions stay
    shared = [label for label in dense_labels[0] if label in dense_labels[1]]
    if any(label[0] not in ("lane", "e") for label in shared):
        return None
    sizes = [[operands[side].shape[dense_labels[side].index(label)] for side in (0, 1)] for label in shared]
    if any(a != b for a, b in sizes):  # two stacks of another expert count clamp an index apart
        return None
    shared.sort(key=lambda label: (label != EXPERT, label[1]))
    dense_spec = DotSpec(
        tuple(dense_labels[0].index(label) for label in shared),
        tuple(dense_labels[1].index(label) for label in shared),
        tuple(dense_labels[0].index(la) for la, _ in contracted),
        tuple(dense_labels[1].index(lb) for _, lb in contracted),
        len(operands[0].shape),
        len(operands[1].shape),
        (operands[0].dtype, operands[1].dtype),
    )
    gone = set(shared) | {label for pair in contracted for label in pair}
    natural = shared + [label for side in (0, 1) for label in dense_labels[side] if label not in gone]
    written = [out_labels[0][a] for a in spec.lhs_batch] + [
        label
        for side, (batch, contract) in enumerate(
            ((spec.lhs_batch, spec.lhs_contract), (spec.rhs_batch, spec.rhs_contract))
        )
        for d, label in enumerate(out_labels[side])
        if d not in batch and d not in contract
    ]
    lanes = sorted(label for label in written if label[0] == "lane")
    # laid out expert-major as a vmap over the experts or einsum("td,edf->etf") writes it: the
    # gathered dim, the lanes the dense dot keeps in the index's order (the gather's batching dims),
    # the other dims as the written dot has them
    rows = [label for label in lanes if label in natural]
    laid = [EXPERT, *rows, *(label for label in written if label[0] != "lane")]
    if EXPERT not in natural or sorted(laid) != sorted(natural):
        return None
    shape = Shape(out.dtype, tuple(_size(operands, dense_labels, label) for label in natural))
    dims = GatherDims(
        offset=tuple(o for o, label in enumerate(written) if label[0] != "lane"),
        collapsed=(0,),
        start_map=(0,),
        operand_batch=tuple(range(1, 1 + len(rows))),
        indices_batch=tuple(label[1] for label in rows),
        vector_dim=len(idx.shape),
        slice_sizes=tuple(
            1 if label[0] == "lane" or label == EXPERT else shape.dims[natural.index(label)] for label in laid
        ),
    )
    if [o for o, label in enumerate(written) if label[0] == "lane"] != [written.index(label) for label in lanes]:
        return None  # the written lanes out of the index's order (a transposed gather), or a lane
        # free on both operands (every pair of a token's two choices)
    perm = tuple(natural.index(label) for label in laid)
    return DenseDot(dense_spec, operands[0], operands[1], shape, perm, idx, dims)


def _size(operands: list[Term], labels: list[list[Label]], label: Label) -> int:
    side = 0 if label in labels[0] else 1
    return operands[side].shape[labels[side].index(label)]
