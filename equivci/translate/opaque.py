"""Ops without a model: an `opaque` term, equal only to the same op (same semantic attributes,
called computations by digest) on equal arguments. A windowed sum (cumsum) is remembered so that
the index arithmetic of routing can still compute it.
"""

from __future__ import annotations

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.translate.attributes import reducer_of, semantic_attrs
from equivci.translate.builder import Builder, Value


def opaque(ev: Builder, inst: Instruction, args: list) -> Value:
    attrs = semantic_attrs(inst, ev.module)
    if inst.opcode == "custom-call":
        attrs.pop("custom_call_has_side_effect", None)
    key = f"{inst.opcode}|{sorted(attrs.items())}|{inst.shape}"
    flat = [a for arg in args for a in (arg if isinstance(arg, tuple) else (arg,))]
    shape = inst.shape if not inst.shape.is_tuple else Shape("tuple")
    term = ev.mk("opaque", (key,), flat, shape)
    if inst.opcode == "reduce-window":
        note_window_sum(ev, inst, args, term)
    if inst.shape.is_tuple:
        return tuple(ev.mk("gte", (k,), (term,), e) for k, e in enumerate(inst.shape.elements))
    return term


def note_window_sum(ev: Builder, inst: Instruction, args: list, term: Term) -> None:
    """Remember a windowed sum (cumsum) with unit strides, so that `numeric` can compute it."""
    init = ev.folded(args[1]) if len(args) == 2 else None
    window = inst.attrs.get("window", "")
    fields = dict(f.split("=", 1) for f in window.strip("{}").split() if "=" in f)
    if (
        reducer_of(ev.module, inst) != "add"
        or init is None
        or init.ndim
        or init.item() != 0
        or set(fields) - {"size", "pad"}
    ):
        return
    sizes = [int(v) for v in fields["size"].split("x")]
    pads = (
        [tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x")]
        if "pad" in fields
        else [(0, 0)] * len(sizes)
    )
    if len(sizes) == len(pads) == len(args[0].shape):
        ev.window_sums[term] = (sizes, pads)
