"""Tensor terms over the reference inputs: the language both programs are translated into.

A term denotes a tensor as a function of the reference (global) input leaves. Every term carries
its static attributes in `attrs`, chosen so that two terms with the same op, attrs and arguments
denote the same function: dtypes are part of the op, shapes of broadcasts and reshapes are encoded
relative to their operand (see `bcast_spec`, `reshape_spec`) so that slicing an operand does not
change the attributes of the op that consumes it.
"""

from __future__ import annotations

import dataclasses
import math
import re


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
        t = Term(op, attrs, args, tuple(shape), dtype)
        return self._table.setdefault(t._key, t)

    def __len__(self) -> int:
        return len(self._table)


def bcast_spec(operand_rank: int, out_shape: tuple[int, ...], dims: tuple[int, ...]) -> str:
    """Broadcast attributes independent of the operand's sizes: output dim -> operand dim or new size."""
    parts = []
    for o, size in enumerate(out_shape):
        parts.append(f"i{dims.index(o)}" if o in dims else f"n{size}")
    assert len(dims) == operand_rank
    return ",".join(parts)


def reshape_groups(in_shape: tuple[int, ...], out_shape: tuple[int, ...],
                   singletons: bool = False) -> list[tuple[list[int], list[int]]] | None:
    """Partition both shapes into consecutive dim groups with equal element counts.

    A size-1 dim is ambiguous: (8,) -> (1, 8) may add a unit dim before the 8, while
    (8,) -> (1, 8) inside attention splits 8 into 1 local head of 8. `singletons=False` lets size-1
    dims lead a group, `True` gives each its own group; the loader states both (they denote the
    same reshape) so that either reading can meet the reference's reshape.
    """
    groups, i, j = [], 0, 0
    while i < len(in_shape) or j < len(out_shape):
        if singletons and i < len(in_shape) and in_shape[i] == 1:
            groups.append(([i], []))
            i += 1
            continue
        if singletons and j < len(out_shape) and out_shape[j] == 1:
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(in_shape) or j >= len(out_shape):
            rest_in, rest_out = list(range(i, len(in_shape))), list(range(j, len(out_shape)))
            if any(in_shape[k] != 1 for k in rest_in) or any(out_shape[k] != 1 for k in rest_out):
                return None
            if not groups:
                return [(rest_in, rest_out)]
            groups[-1][0].extend(rest_in)
            groups[-1][1].extend(rest_out)
            break
        gi, gj = [i], [j]
        pi, pj = in_shape[i], out_shape[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj and i < len(in_shape):
                gi.append(i)
                pi *= in_shape[i]
                i += 1
            elif pj < pi and j < len(out_shape):
                gj.append(j)
                pj *= out_shape[j]
                j += 1
            else:
                return None
        groups.append((gi, gj))
    return groups


def reshape_spec(in_shape: tuple[int, ...], out_shape: tuple[int, ...], singletons: bool = False) -> str | None:
    """Reshape attributes without the leading size of each group (it follows from the operand)."""
    groups = reshape_groups(in_shape, out_shape, singletons)
    if groups is None:
        return None
    parts = []
    for gi, gj in groups:
        in_tail = "x".join(str(in_shape[k]) for k in gi[1:])
        out_tail = "x".join(str(out_shape[k]) for k in gj[1:])
        parts.append(f"{len(gi)}:{in_tail}>{len(gj)}:{out_tail}")
    return ";".join(parts)


def reshape_tables(spec: str) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int]]]:
    """From a spec alone: per group (leading input dim, leading output dim, input tail product,
    output tail product), and the sizes of the output dims that are not leading dims."""
    leads, fixed, pos_in, pos_out = [], [], 0, 0
    for part in spec.split(";"):
        ins, outs = part.split(">")
        n_in, in_tail = ins.split(":")
        n_out, out_tail = outs.split(":")
        n_in, n_out = int(n_in), int(n_out)
        in_sizes = [int(v) for v in in_tail.split("x") if v]
        out_sizes = [int(v) for v in out_tail.split("x") if v]
        if n_in and n_out:
            leads.append((pos_in, pos_out, math.prod(in_sizes), math.prod(out_sizes)))
            fixed.extend((pos_out + 1 + k, size) for k, size in enumerate(out_sizes))
        else:  # a group without input dims holds only size-1 output dims
            fixed.extend((pos_out + k, 1) for k in range(n_out))
        pos_in, pos_out = pos_in + n_in, pos_out + n_out
    return leads, fixed


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


def repeat_form(reshape: str, bcast: str) -> tuple[int, int] | None:
    """(d, n) when reshape(reshape, bcast(bcast, y)) is jnp.repeat(y, n, axis=d): the broadcast
    inserts one new dim of size n right after dim d and keeps the others in order, and the reshape
    merges dims d and d + 1 and keeps the others. Output index p along d is then y's index p // n.
    Read from the specs alone, so it holds whatever the operand's sizes."""
    parts = bcast.split(",") if bcast else []
    new = [o for o, p in enumerate(parts) if p.startswith("n")]
    if len(new) != 1 or new[0] == 0:
        return None
    p = new[0]
    n = int(parts[p][1:])
    if n < 2 or parts != [f"i{o}" for o in range(p)] + [f"n{n}"] + [f"i{o}" for o in range(p, len(parts) - 1)]:
        return None
    groups = reshape.split(";")
    expected = ["1:>1:"] * (len(parts) - 1)
    expected[p - 1] = f"2:{n}>1:"
    return (p - 1, n) if groups == expected else None


def compose_bcast(inner: str, outer: str) -> str:
    """The spec of bcast(bcast(x, inner), outer) as one broadcast of x."""
    inner_parts = inner.split(",") if inner else []
    return ",".join(inner_parts[int(p[1:])] if p.startswith("i") else p for p in outer.split(",") if p)


@dataclasses.dataclass(frozen=True)
class AlignedMap:
    """How a two-operand op that acts independently along some dims (a variadic reduce, a batched
    gather) lays out its output: operand dim -> output dim for each aligned dim, and the sizes of
    the output dims that follow from the op's attributes alone. Slicing both operands along dims
    that map to the same output dim slices the output there (the `aligned` rules)."""

    lhs: tuple[tuple[int, int], ...]  # (lhs dim, output dim)
    rhs: tuple[tuple[int, int], ...]  # (rhs dim, output dim)
    fixed: tuple[tuple[int, int], ...]  # (output dim, size)

    def key(self, op_key: str) -> str:
        """The op's egglog key: its shape-free attributes and these tables (the loader reads them back)."""
        enc = lambda pairs: ",".join(f"{a}:{b}" for a, b in pairs)  # noqa: E731
        return f"{op_key}|l={enc(self.lhs)}|r={enc(self.rhs)}|f={enc(self.fixed)}"

    @staticmethod
    def parse(key: str) -> "AlignedMap":
        fields = dict(part.split("=", 1) for part in key.split("|")[-3:])
        dec = lambda text: tuple(tuple(int(v) for v in p.split(":")) for p in text.split(",") if p)  # noqa: E731
        return AlignedMap(dec(fields["l"]), dec(fields["r"]), dec(fields["f"]))


def reduce_pair_map(rank: int, dims: tuple[int, ...]) -> AlignedMap:
    """A reduce of two same-shaped operands over `dims`: every kept dim is aligned."""
    table = tuple((k, o) for o, k in enumerate(k for k in range(rank) if k not in dims))
    return AlignedMap(table, table, ())


@dataclasses.dataclass(frozen=True)
class GatherDims:
    """The dimension numbers of an HLO gather."""

    offset: tuple[int, ...]
    collapsed: tuple[int, ...]
    start_map: tuple[int, ...]
    operand_batch: tuple[int, ...]
    indices_batch: tuple[int, ...]
    vector_dim: int
    slice_sizes: tuple[int, ...]

    @staticmethod
    def parse(attrs: dict[str, str], indices_rank: int) -> "GatherDims":
        ints = lambda name: tuple(int(v) for v in re.findall(r"-?\d+", attrs.get(name, "")))  # noqa: E731
        return GatherDims(ints("offset_dims"), ints("collapsed_slice_dims"), ints("start_index_map"),
                          ints("operand_batching_dims"), ints("start_indices_batching_dims"),
                          int(attrs.get("index_vector_dim", indices_rank)), ints("slice_sizes"))

    def key(self) -> str:
        return "gather:" + ";".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))

    def without_unit_index_dims(self, indices_shape: tuple[int, ...], out_rank: int) -> tuple["GatherDims", list[int], list[int]]:
        """The same gather without size-1 index dims that are neither batching dims nor the index
        vector (take_along_axis keeps one): (dims, kept index dims, kept output dims)."""
        idx_dims = [j for j in range(len(indices_shape)) if j != self.vector_dim]
        batch_out = [o for o in range(out_rank) if o not in self.offset]
        drop_idx = {j for j in idx_dims if indices_shape[j] == 1 and j not in self.indices_batch}
        drop_out = {o for j, o in zip(idx_dims, batch_out) if j in drop_idx}
        kept_idx = [j for j in range(len(indices_shape)) if j not in drop_idx]
        kept_out = [o for o in range(out_rank) if o not in drop_out]
        renum = lambda dims, kept: tuple(kept.index(v) for v in dims)  # noqa: E731
        vector = kept_idx.index(self.vector_dim) if self.vector_dim in kept_idx else len(kept_idx)
        dims = dataclasses.replace(self, offset=renum(self.offset, kept_out),
                                   indices_batch=renum(self.indices_batch, kept_idx), vector_dim=vector)
        return dims, kept_idx, kept_out


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
