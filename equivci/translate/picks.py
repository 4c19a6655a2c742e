"""A gather of one element per lane is the lane's sum against a one-hot.

    take_along_axis(x, col[..., None], axis=v)[..., 0] = sum_v x * (col[..., None] == iota(V))

holds for indices known to lie in [0, V): the one-hot picks exactly one element of each lane, the
one the gather reads (outside [0, V) a gather clamps and a one-hot is all zeros, so the bounds are
the guard). A cross-entropy picks the target logit either way (integer labels or one-hot labels),
and a vocabulary sharded by the SPMD partitioner is the sum form cut along V: each device sums its
columns against its rows of the one-hot (an iota offset by the partition's start), and the
all-reduce of those partial sums is the whole sum. Stating the gather equal to the sum relates
both; the one-hot is built as `jax.nn.one_hot` writes it (compare of broadcasts, converted,
multiplied), the form the translated programs have.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term, bcast_form, gather_map
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import AlignedMap, BcastSpec, DotSpec, GatherDims, ReduceSpec, bcast_spec, compare_text
from equivci.translate import literals, masks, one_hot_columns, one_hots, orders, sorts
from equivci.translate.builder import Builder


def one_hot_sum(
    ev: Builder, x: Term, idx: Term, dims: GatherDims, out: Shape, one_hot_first: bool = False
) -> Term | None:
    """The gather `x[lanes, idx]` as the sum over the indexed dim of x times idx's one-hot (of the
    one-hot times x if `one_hot_first`: a product of floats is commutative, and a program writes
    either order), when it picks single elements along one operand dim, every other operand dim is a
    batching dim in the index's order, and the index's bounds lie in that dim; None otherwise."""
    v = lane_dim(x, idx, dims, out)
    if v is None:
        return None
    others = [k for k in range(len(x.shape)) if k != v]
    lanes = [j for j in range(len(idx.shape)) if j != dims.vector_dim]
    held = idx
    while ev.bounds_of(held) is None and held.op == "reshape":  # a reshape keeps the elements
        held = held.args[0]
    found = ev.bounds_of(held)
    if found is None or found[0] < 0 or found[1] >= x.shape[v]:
        return None
    column = idx if len(lanes) == len(idx.shape) else ev.reshape_term(idx, Shape(idx.dtype, out.dims))
    spread = ev.mk("bcast", (bcast_spec(len(others), x.shape, tuple(others)),), [column], Shape(idx.dtype, x.shape))
    iota = ev.const(np.arange(x.shape[v], dtype=NP_DTYPES[idx.dtype]), idx.dtype)
    across = ev.mk("bcast", (bcast_spec(1, x.shape, (v,)),), [iota], Shape(idx.dtype, x.shape))
    equal = ev.mk("binary", (compare_text("EQ", idx.dtype),), [spread, across], Shape("pred", x.shape))
    one_hot = ev.normal("unary", ("convert",), [equal], Shape(x.dtype, x.shape))
    product = ev.binary("multiply", one_hot, x) if one_hot_first else ev.binary("multiply", x, one_hot)
    return ev.normal("reduce", ("add", ReduceSpec(len(x.shape), (v,)).text()), [product], out)


def row_one_hot_dot(ev: Builder, x: Term, idx: Term, dims: GatherDims, out: Shape) -> Term | None:
    """The rows `x[ids]` of a table x[V, D] as `one_hot(ids, V) @ x`, when the index's bounds lie in
    [0, V): each one-hot row has its one 1 at the row the gather reads (an embedding looked up by a
    one-hot product, `jax.nn.one_hot(ids, V) @ table`; on a vocabulary shard the product of its
    columns of the one-hot, `one_hot(ids - lo, n)`, with its rows of the table, summed over the
    shards). None for any other gather."""
    if len(x.shape) != 2 or x.dtype == "pred" or dims.operand_batch or dims.start_map != (0,) or dims.collapsed != (0,):
        return None
    if dims.vector_dim < len(idx.shape):
        if idx.shape[dims.vector_dim] != 1:
            return None
        lanes = tuple(n for j, n in enumerate(idx.shape) if j != dims.vector_dim)
        idx = ev.reshape_term(idx, Shape(idx.dtype, lanes))
    rank, (rows, width) = len(idx.shape), x.shape
    if dims.slice_sizes != (1, width) or dims.offset != (rank,) or out.dims != (*idx.shape, width):
        return None
    found = ev.bounds_of(idx)
    if found is None or found[0] < 0 or found[1] >= rows:
        return None
    hot = (*idx.shape, rows)
    spread = ev.mk("bcast", (bcast_spec(rank, hot, tuple(range(rank))),), [idx], Shape(idx.dtype, hot))
    iota = ev.const(np.arange(rows, dtype=NP_DTYPES[idx.dtype]), idx.dtype)
    across = ev.mk("bcast", (bcast_spec(1, hot, (rank,)),), [iota], Shape(idx.dtype, hot))
    equal = ev.mk("binary", (compare_text("EQ", idx.dtype),), [spread, across], Shape("pred", hot))
    one_hot = ev.normal("unary", ("convert",), [equal], Shape(x.dtype, hot))
    spec = DotSpec((), (), (rank,), (0,), rank + 1, 2, (x.dtype, x.dtype))
    return ev.normal("dot", (spec.text(),), [one_hot, x], out)


def lane_dim(x: Term, idx: Term, dims: GatherDims, out: Shape) -> int | None:
    """The dim v when the gather picks x[lanes, idx[lanes]] (single elements along v, every other
    operand dim a batching dim in the index's order); None otherwise."""
    if len(dims.start_map) != 1 or x.dtype != out.dtype or x.dtype == "pred":
        return None
    (v,) = dims.start_map
    others = [k for k in range(len(x.shape)) if k != v]
    lanes = [j for j in range(len(idx.shape)) if j != dims.vector_dim]
    if (
        dims.collapsed != (v,)
        or sorted(dims.operand_batch) != others
        or [dims.indices_batch[dims.operand_batch.index(k)] for k in others] != lanes
        or tuple(idx.shape[j] for j in lanes) != out.dims
        or tuple(x.shape[k] for k in others) != out.dims
    ):
        return None
    return v


def max_pick(ev: Builder, x: Term, idx: Term, dims: GatherDims, out: Shape) -> Term | None:
    """x[lanes, argmax(z)[lanes]] as max(x) along the lane, where x is z or a strictly increasing
    map of z along it (orders.py): the argmax's position holds the lane's largest value (a router's
    gate `take_along_axis(probs, argmax(logits))` is `max(probs)`); None otherwise."""
    v = lane_dim(x, idx, dims, out)
    while idx.op == "reshape":  # a reshape keeps the elements
        idx = idx.args[0]
    if v is None or idx not in ev.argmaxes or idx.shape != out.dims:
        return None
    z, dim = ev.argmaxes[idx]
    if dim != v or z.shape != x.shape or all(t is not z for t in orders.increasing_chain(ev, x, (v,))):
        return None
    return ev.normal("reduce", ("maximum", ReduceSpec(len(x.shape), (v,)).text()), [x], out)


def sorted_pick(ev: Builder, x: Term, idx: Term, dims: GatherDims, out: Shape) -> Term | None:
    """x picked along a lane at a window of the positions a stable sort of keys k puts in order,
    `take_along_axis(x, argsort(k)[..., a:b])`, as that window of x carried through the same sort:

        x[perm(k)] = sort(k, x)[1],    and for x = k the sorted keys sort(k, positions)[0]

    (a sort moves each lane of its other operand as it moves the keys). A top-k's values picked
    by `argsort(-p)[..., :k]` are then `top_k(p)`'s (sorts.py). None for any other gather."""
    if dims.vector_dim == len(idx.shape) - 1 and idx.shape[-1] == 1:  # one-coordinate index vectors
        idx = ev.reshape_term(idx, Shape(idx.dtype, idx.shape[:-1]))
        dims = dataclasses.replace(dims, vector_dim=len(idx.shape))
    v = along_lane(x, idx, dims, out)
    perm, window = idx, None
    if perm.op == "slice" and perm.attrs[0] == v:
        perm, window = perm.args[0], perm.attrs[1:]
    if v is None or perm.op != "aligned" or perm.args[0].shape != x.shape:
        return None
    kind, order, dim, output = (AlignedMap.op_key(perm.attrs[0]).split(":") + ["", "", "", ""])[:4]
    keys, held = perm.args
    if (kind, dim, output) != ("sort", str(v), "1") or order not in ("LT", "GT"):
        return None
    if not literals.holds_positions(ev, held, v):
        return None
    payload, sorted_output = (held, 0) if x is keys else (x, 1)
    dtypes = [keys.dtype, payload.dtype]
    # Within the first k of a merge of per-piece top-k candidates, the sort of the pieces (sorts.merged_top).
    merged = (
        None if window is None else sorts.merged_top(ev, keys, None if x is keys else x, v, order, dtypes, window[1])
    )
    carried = (merged or sorts.sorted_lanes(ev, keys, payload, v, order, dtypes))[sorted_output]
    return carried if window is None else ev.slice_term(carried, v, *window)


def along_lane(x: Term, idx: Term, dims: GatherDims, out: Shape) -> int | None:
    """The dim v when the gather reads out[..., j, ...] = x[..., idx[..., j, ...], ...] along v
    (`take_along_axis`: every other dim a batching dim at the same place in x, idx and the
    output); None otherwise."""
    if len(dims.start_map) != 1 or x.dtype != out.dtype or len(idx.shape) != len(x.shape):
        return None
    (v,) = dims.start_map
    others = tuple(k for k in range(len(x.shape)) if k != v)
    if (
        dims.collapsed != (v,)
        or dims.offset
        or dims.vector_dim != len(idx.shape)
        or dims.operand_batch != others
        or dims.indices_batch != others
        or out.dims != idx.shape
        or any(x.shape[k] != idx.shape[k] for k in others)
    ):
        return None
    return v


def one_hot_facts(ev: Builder, term: Term, x: Term, idx: Term, dims: GatherDims, out: Shape) -> list[list[Term]]:
    """[gather, its one-hot sum] for the gather `term` of x at idx, and for each gather at idx that
    `term` holds when it is f(gather(a, idx), m) (gathers.py: log-softmax's x - max - lse taken at
    the labels is x at the labels less max and lse, and a vocabulary-parallel device sums its
    logits, not its log-probabilities, against its columns of the one-hot)."""
    facts = []
    if sums := _both_orders(ev, x, idx, dims, out):
        facts.append([term, *sums])
    stack = list(term.args) if term.op == "binary" else []
    while stack:
        inner = stack.pop()
        if inner.op == "binary":
            stack.extend(inner.args)
        elif (
            inner.op == "aligned" and inner.args[1] is idx and inner.attrs == _gather_key(inner.args[0], idx, dims, out)
        ):
            if sums := _both_orders(ev, inner.args[0], idx, dims, Shape(inner.dtype, out.dims)):
                facts.append([inner, *sums])
    return facts


def _both_orders(ev: Builder, x: Term, idx: Term, dims: GatherDims, out: Shape) -> list[Term]:
    """The one-hot sums of the gather of x at idx, x first and the one-hot first; [] when none."""
    sums = [one_hot_sum(ev, x, idx, dims, out, one_hot_first=first) for first in (False, True)]
    return [t for t in sums if t is not None]


def _gather_key(x: Term, idx: Term, dims: GatherDims, out: Shape) -> tuple | None:
    """The attributes of the gather of x at idx by `dims` (Builder.gather_term's): an inner term
    is a gather by these very dims only with these."""
    aligned = gather_map(dims, len(x.shape), len(idx.shape), len(out.dims))
    return None if aligned is None else (aligned.key(dims.key()),)


def weighted_pick(ev: Builder, spec: DotSpec, lhs: Term, rhs: Term) -> tuple[DotSpec, Term, list[Term], Term] | None:
    """A dot that sums the picks of a gather over its index lanes with weights, as a dot of their
    weighted one-hot with the gathered operand:

        sum_l g[b, l] * x[b, idx[b, l], o] = sum_v (sum_l g[b, l] * (idx[b, l] == v)) * x[b, v, o]

    for indices in [0, V) (each lane's one-hot has its one 1 at the row the gather reads). A
    top-k router's gates times the picked experts' outputs (`einsum("nk,nkd->nd", gates,
    take_along_axis(ys, top_idx[..., None], 1))`) is then the weighted one-hot contracted with every
    expert's output, which an expert-parallel device cuts along v: its experts' columns of the
    one-hot (`top_idx == owned`) against its experts' outputs, summed over the devices.

    Returns (the dot's spec, the weighted one-hot as a reduce over the lanes, the same as a dot and
    as the reduce of the one-hot times the weights, x) when one operand is such a gather (scalar indices, one indexed dim, the others batching dims
    or whole) and the dot contracts exactly its lanes and batches exactly its batch dims, the other
    operand having no other dims; None otherwise."""
    for g, p, g_batch, p_batch, g_contract, p_contract in (
        (lhs, rhs, spec.lhs_batch, spec.rhs_batch, spec.lhs_contract, spec.rhs_contract),
        (rhs, lhs, spec.rhs_batch, spec.lhs_batch, spec.rhs_contract, spec.lhs_contract),
    ):
        p = ev.gathered.get(p, p)  # a dot of gathered kernels, stated as the gather of the dense dot
        if p.op != "aligned" or not (key := AlignedMap.op_key(p.attrs[0])).startswith("gather:"):
            continue
        x, idx = p.args
        dims = GatherDims.from_key(key)
        if dims.vector_dim == len(idx.shape) - 1 and idx.shape[-1] == 1:  # one-coordinate index vectors
            idx = ev.reshape_term(idx, Shape(idx.dtype, idx.shape[:-1]))
            dims = dataclasses.replace(dims, vector_dim=len(idx.shape))
        lanes = _index_dims(x, idx, dims, p.shape)
        if lanes is None or len(g.shape) != len(g_batch) + len(g_contract) or g.dtype != x.dtype:
            continue
        # the gather's output dims that are index dims, in the index's order
        at = [o for o in range(len(p.shape)) if o not in dims.offset]
        batch = [at[j] for j in dims.indices_batch]
        if sorted(p_batch) != sorted(batch) or sorted(p_contract) != sorted(at[j] for j in lanes):
            continue
        found = ev.bounds_of(idx)
        (v,) = dims.start_map
        if found is None or not (0 <= found[0] and found[1] < x.shape[v]):
            continue
        return _weighted(ev, g, x, idx, dims, at, g_batch, p_batch, g_contract, p_contract)
    return None


def _index_dims(x: Term, idx: Term, dims: GatherDims, out: tuple[int, ...]) -> list[int] | None:
    """The index dims that are no batching dims (the lanes), when the gather reads x[b, idx[b, l], o]:
    scalar indices (a unit index vector dim reshaped away) into one dim v, every other dim of x a batching dim or taken whole (its offset
    dims in order); None otherwise."""
    if dims.vector_dim != len(idx.shape) or len(dims.start_map) != 1 or dims.collapsed != dims.start_map:
        return None
    (v,) = dims.start_map
    whole = [k for k in range(len(x.shape)) if k != v and k not in dims.operand_batch]
    sizes = tuple(x.shape[k] if k in whole else 1 for k in range(len(x.shape)))
    if len(dims.offset) != len(whole) or dims.slice_sizes != sizes or len(out) != len(idx.shape) + len(whole):
        return None
    if [out[o] for o in dims.offset] != [x.shape[k] for k in whole]:
        return None
    return [j for j in range(len(idx.shape)) if j not in dims.indices_batch]


def _weighted(
    ev: Builder,
    g: Term,
    x: Term,
    idx: Term,
    dims: GatherDims,
    at: list[int],
    g_batch: tuple[int, ...],
    p_batch: tuple[int, ...],
    g_contract: tuple[int, ...],
    p_contract: tuple[int, ...],
) -> tuple[DotSpec, Term, list[Term], Term]:
    """(spec, G as a reduce, [G as a dot, G as the reduce of the one-hot times the weights], x) for dot(G, x) = the dot of g with the gather of x at idx,
    G[batch in the index's order, v] the weights' one-hot."""
    (v,) = dims.start_map
    hot = (*idx.shape, x.shape[v])
    rank = len(idx.shape)
    spread = ev.mk("bcast", (bcast_spec(rank, hot, tuple(range(rank))),), [idx], Shape(idx.dtype, hot))
    iota = ev.const(np.arange(x.shape[v], dtype=NP_DTYPES[idx.dtype]), idx.dtype)
    across = ev.mk("bcast", (bcast_spec(1, hot, (rank,)),), [iota], Shape(idx.dtype, hot))
    equal = ev.mk("binary", (compare_text("EQ", idx.dtype),), [spread, across], Shape("pred", hot))
    one_hot_columns.record(ev, equal, "EQ", spread, across)  # a device's experts' test is a window of it
    one_hot = ev.normal("unary", ("convert",), [equal], Shape(x.dtype, hot))
    # g's dims as index dims: a batch pair or a contracted pair names the gather's output dim
    g_to_idx = {gd: at.index(pd) for gd, pd in (*zip(g_batch, p_batch), *zip(g_contract, p_contract))}
    weights = ev.mk(
        "bcast",
        (bcast_spec(len(g.shape), hot, tuple(g_to_idx[k] for k in range(len(g.shape)))),),
        [g],
        Shape(g.dtype, hot),
    )
    lanes = tuple(sorted(at.index(pd) for pd in p_contract))
    kept = tuple(j for j in range(rank) if j not in lanes)  # the batch dims, in the index's order
    shape = Shape(x.dtype, (*(idx.shape[j] for j in kept), x.shape[v]))
    product = ev.binary("multiply", weights, one_hot)
    as_sum = ev.normal("reduce", ("add", ReduceSpec(rank + 1, lanes).text()), [product], shape)
    # the one-hot first, as `sum(one_hot(idx, E) * w[..., None])` writes it
    swapped = ev.normal(
        "reduce", ("add", ReduceSpec(rank + 1, lanes).text()), [ev.binary("multiply", one_hot, weights)], shape
    )
    # the same weights as a dot over the lanes (a one-hot contracted by einsum)
    g_order = sorted(g_batch, key=lambda k: g_to_idx[k])
    lane_order = [next(k for k in g_contract if g_to_idx[k] == j) for j in lanes]
    lane_spec = DotSpec(tuple(g_order), kept, tuple(lane_order), lanes, len(g.shape), rank + 1, (g.dtype, x.dtype))
    as_dot = ev.normal("dot", (lane_spec.text(),), [g, one_hot], shape)
    # dot(G, x): G's batch dims against x's batching dims in the written dot's batch order (so the
    # output's dims are the written one's), G's last dim against v
    order = [at.index(pd) for pd in p_batch]
    x_batch = tuple(dims.operand_batch[dims.indices_batch.index(j)] for j in order)
    spec = DotSpec(
        tuple(kept.index(j) for j in order),
        x_batch,
        (len(kept),),
        (v,),
        len(kept) + 1,
        len(x.shape),
        (x.dtype, x.dtype),
    )
    forms = [as_dot, swapped]
    if (local := masked_local_ids(ev, g, idx, x.shape[v])) is not None:
        # a device's weights masked to its experts, its local ids clamped: the window of the one-hot
        w, ids, lo = local
        hot_ids = one_hots.spread(ev, ids, hot, tuple(range(rank)))
        owned = ev.const(np.arange(lo, lo + x.shape[v], dtype=NP_DTYPES[ids.dtype]), ids.dtype)
        hot_owned = one_hots.spread(ev, owned, hot, (rank,))
        mine = ev.mk("binary", (compare_text("EQ", ids.dtype),), [hot_ids, hot_owned], Shape("pred", hot))
        if found := one_hot_columns.columns(ev, mine, "EQ", hot_ids, hot_owned):
            ev.equal_terms.append([mine, *found])
        w_dims = tuple(g_to_idx[k] for k in range(len(g.shape)))  # w is laid out as g
        w_hot = ev.mk("bcast", (bcast_spec(len(w.shape), hot, w_dims),), [w], Shape(w.dtype, hot))
        masked = ev.binary("multiply", w_hot, ev.normal("unary", ("convert",), [mine], Shape(x.dtype, hot)))
        forms.append(ev.normal("reduce", ("add", ReduceSpec(rank + 1, lanes).text()), [masked], shape))
    return spec, as_sum, forms, x


def masked_local_ids(ev: Builder, g: Term, idx: Term, n: int) -> tuple[Term, Term, int] | None:
    """(w, x, lo) when g = select(lo <= x < lo + n, w, 0) and idx = clamp(x - lo, 0, n - 1): the
    weights of a device's experts [lo, lo + n) masked to its own ids, read at its local ids. Then
    for e in [0, n), g * (idx == e) = w * (x == lo + e) for every x: inside the window the clamp
    leaves x - lo, outside it the mask is 0 and x is no lo + e either."""
    if g.op != "ternary" or g.attrs != ("select",) or ev.uniform(g.args[2]) != 0:
        return None
    window = masks.window_of(ev, g.args[0])
    if window is None:
        return None
    window = window.clipped(ev.bounds_of(window.x))
    lo, x = window.lo, window.x
    if window.hi - lo != n or _clamped_offset(ev, idx, n) != (x, lo):
        return None
    return g.args[1], x, lo


def _clamped_offset(ev: Builder, idx: Term, n: int) -> tuple[Term, int] | None:
    """(x, lo) when idx = min(n - 1, max(0, x - lo)) (either order of the two), x - lo written or lo = 0."""
    if idx.op != "binary" or idx.attrs[0] not in ("minimum", "maximum"):
        return None
    outer, other = idx.attrs[0], "maximum" if idx.attrs[0] == "minimum" else "minimum"
    inner, bound = (idx.args[1], idx.args[0]) if ev.folded(idx.args[0]) is not None else idx.args
    if inner.op != "binary" or inner.attrs != (other,):
        return None
    local, bound2 = (inner.args[1], inner.args[0]) if ev.folded(inner.args[0]) is not None else inner.args
    ends = {outer: ev.uniform(bound), other: ev.uniform(bound2)}
    if ends != {"minimum": n - 1, "maximum": 0}:
        return None
    if local.op == "binary" and local.attrs == ("subtract",) and (c := masks.scalar_int(ev, local.args[1])) is not None:
        return local.args[0], c
    return local, 0


def weighted_sum(
    ev: Builder, x: Term, dims: tuple[int, ...], out: Shape
) -> tuple[DotSpec, Term, Term, Shape, tuple[int, ...]] | None:
    """sum over dims R of bcast(a) * y, y read in place and a reading every summed dim, as the dot
    of a with y, stated beside the sum (a has no free dims: y reads them all):

        sum_R a[.., r, ..] * y[.., r, ..] = dot(a, y; contracting R, batch the kept dims a reads)

    exact over the reals, each output element the sum of the same products. The dot's own facts
    then apply: `sum(top_p[:, :, None] * take_along_axis(ys, top_i[..., None], 1), 1)` is the top-k
    gates against the picked experts' rows, a dot whose weighted one-hot (picks.weighted_pick) an
    expert-parallel device cuts along the experts. Only where y is a gather (the form those facts
    read; other weighted sums stay sums, as their e-graphs grew without use) in f32 or f64 (as
    summed_product). None otherwise."""
    if x.op != "binary" or x.attrs[0] != "multiply" or x.dtype not in ("f32", "f64") or out.dtype != x.dtype:
        return None
    forms = [bcast_form(t) for t in x.args]
    if sum(f is not None for f in forms) != 1 or any(t.dtype != x.dtype for t in x.args):
        return None
    k = 0 if forms[0] is not None else 1
    spec_a, a = forms[k]  # type: ignore[misc]
    y = x.args[1 - k]
    if y.op != "aligned" or not AlignedMap.op_key(y.attrs[0]).startswith("gather:"):
        return None
    reads = dict(BcastSpec.parse(spec_a).operand_dims())
    if any(o not in reads for o in dims):
        return None
    kept = [o for o in range(len(x.shape)) if o not in dims]
    batch = [o for o in kept if o in reads]
    spec = DotSpec(
        tuple(reads[o] for o in batch),
        tuple(batch),
        tuple(reads[o] for o in dims),
        tuple(dims),
        len(a.shape),
        len(y.shape),
        (a.dtype, y.dtype),
    )
    names = batch + [o for o in kept if o not in batch]
    return spec, a, y, Shape(out.dtype, tuple(x.shape[o] for o in names)), tuple(names.index(o) for o in kept)
