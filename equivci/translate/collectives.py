"""Handlers of the collectives, over every device's operand at once: all-reduce is a sum in group
order, all-gather a concatenation, reduce-scatter a window of the sum, all-to-all concatenated
windows (the tuple form: each member's k-th operand to member k), collective-permute the source
device's value (zeros where none is sent).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np

from equivci.hlo.collectives import UnsupportedGroups, parse_groups, parse_pairs
from equivci.hlo.ir import WIDER, Instruction, Shape
from equivci.terms import semantics
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import parse_transpose
from equivci.translate import argmax_pieces, masks, pieces
from equivci.translate.attributes import dims_attr, reducer_of
from equivci.translate.builder import Builder, Unsupported
from equivci.translate.linear_sums import linear_sums

# float dtype -> the float dtypes that round to it

OPCODES = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"}


@dataclasses.dataclass
class Collectives:
    # collective-permute name -> the source/target pairs to use instead (localization's what-ifs)
    pairs_override: dict[str, list[tuple[int, int]]] = dataclasses.field(default_factory=dict)


def evaluate(ev: Builder, state: Collectives, inst: Instruction, ops: list[list]) -> list:
    try:
        groups = parse_groups(inst.attrs.get("replica_groups"), ev.n)
    except UnsupportedGroups as exc:
        raise Unsupported(f"replica groups {exc} of {inst.opcode} {inst.name}") from exc
    if inst.opcode == "collective-permute":
        pairs = state.pairs_override.get(inst.name) or parse_pairs(inst.attrs.get("source_target_pairs", ""))
        source = {t: s for s, t in pairs}
        out = []
        for d in range(ev.n):
            if d in source:
                out.append(ops[0][source[d]])
            else:
                out.append(
                    ev.const(np.zeros(inst.shape.dims, NP_DTYPES.get(inst.shape.dtype, np.float32)), inst.shape.dtype)
                )
        return out
    group_of = {d: g for g in groups for d in g}
    tuple_valued = isinstance(ops[0][0], tuple) or len(ops) > 1
    n_vals = len(ops) if len(ops) > 1 else (len(ops[0][0]) if isinstance(ops[0][0], tuple) else 1)

    def operand(k: int, d: int) -> Term:
        if len(ops) > 1:
            return ops[k][d]
        v = ops[0][d]
        return v[k] if isinstance(v, tuple) else v

    shapes = inst.shape.elements if inst.shape.is_tuple else (inst.shape,)
    if inst.opcode == "all-to-all" and "dimensions" not in inst.attrs:
        # The tuple form: operand k of each member goes to member k, which has them as its outputs
        # in group order (one operand per member).
        if n_vals != len(group_of[0]) or any(len(g) != n_vals for g in groups):
            raise Unsupported(f"tuple all-to-all {inst.name} with {n_vals} operands over groups of {len(groups[0])}")
        return [tuple(operand(group_of[d].index(d), g) for g in group_of[d]) for d in range(ev.n)]
    out = []
    for d in range(ev.n):
        group = group_of[d]
        pos = group.index(d)
        results = []
        for k in range(n_vals):
            members = [operand(k, g) for g in group]
            results.append(collective_value(ev, inst, members, pos, shapes[k] if k < len(shapes) else shapes[0]))
        out.append(tuple(results) if tuple_valued and n_vals > 1 else results[0])
    return out


def combine(ev: Builder, reducer: str, members: list[Term]) -> Term:
    """The elementwise reduction of the members, in group order."""
    if reducer == "add" and 0 < len(nonzero := [m for m in members if ev.uniform(m) != 0]) < len(members):
        members = nonzero  # devices that hold zeros add nothing (a pipeline's idle stages)
    inner = [m.args[0] for m in members if m.op == "reshape"]
    if len(inner) == len(members) > 1 and len({t.shape for t in inner}) == 1:
        # Reshaped alike (keepdims after a local reduction): reduce, then reshape once, so that
        # the reshape meets the reference's and a reshape of it composes away.
        lifted = ev.reshape_term(combine(ev, reducer, inner), Shape(members[0].dtype, members[0].shape))
        if ev.folded(lifted) is None:
            # The members' own reduction stays stated beside it (the rules lift a reduction of
            # reshapes, never push one in): where a member's reshape is a form it is known in
            # (a device's one-head attention context merged back to [b, s, hd], dotted with its
            # rows of the output projection: a piece of the reference's contraction), the pieces
            # meet only as written.
            ev.equal_terms.append([lifted, _written_combination(ev, reducer, members)])
        return lifted
    if len(members) > 1 and all(m.op == "transpose" and m.attrs == members[0].attrs for m in members):
        # Transposed alike (each device's partial attention context laid out [b, q, h, d] before its
        # psum): reduce, then transpose once, exact (the reducer runs element by element, in the
        # same order, wherever the elements sit), so that the partial dots under the transpose merge.
        inner = [m.args[0] for m in members]
        return ev.transpose_term(combine(ev, reducer, inner), parse_transpose(members[0].attrs[0]))
    if reducer == "add" and (negated := _negated_shares(ev, members, {})) is not None:
        return negated
    tiled = masks.tiled_lookup(ev, members) if reducer == "add" else masks.tiled_reduce(ev, reducer, members)
    if tiled is not None:
        return tiled
    if (joined := _pieces_combined(ev, reducer, members)) is not None:
        return joined
    acc = members[0]
    for m in members[1:]:
        acc = ev.fold_or(
            "binary",
            (reducer,),
            [acc, m],
            Shape(acc.dtype, acc.shape),
            lambda a, b: semantics.apply(semantics.BINARY, reducer, a, b),
        )
    if reducer == "add":
        ev.collective_sums.add(acc)
        _record_device_sum(ev, acc, members)
    if (regrouped := _sums_summed(ev, reducer, members)) is not None:
        factor, summed = regrouped
        scale, base = ev.scale_of(acc)
        if scale == factor:  # stated of the sums themselves: scaled alike, their multiples meet too
            ev.equal_terms.append([base, summed])
            ev.regrouped_sums[base] = summed
    if reducer == "add":
        for mapped in linear_sums(ev, members, lambda inner: combine(ev, reducer, inner)):
            ev.equal_terms.append([acc, mapped])
    if reducer == "add" and (negated := _negated_shares(ev, members, ev.negated_sums)) is not None:
        ev.equal_terms.append([acc, negated])
    if reducer == "add" and (rounded := _rounded_sum(ev, members)) is not None:
        ev.equal_terms.append([acc, rounded])
        ev.rounded_sums[acc] = rounded
    if reducer == "minimum" and (first := argmax_pieces.owner_min(ev, members)) is not None:
        ev.equal_terms.append([acc, first])  # the smallest offset argmax of the pieces holding the max
    return acc


def _written_combination(ev: Builder, reducer: str, members: list[Term]) -> Term:
    """The reduction of the members in group order, as written: no fact read, nothing folded."""
    acc = members[0]
    for m in members[1:]:
        acc = ev.mk("binary", (reducer,), [acc, m], Shape(acc.dtype, acc.shape))
    return acc


def _negated_shares(ev: Builder, members: list[Term], negations: dict[Term, Term]) -> Term | None:
    """Each device's negated share (a loss -mean(...) of its rows, then pmean-ed; a mean of each
    row's negated pick, with its 1/n in front): the negated sum, sum_d (-x_d) = -(sum_d x_d), exact
    in floats too (rounding to nearest is symmetric), under the factor the shares share, in front
    as the builder keeps every sum of terms scaled alike (f * a + f * b = f * (a + b)), so that the
    shares' partial reductions merge as the reference's one. A share is a negation, or a term that
    `negations` holds the negation of (x_d = -y_d: a sum of a signed sum, reductions.reduction).
    None unless every member is such a share, under one factor."""
    scaled = [ev.scale_of(m) for m in members]
    factors = {f for f, _ in scaled}
    inner = [b.args[0] if b.op == "unary" and b.attrs == ("negate",) else negations.get(b) for _, b in scaled]
    if len(members) < 2 or len(factors) != 1 or any(y is None for y in inner):
        return None
    total = combine(ev, "add", [y for y in inner if y is not None])
    return ev.scaled(ev.normal("unary", ("negate",), [total], Shape(total.dtype, total.shape)), factors.pop())


def regrouped_by_device(ev: Builder, term: Term, a: Term, b: Term) -> None:
    """`term` = a + b, where a and b are sums over devices (or the same window of them, scaled alike):
    stated equal to the sum over devices of each device's a_d + b_d, sum_d a_d + sum_d b_d =
    sum_d (a_d + b_d) (finite sums commute), in that window. A microbatch loop accumulates
    gradients each reduce-scattered already (FSDP: the all-gather's transpose inside the
    differentiated loss): summed by device, each device's microbatches are adjacent rows of the
    batch, and the partial contractions merge into the reference's. Recorded for `term` too, so
    that the next microbatch's sum pairs with it."""
    (factor, base_a), (fb, base_b) = ev.scale_of(a), ev.scale_of(b)
    found_a, found_b = _device_sum(ev, base_a), _device_sum(ev, base_b)
    if factor != fb or found_a is None or found_b is None or base_a is base_b:
        return
    (terms_a, window), (terms_b, window_b) = found_a, found_b
    if window != window_b or len(terms_a) != len(terms_b) or terms_a[0].shape != terms_b[0].shape:
        return
    shape = Shape(a.dtype, terms_a[0].shape)
    members = tuple(ev.normal("binary", ("add",), [x, y], shape) for x, y in zip(terms_a, terms_b))
    total = members[0]
    for m in members[1:]:
        total = ev.normal("binary", ("add",), [total, m], shape)
    stated = ev.scaled(ev.slice_term(total, *window) if window else total, factor)
    if stated is None or stated is term or ev.folded(total) is not None:
        return
    ev.equal_terms.append([term, stated])
    _record_device_sum(ev, total, members)
    if ev.scale_of(term)[0] == factor:
        ev.device_sums.setdefault(ev.scale_of(term)[1], (members, window))


def _record_device_sum(ev: Builder, total: Term, members) -> None:
    """`total` = the sum of `members`, one per device; when they share total's constant factor
    (the builder keeps it in front of the sum), its base is the sum of theirs too."""
    ev.device_sums.setdefault(total, (tuple(members), None))
    factor, base = ev.scale_of(total)
    scales = [ev.scale_of(m) for m in members]
    if factor != 1 and all(f == factor for f, _ in scales):
        ev.device_sums.setdefault(base, (tuple(b for _, b in scales), None))


def _device_sum(ev: Builder, t: Term) -> tuple[tuple[Term, ...], tuple[int, int, int] | None] | None:
    """(each device's term, the window) where `t` is that window (None: all) of their sum."""
    if t in ev.device_sums:
        return ev.device_sums[t]
    if t.op == "slice" and (whole := ev.device_sums.get(t.args[0])) is not None and whole[1] is None:
        return whole[0], t.attrs
    return None


def _rounded_sum(ev: Builder, members: list[Term]) -> Term | None:
    """A sum over devices of values each rounded to a narrower float (bf16 partial sums psummed in
    bf16) as the sum of the unrounded values rounded once: over the reals a rounding is the value
    itself, so only where the roundings happen moves, as when the sum is re-associated across
    shards; the result keeps its narrow dtype (the rounding is still there, once). The same for
    values rounded to a narrower float and back (each device's bf16 gradient of an f32 master
    weight, averaged in f32): the sum of the round trips is the round trip of the sum. None unless
    every member is one such rounding from one wider float dtype."""
    trips = {_round_trip(m) for m in members}
    if len(trips) != 1 or (trip := trips.pop()) is None:
        return None
    narrow, wide = trip
    total = combine(ev, "add", [m.args[0].args[0] if narrow != m.dtype else m.args[0] for m in members])
    rounded = ev.normal("unary", ("convert",), [total], Shape(narrow, members[0].shape))
    return (
        rounded
        if narrow == members[0].dtype
        else ev.normal("unary", ("convert",), [rounded], Shape(wide, rounded.shape))
    )


def _round_trip(t: Term) -> tuple[str, str] | None:
    """(narrow, wide) where t is a rounding of a `wide` float to the narrower `narrow`, or such a
    rounding converted back to `wide`."""
    if not (t.op == "unary" and t.attrs == ("convert",)):
        return None
    inner = t.args[0]
    if t.dtype in WIDER and inner.dtype in WIDER[t.dtype]:
        return t.dtype, inner.dtype
    if inner.op == "unary" and inner.attrs == ("convert",) and inner.dtype in WIDER:
        wide = inner.args[0].dtype
        return (inner.dtype, wide) if wide == t.dtype and wide in WIDER[inner.dtype] else None
    return None


def _sums_summed(ev: Builder, reducer: str, members: list[Term]) -> tuple[Fraction, Term] | None:
    """A sum over devices of sums each device made of its own terms (its microbatches, accumulated)
    as the sum, term by term, of their sums over devices: finite sums commute,
    sum_d f * (x_d1 + ... + x_dM) = f * (sum_d x_d1 + ... + sum_d x_dM), and a device's sum of
    values concatenated alike (its microbatches' losses, stacked) is a reduce of its pieces,
    sum_d f * reduce(concat(a_d, b_d)) = f * reduce(concat(sum_d a_d, sum_d b_d)). Returns (f, the
    regrouped sum), stated beside the sum in group order, which keeps the windows a sum over
    shards merges."""
    scales = [ev.scale_of(m) for m in members]
    sums = [base for _, base in scales]
    if reducer != "add" or len({f for f, _ in scales}) != 1:
        return None
    first = sums[0]
    if first.op == "reduce" and first.attrs[:1] == ("add",) and all(t.attrs == first.attrs for t in sums):
        bases = [t.args[0] for t in sums]
        if pieces.split_alike(ev, bases) is None:
            return None
        whole = combine(ev, reducer, bases)
        return scales[0][0], ev.normal("reduce", first.attrs, [whole], Shape(first.dtype, first.shape))
    terms = [_summands(t) for t in sums]
    if len(terms[0]) < 2 or any(len(t) != len(terms[0]) for t in terms):
        return None
    columns = [combine(ev, reducer, list(column)) for column in zip(*terms)]
    acc = columns[0]
    for column in columns[1:]:
        acc = ev.normal("binary", ("add",), [acc, column], Shape(acc.dtype, acc.shape))
    return scales[0][0], acc


def _summands(t: Term) -> list[Term]:
    """The terms of a tree of adds, in order."""
    if t.op == "binary" and t.attrs == ("add",):
        return _summands(t.args[0]) + _summands(t.args[1])
    return [t]


def _pieces_combined(ev: Builder, reducer: str, members: list[Term]) -> Term | None:
    """The reduction of members concatenated alike as the concatenation of the reduced pieces
    (equivci.translate.pieces); a factor they share stays in front of a sum."""
    scales = [ev.scale_of(m) for m in members]
    factors = {f for f, _ in scales}
    if len(factors) != 1 or (factor := factors.pop()) != 1 and reducer != "add":
        return None
    split = pieces.split_alike(ev, [base for _, base in scales])
    if split is None:
        return _padded_pieces(ev, members) if reducer == "add" else None
    dim, columns = split
    return ev.scaled(ev.concat([combine(ev, reducer, column) for column in columns], dim), factor)


def _padded_pieces(ev: Builder, members: list[Term]) -> Term | None:
    """A sum of members that hold non-zero pieces at places no other member does, zeros elsewhere
    (each device's total put in its own slot, then psummed) as the concatenation of those pieces
    (pieces.padded_sum, member by member)."""
    acc: Term | None = members[0]
    for m in members[1:]:
        acc = pieces.padded_sum(ev, acc, m) if acc is not None else None
    return acc


def collective_value(ev: Builder, inst: Instruction, members: list[Term], pos: int, shape: Shape) -> Term:
    op = inst.opcode
    if op in ("all-reduce", "reduce-scatter"):
        reducer = reducer_of(ev.module, inst)
        if reducer is None:
            raise Unsupported(f"the reduction of {op} {inst.name} is not a single add/max/min/multiply")
        acc = combine(ev, reducer, members)
        if op == "all-reduce":
            return acc
        dim = dims_attr(inst.attrs.get("dimensions"))[0]
        size = shape.dims[dim]
        return ev.slice_term(acc, dim, pos * size, (pos + 1) * size)
    if op == "all-gather":
        dim = dims_attr(inst.attrs.get("dimensions"))[0]
        return ev.concat(members, dim)
    if op == "all-to-all":
        dims = dims_attr(inst.attrs.get("dimensions"))
        if len(dims) != 1:
            raise Unsupported(f"all-to-all {inst.name} along dims {dims}")
        dim = dims[0]
        chunk = members[0].shape[dim] // len(members)
        moved = ev.concat([ev.slice_term(m, dim, pos * chunk, (pos + 1) * chunk) for m in members], dim)
        # the slots each group's device sends to this device's experts, when every group's slots
        # are a piece of the value the reference computes for all groups: one window of that value
        return ev.one_window(moved) or moved
    raise Unsupported(op)
