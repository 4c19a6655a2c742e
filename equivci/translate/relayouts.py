"""A dot of a relayout along free dims is the same relayout of the dot.

dot_general computes every output element from one row of each operand along the contracting and
batch dims, so slicing, splitting or merging an operand's other (free) dims only picks and arranges
output elements: dot(x, reshape(W[:, :, s:e, :])) with W's contracting dim kept whole and in a group
of its own is reshape(dot(x, W)[..., s:e, :]) on the output's free dims. A fused QKV weight
reshaped to [d, 3, heads, head_dim], sharded over heads and flattened again on each device is then a
window layout of the reference's projection, and the builder's composed reshapes and windows
(Builder.reshape_term) meet the reference's split of that projection.

A contraction over several dims that are consecutive, in the same order, in both operands is one
contraction over the merged dim of both operands reshaped (row-major, so the pairs of indices
match): einsum("bshd,hdm->bsm", o, wo.reshape(h, d, m)) is a dot with the [b, s, h*d] reshape of o,
as a model that flattens heads before the output projection computes it. Stated where an operand
is such a split, so that the dot meets the flattened form.

The relayout is followed down from the operand through slices and reshapes only while every
contracting and batch dim stays whole: not sliced, and alone in its reshape group with its size."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from fractions import Fraction

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term, inserted_unit_dims
from equivci.terms.spec import DotSpec, parse_transpose, reshape_groups, swapped_dot, transpose_text
from equivci.translate.builder import Builder

_MAX_CHAIN = 8


@dataclasses.dataclass(frozen=True)
class _Side:
    """One operand as a chain of free-dim relayouts of a base: levels[0] is the operand itself,
    levels[-1] the base; kept[i] are the contracting and batch dims at level i (in the spec's order)."""

    levels: tuple[Term, ...]
    kept: tuple[tuple[int, ...], ...]

    @property
    def relaid(self) -> bool:
        return any(t.op == "reshape" for t in self.levels[:-1])


def _down(operand: Term, kept: tuple[int, ...]) -> _Side:
    levels, kepts = [operand], [kept]
    cur = operand
    while cur.op in ("slice", "reshape") and len(levels) <= _MAX_CHAIN:
        inner = cur.args[0]
        if cur.op == "slice":
            if cur.attrs[0] in kept:
                break
            below = kept
        else:
            mapped = _kept_through_reshape(inner.shape, cur.shape, kept)
            if mapped is None:
                break
            below = mapped
        cur, kept = inner, below
        levels.append(cur)
        kepts.append(kept)
    return _Side(tuple(levels), tuple(kepts))


def _kept_through_reshape(in_shape, out_shape, kept: tuple[int, ...]) -> tuple[int, ...] | None:
    """The input dims of a reshape's output dims `kept`, when each is a group of its own (the
    same dim, unsplit and unmerged); None otherwise. Size-1 dims next to a kept dim join its group:
    a contraction merged from a device's one head and head_dim (`merged_contraction`) stays merged,
    as the reference's over all heads is. A reshape that only inserts size-1 dims keeps every input
    dim whole: the inserted ones are free dims of their own (dot_product_attention's [B, T, N, 1, H]
    queries, its unit group dim), so that the dot is the reshape of the dot of the unreshaped operand."""
    inserted = inserted_unit_dims(tuple(in_shape), tuple(out_shape))
    if inserted is not None:
        left = [j for j in range(len(out_shape)) if j not in inserted]
        return None if any(j in inserted for j in kept) else tuple(left.index(j) for j in kept)
    groups = reshape_groups(tuple(in_shape), tuple(out_shape))
    if groups is None:
        return None
    alone = {gj[0]: gi[0] for gi, gj in groups if len(gi) == 1 and len(gj) == 1}
    if all(j in alone and in_shape[alone[j]] == out_shape[j] for j in kept):
        return tuple(alone[j] for j in kept)
    return None


def merged_contraction(ev: Builder, spec: DotSpec, lhs: Term, rhs: Term) -> tuple[DotSpec, Term, Term] | None:
    """The dot with its contracting dims merged into one on each side, when they are several,
    consecutive in the same order on both, and one operand is a reshape that split them from one
    dim; None otherwise."""
    pairs = sorted(zip(spec.lhs_contract, spec.rhs_contract))
    lc, rc = tuple(i for i, _ in pairs), tuple(j for _, j in pairs)
    m = len(lc)
    if m < 2 or lc != tuple(range(lc[0], lc[0] + m)) or rc != tuple(range(rc[0], rc[0] + m)):
        return None

    def split(x: Term, first: int) -> bool:  # x is a reshape that split one dim into these
        merged = x.shape[:first] + (math.prod(x.shape[first : first + m]),) + x.shape[first + m :]
        return x.op == "reshape" and x.args[0].shape == merged

    # Only where an operand split the dim itself: a dispatch mask's (expert, slot) contraction
    # must keep the form the routing lemma reads.
    if not (split(lhs, lc[0]) or split(rhs, rc[0])):
        return None

    def merged(x: Term, first: int) -> Term:
        dims = x.shape[:first] + (math.prod(x.shape[first : first + m]),) + x.shape[first + m :]
        return ev.reshape_term(x, Shape(x.dtype, dims))

    def moved(dims: tuple[int, ...], first: int) -> tuple[int, ...]:
        return tuple(k if k < first else k - (m - 1) for k in dims)

    merged_spec = DotSpec(
        moved(spec.lhs_batch, lc[0]),
        moved(spec.rhs_batch, rc[0]),
        (lc[0],),
        (rc[0],),
        spec.lhs_rank - (m - 1),
        spec.rhs_rank - (m - 1),
        spec.dtypes,
    )
    return merged_spec, merged(lhs, lc[0]), merged(rhs, rc[0])


def _free(shape, kept) -> list[int]:
    return [size for k, size in enumerate(shape) if k not in kept]


def dot_of_relayouts(
    ev: Builder, spec: DotSpec, lhs: Term, rhs: Term, out: Shape, normal: Callable[[DotSpec, Term, Term, Shape], Term]
) -> Term | None:
    """dot(lhs, rhs) as relayouts of the dot of their bases, when an operand is a reshape (under
    slices) of its free dims, or an op known as a squeeze (squeezes.py); None when neither is.
    `normal` builds a dot in normal form: the dot of the bases is stated equal to it, since the
    written dot reoriented only the operands that were no relayouts (a device's queries with a unit
    dim inserted kept as written, its keys reoriented) and the reference's dot reads both in one form."""
    (l_factor, lhs), (r_factor, rhs) = _unsqueezed(ev, lhs), _unsqueezed(ev, rhs)
    left = _down(lhs, spec.lhs_batch + spec.lhs_contract)
    right = _down(rhs, spec.rhs_batch + spec.rhs_contract)
    if not (left.relaid or right.relaid):
        return None
    nb = len(spec.lhs_batch)

    def unpack(side: _Side, level: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        kept = side.kept[level]
        return kept[:nb], kept[nb:]

    (lb, lc), (rb, rc) = unpack(left, -1), unpack(right, -1)
    base_l, base_r = left.levels[-1], right.levels[-1]
    base_spec = DotSpec(lb, rb, lc, rc, len(base_l.shape), len(base_r.shape), spec.dtypes).text()
    batch = [lhs.shape[k] for k in spec.lhs_batch]

    def shape_at(l_level: int, r_level: int) -> tuple[int, ...]:
        return tuple(
            batch
            + _free(left.levels[l_level].shape, left.kept[l_level])
            + _free(right.levels[r_level].shape, right.kept[r_level])
        )

    args = [base_l, base_r]
    shape = Shape(out.dtype, shape_at(-1, -1))
    term = ev.factored("dot", (base_spec,), args, shape) or ev.mk("dot", (base_spec,), args, shape)
    if (base := normal(DotSpec.parse(base_spec), base_l, base_r, shape)) is not term:
        ev.equal_terms.append([term, base])
    r_level = len(right.levels) - 1
    for l_level in range(len(left.levels) - 2, -1, -1):
        term = _apply(ev, term, left.levels[l_level], left.kept[l_level], nb, shape_at(l_level, r_level))
    n_left = len(_free(lhs.shape, left.kept[0]))
    for r_level in range(len(right.levels) - 2, -1, -1):
        term = _apply(ev, term, right.levels[r_level], right.kept[r_level], nb + n_left, shape_at(0, r_level))
    scaled = ev.times(term, l_factor, r_factor)
    return scaled if scaled is not None and scaled.shape == tuple(out.dims) else None


def _unsqueezed(ev: Builder, t: Term) -> tuple[Fraction, Term]:
    """t as a constant factor times an operand to follow: the reshape of the term whose squeeze t
    is (squeezes.py), or t itself. The builder keeps constant factors in front, of a reshape and of
    an unsqueezed op alike (the 0.5 of GELU's `0.5 * x * (1 + tanh(...))`, a fan-in scale): followed
    as written, the relayout would stop at the factor, and a pipeline's microbatch `xs[t]` through
    a GELU MLP would meet the reference's dot over every microbatch only up to the first GELU.
    dot(f * x, y) is f * dot(x, y), as the written dot's factor is pulled out (Builder.factored)."""
    if t in ev.unsqueezed:
        t = ev.reshape_term(ev.unsqueezed[t], Shape(t.dtype, t.shape))
    return ev.scale_of(t)


def _apply(ev: Builder, term: Term, level: Term, kept: tuple[int, ...], offset: int, shape: tuple[int, ...]) -> Term:
    """The dot output's counterpart of the relayout that made `level`: its free dims start at `offset`."""
    if level.op == "slice":
        dim, start, stop = level.attrs
        return ev.slice_term(term, offset + sum(1 for k in range(dim) if k not in kept), start, stop)
    return ev.reshape_term(term, Shape(term.dtype, shape))


def through_transposes(spec: DotSpec, lhs: Term, rhs: Term) -> tuple[DotSpec, Term, Term, tuple[int, ...]] | None:
    """dot(transpose(x, p), y) as transpose(dot(x, y), q): dot_general names each operand dim by
    its role (batch, contracting, free), so a transposed operand only renames its batch and
    contracting dims through p and reorders its free dims in the output, which q (output dim o is
    the new dot's dim q[o]) puts back. None when neither operand is a transpose.

    Written both ways (heads moved in front before the batched dot in one program, the dot
    batching over the unmoved head dim in the other), the two meet on the untransposed form."""
    if lhs.op != "transpose" and rhs.op != "transpose":
        return None
    nb = len(spec.lhs_batch)
    out_perm = list(range(nb))
    sides = []
    for operand, batch, contract in (
        (lhs, spec.lhs_batch, spec.lhs_contract),
        (rhs, spec.rhs_batch, spec.rhs_contract),
    ):
        p = parse_transpose(operand.attrs[0]) if operand.op == "transpose" else tuple(range(len(operand.shape)))
        base = operand.args[0] if operand.op == "transpose" else operand
        free = [p[i] for i in range(len(p)) if i not in batch + contract]
        offset = len(out_perm)
        out_perm += [offset + sorted(free).index(f) for f in free]
        sides.append((base, tuple(p[i] for i in batch), tuple(p[i] for i in contract)))
    (x, lb, lc), (y, rb, rc) = sides
    untransposed = DotSpec(lb, rb, lc, rc, spec.lhs_rank, spec.rhs_rank, spec.dtypes)
    return untransposed, x, y, tuple(out_perm)


def reads(ev: Builder, term: Term) -> int:
    """The reference inputs `term` reads, as a bit set (bit k: input k). A device reads windows of
    the same inputs as the reference, so the set names an operand alike in both programs."""
    memo = ev.reads
    stack = [term]
    while stack:
        t = stack[-1]
        if t in memo:
            stack.pop()
            continue
        pending = [a for a in t.args if a not in memo]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        bits = 1 << t.attrs[0] if t.op == "param" else 0
        for a in t.args:
            bits |= memo[a]
        memo[t] = bits
    return memo[term]


def canonical_dot(ev: Builder, dot: Term) -> tuple[DotSpec, Term, Term, tuple[int, ...]] | None:
    """dot(a, b) as transpose(dot(a', b'; spec), composed) in one form whichever way it was written:
    the operand that reads the higher-numbered reference inputs first (dot(a, b) is transpose(dot(b,
    a)) with the free dims swapped: swapped_dot), then the batch pairs in the order of the lhs's
    dims (each batch pair's output dim moves with it). Output dim o of `dot` is the canonical dot's
    dim composed[o]. None when `dot` is in that form already."""
    spec = DotSpec.parse(dot.attrs[0])
    a, b = dot.args
    identity = tuple(range(len(dot.shape)))
    composed = identity
    swapped = reads(ev, b) > reads(ev, a)
    if swapped:
        spec, composed = swapped_dot(spec, identity)
        a, b = b, a
    order = sorted(range(len(spec.lhs_batch)), key=spec.lhs_batch.__getitem__)
    moved = {old: new for new, old in enumerate(order)}  # batch output dim old -> new
    composed = tuple(moved.get(k, k) for k in composed)
    if composed == identity and not swapped:  # (swapped in place: an operand without free dims)
        return None
    spec = dataclasses.replace(
        spec, lhs_batch=tuple(spec.lhs_batch[k] for k in order), rhs_batch=tuple(spec.rhs_batch[k] for k in order)
    )
    return spec, a, b, composed


def reoriented(ev: Builder, operand: Term) -> Term | None:
    """A dot's operand that is (windows of) another dot, as the transpose of (the same windows of)
    that dot in its canonical form (canonical_dot), which the dot reading it absorbs
    (through_transposes). Whichever order two programs wrote the inner dot in
    (`einsum("dhk,bsd->hkbs", w, x)` in one, `x @ w.reshape(d, -1)` in the other), the outer one
    then reads the same dot. None when the operand is no such dot or is in that form already (the
    dot's own term keeps its written form: other ops read its layout; so does a transpose of it,
    which a device's unit head dim may turn into a plain reshape in one form only)."""
    windows = []
    base = operand
    while base.op == "slice":
        windows.append(base.attrs)
        base = base.args[0]
    if base.op == "reshape":
        # heads split off a projection (q = (x @ w)[..., :d].reshape(b, s, h, hd), and a KV group
        # taken of it): the reshape of the reoriented dot, where it moves out of the transpose
        # (Builder.transposed_reshape), and its windows, which keep the transpose outside. Only a
        # split of a dim into several heads: a device's one head (a unit dim inserted, or merged
        # with head_dim) is a run of the other form where the reference's several heads are none
        # (its KV heads repeated), and the two would part.
        groups = reshape_groups(base.args[0].shape, base.shape, singletons=True) or []
        if any(len(gi) > 1 for gi, _ in groups) or not any(sum(base.shape[j] > 1 for j in gj) > 1 for _, gj in groups):
            return None
        inner = reoriented(ev, base.args[0])
        if inner is None:
            return None
        moved = ev.reshape_term(inner, Shape(base.dtype, base.shape))
        for dim, start, stop in reversed(windows):  # innermost first
            moved = ev.slice_term(moved, dim, start, stop)
        return moved if moved.op == "transpose" else None
    canonical = canonical_dot(ev, base) if base.op == "dot" else None
    if canonical is None:
        return None
    spec, a, b, composed = canonical
    shape = [0] * len(base.shape)
    for o, size in enumerate(base.shape):
        shape[composed[o]] = size
    out = Shape(base.dtype, tuple(shape))
    inner = ev.factored("dot", (spec.text(),), [a, b], out) or ev.mk("dot", (spec.text(),), [a, b], out)
    for dim, start, stop in reversed(windows):  # innermost first
        inner = ev.slice_term(inner, composed[dim], start, stop)
    attrs = (transpose_text(composed),)
    return ev.mk("transpose", attrs, [inner], Shape(operand.dtype, operand.shape))


def split_contraction(
    ev: Builder, spec: DotSpec, lhs: Term, rhs: Term, one_sided: bool = False
) -> tuple[DotSpec, Term, Term] | None:
    """The dot over the dims that both operands' reshapes merged into a contracting dim, when they
    merged dims of the same sizes (row-major: index i of the merged dim is the same tuple of split
    indices on both sides, so the sum over i is the sum over the tuples): `o.reshape(b, s, h*d) @
    w.reshape(h*d, m)` is einsum("bshd,hdm->bsm", o, w), and a transpose below a reshape is then
    absorbed into the dot (through_transposes). `one_sided`: also where only one operand merged
    the dims (heads and head_dim, or a device's one head and head_dim) and the other's contracting
    dim is split alike by a reshape made here, the same identity: `o.reshape(b, s, h*d) @ w` is
    einsum("bshd,hdm->bsm", o, w.reshape(h, d, m)), whatever made w. None when no contraction is
    such a merge (with `one_sided`, when none is a merge on one side only). A patchified image
    `img.reshape(..).transpose(..).reshape(b, n, c*p*p) @ w` is so the dot over (c, p, p) of the
    image's patches with w.reshape(c, p, p, d), as a patch convolution computes it."""

    def merged_from(x: Term, dim: int) -> tuple[int, ...] | None:  # the sizes reshaped into `dim`
        if x.op != "reshape":
            return None
        groups = reshape_groups(x.args[0].shape, x.shape, singletons=True) or []
        return next((tuple(x.args[0].shape[i] for i in gi) for gi, gj in groups if gj == [dim] and len(gi) > 1), None)

    split = {}  # contracting pair -> the sizes both sides merged
    one_sided_pairs = 0
    for i, j in zip(spec.lhs_contract, spec.rhs_contract):
        sizes, other = merged_from(lhs, i), merged_from(rhs, j)
        if sizes is not None and sizes == other:
            split[(i, j)] = sizes
        elif one_sided and (sizes is None or other is None) and (merged := sizes or other) is not None:
            split[(i, j)] = merged
            one_sided_pairs += 1
    if not split or (one_sided and not one_sided_pairs):
        return None

    def entries(rank: int, side: int) -> list[tuple[int, int]]:  # (old dim, part) per new dim
        parts = {pair[side]: len(sizes) for pair, sizes in split.items()}
        return [(d, m) for d in range(rank) for m in range(parts.get(d, 1))]

    left, right = entries(len(lhs.shape), 0), entries(len(rhs.shape), 1)
    lc, rc = [], []
    for i, j in zip(spec.lhs_contract, spec.rhs_contract):
        for m in range(len(split.get((i, j), (0,)))):
            lc.append(left.index((i, m)))
            rc.append(right.index((j, m)))

    def unmerged(x: Term, dims: list[tuple[int, int]], side: int) -> Term:
        by_dim = {pair[side]: sizes for pair, sizes in split.items()}
        shape = tuple(by_dim[d][m] if d in by_dim else x.shape[d] for d, m in dims)
        return ev.reshape_term(x, Shape(x.dtype, shape))

    new_spec = DotSpec(
        tuple(left.index((d, 0)) for d in spec.lhs_batch),
        tuple(right.index((d, 0)) for d in spec.rhs_batch),
        tuple(lc),
        tuple(rc),
        len(left),
        len(right),
        spec.dtypes,
    )
    return new_spec, unmerged(lhs, left, 0), unmerged(rhs, right, 1)
