"""Tensor terms over the reference inputs: the language both programs are translated into.

A term denotes a tensor as a function of the reference (global) input leaves. Every term carries
its static attributes in `attrs`, chosen so that two terms with the same op, attrs and arguments
denote the same function: dtypes are part of the op, shapes of broadcasts and reshapes are encoded
relative to their operand (see equivci.terms.spec) so that slicing an operand does not
change the attributes of the op that consumes it.
"""

from __future__ import annotations

import dataclasses

from equivci.terms.spec import AlignedMap, BcastSpec, GatherDims, bcast_spec, reshape_spec


@dataclasses.dataclass(frozen=True, eq=False)
class Term:
    op: str
    attrs: tuple
    args: tuple["Term", ...]
    shape: tuple[int, ...]
    dtype: str
    _key: tuple = dataclasses.field(init=False, repr=False)
    _hash: int = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        key = (self.op, self.attrs, tuple(id(a) for a in self.args), self.shape, self.dtype)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_hash", hash(key))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Term) and self._key == other._key)


class TermTable:
    """Hash-consing: structurally equal terms are the same Python object."""

    def __init__(self) -> None:
        self._table: dict[tuple, Term] = {}

    def make(self, op: str, attrs: tuple, args: tuple[Term, ...], shape: tuple[int, ...], dtype: str) -> Term:
        shape = tuple(shape)
        # Most terms asked for exist already (every layer and device rebuilds the same constants and
        # layouts): look them up before making a new object.
        found = self._table.get((op, attrs, tuple(id(a) for a in args), shape, dtype))
        if found is not None:
            return found
        t = Term(op, attrs, args, shape, dtype)
        return self._table.setdefault(t._key, t)

    def __len__(self) -> int:
        return len(self._table)


def inserted_unit_dims(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> set[int] | None:
    """The output positions of size-1 dims that a reshape only inserts, if that is all it does."""
    inserted, i = set(), 0
    for o, size in enumerate(out_shape):
        if i < len(in_shape) and in_shape[i] == size:
            i += 1
        elif size == 1:
            inserted.add(o)
        else:
            return None
    return inserted if i == len(in_shape) and inserted else None


def bcast_form(term: Term) -> tuple[str, Term] | None:
    """`term` as a broadcast of a smaller term: a broadcast, or a reshape that only adds size-1 dims."""
    if term.op == "bcast":
        return term.attrs[0], term.args[0]
    if term.op == "reshape":
        unit = inserted_unit_dims(term.args[0].shape, term.shape)
        if unit is not None:
            kept = tuple(o for o in range(len(term.shape)) if o not in unit)
            return bcast_spec(len(term.args[0].shape), term.shape, kept), term.args[0]
    return None


def read_unit_bcast(term: Term) -> tuple[str, Term] | None:
    """A value read as it is stored (an input or a window of one) that has size-1 dims beside
    larger ones, as the broadcast of its squeeze along new dims of size 1: a stage's slab of a
    stacked bias, `b[i:i + 1]` of shape [1, f], added to a one-row microbatch is the row of that
    bias broadcast over every row, which the reference adds to all rows at once. Exact (no element
    moves); values an op computes are left alone (their windows relate through the op)."""
    if term.op not in ("param", "slice") or 1 not in term.shape or set(term.shape) == {1}:
        return None
    kept = tuple(o for o, n in enumerate(term.shape) if n != 1)
    squeezed = tuple(term.shape[o] for o in kept)
    spec = reshape_spec(term.shape, squeezed)
    if spec is None:
        return None
    inner = Term("reshape", (spec,), (term,), squeezed, term.dtype)
    return bcast_spec(len(squeezed), term.shape, kept), inner


def unit_squeezed(term: Term) -> tuple[str, Term] | None:
    """A broadcast along a new dim that keeps size-1 operand dims, as the broadcast of its operand
    without them (new dims of size 1 there): a device's one-head table [s, 1, d] broadcast over
    the batch is then a broadcast of the [s, d] table, as the reference's over batch and heads is.
    The operand without its size-1 dims is one reshape (of the operand's own operand, if a reshape)."""
    x = term.args[0] if term.op == "bcast" else None
    if x is None or 1 not in x.shape:
        return None
    parts = BcastSpec.parse(term.attrs[0]).parts
    if not any(kind == "n" and size != 1 for kind, size in parts):
        return None
    kept = [k for k, size in enumerate(x.shape) if size != 1]
    squeezed = tuple(x.shape[k] for k in kept)
    renamed = BcastSpec(
        tuple(
            ("n", 1) if kind == "i" and x.shape[v] == 1 else (kind, kept.index(v) if kind == "i" else v)
            for kind, v in parts
        )
    )
    base = x.args[0] if x.op == "reshape" else x
    if base.shape == squeezed:
        return renamed.text(), base
    spec = reshape_spec(base.shape, squeezed)
    if spec is None:
        return None
    return renamed.text(), Term("reshape", (spec,), (base,), squeezed, x.dtype)


def reduce_pair_map(rank: int, dims: tuple[int, ...]) -> AlignedMap:
    """A reduce of two same-shaped operands over `dims`: every kept dim is aligned."""
    table = tuple((k, o) for o, k in enumerate(k for k in range(rank) if k not in dims))
    return AlignedMap(table, table, ())


def sort_map(rank: int, dim: int, size: int) -> AlignedMap:
    """A sort along `dim`: each lane along it is sorted on its own, so every other dim is aligned
    (a slice of the lanes sorts to the same slice); the sorted dim keeps its size."""
    table = tuple((k, k) for k in range(rank) if k != dim)
    return AlignedMap(table, table, ((dim, size),))


def gather_map(g: GatherDims, operand_rank: int, indices_rank: int, out_rank: int) -> AlignedMap | None:
    """A gather's tables: output rows along an index dim come from the index rows at that position
    (and, for a batching dim, from the operand rows there too); window dims have fixed sizes."""
    offset = set(g.offset)
    batch_out = [o for o in range(out_rank) if o not in offset]
    idx_dims = [j for j in range(indices_rank) if j != g.vector_dim]
    window = [k for k in range(operand_rank) if k not in g.collapsed and k not in g.operand_batch]
    if len(batch_out) != len(idx_dims) or len(window) != len(offset) or len(g.slice_sizes) != operand_rank:
        return None
    rhs = tuple(zip(idx_dims, batch_out))
    out_of_idx = dict(rhs)
    lhs = tuple((k, out_of_idx[j]) for k, j in zip(g.operand_batch, g.indices_batch))
    return AlignedMap(lhs, rhs, tuple((o, g.slice_sizes[k]) for k, o in zip(window, sorted(offset))))
