"""Handlers of dot and reduce: a dot keeps its dims in a spec, a reduction by a single
add/max/min/multiply/and/or from its identity is a `reduce` term, and a two-operand reduce
(argmax) an aligned map over the kept dims.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from fractions import Fraction

import numpy as np

from equivci.hlo.ir import FLOATS, Instruction, Module, Shape
from equivci.terms.ir import Term, bcast_form, inserted_unit_dims, reduce_pair_map
from equivci.terms.spec import BcastSpec, DotSpec, ReduceSpec, transpose_text
from equivci.translate import (
    constant_selects,
    gathered_dots,
    moved_columns,
    one_hots,
    orders,
    picks,
    relaid,
    signed_sums,
    small_maps,
    squeezes,
    tiles,
)
from equivci.translate.arrays import all_equal, distinct, is_identity
from equivci.translate.attributes import called, dims_attr, fingerprint, reducer_of
from equivci.translate.builder import SCALABLE, Builder, Value, power_of_two
from equivci.translate.opaque import opaque
from equivci.translate.relayouts import (
    dot_of_relayouts,
    merged_contraction,
    reoriented,
    split_contraction,
    through_transposes,
)
from equivci.translate.shapes import copies_window

# reducers whose reduction over a concatenation is that op of the pieces' reductions
COMBINED = {"add": "add", "maximum": "maximum", "minimum": "minimum"}


# Float dtypes narrower than f32: a dot with such a result is its f32 dot rounded once.
ROUNDED = {"bf16", "f16"}
# Float dtypes whose sum of products is read as a dot as it is written (a narrower one's dot is its
# f32 dot rounded once, which a sum written in that dtype is not)
WIDE = {"f32", "f64"}


def dot(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    if (scaled := power_of_two_out(ev, inst, args, device)) is not None:
        return scaled
    if inst.shape.dtype in ROUNDED:
        # The products summed exactly, rounded once at the end (XLA accumulates a bf16 dot in f32):
        # `preferred_element_type=bf16` and an f32 dot converted to bf16 are one term.
        wide = dot(ev, dataclasses.replace(inst, shape=Shape("f32", inst.shape.dims)), args, device)
        return ev.normal("unary", ("convert",), [wide], inst.shape)
    a = inst.attrs
    lb, rb = dims_attr(a.get("lhs_batch_dims")), dims_attr(a.get("rhs_batch_dims"))
    lc, rc = dims_attr(a.get("lhs_contracting_dims")), dims_attr(a.get("rhs_contracting_dims"))
    lhs, rhs = args
    dot_spec = DotSpec(lb, rb, lc, rc, len(lhs.shape), len(rhs.shape), (lhs.dtype, rhs.dtype))
    return dot_with_facts(ev, dot_spec, lhs, rhs, inst.shape)


def power_of_two_out(ev: Builder, inst: Instruction, args: list, device: int) -> Term | None:
    """dot(2^k * x, y) as 2^k * dot(x, y) where x is a bf16 or f16 operand (whose constant factors
    the builder cannot hold in front) and the dot's output dtype can: scaling by a power of two is
    exact in every float dtype (barring overflow), so each product and partial sum is scaled
    exactly. Attention logits with 1/sqrt(head_dim) = 1/2 folded into bf16 queries then meet
    logits scaled after the f32-accumulated dot. None when no such factor is found."""
    if inst.shape.dtype not in SCALABLE:
        return None
    for k, t in enumerate(args):
        if t.op != "binary" or t.attrs != ("multiply",) or t.dtype not in ROUNDED:
            continue
        for j in (0, 1):
            c = ev.uniform(t.args[j])
            if c and abs(c) == power_of_two(c) and t.args[1 - j].shape == t.shape:
                operands = [t.args[1 - j] if i == k else a for i, a in enumerate(args)]
                scaled = ev.scaled(dot(ev, inst, operands, device), c)
                if scaled is not None:
                    return scaled
    return None


def dot_with_facts(ev: Builder, dot_spec: DotSpec, lhs: Term, rhs: Term, shape: Shape) -> Term:
    """The dot's term in normal form, with the facts stated beside it; a dot with a selector (an
    operand without free dims) that is zero everywhere is zero (each output element a sum of
    products with a zero factor; over the reals: an infinite factor would make it NaN): device 0's
    sum of no earlier devices' totals, `tensordot((arange(n) < 0).astype(f), gathered, 1)`."""
    selectors = (
        (lhs, len(dot_spec.lhs_batch + dot_spec.lhs_contract)),
        (rhs, len(dot_spec.rhs_batch + dot_spec.rhs_contract)),
    )
    if (
        any(len(x.shape) == n and ev.uniform(x) == 0 for x, n in selectors)
        and (zero := ev.splat(Fraction(0), shape)) is not None
    ):
        return zero
    term = dot_term(ev, dot_spec, lhs, rhs, shape)
    if (dense := gathered_dots.dense_dot(ev, dot_spec, lhs, rhs, shape)) is not None:
        # each row's own expert: the gather of the dot with every expert's kernel
        whole = ev.transpose_term(dot_term(ev, dense.spec, dense.lhs, dense.rhs, dense.shape), dense.perm)
        if (picked := ev.gather_term(whole, dense.idx, dense.dims, shape)) is not None:
            ev.equal_terms.append([term, picked])
            ev.gathered[term] = picked
    if (weighted := picks.weighted_pick(ev, dot_spec, lhs, rhs)) is not None:
        # gates times the picked experts' rows: the gates' one-hot against every expert's rows
        spec, as_sum, others, x = weighted
        ev.equal_terms.append([term, dot_term(ev, spec, as_sum, x, shape)])
        ev.equal_terms.append([as_sum, *others])
    if (moved := moved_columns.moved_columns(ev, dot_spec, lhs, rhs, shape)) is not None:
        ev.equal_terms.append([term, moved])
        ev.piecewise[term] = moved
    if (summed := product_sum(ev, dot_spec, lhs, rhs, shape)) is not None:
        ev.equal_terms.append([term, summed])
    if (applied := small_maps.applied_matrix(ev, dot_spec, lhs, rhs, shape)) is not None:
        # a rotation einsum as the formula it computes, made the term: the relayout after it (the
        # pairs merged back into the head dim) then reads the formula's pieces
        ev.equal_terms.append([applied, term])
        return applied
    if (copied := dot_of_copies(ev, dot_spec, lhs, rhs, shape)) is not None:
        ev.equal_terms.append([term, copied])
    if moved_units := unit_batch_moved(ev, dot_spec, lhs, rhs, shape):
        ev.equal_terms.append([term, *moved_units])
    if (ordered := contraction_sorted(dot_spec)) is not None:
        ev.equal_terms.append([term, dot_term(ev, ordered, lhs, rhs, shape)])
    # read off the normal form: a transposed squeeze is absorbed there, the squeeze left bare
    if term.op == "dot" and (unit := unit_contractions(ev, DotSpec.parse(term.attrs[0]), *term.args)) is not None:
        ev.equal_terms.append([term, dot_term(ev, *unit, shape)])
    if (one_sided := split_contraction(ev, dot_spec, lhs, rhs, one_sided=True)) is not None:
        # stated beside it, the normal form kept (it would merge the dims again): a device's heads
        # contracted with its rows of the output projection split [h, hd, d] (einsum("bhqd,hde->bqe"))
        # meet the reference's merge of its heads against the unsplit kernel only over the split
        # dims; read through the operands' relayouts too, a patchified image meets a convolution
        ev.equal_terms.append([term, dot_term(ev, *one_sided, shape)])
        relaid = dot_of_relayouts(ev, *one_sided, shape, functools.partial(dot_term, ev))
        if relaid is not None and relaid is not term:
            ev.equal_terms.append([term, relaid])
    squeezes.squeezed_dot(ev, dot_spec, lhs, rhs, term, functools.partial(dot_term, ev))
    if (shared := dot_of_batch_copies(ev, dot_spec, lhs, rhs, shape)) is not None:
        # stated beside the written dot, not made the term: as the term it moved the layout every
        # later op builds on, and lost the zoo's GQA with replicated KV heads (gqa-tp4-kv2-replicated)
        ev.equal_terms.append([term, shared])
    return term


def dot_of_batch_copies(ev: Builder, spec: DotSpec, lhs: Term, rhs: Term, out: Shape) -> Term | None:
    """A dot batched over a dim j along which one operand is copies of one slice p (the same
    elements at every index of j), as the dot of p, its j a size-1 batch dim, against the other
    operand x whose j turns free beside a size-1 batch partner, laid back out by a transpose:

        dot(x[.., j, .., c], copies_j(p)[.., j, .., c]; batch j) = dot(x[.., 1, j, .., c], p[.., 1, .., c]; batch 1)

    (out[.., j, ..] = sum_c x[.., j, .., c] * p[.., c]: the same products, summed alike: no rounding
    moves). A device's two query heads batched against their KV head's keys repeated twice are then
    the query heads of one group against that group's keys once, the reference's grouped dot at that
    group. The copies are read on numbered elements (a broadcast, under a reshape: `jnp.repeat`,
    `broadcast_to`, a tile) or a concatenation of one size-1 value. None when no batch dim is such a
    dim of either operand: copies along a free dim are dot_of_copies', along a contracted one a sum."""
    operands = [lhs, rhs]
    batches, contracts = [spec.lhs_batch, spec.rhs_batch], [spec.lhs_contract, spec.rhs_contract]
    for side in (0, 1):
        for t, j in enumerate(batches[side]):
            part = _one_copy(ev, operands[side], j)
            if part is None:
                continue
            other, k = 1 - side, batches[1 - side][t]
            x = operands[other]
            # p's j (size 1 now) needs a size-1 batch partner in x, whose j turns free: one put just
            # before x's j, where a repeat's group dim stands (x's first size-1 free dim moved there,
            # a reshape; else a new one, dropped again by the reshape back)
            free = [d for d in range(len(x.shape)) if d not in batches[other] + contracts[other]]
            unit = next((d for d in free if x.shape[d] == 1), None)
            layout: list[int | None] = [d for d in range(len(x.shape)) if d != unit]
            layout.insert(layout.index(k), None)
            ops, batch, contract = list(operands), list(batches), list(contracts)
            ops[side] = part
            ops[other] = ev.reshape_term(x, Shape(x.dtype, tuple(1 if d is None else x.shape[d] for d in layout)))
            batch[other] = tuple(layout.index(None if i == t else d) for i, d in enumerate(batch[other]))
            contract[other] = tuple(layout.index(d) for d in contract[other])
            new = DotSpec(
                batch[0], batch[1], contract[0], contract[1], len(ops[0].shape), len(ops[1].shape), spec.dtypes
            )
            # the new dot's output dims named as the written dot's: a batch pair or an operand's free
            # dim; x's j, free now, is the written batch pair t, and the new size-1 pair t is "u"
            names = [
                ("u",) if n == ("b", t) else ("b", t) if n == (other, k) else n
                for n in ((n[0], layout[n[1]]) if n[0] == other else n for n in _dot_dims(new))
            ]
            order = [("u",) if n == (other, unit) else n for n in _dot_dims(spec)]
            if unit is None:
                order.insert(t, ("u",))
            sizes = {n: out.dims[o] for o, n in enumerate(_dot_dims(spec))} | {("u",): 1}
            inner = Shape(out.dtype, tuple(sizes[n] for n in names))
            laid = ev.transpose_term(dot_term(ev, new, ops[0], ops[1], inner), tuple(names.index(n) for n in order))
            return ev.reshape_term(laid, out)
    return None


def _dot_dims(spec: DotSpec) -> list[tuple]:
    """A dot's output dims in order: ("b", k) for its k-th batch pair, then (0, d) for the lhs's free
    dims d and (1, d) for the rhs's."""
    free = [
        [d for d in range(rank) if d not in batch + contract]
        for rank, batch, contract in (
            (spec.lhs_rank, spec.lhs_batch, spec.lhs_contract),
            (spec.rhs_rank, spec.rhs_batch, spec.rhs_contract),
        )
    ]
    return [("b", k) for k in range(len(spec.lhs_batch))] + [(0, d) for d in free[0]] + [(1, d) for d in free[1]]


def unit_batch_moved(ev: Builder, spec: DotSpec, lhs: Term, rhs: Term, out: Shape) -> list[Term]:
    """The dot with an operand's size-1 batch dims (of pairs size 1 on both sides) moved to just
    before its last dim, where splitting a projection's last dim into heads puts the head dim
    ([b, s, h, hd]), for either operand or both (a dot's output, such as attention's
    probabilities, keeps its batch dims first). Moving a size-1 dim is a reshape (no element
    moves) and the batch pairs keep their order, so the output is the same: a device holding one
    head of `q.transpose(0, 2, 1, 3)`, which XLA writes as a reshape of its [b, s, hd] slab to
    [b, 1, s, hd], meets the reference's dot of its [b, s, h, hd] heads at that head's window.
    Empty when no such dim moves."""
    units = [(lb, rb) for lb, rb in zip(spec.lhs_batch, spec.rhs_batch) if lhs.shape[lb] == 1 and rhs.shape[rb] == 1]
    if not units:
        return []
    choices = []  # per operand: (the operand, its dims' new positions) as written, then moved
    for t, unit in ((lhs, [lb for lb, _ in units]), (rhs, [rb for _, rb in units])):
        rest = [d for d in range(len(t.shape)) if d not in unit]
        order = rest[:-1] + unit + rest[-1:]
        kept = (t, list(range(len(t.shape))))
        if order == kept[1]:
            choices.append([kept])
        else:
            moved = ev.reshape_term(t, Shape(t.dtype, tuple(t.shape[d] for d in order)))
            choices.append([kept, (moved, [order.index(d) for d in range(len(order))])])
    forms = []
    for (x, at_x), (y, at_y) in itertools.product(*choices):
        if x is lhs and y is rhs:
            continue
        new = DotSpec(
            tuple(at_x[d] for d in spec.lhs_batch),
            tuple(at_y[d] for d in spec.rhs_batch),
            tuple(at_x[d] for d in spec.lhs_contract),
            tuple(at_y[d] for d in spec.rhs_contract),
            spec.lhs_rank,
            spec.rhs_rank,
            spec.dtypes,
        )
        forms.append(dot_term(ev, new, x, y, out))
    return forms


def unit_contractions(ev: Builder, spec: DotSpec, lhs: Term, rhs: Term) -> tuple[DotSpec, Term, Term] | None:
    """A dot of an operand that a reshape squeezed (dropped size-1 dims of x, nothing else), as the
    dot of x whose size-1 dims are contracted against size-1 dims inserted in the other operand y
    just before its first contracted dim, the pairs in y's dim order:

        dot(squeeze(x), y; C) = dot(x, y'; C + {(u, u')})

    (a sum over one index is its one term; the output is the same). A device holding one KV group
    contracts its [b, hd, G, t] context, the group dim squeezed out, with its rows of the output
    projection split [G, hd, d]; the reference contracts its groups too, and the device's dot is
    its piece at that group. None when neither operand is such a squeeze or the other operand
    contracts nothing."""
    for side in (0, 1):
        squeezed, other = (lhs, rhs) if side == 0 else (rhs, lhs)
        if squeezed.op != "reshape":
            continue
        x = squeezed.args[0]
        units = inserted_unit_dims(squeezed.shape, x.shape)
        own_contract = spec.lhs_contract if side == 0 else spec.rhs_contract
        other_contract = spec.rhs_contract if side == 0 else spec.lhs_contract
        if units is None or not other_contract:
            continue
        at_x = [d for d in range(len(x.shape)) if d not in units]  # squeezed dim -> x dim
        first = min(other_contract)
        added = len(units)
        at_y = [d if d < first else d + added for d in range(len(other.shape))]  # other dim -> new dim
        grown = list(other.shape)
        grown[first:first] = [1] * added
        y = ev.reshape_term(other, Shape(other.dtype, tuple(grown)))
        pairs = sorted(
            [(at_x[i], at_y[j]) for i, j in zip(own_contract, other_contract)]
            + [(u, first + k) for k, u in enumerate(sorted(units))],
            key=lambda p: p[1],
        )
        own_batch = tuple(at_x[d] for d in (spec.lhs_batch if side == 0 else spec.rhs_batch))
        other_batch = tuple(at_y[d] for d in (spec.rhs_batch if side == 0 else spec.lhs_batch))
        xc, yc = tuple(p for p, _ in pairs), tuple(q for _, q in pairs)
        if side == 0:
            new = DotSpec(own_batch, other_batch, xc, yc, len(x.shape), len(grown), spec.dtypes)
            return new, x, y
        new = DotSpec(other_batch, own_batch, yc, xc, len(grown), len(x.shape), spec.dtypes)
        return new, y, x
    return None


def _one_copy(ev: Builder, t: Term, j: int) -> Term | None:
    """t's slice [0:1] along dim j when t is copies of it along j: a broadcast (under a reshape:
    `jnp.repeat`, a tile) holding the same elements at every index along j, read on numbered
    elements, as the copies of its window (shapes.copies_window); or a concatenation of one size-1
    value along j."""
    copies = t.args[0] if t.op == "reshape" else t
    if copies.op == "bcast":
        if not tiles.constant_along(copies, t.shape, j, ev.budgets.layout_labels):
            return None
        return copies_window(ev, t, [(0, 1) if d == j else (0, n) for d, n in enumerate(t.shape)])
    found = _copies(t)
    return found[1] if found is not None and found[0] == j and found[1].shape[j] == 1 else None


def dot_of_copies(ev: Builder, spec: DotSpec, lhs: Term, rhs: Term, out: Shape) -> Term | None:
    """A dot of an operand that is r copies of y concatenated along one of its free dims, as r copies
    of the dot of y along that dim's output dim:

        dot(x, concat([y] * r; f)) = concat([dot(x, y)] * r; o)

    (an output element along o reads one copy of y, the same whichever). A device holding two query
    heads of one KV group repeats its KV head's kernel for them (tiles.py states the copies a
    concatenation, `Builder.tiled`); its keys are then that KV head's keys twice, which the reference's repeat holds
    at those heads. Not along a contracted dim (a sum over the copies) or a batch dim."""
    nb = len(spec.lhs_batch)
    lhs_free = [d for d in range(spec.lhs_rank) if d not in spec.lhs_batch + spec.lhs_contract]
    rhs_free = [d for d in range(spec.rhs_rank) if d not in spec.rhs_batch + spec.rhs_contract]
    for operand, free, first in ((lhs, lhs_free, nb), (rhs, rhs_free, nb + len(lhs_free))):
        found = _copies(ev.tiled.get(operand, operand))
        if found is None or found[0] not in free:
            continue
        dim, part, count = found
        o = first + free.index(dim)
        shape = Shape(out.dtype, tuple(n // count if i == o else n for i, n in enumerate(out.dims)))
        piece = dot_term(ev, spec, part, rhs, shape) if operand is lhs else dot_term(ev, spec, lhs, part, shape)
        return ev.concat([piece] * count, o)
    return None


def _copies(t: Term) -> tuple[int, Term, int] | None:
    """(dim, y, r) when t is r >= 2 copies of y concatenated along dim."""
    if t.op != "concat":
        return None
    dim, parts, stack = t.attrs[0], [], [t]
    while stack:
        u = stack.pop()
        if u.op == "concat" and u.attrs[0] == dim:
            stack.extend(reversed(u.args))
        else:
            parts.append(u)
    return (dim, parts[0], len(parts)) if all(p is parts[0] for p in parts) else None


def product_sum(ev: Builder, spec: DotSpec, lhs: Term, rhs: Term, out: Shape) -> Term | None:
    """A dot where one operand a has no free dims, as the sum over the contracted dims of the other
    operand m times a broadcast along m's free dims:

        dot(a[b, c], m[b, c, f]) = sum_c m[b, c, f] * a[b, c]

    (each output element is that very sum of products). A top-k combine written as
    `einsum("tk,tke->te", w, one_hot(idx))` then meets the scatter `.at[rows, idx].add(w)`, which
    one_hots.py states as that sum. None when both operands have free dims, the dtypes differ, or
    m's batch dims do not lead its dims in the dot's batch order (the sum would be transposed)."""
    for a, m, a_batch, m_batch, a_contract, m_contract in (
        (lhs, rhs, spec.lhs_batch, spec.rhs_batch, spec.lhs_contract, spec.rhs_contract),
        (rhs, lhs, spec.rhs_batch, spec.lhs_batch, spec.rhs_contract, spec.lhs_contract),
    ):
        if len(a.shape) != len(a_batch) + len(a_contract) or not a_contract or len(a.shape) == len(m.shape):
            continue
        if a.dtype != m.dtype or m.dtype != out.dtype:
            return None
        kept = [d for d in range(len(m.shape)) if d not in m_contract]
        if kept[: len(m_batch)] != list(m_batch):
            return None
        to_m = dict(zip(a_batch, m_batch)) | dict(zip(a_contract, m_contract))
        at = tuple(to_m[k] for k in range(len(a.shape)))
        spread = one_hots.spread(ev, a, m.shape, at)
        product = ev.binary("multiply", m, spread)
        dims = tuple(sorted(m_contract))
        summed = ev.normal("reduce", ("add", ReduceSpec(len(m.shape), dims).text()), [product], out)
        if (selected := kept_pieces(ev, m, a, at, dims, out)) is not None:
            ev.equal_terms.append([summed, selected])
        return summed
    return None


def kept_pieces(ev: Builder, m: Term, a: Term, at: tuple[int, ...], dims: tuple[int, ...], out: Shape) -> Term | None:
    """The sum over `dims` of m * a (a's dim k at m's dim at[k], a constant along m's other dims), for
    a constant a of ones and zeros in runs along one dim,
    as the sum of the concatenation of m's windows where it is 1 and zeros where it is 0 (m * 1 = m
    and m * 0 = 0 over the reals), that is of the kept pieces' sums (`over_pieces`): a dot of the devices'
    gathered totals with `(arange(n) < me).astype(f)` is the sum of the earlier devices' totals."""
    held = ev.folded(a)
    if held is None or m.dtype not in FLOATS or not np.all((held == 0) | (held == 1)):
        return None
    order = sorted(range(len(at)), key=lambda k: at[k])
    placed = np.transpose(held, order).reshape([m.shape[d] if d in at else 1 for d in range(len(m.shape))])
    value = np.broadcast_to(placed, m.shape)
    zeros = ev.splat(Fraction(0), Shape(m.dtype, m.shape))
    chosen = None if zeros is None else constant_selects.select_by_constant(ev, ev.const(value == 1, "pred"), m, zeros)
    return None if chosen is None else reduction(ev, "add", chosen, dims, out)


def dot_term(ev: Builder, dot_spec: DotSpec, lhs: Term, rhs: Term, shape: Shape) -> Term:
    """dot(lhs, rhs) by `dot_spec` in normal form: transposed operands absorbed, split and merged
    contractions, operands that are dots reoriented (the written form stated beside it)."""
    spec, x, y = split_contraction(ev, dot_spec, lhs, rhs) or (dot_spec, lhs, rhs)
    spec, x, y, perm = through_transposes(spec, x, y) or (spec, x, y, tuple(range(len(shape.dims))))
    # a transpose absorbed may uncover a reshape that merged a contraction (heads moved, then flattened)
    spec, x, y = split_contraction(ev, spec, x, y) or (spec, x, y)
    x_dot, y_dot = reoriented(ev, x), reoriented(ev, y)
    if x_dot is not None or y_dot is not None:
        spec, x, y, moved = through_transposes(spec, x_dot or x, y_dot or y) or (spec, x, y, perm)
        perm = tuple(moved[k] for k in perm)
    if (spec, x, y) == (dot_spec, lhs, rhs):
        return _dot(ev, dot_spec, lhs, rhs, shape)
    inner = Shape(shape.dtype, tuple(shape.dims[perm.index(k)] for k in range(len(perm))))
    term = _dot(ev, spec, x, y, inner)
    if perm != tuple(range(len(perm))):
        attrs = (transpose_text(perm),)
        term = ev.factored("transpose", attrs, [term], shape) or ev.mk("transpose", attrs, [term], shape)
    # The written form stays stated beside it: the windows of a transposed operand nest in
    # another order (slices keep the higher dim outside), and rules that match a contraction's
    # window outermost (a gradient x.T @ dy summed per microbatch) find it only there.
    ev.equal_terms.append([term, _dot(ev, dot_spec, lhs, rhs, shape)])
    return term


def _dot(ev: Builder, dot_spec: DotSpec, lhs: Term, rhs: Term, out: Shape) -> Term:
    merged = merged_contraction(ev, dot_spec, lhs, rhs)
    if merged is not None:
        dot_spec, lhs, rhs = merged
    spec = dot_spec.text()
    written = ev.factored("dot", (spec,), [lhs, rhs], out) or ev.mk("dot", (spec,), [lhs, rhs], out)
    relaid = dot_of_relayouts(ev, dot_spec, lhs, rhs, out, functools.partial(dot_term, ev))
    if relaid is not None:
        # The written form stays stated beside it: a device that holds one group reads its slot
        # as a window, not as a relayout, and its dot is the written dot's window along the group.
        ev.equal_terms.append([relaid, written])
        return relaid
    return written


def reduce(ev: Builder, inst: Instruction, args: list, device: int) -> Value:
    reducer = reducer_of(ev.module, inst)
    if len(args) == 4 and inst.shape.is_tuple:
        return reduce_pair(ev, inst, args)
    if reducer is None or len(args) != 2:
        return opaque(ev, inst, args)
    x, init = args
    init_value = ev.folded(init)
    if init_value is None or not is_identity(reducer, init_value):
        return opaque(ev, inst, args)
    dims = dims_attr(inst.attrs.get("dimensions"))
    value = ev.folded(x)
    if value is not None and reducer in ("and", "or"):  # masks of range checks fold away
        return ev.const(np.all(value, axis=dims) if reducer == "and" else np.any(value, axis=dims), inst.shape.dtype)
    if _identity(ev, reducer, x):  # (exact: no element changes the identity; the earlier shards' totals of shard 0)
        return ev.const(np.full(inst.shape.dims, init_value), inst.shape.dtype)
    term = reduction(ev, reducer, x, dims, inst.shape)
    if reducer == "add" and (contracted := summed_batches(ev, x, dims, inst.shape)) is not None:
        ev.equal_terms.append([term, contracted])
    if reducer == "add" and (as_dot := summed_product(ev, x, dims, inst.shape)) is not None:
        # the dot is the term, every fact about dots applies; the written sum is not stated beside
        # it: the layout rules on its broadcast product grew a ring's e-graph past its budget
        return as_dot
    factor, product = ev.scale_of(x)  # (GELU's 0.5 on the picked rows, moved in front)
    if reducer == "add" and (weighted := picks.weighted_sum(ev, product, dims, inst.shape)) is not None:
        # stated beside the sum, with the dot's own facts (picks.weighted_pick's one-hot)
        spec, a, y, inner, perm = weighted
        as_dot = ev.scaled(ev.transpose_term(dot_with_facts(ev, spec, a, y, inner), perm), factor)
        if as_dot is not None:
            ev.equal_terms.append([term, as_dot])
    return term


def summed_product(ev: Builder, x: Term, dims: tuple[int, ...], out: Shape) -> Term | None:
    """sum over dims R of bcast(a) * bcast(b) as dot_general(a, b), when every summed dim is read by
    both broadcasts and every kept dim by at least one:

        sum_R a[.., r, ..] * b[.., r, ..] = dot(a, b; contracting R, batch the kept dims both read)

    the kept dims only a reads its free dims, only b reads b's (each output element is the sum of
    the same products: the dot XLA computes for `p @ v`, in another summation order, which the
    reference's rounding bound covers as it does any sum's). `(p[..., None, :] * v[..., None, :, :])
    .sum(-1)` then meets the reference's einsum. None for a summed dim one operand is broadcast
    along (a sum of copies: a count times the other), a kept dim neither reads, mixed dtypes, or a
    sum in a dtype narrower than f32 (its dot is its f32 dot rounded once, ROUNDED)."""
    if x.op != "binary" or x.attrs[0] != "multiply" or x.dtype not in WIDE or out.dtype != x.dtype:
        return None
    forms = [f for t in x.args if (f := bcast_form(t)) is not None]
    if len(forms) != 2 or any(t.dtype != x.dtype for t in x.args):
        return None
    # reads[i][o]: the operand dim of operand i that output dim o of x is, if any
    reads = [{o: k for o, k in BcastSpec.parse(spec).operand_dims()} for spec, _ in forms]
    kept = [o for o in range(len(x.shape)) if o not in dims]
    if any(o not in reads[0] or o not in reads[1] for o in dims) or any(
        o not in reads[0] and o not in reads[1] for o in kept
    ):
        return None
    a, b = forms[0][1], forms[1][1]
    batch = [o for o in kept if o in reads[0] and o in reads[1]]
    spec = DotSpec(
        tuple(reads[0][o] for o in batch),
        tuple(reads[1][o] for o in batch),
        tuple(reads[0][o] for o in dims),
        tuple(reads[1][o] for o in dims),
        len(a.shape),
        len(b.shape),
        (a.dtype, b.dtype),
    )
    # the dot's output dims as x's: the batch dims, then a's free dims in a's order, then b's
    at = [{k: o for o, k in r.items()} for r in reads]
    free = [
        [at[i][k] for k in range(len(t.shape)) if at[i][k] in kept and at[i][k] not in batch]
        for i, t in enumerate((a, b))
    ]
    names = batch + free[0] + free[1]
    inner = Shape(out.dtype, tuple(x.shape[o] for o in names))
    return ev.transpose_term(dot_term(ev, spec, a, b, inner), tuple(names.index(o) for o in kept))


def reduction(ev: Builder, reducer: str, x: Term, dims: tuple[int, ...], shape: Shape, signed: bool = True) -> Term:
    """x reduced over dims in normal form: over a concatenation along a reduced dim, the reducer of
    the pieces' reductions (`over_pieces`); a sum of negations as the negated sum, the written sum
    stated beside it (`negated_operand`); with the moved forms of `moved_reductions` stated beside.
    The negation outside is the term so that each device's sum of negated picks, psum-ed, is a sum
    of negated shares (collectives.py), whose partial sums merge as the reference's one sum."""
    term = over_pieces(ev, reducer, x, dims, shape)
    if term is None and reducer == "add" and (y := negated_operand(ev, x, shape)) is not None:
        term = ev.normal("unary", ("negate",), [reduction(ev, reducer, y, dims, shape)], shape)
        ev.equal_terms.append([term, reduce_term(ev, reducer, x, dims, shape)])
    elif term is None and signed and reducer == "add" and (y := negated_signed_sum(ev, x)) is not None:
        term = reduce_term(ev, reducer, x, dims, shape)
        inner = reduction(ev, reducer, y, dims, shape, signed=False)  # (its negation is x again)
        ev.equal_terms.append([term, ev.normal("unary", ("negate",), [inner], shape)])
        ev.negated_sums[term] = inner
    term = term or reduce_term(ev, reducer, x, dims, shape)
    for moved in moved_reductions(ev, reducer, x, dims, shape):
        if moved is not term:
            ev.equal_terms.append([term, moved])
    if (written := over_unit_dims(ev, reducer, x, dims, shape)) is not None and written is not term:
        ev.equal_terms.append([term, written])
    return term


def over_unit_dims(ev: Builder, reducer: str, x: Term, dims: tuple[int, ...], shape: Shape) -> Term | None:
    """The reduction over every dim written, size-1 ones included, which `reduce_term`'s normal form
    drops (they add no element: the same value). A size-1 reduced dim may be a window of a dim the
    reference reduces: a data shard of one row summed to a scalar, psum-ed, is the sum of the
    devices' reductions of adjacent windows of that dim, which merge (rules reductions/merge_*) only
    where each is known as a reduction over it. None when no reduced dim has size 1."""
    if reducer not in COMBINED or x.dtype != shape.dtype or all(x.shape[k] != 1 for k in dims):
        return None
    key = ReduceSpec(len(x.shape), tuple(sorted(dims))).text()
    return ev.factored("reduce", (reducer, key), [x], shape) or ev.mk("reduce", (reducer, key), (x,), shape)


def negated_operand(ev: Builder, x: Term, shape: Shape) -> Term | None:
    """y where x = -y, x summed to `shape`: a sum of negations is the negated sum, Σ -y =
    -Σ y (exact: negation flips the sign bit and rounding is symmetric; modulo 2^bits on integers),
    also where x is a reshape of negations, reshape(-z) = -reshape(z) (a reshape moves elements,
    negation acts on each alone). A loss written `-take_along_axis(logp, t[..., None]).mean()` and
    one written `(-take_along_axis(logp, t[..., None])[..., 0]).mean()` meet there, and a data
    shard's `-pick` kept as [b, s, 1] (the reference's pick is [b, s], reshaped). None for any other x."""
    if x.dtype != shape.dtype:
        return None
    if x.op == "reshape" and x.args[0].op == "unary" and x.args[0].attrs == ("negate",):
        z = x.args[0].args[0]
        return ev.reshape_term(z, Shape(z.dtype, x.shape)) if z.dtype == x.dtype else None
    if x.op == "unary" and x.attrs == ("negate",) and x.args[0].dtype == x.dtype:
        return x.args[0]
    return None


def summed_batches(ev: Builder, x: Term, dims: tuple[int, ...], out: Shape) -> Term | None:
    """A sum over output dims of a dot that are batch dims as the dot contracting those pairs:

        sum_e dot(a, b; batch e)[e, ..] = dot(a, b; contracting e)

    each output element is the sum of the same products (another summation order, which the
    reference's rounding bound covers as any sum's). A vmapped expert's combine summed over the
    local experts then meets the reference's einsum contracting experts and slots together, and a
    psum of the devices' sums its contraction merged over the expert shards. The contraction pairs
    in the order of the lhs's dims (contraction_sorted). None unless x is a dot (a constant factor
    in front) with every summed dim a batch dim, in f32 or f64."""
    factor, base = ev.scale_of(x)
    if base.op != "dot" or x.dtype not in WIDE or out.dtype != x.dtype:
        return None
    spec = DotSpec.parse(base.attrs[0])
    nb = len(spec.lhs_batch)
    if not dims or any(k >= nb for k in dims):
        return None
    kept = [i for i in range(nb) if i not in dims]
    pairs = sorted(
        [*zip(spec.lhs_contract, spec.rhs_contract), *((spec.lhs_batch[i], spec.rhs_batch[i]) for i in dims)]
    )
    contracted = dataclasses.replace(
        spec,
        lhs_batch=tuple(spec.lhs_batch[i] for i in kept),
        rhs_batch=tuple(spec.rhs_batch[i] for i in kept),
        lhs_contract=tuple(p for p, _ in pairs),
        rhs_contract=tuple(q for _, q in pairs),
    )
    term = dot_term(ev, contracted, base.args[0], base.args[1], Shape(base.dtype, out.dims))
    return term if factor == 1 else ev.scaled(term, factor)


def contraction_sorted(spec: DotSpec) -> DotSpec | None:
    """The dot's contraction pairs in the order of the lhs's dims: a sum over pairs of indices
    is the same sum in any order of the pairs (einsum orders them by their letters). None when
    they are in that order."""
    pairs = sorted(zip(spec.lhs_contract, spec.rhs_contract))
    if [p for p, _ in pairs] == list(spec.lhs_contract):
        return None
    return dataclasses.replace(spec, lhs_contract=tuple(p for p, _ in pairs), rhs_contract=tuple(q for _, q in pairs))


def moved_reductions(ev: Builder, reducer: str, x: Term, dims: tuple[int, ...], shape: Shape) -> list[Term]:
    """The reduction of `x` over `dims` with a reshape of x moved out of it, stated beside the
    written one: a reduction of y reshaped only by inserting or dropping size-1 dims is the
    reduction of y over the same dims, reshaped (the size-1 dims add no element). x's quotient form
    (reciprocals.py) is read too: dot_product_attention's scores `c * s` with a unit dim inserted
    in s are the reshape of the reference's `s / q`, and their row max the reshape of its row max."""
    moved = []
    x = ev.quotients.get(x, x)
    if x.op == "reshape" and x.args[0].dtype == x.dtype:
        y = x.args[0]
        wide = [k for k, n in enumerate(x.shape) if n != 1]
        narrow = [k for k, n in enumerate(y.shape) if n != 1]
        if [x.shape[k] for k in wide] == [y.shape[k] for k in narrow]:
            ydims = tuple(narrow[wide.index(k)] for k in dims if k in wide)
            out = Shape(shape.dtype, tuple(n for k, n in enumerate(y.shape) if k not in ydims))
            moved.append(ev.reshape_term(reduce_term(ev, reducer, y, ydims, out), shape))
    return moved


def negated_signed_sum(ev: Builder, x: Term) -> Term | None:
    """-x in one form (signed_sums.one_form) where x is a float sum of terms of both signs (or a
    reshape of one: the negation goes inside it, as in `negated_operand`), so that Σ x is stated as
    -Σ(-x), exact (negation flips the sign bit and rounding is symmetric). A vocabulary-parallel loss summed as
    Σ (log Σ_d s_d + M - target) meets the reference's negated sum of its log-softmax picks,
    -Σ ((pick - m) - log s), term by term. None for any other x."""
    z = x.args[0] if x.op == "reshape" and x.args[0].dtype == x.dtype else x
    if not (z.op == "binary" and z.attrs in (("add",), ("subtract",))) or not signed_sums.mixed_signs(ev, z):
        return None
    form = signed_sums.one_form(ev, ev.mk("unary", ("negate",), [z], Shape(z.dtype, z.shape)))
    if form is None:
        return None
    return form if z is x else ev.reshape_term(form, Shape(x.dtype, x.shape))


def reduced_over(t: Term) -> tuple[str, Term, tuple[int, ...]] | None:
    """(reducer, x, dims) when `t` is x reduced over dims, also in `reduce_term`'s normal form for
    size-1 dims among them: the reduction over the others, reshaped to drop the size-1 dims."""
    if t.op == "reduce":
        return t.attrs[0], t.args[0], ReduceSpec.parse(t.attrs[1]).dims
    if t.op != "reshape" or t.args[0].op != "reduce":
        return None
    reducer, x, dims = t.args[0].attrs[0], t.args[0].args[0], ReduceSpec.parse(t.args[0].attrs[1]).dims
    kept = [k for k in range(len(x.shape)) if k not in dims]
    if tuple(x.shape[k] for k in kept if x.shape[k] != 1) != tuple(s for s in t.shape if s != 1):
        return None
    if any(s == 1 for s in t.shape):  # the result keeps size-1 dims: which ones is not read here
        return None
    return reducer, x, tuple(sorted((*dims, *(k for k in kept if x.shape[k] == 1))))


def reduce_term(ev: Builder, reducer: str, x: Term, dims: tuple[int, ...], shape: Shape) -> Term:
    """The reduction of `x` over `dims` by `reducer` (from its identity), in normal form."""
    if all(x.shape[k] == 1 for k in dims) and x.dtype == shape.dtype:
        # Each output element reduces one element with the identity: a reshape. (The transpose of
        # a broadcast through a unit dim, as in a bias's gradient, sums over it.)
        return ev.reshape_term(x, shape)
    kept = tuple(k for k in dims if x.shape[k] != 1)
    if len(kept) < len(dims) and x.dtype == shape.dtype:
        # The size-1 dims add no element to any output's reduction, so it is the reduction over
        # the others, reshaped: a device's one KV head reduced over the group dim of GQA's repeat
        # (reduced as a unit dim) meets the window of the reference's reduction over all heads.
        # Code that reads a reduction's dims reads this form through `reduced_over`.
        others = Shape(shape.dtype, tuple(s for i, s in enumerate(x.shape) if i not in kept))
        return ev.reshape_term(reduce_term(ev, reducer, x, kept, others), shape)
    key = ReduceSpec(len(x.shape), tuple(sorted(dims))).text()
    return ev.factored("reduce", (reducer, key), [x], shape) or ev.mk("reduce", (reducer, key), (x,), shape)


def over_pieces(ev: Builder, reducer: str, x: Term, dims: tuple[int, ...], shape: Shape) -> Term | None:
    """A reduction over a dim along which `x` is the concatenation of windows of other values (moved
    by slices, reshapes and concatenations: each device's total all-gathered, the earlier ones kept
    by a select against zeros) is the reducer applied to the reductions of the pieces, pieces that
    are the reducer's identity left out: sum(concat(a, b, 0)) = sum(a) + sum(b). A running total
    carried across shards then meets the sums of the reference's adjacent windows, which merge
    (rules reductions/merge_*). None when x is no such concatenation (or one piece)."""
    if reducer not in COMBINED or x.op not in relaid.MOVES or x.dtype != shape.dtype:
        return None
    found = ev.relaid_pieces(x, Shape(x.dtype, x.shape))
    if found is None or found[0] not in dims or len(found[1]) < 2:
        return None
    kept = [p for p in found[1] if not _identity(ev, reducer, p)]
    if not kept:
        return None
    reduced = [reduce_term(ev, reducer, p, dims, shape) for p in kept]
    inner = [r.args[0] for r in reduced if r.op == "reshape"]
    if len(inner) == len(reduced) and len({t.shape for t in inner}) == 1:
        # reshaped alike (totals kept as [b, 1, c]): combined, then reshaped once, as collectives.combine
        reduced = inner
    acc = reduced[0]
    for r in reduced[1:]:
        acc = ev.binary(COMBINED[reducer], acc, r)
    return ev.reshape_term(acc, shape)


def _identity(ev: Builder, reducer: str, piece: Term) -> bool:
    """Whether every element of `piece` is a constant the reducer leaves unchanged."""
    value = ev.folded(piece)
    held = distinct(value) if value is not None and value.size else None
    return held is not None and all_equal(held) and is_identity(reducer, np.asarray(held.flat[0]))


def reduce_pair(ev: Builder, inst: Instruction, args: list) -> Value:
    """A reduce of two operands at once (argmax, argmin): each output element depends only on
    the operands at the same kept index, so it is an aligned map over the kept dims."""
    x, y, *inits = args
    init_values = [v for i in inits if (v := ev.folded(i)) is not None and not v.ndim]
    if len(init_values) != len(inits) or x.shape != y.shape:
        return opaque(ev, inst, args)
    dims = dims_attr(inst.attrs.get("dimensions"))
    aligned = reduce_pair_map(len(x.shape), dims)
    op_key = (
        f"reduce2:{fingerprint(called(ev.module, inst, 'to_apply').name, ev.module)}:"
        f"{[v.item() for v in init_values]}:{len(x.shape)}:{sorted(dims)}"
    )
    out = tuple(
        ev.mk("aligned", (aligned.key(f"{op_key}:{k}"),), (x, y), element)
        for k, element in enumerate(inst.shape.elements)
    )
    for k, term in enumerate(out):
        if picks_operand(ev.module, inst, k):  # an argmax index is one of the operand's (or the init)
            ev.bound(term, (x, y)[k], inits[k])
    reducer = called(ev.module, inst, "to_apply").name
    if not orders.orders_only(ev.module, reducer) or not picks_operand(ev.module, inst, 1):
        return out
    if (base := orders.unmapped(ev, x, dims, init_values[0])) is not None:
        # the index of argmax(softmax(x)) is that of argmax(x) (orders.py); the maximum itself is not
        ev.equal_terms.append([out[1], ev.mk("aligned", out[1].attrs, (base, y), inst.shape.elements[1])])
    if (
        len(dims) == 1
        and init_values[0] == -np.inf
        and _positions(ev, y, dims[0])
        and orders.is_argmax(ev.module, reducer)
    ):
        ev.argmaxes[out[1]] = (x, dims[0])
        if orders.first_on_ties(ev.module, reducer):
            ev.first_argmaxes.add(out[1])
    return out


def _positions(ev: Builder, y: Term, dim: int) -> bool:
    """Whether y[..., i, ...] = i along dim: the index an argmax returns is the position."""
    value = ev.folded(y)
    if value is None:
        return False
    expected = np.arange(y.shape[dim]).reshape([-1 if k == dim else 1 for k in range(len(y.shape))])
    return bool(np.array_equal(value, np.broadcast_to(expected, y.shape)))


def picks_operand(module: Module, inst: Instruction, k: int) -> bool:
    """Whether output `k` of a two-operand reduce is always one of its two inputs: the reducer's
    result k is a select between its parameters k and k + 2."""
    comp = called(module, inst, "to_apply")
    root = comp.root
    by_name = {i.name: i for i in comp.instructions}
    if root.opcode != "tuple" or k >= len(root.operands):
        return False
    chosen = by_name.get(root.operands[k])
    if chosen is None or chosen.opcode != "select":
        return False
    numbers = {
        by_name[o].attrs.get("_number")
        for o in chosen.operands[1:]
        if o in by_name and by_name[o].opcode == "parameter"
    }
    return numbers == {str(k), str(k + 2)}


HANDLERS = {"dot": dot, "reduce": reduce}
