"""Ops on a value whose leading dim is split into groups act group by group.

A vmapped reference over groups of tokens (`jax.vmap(f)(x.reshape(G, T, d))`) computes on
reshape(y) of shape [G, T, ...] from y of shape [G*T, ...]. Two general facts relate it to the
same code run on one group per device (rows [g*T, (g+1)*T) of y):

* an op that works along the dims after the two split ones (elementwise ops, a broadcast that keeps
  both, a reduce of later dims, an argmax over the experts, a reshape or transpose of later dims) is
  the reshape of the same op on y:
  op(reshape(y)) = reshape(op'(y)), op' the op with those dims renumbered;
* an op that works along the token dim T but keeps the groups apart (a windowed sum with a
  one-group window over G: the cumsum of a group's one-hot, a slot's position; a dot batched over G:
  the tokens a group dispatches to its slots) is, group by group, the op on the group's rows:
  op(reshape(y)) = reshape(concat_g op'(y[g*T : (g+1)*T])).

The op's own term keeps its form (localization reads its operands); the regrouped term is stated
equal beside it and recorded (`Builder.regrouped`) so that the next op on it is regrouped too.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.spec import BcastSpec, DotSpec
from equivci.translate import bounds, elementwise
from equivci.translate.attributes import dims_attr
from equivci.translate.builder import Builder, Value
from equivci.translate.shapes import broadcast_term

# opcodes whose dims attribute (if any) is renumbered here; every other op is left as it is
LIFTED_OPS = {*elementwise.HANDLERS, "broadcast", "reduce", "reduce-window", "reshape", "transpose"}


def flat_of(ev: Builder, t: Term) -> Term | None:
    """y when `t` is reshape(y) splitting y's leading dim in two (and nothing else), or an op found
    to be the reshape of one on y."""
    if t.op == "reshape" and _splits_lead(t.args[0].shape, t.shape):
        return t.args[0]
    return ev.regrouped.get(t)


def note(ev: Builder, inst: Instruction, args: list, result: Value, handler: Callable, device: int) -> None:
    """Record `result` as the reshape of the op on the flat operands, when one operand is split
    in groups and the op keeps the two split dims (see the module docstring)."""
    if inst.opcode == "dot" and isinstance(result, Term):
        _dot_by_group(ev, inst, args, result, handler, device)
        return
    if inst.opcode not in LIFTED_OPS:
        return
    results = result if isinstance(result, tuple) else (result,)  # an argmax's (value, index)
    if any(not isinstance(r, Term) or ev.folded(r) is not None or len(r.shape) < 2 for r in results):
        return
    terms = [a for a in args if isinstance(a, Term)]
    if len(terms) != len(args) or not any(flat_of(ev, a) is not None for a in terms):
        return
    groups, per_group = results[0].shape[0], results[0].shape[1]
    flat: Value | None
    if inst.opcode == "reduce-window":
        flat = _by_group(ev, inst, terms, handler, device, groups, per_group)
    else:
        flat = _lifted(ev, inst, terms, handler, device)
    flats = flat if isinstance(flat, tuple) else (flat,)
    if len(flats) != len(results):
        return
    pairs = [(r, f) for r, f in zip(results, flats) if isinstance(r, Term) and isinstance(f, Term)]
    if len(pairs) != len(results) or any(f.shape != (groups * per_group, *r.shape[2:]) for r, f in pairs):
        return
    for r, f in pairs:
        ev.regrouped[r] = f
        ev.equal_terms.append([r, ev.reshape_term(f, Shape(r.dtype, r.shape))])
        _note_pieces(ev, r, f)


def _lifted(ev: Builder, inst: Instruction, args: list[Term], handler: Callable, device: int) -> Value | None:
    """op'(y): the op on the flat operands, its dims attribute renumbered."""
    attrs = dict(inst.attrs)
    if inst.opcode == "reduce":
        dims = dims_attr(inst.attrs.get("dimensions"))
        if any(k < 2 for k in dims):  # a reduce over the split dims mixes groups
            return None
        attrs["dimensions"] = "{" + ",".join(str(k - 1) for k in dims) + "}"
    if inst.opcode == "reshape" and inst.shape.dims[:2] != args[0].shape[:2]:
        return None  # a reshape that moves elements across the split dims
    if inst.opcode == "transpose":
        perm = dims_attr(inst.attrs.get("dimensions"))
        if perm[:2] != (0, 1):
            return None
        attrs["dimensions"] = "{" + ",".join(["0", *(str(k - 1) for k in perm[2:])]) + "}"
    flats = []
    for a in args:
        if inst.opcode == "reduce" and not a.shape:  # an init value
            flats.append(a)
            continue
        f = _flat_operand(ev, inst, a)
        if f is None:
            return None
        flats.append(f)
    if inst.opcode == "broadcast":  # of a value split in groups, into dims that keep both
        dims = dims_attr(inst.attrs.get("dimensions"))
        if dims[:2] != (0, 1):
            return None
        attrs["dimensions"] = "{" + ",".join(["0", *(str(k - 1) for k in dims[2:])]) + "}"
    shape = inst.shape
    if shape.is_tuple:
        shape = Shape("tuple", elements=tuple(_flat_shape(e) for e in shape.elements))
    else:
        shape = _flat_shape(shape)
    flat_inst = dataclasses.replace(inst, shape=shape, attrs=attrs)
    value = handler(ev, flat_inst, flats, device)
    bounds.note(ev, flat_inst, flats, value)
    rows = _groups_rows(inst)
    outputs = value if isinstance(value, tuple) else (value,)
    for k, out in enumerate(outputs):
        if isinstance(out, Term) and out.shape[:1] == (rows,):
            ev.row_ops.setdefault(out, (flat_inst, flats, handler, device, k if isinstance(value, tuple) else None))
    return value


def _groups_rows(inst: Instruction) -> int:
    """G * T: the rows of an op's result split as [G, T, ...] (its first tuple element's)."""
    shape = inst.shape.elements[0] if inst.shape.is_tuple else inst.shape
    return shape.dims[0] * shape.dims[1]


def _flat_operand(ev: Builder, inst: Instruction, a: Term) -> Term | None:
    """An operand of a lifted op on the flat shape: its flat form, a constant reshaped, or a
    broadcast of a value that does not vary along the two split dims."""
    f = flat_of(ev, a)
    if f is not None:
        return f
    if len(a.shape) < 2:
        return None
    flat = _flat_shape(Shape(a.dtype, a.shape))
    if a.op == "bcast":
        parts = BcastSpec.parse(a.attrs[0]).parts
        if parts[0][0] == "n" and parts[1][0] == "n":
            kept = [(k, p) for k, p in enumerate(parts) if p[0] == "i"]
            dims = tuple(k - 1 for k, p in sorted(kept, key=lambda kp: kp[1][1]))
            return broadcast_term(ev, a.args[0], flat, dims)
    value = ev.folded(a)
    return None if value is None else ev.const(value.reshape(flat.dims), a.dtype)


def _by_group(
    ev: Builder, inst: Instruction, args: list[Term], handler: Callable, device: int, groups: int, per_group: int
) -> Term | None:
    """concat_g op'(y[g*T : (g+1)*T]): a windowed op whose window spans one group along G."""
    window = inst.attrs.get("window", "")
    fields = dict(f.split("=", 1) for f in window.strip("{}").split() if "=" in f)
    parts = {k: v.split("x") for k, v in fields.items()}
    if any(len(v) != len(inst.shape.dims) for v in parts.values()):
        return None
    if parts.get("size", ["1"])[0] != "1" or parts.get("pad", ["0_0"])[0] != "0_0":
        return None
    if any(parts.get(k, ["1"])[0] != "1" for k in ("stride", "lhs_dilate", "rhs_dilate")):
        return None
    x, *inits = args
    y = flat_of(ev, x)
    if y is None or any(i.shape for i in inits):
        return None
    fields = {k: "x".join(v[1:]) for k, v in parts.items()}
    attrs = {**inst.attrs, "window": "{" + " ".join(f"{k}={v}" for k, v in fields.items()) + "}"}
    group_inst = dataclasses.replace(inst, shape=Shape(inst.shape.dtype, inst.shape.dims[1:]), attrs=attrs)
    pieces = []
    for g in range(groups):
        rows = _rows(ev, y, g * per_group, (g + 1) * per_group)
        piece = handler(ev, group_inst, [rows, *inits], device)
        if not isinstance(piece, Term):
            return None
        pieces.append(piece)
    return ev.concat(pieces, 0)


def _flat_shape(shape: Shape) -> Shape:
    return Shape(shape.dtype, (shape.dims[0] * shape.dims[1], *shape.dims[2:]))


def _dot_by_group(ev: Builder, inst: Instruction, args: list, result: Term, handler: Callable, device: int) -> None:
    """A dot batched over the groups (dim 0 of both operands, both split in groups) is, group by
    group, the dot of the groups' rows: result = concat_g [dot'(x[g*T:(g+1)*T], y[g*T:(g+1)*T])]."""
    a = inst.attrs
    lb, rb = dims_attr(a.get("lhs_batch_dims")), dims_attr(a.get("rhs_batch_dims"))
    lc, rc = dims_attr(a.get("lhs_contracting_dims")), dims_attr(a.get("rhs_contracting_dims"))
    flats = [flat_of(ev, x) if isinstance(x, Term) else None for x in args]
    if lb[:1] != (0,) or rb[:1] != (0,) or any(f is None for f in flats):
        return
    lhs, rhs = args
    groups, per_group = lhs.shape[0], lhs.shape[1]
    if rhs.shape[:2] != (groups, per_group) or result.shape[:1] != (groups,):
        return
    attrs = {
        **a,
        "lhs_batch_dims": _dims([k - 1 for k in lb[1:]]),
        "rhs_batch_dims": _dims([k - 1 for k in rb[1:]]),
        "lhs_contracting_dims": _dims([k - 1 for k in lc]),
        "rhs_contracting_dims": _dims([k - 1 for k in rc]),
    }
    group_inst = dataclasses.replace(inst, shape=Shape(result.dtype, result.shape[1:]), attrs=attrs)
    pieces = []
    for g in range(groups):
        rows = [_rows(ev, f, g * per_group, (g + 1) * per_group) for f in flats if f is not None]
        piece = handler(ev, group_inst, rows, device)
        if not isinstance(piece, Term) or piece.shape != result.shape[1:]:
            return
        pieces.append(piece)
    # the groups' results side by side along the next dim: the result is that, split in groups
    flat = ev.concat(pieces, 0)
    if len(result.shape) < 2 or result.shape[1] < 2:
        return
    ev.regrouped[result] = flat
    ev.equal_terms.append([result, ev.reshape_term(flat, Shape(result.dtype, result.shape))])
    _note_pieces(ev, result, flat)


def _note_pieces(ev: Builder, result: Term, flat: Term) -> None:
    """result = reshape(flat, [G, ...]): the rows of flat a group's op made (a term of its own, what
    the device that holds the group computes) are result[g] read in row-major order."""
    groups = result.shape[0]
    size = flat.shape[0] // groups
    rest = tuple((0, n) for n in result.shape[1:])
    for g in range(groups):
        piece = ev.slice_term(flat, 0, g * size, (g + 1) * size)
        if piece.op != "slice":
            ev.boxes.setdefault(piece, (result, ((g, g + 1), *rest)))


def _rows(ev: Builder, y: Term, start: int, stop: int, memo: dict | None = None) -> Term:
    """y[start:stop], taken before a reshape of y that keeps its rows and before the lifted ops that
    made y (each acts row by row: the rows of op'(y) are op' on the rows of y), as the device that
    holds the rows computes them: the same terms on both sides."""
    memo = {} if memo is None else memo
    if y in memo:
        return memo[y]
    if y.op == "reshape" and y.args[0].shape[:1] == y.shape[:1]:
        rows = _rows(ev, y.args[0], start, stop, memo)
        found = ev.reshape_term(rows, Shape(y.dtype, (stop - start, *y.shape[1:])))
    else:
        window = ev.slice_term(y, 0, start, stop)
        pushed = _op_rows(ev, y, start, stop, memo) or _elementwise_rows(ev, y, start, stop, memo)
        if pushed is not None and pushed is not window:
            ev.equal_terms.append([pushed, window])  # keeps the rows known as a window of y
        found = pushed or window
    memo[y] = found
    return found


def _elementwise_rows(ev: Builder, y: Term, start: int, stop: int, memo: dict) -> Term | None:
    """Rows of an elementwise op (built by a normal form rather than an op of the program) and of a
    broadcast that keeps or adds the leading dim: the op on the operands' rows."""
    n = y.shape[0]
    shape = Shape(y.dtype, (stop - start, *y.shape[1:]))
    if y.op in ("unary", "binary", "ternary") and all(a.shape == y.shape for a in y.args):
        return ev.normal(y.op, y.attrs, [_rows(ev, a, start, stop, memo) for a in y.args], shape)
    if y.op == "dot":  # rows of the lhs's leading free dim: the dot of those rows
        spec = DotSpec.parse(y.attrs[0])
        lhs, rhs = y.args
        if spec.lhs_batch or 0 in spec.lhs_contract or lhs.shape[:1] != (n,):
            return None
        return ev.normal("dot", y.attrs, [_rows(ev, lhs, start, stop, memo), rhs], shape)
    if y.op != "bcast":
        return None
    parts = BcastSpec.parse(y.attrs[0]).parts
    kept = sorted((p[1], k) for k, p in enumerate(parts) if p[0] == "i")
    dims = tuple(k for _, k in kept)
    if parts[0][0] == "n":  # constant along the rows
        return broadcast_term(ev, y.args[0], shape, dims)
    if dims[:1] == (0,) and y.args[0].shape[:1] == (n,):
        return broadcast_term(ev, _rows(ev, y.args[0], start, stop, memo), shape, dims)
    return None


def _op_rows(ev: Builder, y: Term, start: int, stop: int, memo: dict) -> Term | None:
    """The lifted op that made y, on rows [start, stop) of its operands."""
    if y not in ev.row_ops:
        return None
    inst, operands, handler, device, k = ev.row_ops[y]
    n = y.shape[0]
    args = [_rows(ev, a, start, stop, memo) if a.shape[:1] == (n,) else a for a in operands]
    shapes = inst.shape.elements if inst.shape.is_tuple else (inst.shape,)
    cut = tuple(Shape(s.dtype, (stop - start, *s.dims[1:])) for s in shapes)
    shape = Shape("tuple", elements=cut) if inst.shape.is_tuple else cut[0]
    rows_inst = dataclasses.replace(inst, shape=shape)
    value = handler(ev, rows_inst, args, device)
    bounds.note(ev, rows_inst, args, value)
    out = value[k] if k is not None and isinstance(value, tuple) else value
    return out if isinstance(out, Term) and out.shape == (stop - start, *y.shape[1:]) else None


def _dims(dims: list[int]) -> str:
    return "{" + ",".join(map(str, dims)) + "}"


def _splits_lead(before: tuple[int, ...], after: tuple[int, ...]) -> bool:
    return (
        len(after) == len(before) + 1
        and after[2:] == before[1:]
        and after[0] * after[1] == before[0]
        and after[0] > 1
        and after[1] > 1
    )
