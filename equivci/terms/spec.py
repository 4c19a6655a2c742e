"""The grammar of the term attributes that are strings: one typed value per kind, with `text()`
to write it and `parse(text)` to read it back. The evaluator builds attributes through these, and
the loader, the numeric semantics, routing and the vocabulary masks read them through these; the
egglog rules see the strings as opaque keys into the tables the loader seeds from them.

    dot        "lb|rb|lc|rc|lhs_rank|rhs_rank|lhs_dtype,rhs_dtype"   HLO dot_general; dims are
               comma lists (batch dims of each side, contracting dims of each side)
    reduce     "rank:d0,d1,.."                                       the reduced operand dims, sorted
    bcast      "i<k>,n<size>,.."   one entry per output dim: operand dim k, or a new dim of `size`
    reshape    "n_in:t1xt2>n_out:u1xu2;.."   groups of consecutive dims with equal element counts:
               how many input and output dims, and the sizes of all but the leading one
    transpose  "p0,p1,.."          output dim o is operand dim p[o]
    compare    "compare-<DIR>:<dtype>"   the op of a `binary` comparison (DIR as in HLO: EQ, LT, ..)

`text(parse(s)) == s` for every string the evaluator writes (tests/terms/test_spec.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v != "")


def _join(values, sep: str = ",") -> str:
    return sep.join(map(str, values))


@dataclasses.dataclass(frozen=True)
class DotSpec:
    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    lhs_contract: tuple[int, ...]
    rhs_contract: tuple[int, ...]
    lhs_rank: int
    rhs_rank: int
    dtypes: tuple[str, str]

    def text(self) -> str:
        return (
            f"{_join(self.lhs_batch)}|{_join(self.rhs_batch)}|{_join(self.lhs_contract)}|"
            f"{_join(self.rhs_contract)}|{self.lhs_rank}|{self.rhs_rank}|{self.dtypes[0]},{self.dtypes[1]}"
        )

    @staticmethod
    def parse(text: str) -> DotSpec:
        lb, rb, lc, rc, lr, rr, dtypes = text.split("|")
        lhs_dtype, rhs_dtype = dtypes.split(",")
        return DotSpec(_ints(lb), _ints(rb), _ints(lc), _ints(rc), int(lr), int(rr), (lhs_dtype, rhs_dtype))


def swapped_dot(dot: DotSpec, perm: tuple[int, ...]) -> tuple[DotSpec, tuple[int, ...]]:
    """transpose(dot(x, y), perm) as transpose(dot(y, x; spec), composed): the spec of the dot with
    its operands swapped (its output puts y's free dims before x's), and the one transpose that
    puts the output dims where `perm` wants them (output dim o is the swapped dot's composed[o])."""
    nb = len(dot.lhs_batch)
    nx = dot.lhs_rank - nb - len(dot.lhs_contract)
    ny = dot.rhs_rank - nb - len(dot.rhs_contract)
    back = tuple(range(nb)) + tuple(nb + ny + i for i in range(nx)) + tuple(nb + j for j in range(ny))
    spec = DotSpec(
        dot.rhs_batch,
        dot.lhs_batch,
        dot.rhs_contract,
        dot.lhs_contract,
        dot.rhs_rank,
        dot.lhs_rank,
        (dot.dtypes[1], dot.dtypes[0]),
    )
    return spec, tuple(back[k] for k in perm)


@dataclasses.dataclass(frozen=True)
class ReduceSpec:
    rank: int
    dims: tuple[int, ...]  # sorted

    def text(self) -> str:
        return f"{self.rank}:{_join(sorted(self.dims))}"

    @staticmethod
    def parse(text: str) -> ReduceSpec:
        rank, dims = text.split(":")
        return ReduceSpec(int(rank), _ints(dims))


@dataclasses.dataclass(frozen=True)
class BcastSpec:
    """Per output dim: ("i", operand dim) or ("n", size of a new dim)."""

    parts: tuple[tuple[str, int], ...]

    @staticmethod
    def of(operand_rank: int, out_shape: tuple[int, ...], dims: tuple[int, ...]) -> BcastSpec:
        """HLO broadcast_in_dim (`dims[k]`: the output dim of operand dim k), independent of the operand's sizes."""
        assert len(dims) == operand_rank
        return BcastSpec(tuple(("i", dims.index(o)) if o in dims else ("n", size) for o, size in enumerate(out_shape)))

    def text(self) -> str:
        return ",".join(f"{kind}{value}" for kind, value in self.parts)

    @staticmethod
    def parse(text: str) -> BcastSpec:
        parts = []
        for part in text.split(",") if text else []:
            if part[:1] not in ("i", "n"):
                raise ValueError(f"bad bcast spec {text!r}")
            parts.append((part[0], int(part[1:])))
        return BcastSpec(tuple(parts))

    def operand_dims(self) -> list[tuple[int, int]]:
        """(output dim, operand dim) for the output dims that have one, in output order."""
        return [(o, value) for o, (kind, value) in enumerate(self.parts) if kind == "i"]

    def compose(self, outer: BcastSpec) -> BcastSpec:
        """bcast(bcast(x, self), outer) as one broadcast of x."""
        return BcastSpec(tuple(self.parts[value] if kind == "i" else (kind, value) for kind, value in outer.parts))


@dataclasses.dataclass(frozen=True)
class ReshapeGroup:
    n_in: int
    in_tail: tuple[int, ...]  # the sizes of the group's input dims after the first
    n_out: int
    out_tail: tuple[int, ...]

    def text(self) -> str:
        return f"{self.n_in}:{_join(self.in_tail, 'x')}>{self.n_out}:{_join(self.out_tail, 'x')}"


@dataclasses.dataclass(frozen=True)
class ReshapeSpec:
    groups: tuple[ReshapeGroup, ...]

    def text(self) -> str:
        return ";".join(g.text() for g in self.groups)

    @staticmethod
    def parse(text: str) -> ReshapeSpec:
        groups = []
        for part in text.split(";") if text else []:
            ins, outs = part.split(">")
            n_in, in_tail = ins.split(":")
            n_out, out_tail = outs.split(":")
            groups.append(
                ReshapeGroup(
                    int(n_in),
                    tuple(int(v) for v in in_tail.split("x") if v),
                    int(n_out),
                    tuple(int(v) for v in out_tail.split("x") if v),
                )
            )
        return ReshapeSpec(tuple(groups))

    def tables(self) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int]]]:
        """Per group (leading input dim, leading output dim, input tail product, output tail
        product), and the sizes of the output dims that are not leading dims."""
        leads: list[tuple[int, int, int, int]] = []
        fixed: list[tuple[int, int]] = []
        pos_in = pos_out = 0
        for g in self.groups:
            if g.n_in and g.n_out:
                leads.append((pos_in, pos_out, math.prod(g.in_tail), math.prod(g.out_tail)))
                fixed.extend((pos_out + 1 + k, size) for k, size in enumerate(g.out_tail))
            else:  # a group without input dims holds only size-1 output dims
                fixed.extend((pos_out + k, 1) for k in range(g.n_out))
            pos_in, pos_out = pos_in + g.n_in, pos_out + g.n_out
        return leads, fixed

    def inverse(self) -> ReshapeSpec:
        """The reshape back: each group's sides swapped. Every group keeps its element count and
        its leads follow from the operand, so this reshape of the output is the input's shape, and a
        row-major reshape there and back moves no element."""
        return ReshapeSpec(tuple(ReshapeGroup(g.n_out, g.out_tail, g.n_in, g.in_tail) for g in self.groups))

    def narrowings(self, side: str) -> list[tuple[int, int, tuple]]:
        """(p, m, family) per group with two or more dims on `side` ("in" or "out"): p its second
        dim there, m that dim's size, and `family` alike for exactly the specs that differ from this
        one in that size alone (the lead's size still follows from the operand). A window of heads
        within one group of a [groups, heads, head_dim] split is the narrower member's reshape of
        the window of the flat dim ("out"), and the merge of such a window is a window of the merge
        ("in")."""
        narrowings = []
        pos = 0
        for i, g in enumerate(self.groups):
            tail = g.in_tail if side == "in" else g.out_tail
            if g.n_in and g.n_out and tail:
                family = (side, i, self.groups[:i], g.n_in, g.n_out, g.out_tail if side == "in" else g.in_tail)
                narrowings.append((pos + 1, tail[0], (*family, tail[1:], self.groups[i + 1 :])))
            pos += g.n_in if side == "in" else g.n_out
        return narrowings


def transpose_text(perm) -> str:
    return _join(perm)


def parse_transpose(text: str) -> tuple[int, ...]:
    return _ints(text)


COMPARE_PREFIX = "compare-"


def compare_text(direction: str, dtype: str) -> str:
    return f"{COMPARE_PREFIX}{direction}:{dtype}"


def parse_compare(name: str) -> tuple[str, str] | None:
    """(direction, operand dtype) of a comparison's op name, None for any other binary op."""
    if not name.startswith(COMPARE_PREFIX):
        return None
    direction, _, dtype = name[len(COMPARE_PREFIX) :].partition(":")
    return direction, dtype


def bcast_spec(operand_rank: int, out_shape: tuple[int, ...], dims: tuple[int, ...]) -> str:
    """Broadcast attributes independent of the operand's sizes: output dim -> operand dim or new size."""
    return BcastSpec.of(operand_rank, out_shape, dims).text()


def compose_bcast(inner: str, outer: str) -> str:
    """The spec of bcast(bcast(x, inner), outer) as one broadcast of x."""
    return BcastSpec.parse(inner).compose(BcastSpec.parse(outer)).text()


def reshape_groups(
    in_shape: tuple[int, ...], out_shape: tuple[int, ...], singletons: bool = False
) -> list[tuple[list[int], list[int]]] | None:
    """Partition both shapes into consecutive dim groups with equal element counts.

    A size-1 dim is ambiguous: (8,) -> (1, 8) may add a unit dim before the 8, while
    (8,) -> (1, 8) inside attention splits 8 into 1 local head of 8. `singletons=False` lets size-1
    dims lead a group, `True` gives each its own group; the loader states both (they denote the
    same reshape) so that either reading can meet the reference's reshape.
    """
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
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
    return _reshape_spec(tuple(in_shape), tuple(out_shape), singletons)


@functools.lru_cache(maxsize=1 << 14)  # asked for every reshape built: a model's layers repeat the same few shapes
def _reshape_spec(in_shape: tuple[int, ...], out_shape: tuple[int, ...], singletons: bool) -> str | None:
    groups = reshape_groups(in_shape, out_shape, singletons)
    if groups is None:
        return None
    return ReshapeSpec(
        tuple(
            ReshapeGroup(len(gi), tuple(in_shape[k] for k in gi[1:]), len(gj), tuple(out_shape[k] for k in gj[1:]))
            for gi, gj in groups
        )
    ).text()


def repeat_form(reshape: str, bcast: str) -> tuple[int, int] | None:
    """(d, n) when reshape(reshape, bcast(bcast, y)) is jnp.repeat(y, n, axis=d): the broadcast
    inserts one new dim of size n right after dim d and keeps the others in order, and the reshape
    merges dims d and d + 1 and keeps the others. Output index p along d is then y's index p // n.
    Read from the specs alone, so it holds whatever the operand's sizes."""
    parts = BcastSpec.parse(bcast).parts
    new = [o for o, (kind, _) in enumerate(parts) if kind == "n"]
    if len(new) != 1 or new[0] == 0:
        return None
    p = new[0]
    n = parts[p][1]
    if n < 2 or parts != tuple(
        [("i", o) for o in range(p)] + [("n", n)] + [("i", o) for o in range(p, len(parts) - 1)]
    ):
        return None
    expected = [ReshapeGroup(1, (), 1, ())] * (len(parts) - 1)
    expected[p - 1] = ReshapeGroup(2, (n,), 1, ())
    return (p - 1, n) if ReshapeSpec.parse(reshape).groups == tuple(expected) else None


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
    def op_key(key: str) -> str:
        """The op's own part of a key written by `key`."""
        return key.split("|l=")[0]

    @staticmethod
    def parse(key: str) -> "AlignedMap":
        fields = dict(part.split("=", 1) for part in key.split("|")[-3:])

        def dec(text: str) -> tuple[tuple[int, int], ...]:
            pairs = (p.split(":") for p in text.split(",") if p)
            return tuple((int(a), int(b)) for a, b in pairs)

        return AlignedMap(dec(fields["l"]), dec(fields["r"]), dec(fields["f"]))


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
        return GatherDims(
            ints("offset_dims"),
            ints("collapsed_slice_dims"),
            ints("start_index_map"),
            ints("operand_batching_dims"),
            ints("start_indices_batching_dims"),
            int(attrs.get("index_vector_dim", indices_rank)),
            ints("slice_sizes"),
        )

    def key(self) -> str:
        return "gather:" + ";".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))

    @staticmethod
    def from_key(key: str) -> "GatherDims":
        """The dims `key()` wrote."""
        fields = dict(part.split("=", 1) for part in key[len("gather:") :].split(";"))
        ints = lambda name: tuple(int(v) for v in re.findall(r"-?\d+", fields[name]))  # noqa: E731
        return GatherDims(
            ints("offset"),
            ints("collapsed"),
            ints("start_map"),
            ints("operand_batch"),
            ints("indices_batch"),
            int(fields["vector_dim"]),
            ints("slice_sizes"),
        )

    def unit_windows_batched(
        self, operand_shape: tuple[int, ...], indices_shape: tuple[int, ...], out_rank: int
    ) -> tuple["GatherDims", tuple[int, ...]]:
        """The same gather with each size-1 operand dim it takes whole as a window (no start index
        reads it) made a batching dim, paired with a size-1 index dim inserted where the output dim
        it fills is read: (dims, the index's new shape). Exact: along that dim the window's one
        element and the batch's one row are both element 0. A device's one row of a batch, which
        XLA gathers from as a window, then meets its row of the reference's batched gather
        (`take_along_axis` on data-parallel rows). Only for an implicit index vector."""
        dims, shape = self, list(indices_shape)
        if dims.vector_dim != len(shape):
            return dims, indices_shape
        for k in range(len(operand_shape)):
            window = [j for j in range(len(operand_shape)) if j not in dims.collapsed + dims.operand_batch]
            if k not in window or k in dims.start_map or operand_shape[k] != 1:
                continue
            o = sorted(dims.offset)[window.index(k)]
            q = sum(1 for p in range(out_rank) if p < o and p not in dims.offset)  # index dims fill them in order
            pairs = sorted([*zip(dims.operand_batch, (j + (j >= q) for j in dims.indices_batch)), (k, q)])
            dims = dataclasses.replace(
                dims,
                offset=tuple(p for p in dims.offset if p != o),
                operand_batch=tuple(a for a, _ in pairs),
                indices_batch=tuple(b for _, b in pairs),
                vector_dim=dims.vector_dim + 1,
            )
            shape.insert(q, 1)
        return dims, tuple(shape)

    def without_unit_index_dims(
        self, indices_shape: tuple[int, ...], out_rank: int
    ) -> tuple["GatherDims", list[int], list[int]]:
        """The same gather without size-1 index dims that are not batching dims (take_along_axis
        keeps one), a one-coordinate index vector made implicit (index_vector_dim = rank: each
        element is its own start, HLO's meaning of a trailing implicit vector): (dims, kept index
        dims, kept output dims). The rows of `x[ids]` are then read at one index term whether the
        index vector is written ([n, 1], index_vector_dim=1) or implicit ([n])."""
        idx_dims = [j for j in range(len(indices_shape)) if j != self.vector_dim]
        batch_out = [o for o in range(out_rank) if o not in self.offset]
        drop_idx = {j for j in idx_dims if indices_shape[j] == 1 and j not in self.indices_batch}
        if self.vector_dim < len(indices_shape) and indices_shape[self.vector_dim] == 1:
            drop_idx.add(self.vector_dim)
        drop_out = {o for j, o in zip(idx_dims, batch_out) if j in drop_idx}
        kept_idx = [j for j in range(len(indices_shape)) if j not in drop_idx]
        kept_out = [o for o in range(out_rank) if o not in drop_out]
        renum = lambda dims, kept: tuple(kept.index(v) for v in dims)  # noqa: E731
        vector = kept_idx.index(self.vector_dim) if self.vector_dim in kept_idx else len(kept_idx)
        dims = dataclasses.replace(
            self,
            offset=renum(self.offset, kept_out),
            indices_batch=renum(self.indices_batch, kept_idx),
            vector_dim=vector,
        )
        return dims, kept_idx, kept_out
