"""Translate an HLO module into terms over the reference inputs, one copy per device.

The per-device (SPMD) program is evaluated for every device in lock step, so collectives become
plain terms over the other devices' values (all-reduce: a sum in group order, all-gather: a
concatenation, collective-permute: the source device's value). Everything that depends only on
the device index (partition-id arithmetic, dynamic-slice offsets) is folded to constants here,
which turns `dynamic_slice(w, axis_index * k)` into a static slice of the reference input.
Ops without a model become `opaque` terms: equal only to the same op on equal arguments.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from fractions import Fraction
from typing import Protocol

import numpy as np

from equivci.hlo.collectives import UnsupportedGroups, parse_groups, parse_pairs
from equivci.hlo.ir import Computation, Instruction, Module, Shape
from equivci.terms.ir import Term, TermTable, gather_map, reduce_pair_map
from equivci.terms.spec import (
    AlignedMap,
    BcastSpec,
    DotSpec,
    GatherDims,
    ReduceSpec,
    bcast_spec,
    compare_text,
    parse_compare,
    parse_transpose,
    reshape_spec,
    transpose_text,
)
from equivci.translate import masks
from equivci.translate.constants import ConstantPool, Window

UNARY = {
    "abs",
    "ceil",
    "cos",
    "exp",
    "exponential",
    "exponential-minus-one",
    "floor",
    "log",
    "log-plus-one",
    "logistic",
    "negate",
    "not",
    "rsqrt",
    "sign",
    "sine",
    "cosine",
    "sqrt",
    "tanh",
    "erf",
    "cbrt",
    "round-nearest-even",
    "round-nearest-afz",
    "is-finite",
    "tan",
    "popcnt",
    "real",
    "imag",
}
BINARY = {
    "add",
    "subtract",
    "multiply",
    "divide",
    "maximum",
    "minimum",
    "power",
    "remainder",
    "and",
    "or",
    "xor",
    "atan2",
    "shift-left",
    "shift-right-arithmetic",
    "shift-right-logical",
}
IDENTITY_CUSTOM_CALLS = {
    "Sharding",
    "SPMDFullToShardShape",
    "SPMDShardToFullShape",
    "xla.sdy.GlobalToLocalShape",
    "xla.sdy.LocalToGlobalShape",
    "xla.sdy.FuncResultSharding",
    "X64Combine",
    "LayoutConstraint",
}
# Ops whose elements are elements of their first operand.
BOUND_PRESERVING = {"reshape", "bitcast", "broadcast", "slice", "dynamic-slice", "transpose", "copy", "convert"}
REDUCERS = {"add": "add", "maximum": "maximum", "minimum": "minimum", "multiply": "multiply", "and": "and", "or": "or"}
# Float dtypes whose constants numpy holds exactly: constant scalar factors are pulled out of these.
SCALABLE = {"f16", "f32", "f64"}
# Folding constants bigger than this would copy weights-sized arrays around: keep them symbolic.
MAX_FOLD_ELEMENTS = 1 << 16
# Layout identities are checked on one label per element up to this many elements.
MAX_LABELS = 1 << 20

NP_DTYPES = {
    "f32": np.float32,
    "f64": np.float64,
    "f16": np.float16,
    "s32": np.int32,
    "s64": np.int64,
    "u32": np.uint32,
    "u64": np.uint64,
    "s8": np.int8,
    "u8": np.uint8,
    "s16": np.int16,
    "u16": np.uint16,
    "pred": np.bool_,
}


class Unsupported(Exception):
    """A construct the evaluator cannot translate faithfully; the caller answers `unproven`."""


@dataclasses.dataclass
class Event:
    """One evaluated instruction, kept in program order for localization."""

    inst: Instruction
    values: list  # per device: Term or tuple of Terms


def dims_attr(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    return tuple(int(x) for x in re.findall(r"-?\d+", text))


def semantic_attrs(inst: Instruction, module: Module) -> dict[str, str]:
    """The attributes that decide what `inst` computes: no metadata or shardings, and called
    computations by a name-free digest."""
    attrs = {k: v for k, v in inst.attrs.items() if k not in ("metadata", "frontend_attributes", "sharding")}
    for key in ("to_apply", "body", "condition", "calls", "comparator"):
        name = attrs.get(key, "").lstrip("%")
        if name in module.computations:
            attrs[key] = fingerprint(name, module)
    return attrs


@functools.lru_cache(maxsize=None)
def fingerprint(name: str, module: Module) -> str:
    """A name-free digest of a computation, for opaque ops that call one (sort, while, scatter)."""
    comp = module.computations[name]
    index = {inst.name: k for k, inst in enumerate(comp.instructions)}
    rows = [
        f"{inst.opcode}|{inst.shape}|{[index.get(o, o) for o in inst.operands]}|"
        f"{sorted(semantic_attrs(inst, module).items())}|{inst.is_root}"
        for inst in comp.instructions
    ]
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]


@dataclasses.dataclass
class Loop:
    """One evaluated `while`: its state before the first iteration and after the last, per device."""

    inst: Instruction
    init: list  # per device: tuple of Terms
    out: list  # per device: tuple of Terms


class LoopHandler(Protocol):
    def evaluate(self, evaluator: "Evaluator", inst: Instruction, init: list) -> list | None:
        """The per-device results of a `while`, or None to leave it opaque."""


class Evaluator:
    def __init__(self, module: Module, table: TermTable, num_devices: int):
        self.module = module
        self.table = table
        self.n = num_devices
        self.values: dict[Term, np.ndarray] = {}  # folded constant terms -> their value
        self.constants = ConstantPool()  # non-uniform constants, by content and as windows
        self.equal_terms: list[list[Term]] = []  # groups of terms known equal by evaluation
        self.bounds: dict[Term, tuple[float, float]] = {}  # integer terms -> [lo, hi] of their elements
        self.window_sums: dict[Term, tuple] = {}  # opaque reduce-window sums -> (sizes, padding)
        self.masked_rows: dict[Term, masks.MaskedRows] = {}  # window lookups -> the full table's rows
        # (gather index, size of the dim it indexes, the gather and the calls it is in, innermost first)
        self.index_uses: list[tuple[Term, int, tuple[Instruction, ...]]] = []
        self.calls: list[Instruction] = []  # the calls being evaluated, outermost first
        self.events: list[Event] = []
        self.loops: list[Loop] = []
        self.loop_handler: LoopHandler | None = None
        # (term, target) pairs a proof must also show equal: what a loop handler assumed.
        self.obligations: list[tuple[Term, Term]] = []
        self.entry_args: list[list] | None = None  # per-device entry arguments, for re-runs
        # collective-permute name -> the source/target pairs to use instead (localization's what-ifs)
        self.pairs_override: dict[str, list[tuple[int, int]]] = {}

    def child(self, module: Module, num_devices: int) -> "Evaluator":
        """An evaluator with its own events that shares what is known about constants."""
        sub = Evaluator(module, self.table, num_devices)
        sub.values, sub.constants, sub.equal_terms = self.values, self.constants, self.equal_terms
        return sub

    def variant(self, pairs_override: dict[str, list[tuple[int, int]]]) -> list[list[Term]]:
        """The per-device entry results with some collective-permutes' pairs replaced.

        The same term table and constants are shared, so unchanged parts give the same terms.
        """
        other = Evaluator(self.module, self.table, self.n)
        other.values, other.constants, other.bounds = self.values, self.constants, self.bounds
        other.pairs_override = pairs_override
        return other.run(self.module.entry, self.entry_args)

    # -- constants ---------------------------------------------------------------------------
    def const(self, value: np.ndarray, dtype: str) -> Term:
        value = np.asarray(value)
        if _uniform(value):
            scalar = self.table.make("const", (repr(value.flat[0].item()),), (), (), dtype)
            self.values[scalar] = np.asarray(value.flat[0])
            if value.ndim == 0:
                return scalar
            term = self.table.make("bcast", (bcast_spec(0, value.shape, ()),), (scalar,), value.shape, dtype)
        elif (term := self.constants.seen(value, dtype)) is None:
            windows = self.constants.windows(value, dtype)
            if windows:
                # Device-local tables (RoPE angles at a shard's positions, a mask's rows) are windows
                # of the reference's tables; saying so relates them. One that repeats along the dim
                # (a mask broadcast over heads) is every such window.
                slices = [self.window_term(w, value.shape, dtype) for w in windows]
                if len(slices) > 1:
                    self.equal_terms.append(slices)
                term = slices[0]
            else:
                digest = hashlib.sha256(value.tobytes()).hexdigest()[:16]
                term = self.table.make("const", (f"{digest}:{value.shape}",), (), value.shape, dtype)
            self.constants.add(term, value, dtype, source=not windows)
        self.values[term] = value
        return term

    def window_term(self, window: Window, shape: tuple[int, ...], dtype: str) -> Term:
        """The term of a constant pool window, laid out as `shape` (which differs in unit dims only)."""
        term = self.slice_term(window.source, window.dim, window.start, window.start + window.width)
        return self.reshape_term(term, Shape(dtype, shape)) if window.reshaped else term

    def folded(self, term: Term) -> np.ndarray | None:
        return self.values.get(term)

    # -- constant scalar factors ------------------------------------------------------------
    # A term times a constant scalar is kept as `multiply(base, broadcast(c))` with the factor
    # pulled out of dots, sums, slices and layout ops, and products of factors folded (exactly, as
    # rationals). Programs that scale at different places (a data-parallel mean: 1/64 on a shard,
    # then a halving pmean, against the reference's 1/128) then build the same term.
    def uniform(self, t: Term) -> Fraction | None:
        """The value of a constant whose elements are all one finite number."""
        value = self.folded(t)
        if value is None or value.size == 0 or not np.all(value == value.flat[0]) or not np.isfinite(value.flat[0]):
            return None
        return Fraction(float(value.flat[0]))

    def scale_of(self, t: Term) -> tuple[Fraction, Term]:
        """`t` as factor * base (factor 1 when there is none)."""
        if t.op == "binary" and t.attrs == ("multiply",) and t.dtype in SCALABLE and self.folded(t.args[0]) is None:
            factor = self.uniform(t.args[1])
            if factor is not None:
                return factor, t.args[0]
        return Fraction(1), t

    def scaled(self, base: Term, factor: Fraction) -> Term | None:
        """factor * base; None when the factor is not exactly a number of base's dtype."""
        if factor == 1:
            return base
        if base.dtype not in SCALABLE:
            return None
        scalar = np.asarray(float(factor), dtype=NP_DTYPES[base.dtype])
        if Fraction(float(scalar)) != factor:
            return None
        return self.table.make(
            "binary",
            ("multiply",),
            (base, self.const(np.broadcast_to(scalar, base.shape), base.dtype)),
            base.shape,
            base.dtype,
        )

    def plus_zero(self, inst: Instruction, ops: list[list]) -> list | None:
        """x + 0 as x, when every device adds zero: an accumulator that starts at zero (a loop over
        microbatches, unrolled) then carries the constant factors of its terms, and sums of them meet
        the reference's. (A device that adds a non-zero offset keeps the add on every device, so
        that localization compares the same op across devices.)"""
        if inst.opcode != "add" or len(ops) != 2:
            return None
        for k in (0, 1):
            others = ops[1 - k]
            if all(
                isinstance(v, Term)
                and isinstance(z, Term)
                and self.uniform(z) == 0
                and v.shape == inst.shape.dims
                and v.dtype == inst.shape.dtype
                for z, v in zip(ops[k], others)
            ):
                return others
        return None

    def factored(self, kind: str, attrs: tuple, args: list[Term], shape: Shape) -> Term | None:
        """The op with its operands' constant factors pulled in front, if any (else None)."""
        if kind == "ternary" and attrs == ("select",):
            return self.factored_select(args, shape)
        if shape.dtype not in SCALABLE or any(isinstance(a, tuple) or a.dtype != shape.dtype for a in args):
            return None
        op = attrs[0] if kind in ("binary", "reduce", "unary") else kind
        scales = [self.scale_of(a) for a in args]
        factors, bases = [f for f, _ in scales], [b for _, b in scales]
        if op == "multiply":
            for k in (0, 1):  # a constant operand joins the other's factor
                value = self.uniform(args[k])
                if value is not None:
                    return self.scaled(bases[1 - k], value * factors[1 - k])
            return (
                self.scaled(self.mk(kind, attrs, bases, shape), factors[0] * factors[1]) if factors != [1, 1] else None
            )
        if op == "divide":
            value = self.uniform(args[1])
            if value:
                return self.scaled(bases[0], factors[0] / value)
            numerator = self.uniform(args[0])
            if numerator and (numerator != 1 or factors[1] != 1):  # c / (f * x) = (c / f) * (1 / x)
                one = self.const(np.ones(shape.dims, NP_DTYPES[shape.dtype]), shape.dtype)
                return self.scaled(self.mk(kind, attrs, [one, bases[1]], shape), numerator / factors[1])
            return (
                self.scaled(self.mk(kind, attrs, [bases[0], args[1]], shape), factors[0]) if factors[0] != 1 else None
            )
        if op == "dot" and factors != [1, 1]:
            return self.scaled(self.mk(kind, attrs, bases, shape), factors[0] * factors[1])
        linear = (
            op in ("add", "subtract", "negate") or kind in ("concat", "transpose") or (kind == "reduce" and op == "add")
        )
        if linear and factors[0] != 1 and all(f == factors[0] for f in factors):
            return self.scaled(self.mk(kind, attrs, bases, shape), factors[0])
        if op in ("add", "subtract") and 1 not in factors and 0 not in factors:
            # f * a + g * b = f * (a + (g / f) * b) when g / f is exact: sums scaled alike up to one
            # ratio meet (a gradient's two terms, each with the loss's scale, in a shard's and the
            # whole batch's)
            second = self.scaled(bases[1], factors[1] / factors[0])
            if second is not None:
                return self.scaled(self.mk(kind, attrs, [bases[0], second], shape), factors[0])
        return None

    def factored_select(self, args: list[Term], shape: Shape) -> Term | None:
        """select(p, f * a, f * b) = f * select(p, a, b), a zero branch taking any factor (a
        gradient's guarded branch, select(s >= 0, c / s, 0), with the loss's scale in c)."""
        p, *branches = args
        if shape.dtype not in SCALABLE or any(b.dtype != shape.dtype for b in branches):
            return None
        scales = [(Fraction(0), b) if self.uniform(b) == 0 else self.scale_of(b) for b in branches]
        factors = {f for f, _ in scales if f != 0}
        if len(factors) != 1 or (factor := factors.pop()) == 1:
            return None
        bases = [base for _, base in scales]
        return self.scaled(self.mk("ternary", ("select",), (p, *bases), shape), factor)

    # -- term constructors -------------------------------------------------------------------
    def normal(self, kind: str, attrs: tuple, args, shape: Shape) -> Term:
        """The term in the normal form every evaluated op gets (constant factors in front), so a
        term built elsewhere (routing.py's dense terms) meets the reference's own."""
        return self.factored(kind, attrs, list(args), shape) or self.mk(kind, attrs, args, shape)

    def mk(self, op: str, attrs: tuple, args: tuple, shape: Shape) -> Term:
        return self.table.make(op, attrs, tuple(args), shape.dims, shape.dtype)

    def slice_term(self, x: Term, dim: int, start: int, stop: int) -> Term:
        if start == 0 and stop == x.shape[dim]:
            return x
        shape = list(x.shape)
        shape[dim] = stop - start
        value = self.folded(x)
        if value is not None:
            index = [slice(None)] * len(x.shape)
            index[dim] = slice(start, stop)
            window = value[tuple(index)]
            if _uniform(window):
                return self.const(window, x.dtype)
            # A window of a table the program made itself (a device's rows of a longer RoPE table)
            # that a constant known before it holds (the reference's table) is that constant's.
            moved = self.constants.older_windows(window, x.dtype, x) if x.op == "const" else []
            if moved:
                return self.window_term(moved[0], window.shape, x.dtype)
        factor, base = self.scale_of(x)
        if factor != 1 and (term := self.scaled(self.slice_term(base, dim, start, stop), factor)) is not None:
            return term
        if x.op == "slice" and x.attrs[0] == dim:  # compose, so slices stay one level deep per dim
            inner_start = x.attrs[1]
            return self.slice_term(x.args[0], dim, inner_start + start, inner_start + stop)
        term = self.table.make("slice", (dim, start, stop), (x,), tuple(shape), x.dtype)
        if value is not None:
            self.values[term] = window
        elif term not in self.bounds:
            # A window's elements are elements of the whole: a device's shard of the ids keeps the
            # bounds the reference's gathers give the ids (whatever made the window: an input's
            # placement, a collective, an HLO slice).
            self.bound(term, x)
        return term

    def slice_nd(self, x: Term, ranges) -> Term:
        for dim, (start, stop) in enumerate(ranges):
            x = self.slice_term(x, dim, start, stop)
        return x

    def concat(self, parts: list[Term], dim: int) -> Term:
        regathered = self.concat_of_reshapes(parts, dim)
        if regathered is not None:
            return regathered
        acc = parts[0]
        for p in parts[1:]:
            shape = list(acc.shape)
            shape[dim] += p.shape[dim]
            pair = (dim,), [acc, p], Shape(acc.dtype, tuple(shape))
            acc = self.factored("concat", *pair) or self.mk("concat", *pair)
        return acc

    def concat_of_reshapes(self, parts: list[Term], dim: int) -> Term | None:
        """concat(reshape(y_1), ..., reshape(y_n); dim) as reshape(concat(y_1, ..., y_n; k)) when that
        is the same layout: a flat FSDP shard all-gathered is the flattened gather of the shards.

        The layout identity is checked exactly, on labels (every element of the y's numbered), for
        each dim k along which the y's can be concatenated."""
        if len(parts) < 2 or any(p.op != "reshape" for p in parts):
            return None
        inner = [p.args[0] for p in parts]
        if len({len(y.shape) for y in inner}) != 1:
            return None
        rank = len(inner[0].shape)
        total = sum(int(np.prod(y.shape)) for y in inner)
        if total > MAX_LABELS:
            return None
        out_shape = list(parts[0].shape)
        out_shape[dim] = sum(p.shape[dim] for p in parts)
        for k in range(rank):
            if any(y.shape[:k] + y.shape[k + 1 :] != inner[0].shape[:k] + inner[0].shape[k + 1 :] for y in inner):
                continue
            whole = np.arange(total).reshape(*inner[0].shape[:k], -1, *inner[0].shape[k + 1 :])
            bounds = np.cumsum([0] + [y.shape[k] for y in inner])
            pieces = [np.take(whole, np.arange(lo, hi), axis=k) for lo, hi in zip(bounds[:-1], bounds[1:])]
            gathered = np.concatenate([piece.reshape(p.shape) for piece, p in zip(pieces, parts)], axis=dim)
            if np.array_equal(gathered, whole.reshape(out_shape)):
                return self.reshape_term(self.concat(inner, k), Shape(parts[0].dtype, tuple(out_shape)))
        return None

    def binary(self, op: str, a: Term, b: Term, dtype: str | None = None) -> Term:
        shape = Shape(dtype or a.dtype, a.shape)
        return self.factored("binary", (op,), [a, b], shape) or self.mk("binary", (op,), [a, b], shape)

    # -- evaluation --------------------------------------------------------------------------
    def run(self, comp: Computation, args: list[list]) -> list:
        """Evaluate `comp` on per-device argument lists; returns the per-device root values."""
        env: dict[str, list] = {}
        if comp is self.module.entry:
            self.entry_args = args
        params = {int(p.attrs["_number"]): p.name for p in comp.parameters()}
        for k, name in params.items():
            env[name] = args[k]
        for inst in comp.instructions:
            if inst.opcode == "parameter":
                continue
            operands = [_lookup(env, o) for o in inst.operands]
            env[inst.name] = self.eval(inst, operands)
            self.events.append(Event(inst, env[inst.name]))
        return env[comp.root.name]

    def called(self, inst: Instruction, key: str) -> Computation:
        return self.module.computations[inst.attrs[key].lstrip("%")]

    def reducer(self, inst: Instruction) -> str | None:
        comp = self.called(inst, "to_apply")
        root = comp.root
        params = {p.name for p in comp.parameters()}
        if len(comp.instructions) == 3 and root.opcode in REDUCERS and set(root.operands) == params:
            return REDUCERS[root.opcode]
        return None

    def eval(self, inst: Instruction, ops: list[list]) -> list:
        op = inst.opcode
        if op in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"):
            return self.collective(inst, ops)
        if op == "call":
            self.calls.append(inst)
            try:
                return self.run(self.called(inst, "to_apply"), ops)
            finally:
                self.calls.pop()
        if op == "while":
            return self.loop(inst, ops[0])
        if (kept := self.plus_zero(inst, ops)) is not None:
            return kept
        return [self.local(inst, [o[d] for o in ops], d) for d in range(self.n)]

    def loop(self, inst: Instruction, init: list) -> list:
        out = self.loop_handler.evaluate(self, inst, init) if self.loop_handler is not None else None
        if out is None:
            out = [self.opaque(inst, [init[d]]) for d in range(self.n)]
        self.loops.append(Loop(inst, init, out))
        return out

    def local(self, inst: Instruction, args: list, device: int):
        result = self.local_value(inst, args, device)
        if isinstance(result, Term) and inst.opcode in BOUND_PRESERVING and result not in self.bounds:
            self.bound(result, *[a for a in args[:1] if isinstance(a, Term)])
        if isinstance(result, Term) and inst.opcode == "select" and len(args) == 3 and result not in self.bounds:
            self.bound_select(result, *args)
        return result

    def local_value(self, inst: Instruction, args: list, device: int):
        op, shape, attrs = inst.opcode, inst.shape, inst.attrs
        if op == "constant":
            value = parse_literal(attrs["_literal"], shape)
            if value is not None:
                return self.const(value, shape.dtype)
            literal = attrs["_literal"]
            # An elided literal (`constant({...})`, as XLA prints large constants in dumps) says
            # nothing about its content: two of them must never be one term, so it is known only
            # as this instruction's own constant.
            key = f"elided:{inst.name}" if "..." in literal else hashlib.sha256(literal.encode()).hexdigest()[:16]
            return self.mk("const", (key,), (), shape)
        if op == "partition-id":
            return self.const(np.asarray(device, dtype=np.uint32), shape.dtype)
        if op == "replica-id":
            return self.const(np.asarray(0, dtype=np.uint32), shape.dtype)
        if op == "iota":
            dim = int(attrs["iota_dimension"])
            if np.prod(shape.dims) <= MAX_FOLD_ELEMENTS:
                ar = np.arange(shape.dims[dim]).reshape([-1 if k == dim else 1 for k in range(len(shape.dims))])
                return self.const(
                    np.broadcast_to(ar, shape.dims).astype(NP_DTYPES.get(shape.dtype, np.float32)), shape.dtype
                )
            return self.mk("iota", (dim,), (), shape)
        if op in ("copy", "opt-barrier") or (op == "custom-call" and _target(attrs) in IDENTITY_CUSTOM_CALLS):
            return args[0]
        if op == "tuple":
            return tuple(args)
        if op == "get-tuple-element":
            value = args[0]
            index = int(attrs["index"])
            if isinstance(value, tuple):
                return value[index]
            return self.mk("gte", (index,), (value,), shape)
        if op == "convert" or op == "bitcast-convert":
            if args[0].dtype == shape.dtype and op == "convert":
                return args[0]
            exact = op == "convert" and shape.dtype in NP_DTYPES  # bitcasts are not folded
            return self.fold_or(
                "unary", (op,), args, shape, lambda v: v.astype(NP_DTYPES[shape.dtype]) if exact else None
            )
        if (plain := self.without_guard(op, args)) is not None:
            return plain
        if op in UNARY:
            return self.fold_or("unary", (op,), args, shape, lambda v: _np_unary(op, v))
        if op in BINARY:
            return self.fold_or("binary", (op,), args, shape, lambda a, b: _np_binary(op, a, b, shape.dtype))
        if op == "compare":
            decided = self.decide(attrs["direction"], args[0], args[1], shape)
            if decided is not None:
                return decided
            name = compare_text(attrs["direction"], args[0].dtype)
            return self.fold_or("binary", (name,), args, shape, lambda a, b: _np_compare(attrs["direction"], a, b))
        if op == "select":
            chosen = self.select_by_constant(*args)
            if chosen is not None:
                return chosen
        if op in ("select", "clamp"):
            fn = (lambda p, a, b: np.where(p, a, b)) if op == "select" else (lambda lo, x, hi: np.clip(x, lo, hi))
            return self.fold_or("ternary", (op,), args, shape, fn)
        if op == "broadcast":
            return self.eval_broadcast(args[0], shape, dims_attr(attrs.get("dimensions")))
        if op in ("reshape", "bitcast"):
            if reshape_spec(args[0].shape, shape.dims) is None:
                return self.opaque(inst, args)
            return self.reshape_term(args[0], shape)
        if op == "transpose":
            perm = dims_attr(attrs.get("dimensions"))
            if perm == tuple(range(len(perm))):
                return args[0]
            value = self.folded(args[0])
            if value is not None:
                return self.const(value.transpose(perm), shape.dtype)
            attrs = (transpose_text(perm),)
            return self.factored("transpose", attrs, args, shape) or self.mk("transpose", attrs, args, shape)
        if op == "slice":
            ranges = re.findall(r"\[(-?\d+):(-?\d+)(?::(\d+))?\]", attrs["slice"])
            x = args[0]
            for dim, (a, b, step) in enumerate(ranges):
                if step not in ("", "1"):
                    strided = self.strided_slice(x, dim, int(a), int(b), int(step))
                    if strided is None:
                        return self.opaque(inst, args)
                    x = strided
            return self.slice_nd(
                x,
                [
                    (int(a), int(b)) if step in ("", "1") else (0, x.shape[dim])
                    for dim, (a, b, step) in enumerate(ranges)
                ],
            )
        if op == "dynamic-slice":
            sizes = dims_attr(attrs.get("dynamic_slice_sizes"))
            starts = [self.folded(a) for a in args[1:]]
            symbolic = [dim for dim, s in enumerate(starts) if s is None]
            if len(symbolic) > 1:
                return self.opaque(inst, args)
            x = args[0]
            ranges = []
            for dim, (s, size) in enumerate(zip(starts, sizes)):
                start = 0 if s is None else int(np.clip(int(s), 0, x.shape[dim] - size))  # HLO clamps starts
                ranges.append((start, start + size))
            if symbolic:
                dim = symbolic[0]
                x = self.dynamic_window(x, dim, args[1 + dim], sizes[dim])
                ranges[dim] = (0, sizes[dim])
            return self.slice_nd(x, ranges)
        if op == "dynamic-update-slice":
            return self.update_slice(inst, args)
        if op == "concatenate":
            dim = dims_attr(attrs.get("dimensions"))[0]
            values = [self.folded(a) for a in args]
            if all(v is not None for v in values):
                return self.const(np.concatenate(values, axis=dim), shape.dtype)
            return self.concat(list(args), dim)
        if op == "dot":
            return self.dot(inst, args)
        if op == "reduce":
            return self.reduce(inst, args)
        if op == "gather":
            return self.gather(inst, args)
        if op == "scatter" and (written := self.scatter_at_constants(inst, args)) is not None:
            return written
        if op == "scatter" and (added := self.scatter_add_per_row(inst, args)) is not None:
            return added
        if op == "scatter" and (added := self.scatter_add_windows(inst, args)) is not None:
            return added
        return self.opaque(inst, args)

    def strided_slice(self, x: Term, dim: int, start: int, stop: int, step: int) -> Term | None:
        """x[start:stop:step] along `dim` as windows of x with `dim` split into (n / step, step):
        element i of the result is x's start + i * step, row (start // step + i), column start % step.
        Interleaved RoPE's x[..., 1::2] is then a window like any other, which slices of the other
        dims pass through. None when step does not divide the dim."""
        n = x.shape[dim]
        count = len(range(start, stop, step))
        if n % step or count == 0:
            return None
        split = Shape(x.dtype, x.shape[:dim] + (n // step, step) + x.shape[dim + 1 :])
        grid = self.reshape_term(x, split)
        row, column = divmod(start, step)
        picked = self.slice_term(self.slice_term(grid, dim + 1, column, column + 1), dim, row, row + count)
        out = list(x.shape)
        out[dim] = count
        return self.reshape_term(picked, Shape(x.dtype, tuple(out)))

    def reshape_term(self, operand: Term, shape: Shape) -> Term:
        if operand.op == "reshape":  # a reshape of a reshape is one reshape
            operand = operand.args[0]
        if operand.shape == shape.dims:
            return operand
        value = self.folded(operand)
        if value is not None and (value.size <= 1 or _uniform(value)):
            return self.const(value.reshape(shape.dims), shape.dtype)
        factor, base = self.scale_of(operand)
        if factor != 1 and (term := self.scaled(self.reshape_term(base, shape), factor)) is not None:
            return term
        if value is None and (term := self.reshaped_window(operand, shape)) is not None:
            return term
        # Tables stay symbolic (a device's table is a window of the reference's); the value is
        # kept so that index arithmetic on it still folds.
        term = self.mk("reshape", (reshape_spec(operand.shape, shape.dims),), [operand], shape)
        if value is not None:
            self.values[term] = value.reshape(shape.dims)
        return term

    def reshaped_window(self, operand: Term, shape: Shape) -> Term | None:
        """reshape(slices and reshapes of y) as (a reshape of) one window of y, when it is one: a
        microbatch taken as reshape(x, (m, b, d))[k] is the rows x[k*b:(k+1)*b].

        Checked exactly on labels (every element of y numbered) through the chain of ops."""
        chain, base = [], operand
        while base.op in ("slice", "reshape") and len(chain) < 8:
            chain.append(base)
            base = base.args[0]
        if (
            not any(t.op == "reshape" for t in chain)
            or not any(t.op == "slice" for t in chain)
            or int(np.prod(base.shape)) > MAX_LABELS
        ):
            return None
        labels = np.arange(int(np.prod(base.shape))).reshape(base.shape)
        for t in reversed(chain):
            if t.op == "reshape":
                labels = labels.reshape(t.shape)
            else:
                dim, start, stop = t.attrs
                labels = np.take(labels, np.arange(start, stop), axis=dim)
        coords = np.unravel_index(labels.ravel(), base.shape)
        box = tuple((int(c.min()), int(c.max()) + 1) for c in coords) if labels.size else None
        if box is None or int(np.prod([b - a for a, b in box])) != labels.size:
            return None
        whole = np.arange(int(np.prod(base.shape))).reshape(base.shape)
        if not np.array_equal(whole[tuple(slice(a, b) for a, b in box)].ravel(), labels.ravel()):
            return None
        return self.reshape_term(self.slice_nd(base, box), shape)

    def eval_broadcast(self, operand: Term, shape: Shape, dims: tuple[int, ...]) -> Term:
        expanded = [i for i, o in enumerate(dims) if operand.shape[i] == 1 and shape.dims[o] != 1]
        if expanded:
            # HLO may stretch a size-1 operand dim; as terms that is: drop the dim, then broadcast
            # along a new one (a spec must not mean two output shapes).
            keep = [i for i in range(len(dims)) if i not in expanded]
            squeezed = Shape(operand.dtype, tuple(operand.shape[i] for i in keep))
            operand = self.reshape_term(operand, squeezed)
            dims = tuple(dims[i] for i in keep)
        if dims == tuple(range(len(shape.dims))) and operand.shape == shape.dims:
            return operand
        value = self.folded(operand)
        if value is not None and value.ndim == 0:
            return self.const(np.broadcast_to(value, shape.dims), shape.dtype)
        factor, base = self.scale_of(operand)
        if factor != 1 and (term := self.scaled(self.eval_broadcast(base, shape, dims), factor)) is not None:
            return term
        # A broadcast table stays a broadcast (the reference's and a device's differ only in the
        # sizes of new dims, which the rules relate); its value is kept for folding.
        term = self.mk("bcast", (bcast_spec(len(operand.shape), shape.dims, dims),), [operand], shape)
        if value is not None and np.prod(shape.dims) <= MAX_FOLD_ELEMENTS:
            expanded = value.reshape([value.shape[dims.index(o)] if o in dims else 1 for o in range(len(shape.dims))])
            self.values[term] = np.broadcast_to(expanded, shape.dims)
        return term

    def without_guard(self, op: str, args: list) -> Term | None:
        """The operand of an op that cannot change it (logsumexp's guards): max(x, -inf),
        min(x, inf), abs(x) of a non-negative x; and select(is_finite(x), x, c), which is x over
        the reals (the identities every rule is checked against)."""
        if op in ("maximum", "minimum"):
            neutral = -np.inf if op == "maximum" else np.inf
            for k in (0, 1):
                value = self.folded(args[k])
                if value is not None and value.size and np.all(value == neutral) and args[1 - k].shape == args[k].shape:
                    return args[1 - k]
        if op == "abs" and _nonnegative(args[0]):
            return args[0]
        if op == "select" and args[0].op == "unary" and args[0].attrs == ("is-finite",) and args[0].args[0] is args[1]:
            return args[1]
        return None

    def select_by_constant(self, p: Term, a: Term, b: Term) -> Term | None:
        """select(p, a, b) with p the same constant everywhere is one of its branches."""
        value = self.folded(p)
        if value is None or not _uniform(value):
            return None
        return a if bool(value.flat[0]) else b

    def dynamic_window(self, x: Term, dim: int, start: Term, size: int) -> Term:
        """`size` elements of `x` along `dim` from a start known only as a term (a loop counter)."""
        if size == x.shape[dim]:  # the start clamps to 0
            return x
        shape = list(x.shape)
        shape[dim] = size
        return self.mk("dslice", (dim, size), (x, start), Shape(x.dtype, tuple(shape)))

    def fold_or(self, kind: str, attrs: tuple, args: list, shape: Shape, fn) -> Term:
        values = [self.folded(a) for a in args]
        if all(v is not None for v in values) and np.prod(shape.dims) <= MAX_FOLD_ELEMENTS:
            try:
                with np.errstate(all="ignore"):
                    result = fn(*values)
            except (TypeError, ValueError, KeyError):
                result = None
            if result is not None:
                return self.const(np.asarray(result).astype(NP_DTYPES.get(shape.dtype, np.float32)), shape.dtype)
        return self.normal(kind, attrs, args, shape)

    def opaque(self, inst: Instruction, args: list) -> Term:
        attrs = semantic_attrs(inst, self.module)
        if inst.opcode == "custom-call":
            attrs.pop("custom_call_has_side_effect", None)
        key = f"{inst.opcode}|{sorted(attrs.items())}|{inst.shape}"
        flat = [a for arg in args for a in (arg if isinstance(arg, tuple) else (arg,))]
        shape = inst.shape if not inst.shape.is_tuple else Shape("tuple")
        term = self.mk("opaque", (key,), flat, shape)
        if inst.opcode == "reduce-window":
            self.note_window_sum(inst, args, term)
        if inst.shape.is_tuple:
            return tuple(self.mk("gte", (k,), (term,), e) for k, e in enumerate(inst.shape.elements))
        return term

    def note_window_sum(self, inst: Instruction, args: list, term: Term) -> None:
        """Remember a windowed sum (cumsum) with unit strides, so that `numeric` can compute it."""
        init = self.folded(args[1]) if len(args) == 2 else None
        window = inst.attrs.get("window", "")
        fields = dict(f.split("=", 1) for f in window.strip("{}").split() if "=" in f)
        if (
            self.reducer(inst) != "add"
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
            self.window_sums[term] = (sizes, pads)

    def numeric(self, t: Term, args: list[np.ndarray]) -> np.ndarray | None:
        """The value of `t` from its operands' values, for the ops index arithmetic uses."""
        at = t.attrs
        with np.errstate(all="ignore"):
            if t.op == "bcast":
                pairs = BcastSpec.parse(at[0]).operand_dims()
                dims = tuple(o for o, _ in pairs)
                order = [k for _, k in pairs]
                x = np.transpose(args[0], order) if order else args[0]
                x = x.reshape([t.shape[o] if o in dims else 1 for o in range(len(t.shape))])
                return np.broadcast_to(x, t.shape)
            if t.op == "reshape":
                return args[0].reshape(t.shape)
            if t.op == "transpose":
                return np.transpose(args[0], list(parse_transpose(at[0])))
            if t.op == "slice":
                index = [slice(None)] * len(t.shape)
                index[at[0]] = slice(at[1], at[2])
                return args[0][tuple(index)]
            if t.op == "concat":
                return np.concatenate(args, axis=at[0])
            if t.op == "unary" and at[0] == "convert" and t.dtype in NP_DTYPES:
                return args[0].astype(NP_DTYPES[t.dtype])
            if t.op == "unary":
                return _np_unary(at[0], args[0])
            compare = parse_compare(at[0]) if t.op == "binary" else None
            if compare is not None:
                return _np_compare(compare[0], *args)
            if t.op == "binary":
                return _np_binary(at[0], args[0], args[1], t.dtype)
            if t.op == "ternary" and at[0] == "select":
                return np.where(*args)
            if t.op == "opaque" and t in self.window_sums:
                sizes, pads = self.window_sums[t]
                x = np.pad(args[0], pads)
                view = np.lib.stride_tricks.sliding_window_view(x, sizes)
                return view.sum(axis=tuple(range(-len(sizes), 0))).astype(args[0].dtype)
        return None

    def update_slice(self, inst: Instruction, args: list) -> Term:
        x, update, *idx = args
        starts = [self.folded(a) for a in idx]
        symbolic = [d for d, s in enumerate(starts) if s is None]
        if symbolic:
            # One start known only as a term, the update whole along every other dim (a scan
            # writing its per-iteration output): the other starts clamp to 0.
            dim = symbolic[0]
            if len(symbolic) > 1 or any(update.shape[d] != x.shape[d] for d in range(len(x.shape)) if d != dim):
                return self.opaque(inst, args)
            if update.shape == x.shape:
                return update
            return self.mk("dupdate", (dim,), (x, update, idx[dim]), Shape(x.dtype, x.shape))
        starts = [int(np.clip(int(s), 0, n - u)) for s, n, u in zip(starts, x.shape, update.shape)]
        return self.write_window(x, update, starts)

    def scatter_at_constants(self, inst: Instruction, args: list) -> Term | None:
        """A scatter that overwrites or adds, at indices known as constants, into windows that do not
        overlap: the operand with those windows replaced (`outs.at[k].set(y)` at an unrolled loop's
        step k) or increased (the gradient of a gather at a constant index). An index vector whose
        window leaves the operand writes nothing (XLA skips it, no clamping)."""
        if len(args) != 3 or inst.shape.is_tuple:
            return None
        adds = self.reducer(inst) == "add"
        if not adds and not _overwrites(self.called(inst, "to_apply")):
            return None
        x, idx, update = args
        indices = self.folded(idx)
        attrs = inst.attrs
        if indices is None or attrs.get("input_batching_dims") or any(a.dtype != x.dtype for a in (update,)):
            return None
        vector_dim = int(attrs["index_vector_dim"])
        window_dims = dims_attr(attrs.get("update_window_dims"))
        inserted = dims_attr(attrs.get("inserted_window_dims"))
        to_operand = dims_attr(attrs.get("scatter_dims_to_operand_dims"))
        if vector_dim == indices.ndim:
            indices = indices[..., None]
        else:
            indices = np.moveaxis(indices, vector_dim, -1)
        if indices.shape[:-1] and int(np.prod(indices.shape[:-1])) > 64:
            return None
        scatter_dims = [d for d in range(len(update.shape)) if d not in window_dims]
        operand_window = [d for d in range(len(x.shape)) if d not in inserted]
        sizes = [1] * len(x.shape)
        for d, u in zip(operand_window, window_dims):
            sizes[d] = update.shape[u]
        boxes, result = [], x
        for pos in np.ndindex(*indices.shape[:-1]):
            starts = [0] * len(x.shape)
            for k, d in enumerate(to_operand):
                starts[d] = int(indices[pos][k])
            if any(s < 0 or s + n > full for s, n, full in zip(starts, sizes, x.shape)):
                continue
            box = [(s, s + n) for s, n in zip(starts, sizes)]
            if any(all(a < d and c < b for (a, b), (c, d) in zip(box, other)) for other in boxes):
                return None  # overlapping writes: which one wins is unspecified
            boxes.append(box)
            ranges = [(0, n) for n in update.shape]
            for d, p in zip(scatter_dims, pos):
                ranges[d] = (p, p + 1)
            piece = self.reshape_term(self.slice_nd(update, ranges), Shape(x.dtype, tuple(sizes)))
            if adds and self.uniform(here := self.slice_nd(x, box)) != 0:
                piece = self.binary("add", here, piece)
            result = self.write_window(result, piece, starts)
        return result

    def scatter_add_per_row(self, inst: Instruction, args: list) -> Term | None:
        """A scatter-add of one element per row at that row's own index along one dim (the gradient
        of take_along_axis: every other operand dim a batching dim): the operand plus an aligned
        map of (updates, indices) over the rows, so that a shard of the rows adds the shard."""
        if len(args) != 3 or inst.shape.is_tuple or self.reducer(inst) != "add":
            return None
        x, idx, update = args
        attrs = inst.attrs
        batch, idx_batch = (
            dims_attr(attrs.get("input_batching_dims")),
            dims_attr(attrs.get("scatter_indices_batching_dims")),
        )
        inserted, to_operand = (
            dims_attr(attrs.get("inserted_window_dims")),
            dims_attr(attrs.get("scatter_dims_to_operand_dims")),
        )
        vector_dim = int(attrs.get("index_vector_dim", len(idx.shape)))
        idx_dims = [j for j in range(len(idx.shape)) if j != vector_dim]
        if (
            dims_attr(attrs.get("update_window_dims"))
            or len(inserted) != 1
            or inserted != to_operand
            or sorted((*batch, *inserted)) != list(range(len(x.shape)))
            or (vector_dim < len(idx.shape) and idx.shape[vector_dim] != 1)
            or update.shape != tuple(idx.shape[j] for j in idx_dims)
            or any(idx.shape[j] != 1 for j in idx_dims if j not in idx_batch)
            or update.dtype != x.dtype
        ):
            return None
        # rows in the order of the indices' batching dims; the unit dims around them reshaped away
        rows = [j for j in idx_dims if j in idx_batch]
        out_of = {j: batch[idx_batch.index(j)] for j in rows}
        if [out_of[j] for j in rows] != sorted(out_of.values()):
            return None
        shape = tuple(idx.shape[j] for j in rows)
        update = self.reshape_term(update, Shape(update.dtype, shape))
        idx = self.reshape_term(idx, Shape(idx.dtype, shape))
        table = tuple((r, out_of[j]) for r, j in enumerate(rows))
        fixed = ((inserted[0], x.shape[inserted[0]]),)
        factor = self.uniform(update)
        if factor is not None and update.dtype in SCALABLE:
            # the same number c on every row: c times a function of the indices alone (their
            # shard's rows), c a constant factor like any other
            base, lhs = self.const(np.asarray(1, NP_DTYPES[update.dtype]), update.dtype), ()
        else:
            (factor, base), lhs = self.scale_of(update), table
        key = AlignedMap(lhs, table, fixed).key("scatter-add")
        added = self.scaled(self.mk("aligned", (key,), (base, idx), inst.shape), factor)
        if added is None:
            return None
        return added if self.uniform(x) == 0 else self.binary("add", x, added)

    def scatter_add_windows(self, inst: Instruction, args: list) -> Term | None:
        """A scatter-add of whole windows at one index per row along one dim (an embedding table's
        gradient: each token's row added at its id) is the update contracted over the rows with the
        rows' one-hot of the indices, dot(update, onehot(idx)): a sum over rows like any other, so a
        device's rows add their part (index outside the dim: nothing added, as HLO skips it)."""
        if len(args) != 3 or inst.shape.is_tuple or self.reducer(inst) != "add":
            return None
        x, idx, update = args
        attrs = inst.attrs
        window = dims_attr(attrs.get("update_window_dims"))
        inserted, to_operand = (
            dims_attr(attrs.get("inserted_window_dims")),
            dims_attr(attrs.get("scatter_dims_to_operand_dims")),
        )
        vector_dim = int(attrs.get("index_vector_dim", len(idx.shape)))
        if attrs.get("input_batching_dims") or len(to_operand) != 1 or inserted not in ((), to_operand):
            return None
        k = to_operand[0]
        rows = [u for u in range(len(update.shape)) if u not in window]
        kept = [d for d in range(len(x.shape)) if d not in inserted]  # the operand dims the window spans
        sizes = dict(zip(kept, (update.shape[u] for u in window)))
        if (
            (vector_dim < len(idx.shape) and idx.shape[vector_dim] != 1)
            or len(kept) != len(window)
            or sizes.get(k, 1) != 1
            or any(sizes[d] != x.shape[d] for d in kept if d != k)
            or [update.shape[u] for u in rows] != [idx.shape[j] for j in range(len(idx.shape)) if j != vector_dim]
            or update.dtype != x.dtype
            or update.dtype not in SCALABLE
        ):
            return None
        # the update without its unit window dim at k: [window dims except k..., rows...] in its own order
        free = [u for u, d in zip(window, kept) if d != k]
        update = self.reshape_term(update, Shape(update.dtype, tuple(update.shape[u] for u in sorted(free + rows))))
        position = {u: n for n, u in enumerate(sorted(free + rows))}
        row_shape = tuple(update.shape[position[u]] for u in rows)
        idx = self.reshape_term(idx, Shape(idx.dtype, row_shape))
        one = self.const(np.asarray(1, NP_DTYPES[update.dtype]), update.dtype)
        table = tuple((r, r) for r in range(len(rows)))
        key = AlignedMap((), table, ((len(rows), x.shape[k]),)).key("scatter-add")
        onehot = self.mk("aligned", (key,), (one, idx), Shape(update.dtype, (*row_shape, x.shape[k])))
        contract = tuple(position[u] for u in rows)
        spec = DotSpec(
            (), (), contract, tuple(range(len(rows))), len(update.shape), len(onehot.shape), (update.dtype,) * 2
        )
        # dot output: the free window dims in operand order, then the indexed dim
        out_dims = [d for d in range(len(x.shape)) if d != k] + [k]
        dot_shape = Shape(x.dtype, tuple(x.shape[d] for d in out_dims))
        added = self.normal("dot", (spec.text(),), [update, onehot], dot_shape)
        if out_dims != list(range(len(x.shape))):
            perm = tuple(out_dims.index(d) for d in range(len(x.shape)))
            added = self.normal("transpose", (transpose_text(perm),), [added], Shape(x.dtype, x.shape))
        return added if self.uniform(x) == 0 else self.binary("add", x, added)

    def write_window(self, x: Term, piece: Term, starts: list[int]) -> Term:
        """x with the block at `starts` replaced by `piece`: concatenations of x's windows and it."""
        differing = [d for d in range(len(x.shape)) if piece.shape[d] != x.shape[d]]
        if not differing:
            return piece
        d = differing[0]
        s, u = starts[d], piece.shape[d]
        band = (
            piece
            if differing == [d]
            else self.write_window(
                self.slice_term(x, d, s, s + u), piece, [0 if k == d else v for k, v in enumerate(starts)]
            )
        )
        # x's parts along d around the band (x may be earlier writes), so writes compose flat
        before, after, lo = [], [], 0
        for part in _parts_along(x, d):
            hi = lo + part.shape[d]
            if lo < s:
                before.append(self.slice_term(part, d, 0, min(hi, s) - lo))
            if hi > s + u:
                after.append(self.slice_term(part, d, max(lo, s + u) - lo, hi - lo))
            lo = hi
        return self.concat(self.merged(before + [band] + after, d), d)

    def merged(self, parts: list[Term], d: int) -> list[Term]:
        """Adjacent parts that are one window together joined: contiguous slices of one term along
        `d`, or constants of one value, so that writes in any order build the same concatenation."""
        out: list[Term] = []
        for part in parts:
            prev = out[-1] if out else None
            if (
                prev is not None
                and prev.op == part.op == "slice"
                and prev.args[0] is part.args[0]
                and prev.attrs[0] == part.attrs[0] == d
                and prev.attrs[2] == part.attrs[1]
            ):
                out[-1] = self.slice_term(part.args[0], d, prev.attrs[1], part.attrs[2])
                continue
            a, b = (self.uniform(prev), self.uniform(part)) if prev is not None else (None, None)
            if a is not None and a == b and prev is not None and prev.dtype == part.dtype:
                shape = list(part.shape)
                shape[d] += prev.shape[d]
                out[-1] = self.const(np.full(shape, self.folded(part).flat[0]), part.dtype)
                continue
            out.append(part)
        return out

    def dot(self, inst: Instruction, args: list) -> Term:
        a = inst.attrs
        lb, rb = dims_attr(a.get("lhs_batch_dims")), dims_attr(a.get("rhs_batch_dims"))
        lc, rc = dims_attr(a.get("lhs_contracting_dims")), dims_attr(a.get("rhs_contracting_dims"))
        lhs, rhs = args
        spec = DotSpec(lb, rb, lc, rc, len(lhs.shape), len(rhs.shape), (lhs.dtype, rhs.dtype)).text()
        return self.factored("dot", (spec,), args, inst.shape) or self.mk("dot", (spec,), args, inst.shape)

    def reduce(self, inst: Instruction, args: list) -> Term:
        reducer = self.reducer(inst)
        if len(args) == 4 and inst.shape.is_tuple:
            return self.reduce_pair(inst, args)
        if reducer is None or len(args) != 2:
            return self.opaque(inst, args)
        x, init = args
        init_value = self.folded(init)
        if init_value is None or not _is_identity(reducer, init_value):
            return self.opaque(inst, args)
        dims = dims_attr(inst.attrs.get("dimensions"))
        value = self.folded(x)
        if value is not None and reducer in ("and", "or"):  # masks of range checks fold away
            return self.const(
                np.all(value, axis=dims) if reducer == "and" else np.any(value, axis=dims), inst.shape.dtype
            )
        if all(x.shape[k] == 1 for k in dims) and x.dtype == inst.shape.dtype:
            # Each output element reduces one element with the identity: a reshape. (The transpose of
            # a broadcast through a unit dim, as in a bias's gradient, sums over it.)
            return self.reshape_term(x, inst.shape)
        key = ReduceSpec(len(x.shape), tuple(sorted(dims))).text()
        return self.factored("reduce", (reducer, key), [x], inst.shape) or self.mk(
            "reduce", (reducer, key), (x,), inst.shape
        )

    def reduce_pair(self, inst: Instruction, args: list) -> tuple:
        """A reduce of two operands at once (argmax, argmin): each output element depends only on
        the operands at the same kept index, so it is an aligned map over the kept dims."""
        x, y, *inits = args
        init_values = [self.folded(i) for i in inits]
        if any(v is None or v.ndim for v in init_values) or x.shape != y.shape:
            return self.opaque(inst, args)
        dims = dims_attr(inst.attrs.get("dimensions"))
        aligned = reduce_pair_map(len(x.shape), dims)
        op_key = (
            f"reduce2:{fingerprint(self.called(inst, 'to_apply').name, self.module)}:"
            f"{[v.item() for v in init_values]}:{len(x.shape)}:{sorted(dims)}"
        )
        out = tuple(
            self.mk("aligned", (aligned.key(f"{op_key}:{k}"),), (x, y), element)
            for k, element in enumerate(inst.shape.elements)
        )
        for k, term in enumerate(out):
            if self.picks_operand(inst, k):  # an argmax index is one of the operand's (or the init)
                self.bound(term, (x, y)[k], inits[k])
        return out

    def picks_operand(self, inst: Instruction, k: int) -> bool:
        """Whether output `k` of a two-operand reduce is always one of its two inputs: the reducer's
        result k is a select between its parameters k and k + 2."""
        comp = self.called(inst, "to_apply")
        root = comp.root
        by_name = {i.name: i for i in comp.instructions}
        if root.opcode != "tuple" or k >= len(root.operands):
            return False
        chosen = by_name.get(root.operands[k])
        if chosen is None or chosen.opcode != "select":
            return False
        numbers = {
            by_name[o].attrs.get("_number")
            for o in chosen.operands[1:]
            if o in by_name and by_name[o].opcode == "parameter"
        }
        return numbers == {str(k), str(k + 2)}

    # -- bounds of integer values (folds range checks such as a gather's index validation) ---------
    def bounds_of(self, term: Term) -> tuple[float, float] | None:
        value = self.folded(term)
        if value is not None and value.size and term.dtype[0] in "su":
            return float(value.min()), float(value.max())
        return self.bounds.get(term)

    def bound(self, term: Term, *sources: Term) -> None:
        """`term`'s elements are elements of `sources`."""
        found = [self.bounds_of(s) for s in sources]
        if all(b is not None for b in found):
            self._set_bounds(term, min(b[0] for b in found), max(b[1] for b in found))

    def bound_select(self, term: Term, p: Term, a: Term, b: Term) -> None:
        """select(p, a, b)'s elements are b's, or a's where p holds: a range test of a's own ids
        narrows a (where(ids in [lo, hi), ids - lo, 0) is in [0, hi - lo))."""
        chosen, other = masks.bounds_under_mask(self, p, a) or self.bounds_of(a), self.bounds_of(b)
        if chosen is not None and other is not None:
            self._set_bounds(term, min(chosen[0], other[0]), max(chosen[1], other[1]))

    def _set_bounds(self, term: Term, lo: float, hi: float) -> None:
        # Only where term's own dtype holds [lo, hi]: a narrowing convert (ids.astype(int8)) wraps
        # the values past its range, and bounds kept across it folded a `>= 0` test away (unsound).
        np_dtype = NP_DTYPES.get(term.dtype)
        if term.dtype[0] not in "su" or np_dtype is None or self.folded(term) is not None:
            return
        info = np.iinfo(np_dtype)
        if info.min <= lo and hi <= info.max:
            self.bounds[term] = (lo, hi)

    def index_domains(self) -> dict[Term, tuple[tuple[float, float], tuple[Instruction, ...]]]:
        """The entry parameters this program uses as gather indices (as they are, or with negative
        ones wrapped, as numpy indexing does), each with the valid indices [0, size - 1] (the
        smallest such range) and the gather that gives it (with its calls)."""
        domains: dict[Term, tuple[tuple[float, float], tuple[Instruction, ...]]] = {}
        for idx, size, inst in self.index_uses:
            p = self.unwrapped_index(idx, size)
            if p.op == "param" and p.dtype[0] in "su" and (p not in domains or size - 1 < domains[p][0][1]):
                domains[p] = ((0.0, float(size - 1)), inst)
        return domains

    def unwrapped_index(self, idx: Term, size: int) -> Term:
        """`idx` without reshapes and without the wrap select(i < 0, i + size, i) of negative indices."""
        while idx.op == "reshape":
            idx = idx.args[0]
        if idx.op == "ternary" and idx.attrs == ("select",):
            test, wrapped, i = idx.args
            if (
                test.op == "binary"
                and (parse_compare(test.attrs[0]) or ("",))[0] == "LT"
                and test.args[0] is i
                and masks.scalar_int(self, test.args[1]) == 0
                and wrapped.op == "binary"
                and wrapped.attrs == ("add",)
                and wrapped.args[0] is i
                and masks.scalar_int(self, wrapped.args[1]) == size
            ):
                return self.unwrapped_index(i, size)
        return idx

    def decide(self, direction: str, a: Term, b: Term, shape: Shape) -> Term | None:
        """A comparison that the bounds of its operands decide, as a constant."""
        ra, rb = self.bounds_of(a), self.bounds_of(b)
        if ra is None or rb is None:
            return None
        always = {
            "LT": ra[1] < rb[0],
            "LE": ra[1] <= rb[0],
            "GT": ra[0] > rb[1],
            "GE": ra[0] >= rb[1],
            "EQ": ra[0] == ra[1] == rb[0] == rb[1],
            "NE": ra[1] < rb[0] or ra[0] > rb[1],
        }
        never = {
            "LT": ra[0] >= rb[1],
            "LE": ra[0] > rb[1],
            "GT": ra[1] <= rb[0],
            "GE": ra[1] < rb[0],
            "EQ": ra[1] < rb[0] or ra[0] > rb[1],
            "NE": ra[0] == ra[1] == rb[0] == rb[1],
        }
        if direction not in always or not (always[direction] or never[direction]):
            return None
        return self.const(np.full(shape.dims, always[direction], dtype=np.bool_), shape.dtype)

    def gather(self, inst: Instruction, args: list) -> Term:
        """A gather is independent along its index dims (a batched gather also along the operand's
        batching dims): an aligned map. Unit index dims (take_along_axis keeps one) are reshaped
        away first, so that gathers of the same rows meet whatever their index layout."""
        x, idx = args
        attrs = semantic_attrs(inst, self.module)
        if attrs.get("indices_are_sorted", "false") != "false" or attrs.get("unique_indices", "false") != "false":
            return self.opaque(inst, args)
        dims = GatherDims.parse(attrs, len(idx.shape))
        if (window := self.gather_at_constant(x, idx, dims, inst.shape)) is not None:
            return window
        dims, kept_idx, kept_out = dims.without_unit_index_dims(idx.shape, len(inst.shape.dims))
        idx = self.reshape_term(idx, Shape(idx.dtype, tuple(idx.shape[j] for j in kept_idx)))
        out = Shape(inst.shape.dtype, tuple(inst.shape.dims[o] for o in kept_out))
        if len(dims.start_map) == 1:
            self.index_uses.append((idx, x.shape[dims.start_map[0]], (inst, *reversed(self.calls))))
        term = self.gather_term(x, idx, dims, out)
        if term is None:
            return self.opaque(inst, args)
        lookup = masks.masked_lookup(self, x, idx, dims, out)
        if lookup is not None:
            self.masked_rows[term] = lookup
        return self.reshape_term(term, inst.shape)

    def gather_at_constant(self, x: Term, idx: Term, dims: GatherDims, shape: Shape) -> Term | None:
        """A gather of one window at a start known as a constant (`y[..., 0]` written as a gather):
        that static window, clamped into the operand as HLO clamps it, its collapsed dims and the
        unit batch dims reshaped, since offset dims keep the operand's order."""
        indices = self.folded(idx)
        if indices is None or dims.operand_batch or x.dtype != shape.dtype:
            return None
        vectors = indices[..., None] if dims.vector_dim == indices.ndim else np.moveaxis(indices, dims.vector_dim, -1)
        if vectors.size != len(dims.start_map) or len(dims.slice_sizes) != len(x.shape):
            return None
        starts = [0] * len(x.shape)
        for k, start in zip(dims.start_map, vectors.reshape(-1)):
            starts[k] = min(max(int(start), 0), x.shape[k] - dims.slice_sizes[k])
        ranges = [(s, s + n) for s, n in zip(starts, dims.slice_sizes)]
        return self.reshape_term(self.slice_nd(x, ranges), shape)

    def gather_term(self, x: Term, idx: Term, dims: GatherDims, out: Shape) -> Term | None:
        aligned = gather_map(dims, len(x.shape), len(idx.shape), len(out.dims))
        if aligned is None:
            return None
        key = (aligned.key(dims.key()),)
        factor, base = self.scale_of(x)  # rows picked from a scaled value are the scaled rows
        if factor != 1 and (term := self.scaled(self.mk("aligned", key, (base, idx), out), factor)) is not None:
            return term
        return self.mk("aligned", key, (x, idx), out)

    # -- collectives -------------------------------------------------------------------------
    def collective(self, inst: Instruction, ops: list[list]) -> list:
        try:
            groups = parse_groups(inst.attrs.get("replica_groups"), self.n)
        except UnsupportedGroups as exc:
            raise Unsupported(f"replica groups {exc} of {inst.opcode} {inst.name}") from exc
        if inst.opcode == "collective-permute":
            pairs = self.pairs_override.get(inst.name) or parse_pairs(inst.attrs.get("source_target_pairs", ""))
            source = {t: s for s, t in pairs}
            out = []
            for d in range(self.n):
                if d in source:
                    out.append(ops[0][source[d]])
                else:
                    out.append(
                        self.const(
                            np.zeros(inst.shape.dims, NP_DTYPES.get(inst.shape.dtype, np.float32)), inst.shape.dtype
                        )
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
        out = []
        for d in range(self.n):
            group = group_of[d]
            pos = group.index(d)
            results = []
            for k in range(n_vals):
                members = [operand(k, g) for g in group]
                results.append(self.collective_value(inst, members, pos, shapes[k] if k < len(shapes) else shapes[0]))
            out.append(tuple(results) if tuple_valued and n_vals > 1 else results[0])
        return out

    def combine(self, reducer: str, members: list[Term]) -> Term:
        """The elementwise reduction of the members, in group order."""
        if reducer == "add" and 0 < len(nonzero := [m for m in members if self.uniform(m) != 0]) < len(members):
            members = nonzero  # devices that hold zeros add nothing (a pipeline's idle stages)
        inner = [m.args[0] for m in members if m.op == "reshape"]
        if len(inner) == len(members) > 1 and len({t.shape for t in inner}) == 1:
            # Reshaped alike (keepdims after a local reduction): reduce, then reshape once, so that
            # the reshape meets the reference's and a reshape of it composes away.
            return self.reshape_term(self.combine(reducer, inner), Shape(members[0].dtype, members[0].shape))
        tiled = masks.tiled_lookup(self, members) if reducer == "add" else masks.tiled_reduce(self, reducer, members)
        if tiled is not None:
            return tiled
        acc = members[0]
        for m in members[1:]:
            acc = self.fold_or(
                "binary",
                (reducer,),
                [acc, m],
                Shape(acc.dtype, acc.shape),
                lambda a, b: _np_binary(reducer, a, b, acc.dtype),
            )
        return acc

    def collective_value(self, inst: Instruction, members: list[Term], pos: int, shape: Shape) -> Term:
        op = inst.opcode
        if op in ("all-reduce", "reduce-scatter"):
            reducer = self.reducer(inst)
            if reducer is None:
                raise Unsupported(f"the reduction of {op} {inst.name} is not a single add/max/min/multiply")
            acc = self.combine(reducer, members)
            if op == "all-reduce":
                return acc
            dim = dims_attr(inst.attrs.get("dimensions"))[0]
            size = shape.dims[dim]
            return self.slice_term(acc, dim, pos * size, (pos + 1) * size)
        if op == "all-gather":
            dim = dims_attr(inst.attrs.get("dimensions"))[0]
            return self.concat(members, dim)
        if op == "all-to-all":
            dims = dims_attr(inst.attrs.get("dimensions"))
            if len(dims) != 1:
                raise Unsupported(f"tuple all-to-all {inst.name}")
            dim = dims[0]
            chunk = members[0].shape[dim] // len(members)
            return self.concat([self.slice_term(m, dim, pos * chunk, (pos + 1) * chunk) for m in members], dim)
        raise Unsupported(op)


def _parts_along(x: Term, dim: int) -> list[Term]:
    """The operands of nested concatenations along `dim`, in order (x itself when it is none)."""
    if x.op == "concat" and x.attrs[0] == dim:
        return [p for arg in x.args for p in _parts_along(arg, dim)]
    return [x]


def _overwrites(comp: Computation) -> bool:
    """A scatter combiner that returns the update (its second parameter)."""
    params = {int(p.attrs["_number"]): p.name for p in comp.parameters()}
    return len(params) == 2 and comp.root.opcode == "parameter" and comp.root.name == params.get(1)


def _lookup(env: dict[str, list], name: str) -> list:
    """Operand values; newer XLA prints tuple elements as `name#k` instead of get-tuple-element."""
    if name in env:
        return env[name]
    base, sep, index = name.rpartition("#")
    if not sep or base not in env:
        raise Unsupported(f"operand {name} is not defined before its use")
    return [v[int(index)] for v in env[base]]


def _nonnegative(t: Term) -> bool:
    """Whether every element of `t` is >= 0 (or NaN) by its form: exponentials, and sums,
    products and layout changes of such."""
    if t.op == "unary" and t.attrs[0] in ("exponential", "abs"):
        return True
    if (t.op == "binary" and t.attrs[0] in ("add", "multiply", "maximum")) or (
        t.op == "reduce" and t.attrs[0] in ("add", "multiply")
    ):
        return all(_nonnegative(a) for a in t.args)  # (an empty reduce-max would be -inf)
    return t.op in ("reshape", "bcast", "slice", "transpose", "concat") and all(_nonnegative(a) for a in t.args)


def _uniform(value: np.ndarray) -> bool:
    """All elements equal; NaN fills (a gather's out-of-range value) count as equal to each other."""
    return bool(value.size) and np.array_equal(value, np.full_like(value, value.flat[0]), equal_nan=True)


def _target(attrs: dict[str, str]) -> str:
    return attrs.get("custom_call_target", "").strip('"')


def _is_identity(reducer: str, value: np.ndarray) -> bool:
    v = value.item() if value.ndim == 0 else None
    if v is None:
        return False
    return {
        "add": v == 0,
        "multiply": v == 1,
        "maximum": v == float("-inf") or (isinstance(v, int) and v <= -(2**31)),
        "minimum": v == float("inf") or (isinstance(v, int) and v >= 2**31 - 1),
        "and": v is True or v == 1,
        "or": v is False or v == 0,
    }[reducer]


def parse_literal(text: str, shape: Shape) -> np.ndarray | None:
    if shape.is_tuple or shape.dtype not in NP_DTYPES or np.prod(shape.dims) > MAX_FOLD_ELEMENTS:
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


def _np_unary(op: str, v: np.ndarray):
    table = {
        "negate": np.negative,
        "abs": np.abs,
        "exponential": np.exp,
        "log": np.log,
        "sqrt": np.sqrt,
        "tanh": np.tanh,
        "not": lambda x: ~x if x.dtype != np.bool_ else np.logical_not(x),
        "sign": np.sign,
        "floor": np.floor,
        "ceil": np.ceil,
        "cosine": np.cos,
        "sine": np.sin,
        "rsqrt": lambda x: 1 / np.sqrt(x),
        "logistic": lambda x: 1 / (1 + np.exp(-x)),
        "exponential-minus-one": np.expm1,
        "log-plus-one": np.log1p,
    }
    return table[op](v) if op in table else None


def _np_binary(op: str, a, b, dtype: str):
    integer = dtype[0] in "su" or dtype == "pred"
    if op == "divide" and integer:
        return np.trunc(np.true_divide(a, b))
    if op == "remainder" and integer:
        return np.fmod(a, b)
    table = {
        "add": np.add,
        "subtract": np.subtract,
        "multiply": np.multiply,
        "divide": np.divide,
        "maximum": np.maximum,
        "minimum": np.minimum,
        "and": np.logical_and if dtype == "pred" else np.bitwise_and,
        "or": np.logical_or if dtype == "pred" else np.bitwise_or,
        "power": np.power,
        "remainder": np.fmod,
    }
    return table[op](a, b) if op in table else None


def _np_compare(direction: str, a, b):
    return {
        "EQ": np.equal,
        "NE": np.not_equal,
        "LT": np.less,
        "LE": np.less_equal,
        "GT": np.greater,
        "GE": np.greater_equal,
    }[direction](a, b)
