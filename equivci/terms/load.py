"""Load Python terms into an e-graph: one handle per term (one table, not a `let` each), dimensions and static tables seeded.

The loader's own commands are built as egglog's bindings (equivci.terms.egg); `facts` takes
egglog-python facts from its callers, and `expr` gives a loaded term as an egglog-python expression."""

from __future__ import annotations

import contextlib
import math
from fractions import Fraction

from egglog import EGraph, i64

from equivci.hlo.ir import FLOATS
from equivci.terms import language as L
from equivci.terms.egg import Commands
from equivci.terms.ir import Term, bcast_form, inserted_unit_dims, read_unit_bcast, unit_squeezed
from equivci.terms.language import T, TList
from equivci.terms.spec import (
    AlignedMap,
    BcastSpec,
    DotSpec,
    ReduceSpec,
    ReshapeSpec,
    compose_bcast,
    parse_transpose,
    repeat_form,
    reshape_spec,
    swapped_dot,
    transpose_text,
)

_CONSTRUCTORS = (
    "param", "handle", "const", "iota", "slice", "concat", "unary", "binary", "ternary", "dot", "reduce", "bcast",
    "reshape", "transpose", "gte", "aligned", "dslice", "dupdate", "opaque",
)  # fmt: skip
_TABLES = (
    "dim", "dot_batch", "dot_batch_out", "dot_lhs_out", "dot_out_lhs", "dot_rhs_out", "dot_out_rhs", "dot_contract",
    "reduced", "reduce_out", "reduce_in", "bcast_out", "bcast_in", "bcast_new", "bcast_shrink", "repeat_dim",
    "repeat_count", "repeat_window", "aligned_lhs", "aligned_rhs", "aligned_rhs_alone", "aligned_fixed", "perm_out",
    "perm_in", "rs_lead_out", "rs_lead_in", "rs_in_tail", "rs_out_tail", "rs_fixed", "rs_inverse",
    "rs_narrow_in", "rs_narrow_out", "power_of_two_splat",
)  # fmt: skip
CALLABLES = {
    **{name: getattr(T, name) for name in _CONSTRUCTORS},
    "nil": TList.nil,
    "cons": TList.cons,
    **{name: getattr(L, name) for name in _TABLES},
}


class Loader:
    def __init__(self, egraph: EGraph):
        self.egraph = egraph
        self.egg = Commands(egraph, CALLABLES)
        self.exprs: dict[Term, int] = {}  # the loaded terms and their handle numbers
        self.facts: list = []  # egglog-python facts, registered at the next flush
        self._commands: list = []  # the loader's own (egglog bindings), run at the next flush
        self._handles: dict[int, T] = {}
        self._seeded_specs: set[tuple[str, str]] = set()
        self._bcasts: dict[tuple, set[str]] = {}
        self._reshape_peers: dict[tuple, dict[str, int]] = {}  # reshape specs by narrowing family -> size
        self._count = 0
        self._bulk = False
        self._depth: dict[Term, int] = {}
        self.depth = 0  # the longest chain of ops among the loaded terms

    def expr(self, term: Term) -> T:
        """The e-graph expression for `term`, loading it and its arguments on first use."""
        number = self.load(term)
        found = self._handles.get(number)
        if found is None:
            found = self._handles[number] = T.handle(i64(number))
        return found

    def load(self, term: Term) -> int:
        """The handle number of `term`, loading it and its arguments on first use."""
        stack = [term]
        while stack:
            t = stack[-1]
            if t in self.exprs:
                stack.pop()
                continue
            missing = [a for a in t.args if a not in self.exprs]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            self.exprs[t] = self._let(t)
            level = 1 + max((self._depth[a] for a in t.args), default=0)
            self._depth[t] = level
            self.depth = max(self.depth, level)
        return self.exprs[term]

    def _let(self, t: Term) -> int:
        egg = self.egg
        args = [egg.call("handle", self.exprs[a]) for a in t.args]
        op, at = t.op, t.attrs
        if op == "param":
            ex = egg.call("param", at[0])
        elif op == "const":
            ex = egg.call("const", f"{at[0]}:{t.shape}", t.dtype)
        elif op == "iota":
            ex = egg.call("iota", f"{at[0]}:{t.shape}:{t.dtype}")
        elif op == "slice":
            ex = egg.call("slice", args[0], at[0], at[1], at[2])
        elif op == "concat":
            ex = egg.call("concat", args[0], args[1], at[0])
        elif op == "unary":
            ex = egg.call("unary", f"{at[0]}:{t.dtype}", args[0])
        elif op == "binary":
            ex = egg.call("binary", at[0], args[0], args[1])
            for a, handle in zip(t.args, args):
                self._unit_bcast(a, handle)
        elif op == "ternary":
            ex = egg.call("ternary", at[0], args[0], args[1], args[2])
        elif op == "dot":
            key = f"{at[0]}>{t.dtype}"
            self._seed_dot(key, DotSpec.parse(at[0]))
            ex = egg.call("dot", key, args[0], args[1])
        elif op == "reduce":
            self._seed_reduce(at[1])
            ex = egg.call("reduce", at[0], at[1], args[0])
        elif op == "bcast":
            self._seed_bcast(at[0])
            ex = egg.call("bcast", at[0], args[0])
            inner = bcast_form(t.args[0])
            if inner is not None:  # a broadcast of a broadcast is one broadcast
                spec = compose_bcast(inner[0], at[0])
                self._seed_bcast(spec)
                operand = egg.call("handle", self.load(inner[1]))
                self._commands.append(egg.union(ex, egg.call("bcast", spec, operand)))
            squeezed = unit_squeezed(t)
            if squeezed is not None:  # kept size-1 dims are new dims of size 1 too
                self._seed_bcast(squeezed[0])
                operand = egg.call("handle", self.load(squeezed[1]))
                self._commands.append(egg.union(ex, egg.call("bcast", squeezed[0], operand)))
        elif op == "reshape":
            self._seed_reshape(at[0])
            ex = egg.call("reshape", at[0], args[0])
            alternative = reshape_spec(t.args[0].shape, t.shape, singletons=True)
            if alternative is not None and alternative != at[0]:
                self._seed_reshape(alternative)
                self._commands.append(egg.union(ex, egg.call("reshape", alternative, args[0])))
            if t.args[0].op == "bcast":
                self._seed_repeat(at[0], t.args[0].attrs[0])
            as_bcast = bcast_form(t)
            if as_bcast is not None:  # inserting size-1 dims is also a broadcast (relates to wider ones)
                self._seed_bcast(as_bcast[0])
                self._commands.append(egg.union(ex, egg.call("bcast", as_bcast[0], args[0])))
        elif op == "transpose":
            self._seed_transpose(at[0])
            ex = egg.call("transpose", at[0], args[0])
            perm = parse_transpose(at[0])
            swapped = self._swapped_windows(t.args[0], perm)
            if swapped is None:
                swapped = self._swapped_squeeze(t.args[0], perm)
            if swapped is not None:
                self._commands.append(egg.union(ex, swapped))
        elif op == "gte":
            ex = egg.call("gte", at[0], args[0])
        elif op == "aligned":
            key = f"{at[0]}>{t.dtype}"
            self._seed_aligned(key, at[0])
            ex = egg.call("aligned", key, args[0], args[1])
        elif op == "dslice":
            ex = egg.call("dslice", at[0], at[1], args[0], args[1])
        elif op == "dupdate":
            ex = egg.call("dupdate", at[0], args[0], args[1], args[2])
        elif op == "opaque":
            lst = egg.call("nil")
            for arg in reversed(args):
                lst = egg.call("cons", arg, lst)
            ex = egg.call("opaque", f"{at[0]}>{t.dtype}{t.shape}", lst)
        else:
            raise ValueError(f"unknown term op {op}")
        self._count += 1
        handle = egg.call("handle", self._count)
        bind = egg.union(handle, ex)
        if self._bulk:
            self._commands.append(bind)
        else:
            egg.run([bind])
        for k, size in enumerate(t.shape):
            self._commands.append(egg.set("dim", (handle, k), size))
        if _power_of_two_splat(t):
            self._commands.append(egg.row("power_of_two_splat", handle))
        return self._count

    def _unit_bcast(self, operand: Term, handle) -> None:
        """An elementwise operand read with size-1 dims is also the broadcast of its squeeze
        (ir.read_unit_bcast), so that a window of the other operand lifts past it. Only where that
        squeeze is loaded already (the reference's `b[i]`, which it broadcasts over its rows): the
        squeeze of a one-row window of the batch, new, lifts into a reshape of the whole batch
        whose windows the rules then multiply without end."""
        form = read_unit_bcast(operand) if bcast_form(operand) is None else None
        if form is None or form[1] not in self.exprs or not self._once("unit_bcast", str(self.exprs[operand])):
            return
        self._seed_bcast(form[0])
        squeezed = self.egg.call("handle", self.exprs[form[1]])
        self._commands.append(self.egg.union(handle, self.egg.call("bcast", form[0], squeezed)))

    def _swapped_windows(self, operand: Term, perm: tuple[int, ...]):
        """transpose(windows of dot(x, y), perm) as the same windows of the dot with its operands
        swapped, transposed once (_swapped_dot): a device's gate and up projections, windows of
        einsum("bsd,dtf->tbsf") moved back to [b, s, f], are windows of the reference's x @ w.
        None when `operand` is no (window of a) dot."""
        windows = []
        base = operand
        while base.op == "slice":
            windows.append(base.attrs)
            base = base.args[0]
        if base.op != "dot":
            return None
        expr = self._swapped_dot(base, perm)
        for dim, start, stop in reversed(windows):  # innermost first
            expr = self.egg.call("slice", expr, perm.index(dim), start, stop)
        return expr

    def _swapped_squeeze(self, operand: Term, perm: tuple[int, ...]):
        """transpose(squeeze(windows of dot(x, y)), perm) as the squeeze of the same windows of the
        dot with its operands swapped, transposed once more where that dot lays the kept dims out in
        another order than perm's (a squeeze only drops size-1 dims: moving them moves no element).
        `qkv[0]` of einsum("dthk,bsd->tbshk") moved to [b, s, h, k] is then a squeezed window of
        x @ w, which a device computes for its own slot and heads; Falcon's context, a value slot of
        einsum("bkgqs,bskd->bqkgd") read as dot(v, probs), is the transposed squeeze of a window of
        the device's dot(probs, v). None when `operand` is no squeeze of windows of a dot."""
        inner = operand.args[0] if operand.op == "reshape" else None
        units = inserted_unit_dims(operand.shape, inner.shape) if inner is not None else None
        base = inner
        while base is not None and base.op == "slice":
            base = base.args[0]
        if inner is None or units is None or base is None or base.op != "dot":
            return None
        back = swapped_dot(DotSpec.parse(base.attrs[0]), tuple(range(len(inner.shape))))[1]
        natural = tuple(sorted(range(len(back)), key=back.__getitem__))  # the swapped dot's dims
        kept = [k for k in range(len(inner.shape)) if k not in units]
        order = [k for k in natural if k not in units]  # the kept dims as the swapped dot lays them out
        residual = tuple(order.index(kept[p]) for p in perm)
        windows = self._swapped_windows(inner, natural)
        moved = tuple(inner.shape[k] for k in natural)
        squeezed = tuple(inner.shape[k] for k in order)
        forms = {
            s for s in (reshape_spec(moved, squeezed), reshape_spec(moved, squeezed, singletons=True)) if s is not None
        }
        exprs = []
        for spec in sorted(forms):
            self._seed_reshape(spec)
            exprs.append(self.egg.call("reshape", spec, windows))
        self._commands += [self.egg.union(exprs[0], e) for e in exprs[1:]]
        if residual == tuple(range(len(residual))):
            return exprs[0]
        # the kept dims in another order than perm's: the squeeze transposed once more
        text = transpose_text(residual)
        self._seed_transpose(text)
        return self.egg.call("transpose", text, exprs[0])

    def _swapped_dot(self, dot: Term, perm: tuple[int, ...]):
        """transpose(dot(x, y), perm) as the dot with its operands swapped, transposed once (or not
        at all): one program's attention context comes out of dot(v, probs), the other's out of
        dot(probs, v), each then transposed to [batch, seq, heads, head_dim]."""
        spec, composed = swapped_dot(DotSpec.parse(dot.attrs[0]), perm)
        key = f"{spec.text()}>{dot.dtype}"
        self._seed_dot(key, spec)
        x, y = (self.egg.call("handle", self.exprs[a]) for a in dot.args)
        swapped = self.egg.call("dot", key, y, x)
        if composed == tuple(range(len(composed))):
            return swapped
        text = transpose_text(composed)
        self._seed_transpose(text)
        return self.egg.call("transpose", text, swapped)

    @contextlib.contextmanager
    def bulk(self):
        """Load many terms with one egglog call at the end (flushes on exit)."""
        self._bulk = True
        try:
            yield self
        finally:
            self._bulk = False
            self.flush()

    def flush(self) -> None:
        if self._commands:
            self.egg.run(self._commands)
            self._commands = []
        if self.facts:
            self.egraph.register(*self.facts)
            self.facts = []

    # -- static tables -----------------------------------------------------------------------
    def _once(self, kind: str, spec: str) -> bool:
        if (kind, spec) in self._seeded_specs:
            return False
        self._seeded_specs.add((kind, spec))
        return True

    def _table(self, key: str, spec: str, k: int, v: int | str) -> None:
        self._commands.append(self.egg.set(key, (spec, k), v))

    def _seed_dot(self, spec: str, dot: DotSpec) -> None:
        if not self._once("dot", spec):
            return
        lb, rb, lc, rc, lr, rr = (
            dot.lhs_batch,
            dot.rhs_batch,
            dot.lhs_contract,
            dot.rhs_contract,
            dot.lhs_rank,
            dot.rhs_rank,
        )
        out = 0
        for i, jb in zip(lb, rb):
            self._table("dot_batch", spec, i, jb)
            self._table("dot_batch_out", spec, i, out)
            out += 1
        for i in range(lr):
            if i not in lb and i not in lc:
                self._table("dot_lhs_out", spec, i, out)
                self._table("dot_out_lhs", spec, out, i)
                out += 1
        for j in range(rr):
            if j not in rb and j not in rc:
                self._table("dot_rhs_out", spec, j, out)
                self._table("dot_out_rhs", spec, out, j)
                out += 1
        for i, j in zip(lc, rc):
            self._table("dot_contract", spec, i, j)

    def _seed_reduce(self, key: str) -> None:
        if not self._once("reduce", key):
            return
        reduce = ReduceSpec.parse(key)
        reduced = reduce.dims
        out = 0
        for k in range(reduce.rank):
            if k in reduced:
                self._commands.append(self.egg.row("reduced", key, k))
            else:
                self._table("reduce_out", key, k, out)
                self._table("reduce_in", key, out, k)
                out += 1

    def _seed_bcast(self, spec: str) -> None:
        """The tables of a broadcast spec that occurs in a loaded term, paired with its peers."""
        self._bcast_tables(spec)
        if not self._once("bcast_peer", spec):
            return
        # Slicing a new dim of a broadcast is the broadcast to the smaller size. Pair the specs
        # that occur and differ only in new-dim sizes, through every intermediate spec, so that
        # the rules can shrink one dim at a time (rules never invent a spec themselves). The
        # intermediate specs are not peers in turn: pairing them too closes over every mix of the
        # new-dim sizes of a layout (a backward pass: 512 specs became 71k).
        parts = BcastSpec.parse(spec).parts
        shape_key = tuple(p if p[0] == "i" else "n" for p in parts)
        peers = self._bcasts.setdefault(shape_key, set())
        for other in peers:
            self._pair_bcasts(parts, BcastSpec.parse(other).parts)
        peers.add(spec)

    def _bcast_tables(self, spec: str) -> None:
        if not self._once("bcast", spec):
            return
        for o, (kind, value) in enumerate(BcastSpec.parse(spec).parts):
            if kind == "i":
                self._table("bcast_out", spec, value, o)
                self._table("bcast_in", spec, o, value)
            else:
                self._table("bcast_new", spec, o, value)

    def _pair_bcasts(self, parts: tuple[tuple[str, int], ...], oparts: tuple[tuple[str, int], ...]) -> None:
        diff = [o for o in range(len(parts)) if parts[o] != oparts[o]]
        if len(diff) > 3:  # 2**len(diff) intermediate specs: keep the table small
            return
        for mask in range(1 << len(diff)):
            here = list(parts)
            for bit, o in enumerate(diff):
                if mask >> bit & 1:
                    here[o] = oparts[o]
            for o in diff:
                there = list(here)
                there[o] = oparts[o] if here[o] == parts[o] else parts[o]
                a, b = BcastSpec(tuple(here)).text(), BcastSpec(tuple(there)).text()
                if not self._once("bcast_shrink", f"{a}/{o}/{b}"):
                    continue
                self._bcast_tables(a)
                self._bcast_tables(b)
                self._commands.append(self.egg.set("bcast_shrink", (a, o, there[o][1]), b))

    def _seed_repeat(self, reshape: str, bcast: str) -> None:
        """The repeat tables of reshape(bcast(y)) when it is a jnp.repeat (the `repeats` rules fire
        only on these), and the windows inside a group of its count."""
        form = repeat_form(reshape, bcast)
        if form is None or not self._once("repeat", f"{reshape}/{bcast}"):
            return
        d, n = form
        self._commands.append(self.egg.set("repeat_dim", (reshape, bcast), d))
        self._commands.append(self.egg.set("repeat_count", (reshape, bcast), n))
        if self._once("repeat_window", str(n)):
            self._commands += [
                self.egg.row("repeat_window", n, width, c) for width in range(1, n + 1) for c in range(n - width + 1)
            ]

    def _seed_aligned(self, key: str, spec: str) -> None:
        if not self._once("aligned", key):
            return
        tables = AlignedMap.parse(spec)
        for k, o in tables.lhs:
            self._table("aligned_lhs", key, k, o)
        partnered = {o for _, o in tables.lhs}
        for k, o in tables.rhs:
            self._table("aligned_rhs", key, k, o)
            if o not in partnered:
                self._table("aligned_rhs_alone", key, k, o)
        for o, size in tables.fixed:
            self._table("aligned_fixed", key, o, size)

    def _seed_transpose(self, perm_text: str) -> None:
        if not self._once("transpose", perm_text):
            return
        perm = parse_transpose(perm_text)
        for o, k in enumerate(perm):
            self._table("perm_out", perm_text, k, o)
            self._table("perm_in", perm_text, o, k)

    def _seed_reshape(self, spec: str) -> None:
        if not self._once("reshape", spec):
            return
        leads, fixed = ReshapeSpec.parse(spec).tables()
        for k, o, pin, pout in leads:
            self._table("rs_lead_out", spec, k, o)
            self._table("rs_lead_in", spec, o, k)
            self._table("rs_in_tail", spec, k, pin)
            self._table("rs_out_tail", spec, k, pout)
        for o, size in fixed:
            self._table("rs_fixed", spec, o, size)
        self._commands.append(self.egg.set("rs_inverse", (spec,), ReshapeSpec.parse(spec).inverse().text()))
        # A narrower spec is only of use to the rules where it occurs (they never invent a spec):
        # pair the specs that occur and differ in one group's second size, not every smaller size
        # (a [1, V] merge of a vocabulary's 128,256 classes was 128,255 rows).
        for side in ("in", "out"):
            for p, size, family in ReshapeSpec.parse(spec).narrowings(side):
                peers = self._reshape_peers.setdefault(family, {})
                for other, other_size in peers.items():
                    if other_size < size:
                        self._commands.append(self.egg.set(f"rs_narrow_{side}", (spec, p, other_size), other))
                    elif size < other_size:
                        self._commands.append(self.egg.set(f"rs_narrow_{side}", (other, p, size), spec))
                peers[spec] = size


def _power_of_two_splat(t: Term) -> bool:
    """A float scalar constant that is ±2^k, or a broadcast of one (the builder's splats)."""
    if t.op == "bcast":
        t = t.args[0]
    if t.op != "const" or t.shape != () or t.dtype not in FLOATS:
        return False
    try:
        value = float(t.attrs[0])
    except ValueError:
        return False
    if value == 0 or not math.isfinite(value):
        return False
    numerator, denominator = Fraction(value).as_integer_ratio()
    return abs(numerator) & (abs(numerator) - 1) == 0 and denominator & (denominator - 1) == 0
