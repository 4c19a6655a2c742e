"""Handlers of the ops that make constants: literals, iota, the device's partition id.

Whatever depends only on the device index is a constant here, so `dynamic_slice(w, axis_index * k)`
folds to a static slice of the reference input.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import BcastSpec, bcast_spec
from equivci.translate.builder import Builder


def constant(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    shape, attrs = inst.shape, inst.attrs
    value = parse_literal(attrs["_literal"], shape, ev.budgets.fold_elements)
    if value is not None:
        return ev.const(value, shape.dtype)
    if (scale := power_of_two_literal(attrs["_literal"], shape)) is not None:
        return ev.const(scale, shape.dtype)
    literal = attrs["_literal"]
    # An elided literal (`constant({...})`, as XLA prints large constants in dumps) says
    # nothing about its content: two of them must never be one term, so it is known only
    # as this instruction's own constant.
    key = f"elided:{inst.name}" if "..." in literal else hashlib.sha256(literal.encode()).hexdigest()[:16]
    return ev.mk("const", (key,), (), shape)


def power_of_two_literal(literal: str, shape: Shape) -> np.ndarray | None:
    """A bf16 scalar literal that is a power of two (or its negation), as that number (held in
    f32, as the convert of a splat holds bf16 numbers): every float dtype holds it exactly, and a
    product by it is exact, so that the builder can move it in front of the dot it scales
    (reductions.power_of_two_out). None for any other literal: numpy cannot round to bf16."""
    if shape.dtype != "bf16" or shape.dims:
        return None
    value = parse_literal(literal, Shape("f32", ()), 1)
    if value is None or not np.isfinite(value) or value == 0:
        return None
    mantissa, _ = np.frexp(np.abs(value))
    return value if mantissa == 0.5 else None


def partition_id(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    return ev.const(np.asarray(device, dtype=np.uint32), inst.shape.dtype)


def replica_id(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    return ev.const(np.asarray(0, dtype=np.uint32), inst.shape.dtype)


def iota(ev: Builder, inst: Instruction, args: list, device: int) -> Term:
    shape = inst.shape
    dim = int(inst.attrs["iota_dimension"])
    if np.prod(shape.dims) <= ev.budgets.fold_elements:
        ar = np.arange(shape.dims[dim]).reshape([-1 if k == dim else 1 for k in range(len(shape.dims))])
        return ev.const(np.broadcast_to(ar, shape.dims).astype(NP_DTYPES.get(shape.dtype, np.float32)), shape.dtype)
    term = ev.mk("iota", (dim,), (), shape)
    ev.constants.add_iota(term)
    return term


def positions(ev: Builder, shape: Shape, dim: int) -> Term:
    """Each element's position along `dim` in the one form a sort's positions (an argsort's iota,
    a top-k's indices) get, however they are written (a 1-D iota broadcast, an iota of the whole
    shape, a constant): the constant as `iota` folds it (the constant pool finds a device's rows
    of it a window of the reference's), or past the folding budget the 1-D line broadcast, as the
    broadcast handler builds it."""
    lane = np.arange(shape.dims[dim]).reshape([-1 if k == dim else 1 for k in range(len(shape.dims))])
    if np.prod(shape.dims) <= ev.budgets.fold_elements:
        return ev.const(np.broadcast_to(lane, shape.dims).astype(NP_DTYPES[shape.dtype]), shape.dtype)
    n = shape.dims[dim]
    line = (
        ev.const(np.arange(n).astype(NP_DTYPES[shape.dtype]), shape.dtype)
        if n <= ev.budgets.fold_elements
        else ev.mk("iota", (0,), (), Shape(shape.dtype, (n,)))
    )
    return ev.mk("bcast", (bcast_spec(1, shape.dims, (dim,)),), [line], shape)


def holds_positions(ev: Builder, y: Term, dim: int) -> bool:
    """Whether the integer term y holds each element's position along `dim`."""
    if y.dtype[0] not in "su":
        return False
    if y.op == "iota":
        return y.attrs == (dim,)
    if y.op == "bcast" and BcastSpec.parse(y.attrs[0]).operand_dims() == [(dim, 0)]:
        held = ev.folded(y.args[0])
        return y.args[0].op == "iota" or (held is not None and np.array_equal(held, np.arange(y.shape[dim])))
    value = ev.folded(y)
    if value is None:
        return False
    lane = np.arange(y.shape[dim]).reshape([-1 if k == dim else 1 for k in range(len(y.shape))])
    return bool(np.array_equal(value, np.broadcast_to(lane, y.shape)))


def parse_literal(text: str, shape: Shape, fold_elements: int) -> np.ndarray | None:
    if shape.is_tuple or shape.dtype not in NP_DTYPES or np.prod(shape.dims) > fold_elements:
        return None
    tokens = re.findall(r"-?inf|nan|true|false|-?[\d.]+(?:e[-+]?\d+)?", text.replace("{", " ").replace("}", " "))
    conv = {"true": 1, "false": 0, "inf": np.inf, "-inf": -np.inf, "nan": np.nan}
    try:
        flat = [conv[t] if t in conv else float(t) for t in tokens]
    except ValueError:
        return None
    if len(flat) != int(np.prod(shape.dims)):
        return None
    return np.asarray(flat).astype(NP_DTYPES[shape.dtype]).reshape(shape.dims)


HANDLERS = {"constant": constant, "partition-id": partition_id, "replica-id": replica_id, "iota": iota}
