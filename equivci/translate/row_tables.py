"""Tables computed from their row index, read at integer rows, as the computation on those rows.

A constant T whose row r is F(r), F made of elementwise ops on the iota along T's first dim and on
values equal along it (RoPE's cos/sin tables, `cos(arange(N)[:, None] * inv_freq)`), read at rows
`ids` (a gather of whole rows, `table[ids]`, or a dynamic slice at `start`, rows start + arange(n)),
is F(ids): the same ops on convert(ids) in place of the iota. A device that builds the table and
reads its rows then meets one that computes the angles of its positions on the fly. Exact where:

* every row read lies in [0, N): HLO clamps a gather's and a dynamic slice's starts, so a row past
  the table is another row, not F of it. Checked on the index's bounds (an input the reference
  indexes with is a valid index; other integers have no bounds, and nothing is stated);
* the iota's values are the converted indices: convert(i) = i exactly for integers |i| <= 2^p, p
  the float's significand bits (24 for f32, 11 for f16, 8 for bf16, 53 for f64), so N - 1 <= 2^p;
  past it the iota and the convert may round apart, and the table has no recipe;
* F acts on each row alone: elementwise ops, converts, broadcasts and reshapes that keep the first
  dim as the rows, concatenations along other dims, and constants equal along the rows.

Each table's recipe is checked before use: rebuilt from the rows arange(N), it must fold to the
table bit for bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES, TermEvalError, evaluate
from equivci.terms.spec import GatherDims
from equivci.translate import elementwise
from equivci.translate.attributes import dims_attr, semantic_attrs
from equivci.translate.bounds import unwrapped_index
from equivci.translate.builder import Builder
from equivci.translate.shapes import broadcast_term

# rows(idx): the table's rows at an integer index term of shape I, a term of shape I + the rest
Recipe = Callable[[Term], Term | None]
# the largest integer up to which every integer of the float dtype is exact: 2^(significand bits)
EXACT_INTEGERS = {"f64": 2**53, "f32": 2**24, "f16": 2**11, "bf16": 2**8}
ELEMENTWISE = set(elementwise.HANDLERS)


def note(ev: Builder, inst: Instruction, args: list, result, handler, device: int) -> None:
    """State a read of a table's rows (a gather, a dynamic slice) equal to its recipe on the rows
    read; record the recipe of a folded value computed from the iota along its first dim."""
    if not isinstance(result, Term) or not result.shape:
        return
    if ev.folded(result) is None:
        if (rows := _read(ev, inst, args)) is not None:
            ev.equal_terms.append([result, ev.reshape_term(rows, inst.shape)])
        return
    if result not in ev.row_recipes and (recipe := _recipe(ev, inst, args, result, handler, device)) is not None:
        ev.row_recipes[result] = recipe


def _read(ev: Builder, inst: Instruction, args: list) -> Term | None:
    """The recipe's rows that a gather or a dynamic slice of a table with a recipe reads."""
    if not args or not isinstance(args[0], Term) or args[0] not in ev.row_recipes:
        return None
    x = args[0]
    if inst.opcode == "gather" and len(args) == 2:
        idx = args[1]
        attrs = semantic_attrs(inst, ev.module)
        dims, kept_idx, kept_out = GatherDims.parse(attrs, len(idx.shape)).without_unit_index_dims(
            idx.shape, len(inst.shape.dims)
        )
        idx = ev.reshape_term(idx, Shape(idx.dtype, tuple(idx.shape[j] for j in kept_idx)))
        return gathered_rows(ev, x, idx, dims, Shape(inst.shape.dtype, tuple(inst.shape.dims[o] for o in kept_out)))
    if inst.opcode == "dynamic-slice":
        sizes = dims_attr(inst.attrs.get("dynamic_slice_sizes"))
        if sizes[1:] != x.shape[1:] or ev.folded(args[1]) is not None:
            return None
        return sliced_rows(ev, x, args[1], sizes[0])
    return None


def rows_at(ev: Builder, table: Term, idx: Term, found: tuple[float, float] | None) -> Term | None:
    """table[idx] along the first dim as the table's recipe on idx, when the table has one, the
    recipe rebuilds it, and idx's bounds `found` keep every row inside the table; None otherwise."""
    recipe = ev.row_recipes.get(table)
    if recipe is None or idx.dtype[0] not in "su" or found is None:
        return None
    if found[0] < 0 or found[1] > table.shape[0] - 1:
        return None
    if not _rebuilds(ev, table, recipe(ev.const(np.arange(table.shape[0], dtype=NP_DTYPES[idx.dtype]), idx.dtype))):
        return None
    return recipe(idx)


def gathered_rows(ev: Builder, x: Term, idx: Term, dims: GatherDims, out: Shape) -> Term | None:
    """A gather of whole rows of x along its first dim at idx (`table[ids]`, `jnp.take(table, ids,
    axis=0)`), as rows_at; None for other gathers."""
    rest = x.shape[1:]
    if dims.vector_dim < len(idx.shape):  # one index per row: its index vector dim has size 1, last
        if dims.vector_dim != len(idx.shape) - 1 or idx.shape[-1] != 1:
            return None
        idx = ev.reshape_term(idx, Shape(idx.dtype, idx.shape[:-1]))
    if (
        dims.start_map != (0,)
        or dims.collapsed != (0,)
        or dims.operand_batch
        or tuple(dims.slice_sizes) != (1, *rest)
        or out.dims != (*idx.shape, *rest)
        or tuple(dims.offset) != tuple(range(len(idx.shape), len(out.dims)))
    ):
        return None
    idx = unwrapped_index(ev, idx, x.shape[0])
    return rows_at(ev, x, idx, ev.bounds_of(idx))


def sliced_rows(ev: Builder, x: Term, start: Term, size: int) -> Term | None:
    """`size` rows of x from `start` (a dynamic slice along the first dim) as rows_at on
    start + arange(size); None where some value of start would make HLO clamp."""
    start = unwrapped_index(ev, start, x.shape[0])
    found = ev.bounds_of(start)
    if found is None:
        return None
    shape = Shape(start.dtype, (size,))
    idx = elementwise.binary_terms(
        ev,
        "add",
        [broadcast_term(ev, start, shape, ()), ev.const(np.arange(size, dtype=NP_DTYPES[start.dtype]), start.dtype)],
        shape,
    )
    return rows_at(ev, x, idx, (found[0], found[1] + size - 1))


def _recipe(ev: Builder, inst: Instruction, args: list, result: Term, handler, device: int) -> Recipe | None:
    op, rest = inst.opcode, result.shape[1:]
    if op == "iota":
        limit = EXACT_INTEGERS.get(result.dtype)
        if result.dtype[0] in "su":
            limit = int(np.iinfo(NP_DTYPES[result.dtype]).max)
        if int(inst.attrs["iota_dimension"]) != 0 or limit is None or result.shape[0] - 1 > limit:
            return None
        return lambda idx: _converted(ev, idx, result, device)
    if not args or not all(isinstance(a, Term) for a in args) or not any(a in ev.row_recipes for a in args):
        return None
    if op in ELEMENTWISE:
        parts = [_rows_of(ev, a, result.shape[0]) for a in args]
        if any(p is None for p in parts):
            return None

        def elementwise_rows(idx: Term) -> Term | None:
            built = [p(idx) for p in parts]  # type: ignore[misc]  # none is None (checked above)
            if any(b is None for b in built):
                return None
            shape = dataclasses.replace(inst.shape, dims=(*idx.shape, *rest))
            return handler(ev, dataclasses.replace(inst, shape=shape), built, device)

        return elementwise_rows
    if op == "concatenate":
        dim = dims_attr(inst.attrs.get("dimensions"))[0]
        pieces = [_rows_of(ev, a, result.shape[0]) for a in args]
        if dim == 0 or any(p is None for p in pieces):
            return None

        def joined_rows(idx: Term) -> Term | None:
            built = [p(idx) for p in pieces]  # type: ignore[misc]  # none is None (checked above)
            return None if any(b is None for b in built) else ev.concat(built, dim + len(idx.shape) - 1)  # type: ignore[arg-type]

        return joined_rows
    inner = ev.row_recipes.get(args[0])
    if inner is None or args[0].shape[:1] != result.shape[:1]:
        return None
    if op in ("reshape", "bitcast"):
        return lambda idx: _then(inner(idx), lambda t: ev.reshape_term(t, Shape(result.dtype, (*idx.shape, *rest))))
    if op == "broadcast":
        dims = dims_attr(inst.attrs.get("dimensions"))
        if not dims or dims[0] != 0:
            return None

        def broadcast_rows(idx: Term) -> Term | None:
            k = len(idx.shape)
            laid = (*range(k), *(d + k - 1 for d in dims[1:]))
            return _then(inner(idx), lambda t: broadcast_term(ev, t, Shape(result.dtype, (*idx.shape, *rest)), laid))

        return broadcast_rows
    return None


def _rebuilds(ev: Builder, table: Term, whole: Term | None) -> bool:
    """Whether the recipe on every row, `whole`, is the table bit for bit."""
    want = ev.folded(table)
    if whole is None or want is None:
        return False
    try:
        got = evaluate(whole, {}, ev.values)
    except TermEvalError:
        return False
    return got.shape == want.shape and got.dtype == want.dtype and got.tobytes() == want.tobytes()


def _rows_of(ev: Builder, t: Term, n: int) -> Recipe | None:
    """t's recipe: its own, or for a value equal along its rows (a scalar, a broadcast along the
    other dims) the broadcast of its first row."""
    if t in ev.row_recipes:
        return ev.row_recipes[t]
    value = ev.folded(t)
    if not t.shape or t.shape[0] != n or value is None or not np.all(value == value[:1]):
        return None
    row = ev.const(np.asarray(value[0]), t.dtype)

    def copies(idx: Term) -> Term:
        k = len(idx.shape)
        return broadcast_term(
            ev, row, Shape(t.dtype, (*idx.shape, *t.shape[1:])), tuple(range(k, k + len(t.shape) - 1))
        )

    return copies


def _converted(ev: Builder, idx: Term, iota: Term, device: int) -> Term:
    """The iota's rows at idx: idx converted to the iota's dtype, broadcast along its other dims."""
    shape = Shape(iota.dtype, idx.shape)
    value = elementwise.convert(ev, Instruction("row", "convert", shape, (), {}), [idx], device)
    k = len(idx.shape)
    return broadcast_term(ev, value, Shape(iota.dtype, (*idx.shape, *iota.shape[1:])), tuple(range(k)))


def _then(t: Term | None, f: Callable[[Term], Term]) -> Term | None:
    return None if t is None else f(t)
