"""A numpy interpreter for `equivci.terms.ir.Term`: the reference semantics the rules are checked against.

`evaluate(term, params, consts)` computes the value of `term` given the values of the reference
inputs (`params`: param index -> array) and, optionally, of constant / opaque terms (`consts`:
Term -> array; the evaluator keeps these in `Builder.values`). Every op follows the HLO op it is
built from by the op handlers of equivci/translate/, and the attributes are decoded exactly the way the
loader and the rules read them:

* slice(dim, start, stop), concat(dim) of two operands;
* unary(op) / binary(op) / ternary(op) elementwise (ternary: select(pred, on_true, on_false),
  clamp(lo, x, hi) with scalar or full-shape bounds);
* dot(spec), spec = "lb|rb|lc|rc|lhs_rank|rhs_rank|dtypes" (HLO dot_general: output dims are the
  batch dims in lb order, then the lhs free dims, then the rhs free dims, each in operand order);
* reduce(reducer, "rank:d0,d1,..") over the listed operand dims, kept dims in operand order;
* bcast(spec), spec = comma list over output dims, "i<k>" = operand dim k, "n<size>" = new dim;
* reshape(spec): row-major reshape; the output shape is recomputed from the spec and the operand
  shape (group by group) and must equal the term's shape;
* transpose(perm), HLO semantics: output dim o is operand dim perm[o];
* aligned(key) of two operands: a batched HLO gather ("gather:<attrs>|tables") or, standing for any
  two-operand reduce, "argmax2:<dims>:<component>" (the max of x over dims, or y where x is first
  largest), or "scatter-add" of (updates or one scalar update, indices): zeros with each row's
  update added at its index along the one fixed dim. The rules read only the tables at the end of the key.
* dslice(dim, size) of (x, start) and dupdate(dim) of (x, update, start): HLO dynamic-slice and
  dynamic-update-slice along `dim` at an integer scalar start, clamped into range as in HLO.

Shapes are checked at every node, so an ill-typed term (e.g. one a rule built wrongly) fails loudly.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable

import numpy as np

from equivci.terms.ir import Term
from equivci.terms.spec import (
    AlignedMap,
    BcastSpec,
    DotSpec,
    GatherDims,
    ReduceSpec,
    ReshapeSpec,
    parse_compare,
    parse_transpose,
)


class TermEvalError(Exception):
    pass


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v != ""]


def _erf(v):
    return np.vectorize(math.erf, otypes=[np.float64])(v)


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "negate": np.negative,
    "abs": np.abs,
    "exponential": np.exp,
    "exp": np.exp,
    "exponential-minus-one": np.expm1,
    "log": np.log,
    "log-plus-one": np.log1p,
    "logistic": lambda v: 1.0 / (1.0 + np.exp(-v)),
    "sqrt": np.sqrt,
    "rsqrt": lambda v: 1.0 / np.sqrt(v),
    "cbrt": np.cbrt,
    "tanh": np.tanh,
    "sine": np.sin,
    "cosine": np.cos,
    "cos": np.cos,
    "tan": np.tan,
    "sign": np.sign,
    "floor": np.floor,
    "ceil": np.ceil,
    "round-nearest-even": np.rint,
    "round-nearest-afz": lambda v: np.sign(v) * np.floor(np.abs(v) + 0.5),
    "is-finite": np.isfinite,
    "erf": _erf,
    "not": lambda v: np.logical_not(v) if v.dtype == np.bool_ else ~v,
    "real": np.real,
    "imag": np.imag,
}


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind not in "iu":
        return np.divide(a, b)
    # HLO's integer divide truncates toward zero (numpy's // floors); x / 0 is all bits set (XLA CPU).
    safe = np.where(b == 0, 1, b)
    quotient = (np.abs(a) // np.abs(safe)) * (np.sign(a) * np.sign(safe))
    return np.where(b == 0, np.array(-1).astype(a.dtype), quotient).astype(a.dtype)


def _remainder(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind not in "iu":
        return np.fmod(a, b)
    # The sign of the dividend, as C's %; x % 0 is x (XLA CPU).
    return np.where(b == 0, a, np.fmod(a, np.where(b == 0, 1, b))).astype(a.dtype)


BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": _divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "power": np.power,
    "remainder": _remainder,
    "atan2": np.arctan2,
    "and": lambda a, b: np.logical_and(a, b) if a.dtype == np.bool_ else np.bitwise_and(a, b),
    "or": lambda a, b: np.logical_or(a, b) if a.dtype == np.bool_ else np.bitwise_or(a, b),
    "xor": lambda a, b: np.logical_xor(a, b) if a.dtype == np.bool_ else np.bitwise_xor(a, b),
    # re + i·im, in the complex dtype of the parts' precision (translate/complex_pairs.py)
    "complex": lambda a, b: (a + 1j * b).astype(np.result_type(a.dtype, np.complex64)),
}

COMPARE = {
    "EQ": np.equal,
    "NE": np.not_equal,
    "LT": np.less,
    "LE": np.less_equal,
    "GT": np.greater,
    "GE": np.greater_equal,
}

REDUCERS = {
    "add": np.add,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "multiply": np.multiply,
    "and": np.logical_and,
    "or": np.logical_or,
}


def apply(table: dict[str, Callable[..., np.ndarray]], name: str, *args: np.ndarray) -> np.ndarray | None:
    """`table[name](*args)`, or None for an op without a numpy model (the caller keeps it symbolic)."""
    fn = table.get(name)
    if fn is None:
        return None
    with np.errstate(all="ignore"):
        return fn(*args)


# The numpy dtype of each HLO element type that numpy has (one table for the semantics and translate/).
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


def dot_general(lhs: np.ndarray, rhs: np.ndarray, spec: str) -> np.ndarray:
    """HLO dot_general as the evaluator encodes it in the dot spec."""
    dot = DotSpec.parse(spec)
    lb, rb, lc, rc, lr, rr = (
        dot.lhs_batch,
        dot.rhs_batch,
        dot.lhs_contract,
        dot.rhs_contract,
        dot.lhs_rank,
        dot.rhs_rank,
    )
    if lhs.ndim != lr or rhs.ndim != rr or len(lb) != len(rb) or len(lc) != len(rc):
        raise TermEvalError(f"dot spec {spec} does not fit operands {lhs.shape} x {rhs.shape}")
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    lsub: list = [None] * lr
    rsub: list = [None] * rr
    out: list[str] = []
    for i, j in zip(lb, rb):
        ch = next(letters)
        lsub[i] = rsub[j] = ch
        out.append(ch)
    for i, j in zip(lc, rc):
        ch = next(letters)
        lsub[i] = rsub[j] = ch
    for i in range(lr):
        if lsub[i] is None:
            lsub[i] = next(letters)
            out.append(lsub[i])
    for j in range(rr):
        if rsub[j] is None:
            rsub[j] = next(letters)
            out.append(rsub[j])
    for i, j in list(zip(lb, rb)) + list(zip(lc, rc)):
        if lhs.shape[i] != rhs.shape[j]:
            raise TermEvalError(f"dot spec {spec}: lhs dim {i} ({lhs.shape[i]}) != rhs dim {j} ({rhs.shape[j]})")
    return np.einsum(f"{''.join(lsub)},{''.join(rsub)}->{''.join(out)}", lhs, rhs)


def broadcast(x: np.ndarray, spec: str, out_shape: tuple[int, ...]) -> np.ndarray:
    try:
        parts = BcastSpec.parse(spec).parts
    except ValueError:
        raise TermEvalError(f"bad bcast spec {spec}") from None
    if len(parts) != len(out_shape):
        raise TermEvalError(f"bcast spec {spec} has rank {len(parts)}, term has shape {out_shape}")
    operand_dims = []  # operand dim for each output dim that has one, in output order
    for o, (kind, value) in enumerate(parts):
        if kind == "i":
            if x.shape[value] != out_shape[o]:
                raise TermEvalError(
                    f"bcast {spec}: operand dim {value} ({x.shape[value]}) != output dim {o} ({out_shape[o]})"
                )
            operand_dims.append(value)
        elif value != out_shape[o]:
            raise TermEvalError(f"bcast {spec}: new dim {o} has size {out_shape[o]}")
    if sorted(operand_dims) != list(range(x.ndim)):
        raise TermEvalError(f"bcast {spec} does not use every operand dim of {x.shape}")
    moved = np.transpose(x, operand_dims) if x.ndim else x
    expanded = moved.reshape([out_shape[o] if kind == "i" else 1 for o, (kind, _) in enumerate(parts)])
    return np.broadcast_to(expanded, out_shape)


def reshape_out_shape(in_shape: tuple[int, ...], spec: str) -> tuple[int, ...]:
    """Output shape of reshape(spec) on an operand of `in_shape`, group by group as the rules read it."""
    out: list[int] = []
    i = 0
    for group in ReshapeSpec.parse(spec).groups:
        n_in, n_out = group.n_in, group.n_out
        in_tail_dims, out_tail_dims = list(group.in_tail), list(group.out_tail)
        dims = list(in_shape[i : i + n_in])
        if len(dims) != n_in or (n_in and dims[1:] != in_tail_dims):
            raise TermEvalError(f"reshape spec {spec} does not fit operand shape {in_shape}")
        i += n_in
        total = math.prod(dims)
        tail = math.prod(out_tail_dims)
        if n_out == 0:
            if total != 1:
                raise TermEvalError(f"reshape spec {spec}: group of {total} elements has no output dims")
            continue
        if total % tail:
            raise TermEvalError(f"reshape spec {spec}: {total} elements do not fit tail {out_tail_dims}")
        out.extend([total // tail, *out_tail_dims])
    if i != len(in_shape):
        raise TermEvalError(f"reshape spec {spec} does not cover operand shape {in_shape}")
    return tuple(out)


def evaluate(
    term: Term, params: dict[int, np.ndarray], consts: dict | None = None, memo: dict[int, np.ndarray] | None = None
) -> np.ndarray:
    """The value of `term`; `params` maps reference input index -> array. `memo` (id(term) ->
    value) carries values over calls that share subterms."""
    consts = consts or {}
    memo = {} if memo is None else memo
    stack = [term]
    while stack:
        t = stack[-1]
        if id(t) in memo:
            stack.pop()
            continue
        missing = [a for a in t.args if id(a) not in memo]
        if missing and t not in consts:
            stack.extend(missing)
            continue
        stack.pop()
        value = consts[t] if t in consts else _eval_one(t, [memo[id(a)] for a in t.args], params)
        value = np.asarray(value)
        if tuple(value.shape) != tuple(t.shape):
            raise TermEvalError(f"{t.op}{t.attrs}: value has shape {value.shape}, term says {t.shape}")
        memo[id(t)] = value
    return memo[id(term)]


def _eval_one(t: Term, args: list[np.ndarray], params: dict[int, np.ndarray]) -> np.ndarray:
    op, at = t.op, t.attrs
    if op == "param":
        return np.asarray(params[at[0]])
    if op == "const":
        if t.shape == ():
            try:
                value = ast.literal_eval(at[0])
            except (ValueError, SyntaxError):  # an opaque constant, known by a content key only
                raise TermEvalError(f"constant {at[0]} has no value to evaluate") from None
            return np.asarray(value, dtype=NP_DTYPES.get(t.dtype))
        raise TermEvalError(f"array constant {at[0]} needs its value in `consts`")
    if op == "iota":
        dim = at[0]
        ar = np.arange(t.shape[dim]).reshape([-1 if k == dim else 1 for k in range(len(t.shape))])
        return np.broadcast_to(ar, t.shape).astype(NP_DTYPES.get(t.dtype, np.float64))
    if op == "slice":
        dim, start, stop = at
        (x,) = args
        if not 0 <= start <= stop <= x.shape[dim]:
            raise TermEvalError(f"slice {at} out of range for shape {x.shape}")
        index = [slice(None)] * x.ndim
        index[dim] = slice(start, stop)
        return x[tuple(index)]
    if op == "concat":
        a, b = args
        return np.concatenate([a, b], axis=at[0])
    if op == "unary":
        name = at[0]
        (x,) = args
        if name in ("convert", "bitcast-convert"):
            return x.astype(NP_DTYPES[t.dtype]) if name == "convert" else x.view(NP_DTYPES[t.dtype])
        if name not in UNARY:
            raise TermEvalError(f"unary op {name} has no numpy model")
        with np.errstate(all="ignore"):
            return UNARY[name](x)
    if op == "binary":
        name = at[0]
        a, b = args
        if a.shape != b.shape:
            raise TermEvalError(f"binary {name} on shapes {a.shape} and {b.shape}")
        compare = parse_compare(name)
        if compare is not None:
            return COMPARE[compare[0]](a, b)
        if name not in BINARY:
            raise TermEvalError(f"binary op {name} has no numpy model")
        with np.errstate(all="ignore"):
            return BINARY[name](a, b)
    if op == "ternary":
        name = at[0]
        p, a, b = args
        if name == "select":
            if p.shape not in ((), a.shape) or a.shape != b.shape:
                raise TermEvalError(f"select on shapes {p.shape}, {a.shape}, {b.shape}")
            return np.where(p, a, b)
        if name == "clamp":
            lo, x, hi = args
            return np.minimum(np.maximum(x, lo), hi)
        raise TermEvalError(f"ternary op {name} has no numpy model")
    if op == "dot":
        return dot_general(args[0], args[1], at[0])
    if op == "reduce":
        reducer, key = at
        (x,) = args
        reduce = ReduceSpec.parse(key)
        if reduce.rank != x.ndim:
            raise TermEvalError(f"reduce key {key} on operand of rank {x.ndim}")
        return REDUCERS[reducer].reduce(x, axis=reduce.dims)
    if op == "bcast":
        return broadcast(args[0], at[0], t.shape)
    if op == "reshape":
        (x,) = args
        expected = reshape_out_shape(x.shape, at[0])
        if expected != tuple(t.shape):
            raise TermEvalError(f"reshape {at[0]} of {x.shape} gives {expected}, term says {t.shape}")
        return x.reshape(t.shape)
    if op == "transpose":
        perm = list(parse_transpose(at[0]))
        (x,) = args
        if sorted(perm) != list(range(x.ndim)):
            raise TermEvalError(f"transpose {perm} on rank {x.ndim}")
        return np.transpose(x, perm)
    if op == "aligned":
        op_key = AlignedMap.op_key(at[0])
        if op_key.startswith("gather:"):
            return gather(args[0], args[1], op_key, t.shape)
        if op_key.startswith("argmax2:"):
            return argmax2(args[0], args[1], op_key)
        if op_key.startswith("sort:"):
            return sort_lanes(args[0], args[1], op_key)
        if op_key == "scatter-add":
            return scatter_add_rows(args[0], args[1], AlignedMap.parse(at[0]), t.shape)
        raise TermEvalError(f"aligned op {op_key} has no numpy model")
    if op in ("dslice", "dupdate"):
        dim = at[0]
        x, start = args[0], args[-1]
        width = at[1] if op == "dslice" else args[1].shape[dim]
        if start.shape != () or start.dtype.kind not in "iu" or width > x.shape[dim]:
            raise TermEvalError(f"{op}{at}: start {start.dtype}{start.shape}, width {width} of {x.shape}")
        begin = int(np.clip(int(start), 0, x.shape[dim] - width))  # HLO clamps the start
        index = [slice(None)] * x.ndim
        index[dim] = slice(begin, begin + width)
        if op == "dslice":
            return x[tuple(index)]
        out = np.array(x, copy=True)
        out[tuple(index)] = args[1]
        return out
    raise TermEvalError(f"{op} terms have no numpy model (pass their value in `consts`)")


def gather(x: np.ndarray, idx: np.ndarray, op_key: str, out_shape: tuple[int, ...]) -> np.ndarray:
    """HLO gather, element by element (operand batching dims included); key: GatherDims.key()."""
    g = GatherDims.from_key(op_key)
    offset, collapsed, start_map = g.offset, g.collapsed, g.start_map
    op_batch, idx_batch, sizes, vector_dim = g.operand_batch, g.indices_batch, g.slice_sizes, g.vector_dim
    batch_out = [o for o in range(len(out_shape)) if o not in offset]
    idx_dims = [j for j in range(idx.ndim) if j != vector_dim]
    window = [k for k in range(x.ndim) if k not in collapsed and k not in op_batch]
    out = np.zeros(out_shape, dtype=x.dtype)
    for pos in np.ndindex(*out_shape):
        at_idx = dict(zip(idx_dims, (pos[o] for o in batch_out)))
        vec = (
            [idx[tuple(at_idx[j] if j != vector_dim else v for j in range(idx.ndim))] for v in range(len(start_map))]
            if vector_dim < idx.ndim
            else [idx[tuple(at_idx[j] for j in idx_dims)]]
        )
        start = [0] * x.ndim
        for v, k in zip(vec, start_map):
            start[k] = int(np.clip(int(v), 0, x.shape[k] - sizes[k]))
        for k, j in zip(op_batch, idx_batch):
            start[k] = at_idx[j]
        for k, o in zip(window, sorted(offset)):
            start[k] += pos[o]
        out[pos] = x[tuple(start)]
    return out


def scatter_add_rows(update: np.ndarray, idx: np.ndarray, tables: AlignedMap, out_shape) -> np.ndarray:
    """Zeros with each row's update added at that row's index along the one fixed dim; an index
    outside the dim adds nothing (HLO scatter skips it)."""
    ((dim, size),) = tables.fixed
    out = np.zeros(out_shape, dtype=update.dtype)
    update = np.broadcast_to(update, idx.shape)  # a scalar: the same update on every row
    for row in np.ndindex(*idx.shape):
        if 0 <= int(idx[row]) < size:
            pos = [0] * len(out_shape)
            for r, o in tables.rhs:
                pos[o] = row[r]
            pos[dim] = int(idx[row])
            out[tuple(pos)] += update[row]
    return out


def argmax2(x: np.ndarray, y: np.ndarray, op_key: str) -> np.ndarray:
    _, dims_text, component = op_key.split(":")
    dims = _ints(dims_text)
    kept = [k for k in range(x.ndim) if k not in dims]
    xs = np.transpose(x, kept + dims).reshape([x.shape[k] for k in kept] + [-1])
    ys = np.transpose(y, kept + dims).reshape(xs.shape)
    if component == "0":
        return xs.max(axis=-1)
    return np.take_along_axis(ys, xs.argmax(axis=-1)[..., None], axis=-1)[..., 0]


def sort_lanes(x: np.ndarray, y: np.ndarray, op_key: str) -> np.ndarray:
    """Output `index` of HLO's stable sort of (x, y) along `dim` by x (a comparator `compare(x0, x1)`
    with direction LT: ascending, GT: descending; ties keep their order). Key:
    sort:DIRECTION:dim:index (from Evaluator.sort)."""
    _, direction, dim_text, index = op_key.split(":")
    if direction not in ("LT", "GT"):
        raise TermEvalError(f"sort comparator {direction} has no numpy model")
    dim = int(dim_text)
    keys = np.moveaxis(x, dim, -1)
    if direction == "GT":  # descending and stable: ascending on the negated keys, exactly
        keys = -keys.astype(object) if keys.dtype.kind in "iu" else -keys
    perm = np.argsort(keys, axis=-1, kind="stable")
    chosen = np.moveaxis((x, y)[int(index)], dim, -1)
    return np.moveaxis(np.take_along_axis(chosen, perm, axis=-1), -1, dim)
