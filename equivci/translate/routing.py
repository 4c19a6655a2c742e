"""Expert-parallel routing: one-hot dispatch and combine, proved by tracking where rows go.

A mixture-of-experts layer sends each token to the device of its expert and back:

    buf  = dot(M, x)      M[t, e, c] = 1 when token t sits in slot c of expert e (one slot per token)
    ...  all_to_all, the expert's row-wise MLP with the weights of expert e, all_to_all back
    out  = dot(M, back)   contracting (e, c): token t gets the row of its slot

The reference computes every expert on every token (`dense[e, token]`) and picks the routed one
with a gather. Nothing here is matched by name; three facts are checked:

* the mask lemma, by enumeration: M is a function of one integer index vector `q` with known
  bounds, and for every value of `q` it is 0/1, token t has exactly one slot and that slot's
  expert is q[t], and no slot holds two tokens;
* row provenance: the value contracted with M at the combine holds, on every occupied slot
  (e, c) of this device, expert e applied to the token in that slot. Values are tracked as
  *routed*: row (a, b) holds slot `slots[a, b]` = (device, e, c), and equals row (token of the
  slot) of a dense term over all devices' tokens (at `ex[a, b]` along its expert dim, once an
  expert has been applied). Row-wise ops carry the dense term along, with the same op on the
  dense term; slices and concatenations along rows move the slot table; a matmul with the
  weights of expert j (a slice j of a stacked weight) is valid only when every row's slot has
  expert j, and becomes the batched matmul with the stacked weight;
* then out[t] = dense[q[t], token t] exactly (empty slots are multiplied by zero), which is a
  batched gather of the dense term: the equality handed to the prover.

Rows of empty slots are never constrained: the combine multiplies them by zero (over the reals).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term
from equivci.terms.semantics import NP_DTYPES
from equivci.terms.spec import DotSpec, GatherDims, swapped_dot
from equivci.translate.arrays import all_equal


@dataclasses.dataclass(frozen=True)
class Mask:
    """A verified dispatch mask on one device: dims (token, expert, slot) and its index term."""

    term: Term
    t: int
    e: int
    c: int
    index: Term


@dataclasses.dataclass(frozen=True)
class Routed:
    """Rows (a, b) of the value's first two dims hold slot slots[a, b] = (device, e, c)."""

    slots: np.ndarray  # (A, B, 3) int
    ex: np.ndarray | None  # (A, B) expert coordinate into `dense`, None before an expert ran
    dense: Term  # (.., tokens, ..): the value of every token (and expert)
    td: int  # token dim of `dense`
    ed: int | None  # expert dim of `dense`
    per_device: int  # tokens per device: device d's tokens are rows [d * per_device, ...) of `dense`
    masks: tuple[Term, ...]  # the dispatch mask of each device: slot (d, e, c) is masks[d][:, e, c]

    def rest(self) -> list[int]:
        """Dims of `dense` that line up with the value's dims after the two row dims."""
        return [k for k in range(len(self.dense.shape)) if k not in (self.td, self.ed)]


class Router:
    def __init__(self, evaluator, num_devices: int):
        self.ev = evaluator
        self.n = num_devices
        self.masks: dict[tuple[Term, int], Mask | None] = {}  # (term, token dim) -> the lemma's answer
        self.dispatched: dict[Term, Mask] = {}  # masks that dispatched tokens
        self.routed: dict[Term, Routed | None] = {}
        self.facts: list[tuple[Term, Term]] = []
        self.exempt: set[int] = set()  # ids of mask and routed terms (fine for localization)
        self.limits: list[str] = []  # dispatch masks the lemma did not enumerate, and why
        self._limited: set[tuple[int, ...]] = set()

    # -- driver ------------------------------------------------------------------------------
    def run(self, events) -> None:
        # a dot whose operand carries a constant factor is built as factor * dot (Builder.factored)
        dots = [
            e.values
            for e in events
            if len(e.values) == self.n
            and all(isinstance(v, Term) and self.ev.scale_of(v)[1].op == "dot" for v in e.values)
        ]
        for values in dots:
            self.dispatch(values)
        for values in dots:
            for dev, v in enumerate(values):
                self.combine(v, dev)
        # Routed values that are scaled (a gelu's 0.5) are values of the program too: exempt them.
        for event in events:
            for v in event.values:
                if isinstance(v, Term) and self.routed.get(self.ev.scale_of(v)[1]) is not None:
                    self.info(v)

    # -- the mask lemma ----------------------------------------------------------------------
    def mask(self, m: Term, t: int) -> Mask | None:
        if (m, t) not in self.masks:
            self.masks[(m, t)] = self._mask(m, t)
        return self.masks[(m, t)]

    def _mask(self, m: Term, t: int) -> Mask | None:
        # Past 12 tokens there are more index vectors than the lemma enumerates (unless all go to one
        # expert: no routing to check). Most 3-D dot operands are activations contracted over a
        # hidden dim, and walking their terms back through every layer cost 1.6 s at 405B shapes.
        if len(m.shape) != 3 or 2 ** m.shape[t] > self.ev.budgets.routing_cases:
            return None
        leaves = self.free_leaves(m)
        if leaves is None or len(leaves) != 1:
            return None
        (q,) = leaves
        bounds = self.ev.bounds_of(q)
        if bounds is None or q.shape != (m.shape[t],):
            return None
        lo, hi = int(bounds[0]), int(bounds[1])
        if (hi - lo + 1) ** q.shape[0] > self.ev.budgets.routing_cases:
            return None
        others = [k for k in range(3) if k != t]
        roles = [tuple(others), tuple(others[::-1])]  # which of the other dims is the expert's
        for case in itertools.product(range(lo, hi + 1), repeat=q.shape[0]):
            value: np.ndarray = np.asarray(case, dtype=NP_DTYPES.get(q.dtype, np.int64))
            mv = self.evaluate(m, {q: value})
            if mv is None or not np.all((mv == 0) | (mv == 1)):
                return None
            roles = [(e, c) for e, c in roles if _one_slot_each(np.transpose(mv, (t, e, c)), value)]
            if not roles:
                return None
        self.exempt.update(id(s) for s in self.subterms(m, q))
        return Mask(m, t, roles[0][0], roles[0][1], q)

    def note_limit(self, m: Term, t: int) -> None:
        """Say so when `m` looks like a dispatch mask (a function of one bounded index vector over its
        tokens) that has more index vectors than the lemma enumerates: routing of that size is
        left unproven, and the user should know it is the size, not a defect."""
        if (
            len(m.shape) != 3
            or m.shape in self._limited
            or int(np.prod(m.shape)) > self.ev.budgets.routing_limit_elements
        ):
            return
        leaves = self.free_leaves(m)
        if leaves is None or len(leaves) != 1:
            return
        (q,) = leaves
        bounds = self.ev.bounds_of(q)
        if bounds is None or q.shape != (m.shape[t],):
            return
        cases = (int(bounds[1]) - int(bounds[0]) + 1) ** q.shape[0]
        if cases <= self.ev.budgets.routing_cases:
            return
        self._limited.add(m.shape)
        self.limits.append(
            f"the routing lemma did not check the dispatch mask of shape {list(m.shape)}: its {q.shape[0]} tokens "
            f"take expert indices in [{int(bounds[0])}, {int(bounds[1])}], {cases:.3g} index vectors, and it "
            f"enumerates at most {self.ev.budgets.routing_cases}; expert-parallel routing is proved only up to that size "
            "(12 tokens per device with 2 experts, 6 with 4): verify a smaller configuration of the same code"
        )

    def free_leaves(self, m: Term) -> set[Term] | None:
        """The subterms `m` depends on that `evaluate` cannot compute (other than constants)."""
        leaves, stack, seen = set(), [m], set()
        while stack:
            t = stack.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            if self.ev.folded(t) is not None:
                continue
            if t.op in EVALUABLE or (t.op == "opaque" and t in self.ev.window_sums):
                stack.extend(t.args)
            else:
                leaves.add(t)
            if len(seen) > 2000:
                return None
        return leaves

    def subterms(self, m: Term, stop: Term) -> list[Term]:
        out, stack, seen = [], [m], set()
        while stack:
            t = stack.pop()
            if id(t) in seen or t is stop:
                continue
            seen.add(id(t))
            out.append(t)
            stack.extend(t.args)
        return out

    def evaluate(self, term: Term, env: dict[Term, np.ndarray]) -> np.ndarray | None:
        return evaluate(self.ev, term, env)

    # -- dispatch: buf = dot(M, x) -------------------------------------------------------------
    def dispatch(self, values: list[Term]) -> None:
        parts = []
        for dev, v in enumerate(values):
            spec = _dot_spec(v)
            if spec is None or spec.lb or len(spec.lc) != 1:
                return
            m, x = v.args
            mask = self.mask(m, spec.lc[0])
            if mask is None and spec.rc[0] == 0 and dev == 0:
                self.note_limit(m, spec.lc[0])
            if mask is None or spec.rc[0] != 0:
                return
            parts.append((dev, v, mask, x))
        xs = [x for _, _, _, x in parts]
        if any(x.shape != xs[0].shape for x in xs):
            return
        dense = self.ev.concat(xs, 0)  # every device's tokens, in device order
        tokens = xs[0].shape[0]
        masks = tuple(mask.term for _, _, mask, _ in parts)
        self.dispatched.update((mask.term, mask) for _, _, mask, _ in parts)
        for dev, v, mask, x in parts:
            free = [k for k in range(3) if k != mask.t]  # output row dims, in M's order
            grid = np.zeros((v.shape[0], v.shape[1], 3), dtype=np.int64)
            for a in range(v.shape[0]):
                for b in range(v.shape[1]):
                    pos = {free[0]: a, free[1]: b}
                    grid[a, b] = (dev, pos[mask.e], pos[mask.c])
            self.routed[v] = Routed(grid, None, dense, 0, None, tokens, masks)
            self.exempt.add(id(v))

    # -- routed values ---------------------------------------------------------------------------
    def info(self, term: Term) -> Routed | None:
        if term in self.routed:
            return self.routed[term]
        self.routed[term] = None  # no cycles in a DAG; guards re-entry
        found = self._info(term)
        self.routed[term] = found
        if found is not None:
            self.exempt.add(id(term))
        return found

    def _info(self, t: Term) -> Routed | None:
        if t.op == "slice" and t.attrs[0] in (0, 1):
            r = self.info(t.args[0])
            if r is None:
                return None
            d, a, b = t.attrs
            index = [slice(None)] * 2
            index[d] = slice(a, b)
            return dataclasses.replace(r, slots=r.slots[tuple(index)], ex=None if r.ex is None else r.ex[tuple(index)])
        if t.op == "concat" and t.attrs[0] in (0, 1):
            r1, r2 = self.info(t.args[0]), self.info(t.args[1])
            if r1 is None or r2 is None or not _same_dense(r1, r2):
                return None
            d = t.attrs[0]
            ex = None if r1.ex is None else np.concatenate([r1.ex, r2.ex], axis=d)
            return dataclasses.replace(r1, slots=np.concatenate([r1.slots, r2.slots], axis=d), ex=ex)
        if t.op == "unary":
            r = self.info(t.args[0])
            if r is None:
                return None
            return dataclasses.replace(
                r, dense=self.ev.normal("unary", t.attrs, (r.dense,), Shape(t.dtype, r.dense.shape))
            )
        if t.op == "binary":
            return self.binary(t)
        if t.op == "dot":
            return self.expert_dot(t)
        return None

    def binary(self, t: Term) -> Routed | None:
        a, b = t.args
        ra, rb = self.info(a), self.info(b)
        if ra is not None and rb is not None:
            # elementwise on rows that hold the same slots of two dense terms of one layout
            same_layout = (ra.td, ra.ed, ra.per_device, ra.dense.shape, ra.masks) == (
                rb.td,
                rb.ed,
                rb.per_device,
                rb.dense.shape,
                rb.masks,
            )
            if not same_layout or not np.array_equal(ra.slots, rb.slots) or not _same_ex(ra, rb):
                return None
            dense = self.ev.normal("binary", t.attrs, (ra.dense, rb.dense), Shape(t.dtype, ra.dense.shape))
            return dataclasses.replace(ra, dense=dense)
        # one operand routed, the other the same scalar everywhere
        r, other, routed_left = (ra, b, True) if ra is not None else (rb, a, False)
        value = self.ev.folded(other)
        if r is None or value is None or not all_equal(value):
            return None
        wide = self.ev.const(np.full(r.dense.shape, value.flat[0], dtype=value.dtype), other.dtype)
        args = (r.dense, wide) if routed_left else (wide, r.dense)
        return dataclasses.replace(r, dense=self.ev.normal("binary", t.attrs, args, Shape(t.dtype, r.dense.shape)))

    def expert_dot(self, t: Term) -> Routed | None:
        """dot(V, W): V routed (rows first, not contracted), W the weights of one expert."""
        spec = _dot_spec(t)
        v, w = t.args
        r = self.info(v)
        if spec is None or r is None or spec.lb or any(k < 2 for k in spec.lc):
            return None
        stacked = _stacked_slice(w)
        if stacked is None:
            return None
        weights, p, j = stacked
        experts = r.slots[..., 1]
        if r.ex is not None and not np.all(r.ex == experts):
            return None
        if not np.all(experts == j):
            return None
        rest = r.rest()
        w_dims = [k if k < p else k + 1 for k in range(len(w.shape))]  # W's dims inside the stacked weight
        lc = [rest[k - 2] for k in spec.lc]
        rc = [w_dims[k] for k in spec.rc]
        lb, rb = ([r.ed], [p]) if r.ed is not None else ([], [])
        dense = _make_dot(self.ev, r.dense, weights, lb, rb, lc, rc, t.dtype)
        # dot_general output: batch dims, then the dense term's free dims, then the weight's
        dense_free = [k for k in range(len(r.dense.shape)) if k not in lb and k not in lc]
        td = len(lb) + dense_free.index(r.td)
        if r.ed is not None:
            ed = 0
        else:  # the stack's expert dim is a free dim of the weight
            ed = len(dense_free) + [k for k in range(len(weights.shape)) if k not in rc].index(p)
        out = Routed(r.slots, experts.copy(), dense, td, ed, r.per_device, r.masks)
        # The routed value's trailing dims must be the dense term's non-row dims in order.
        if [dense.shape[k] for k in out.rest()] != list(t.shape[2:]):
            return None
        return out

    # -- combine: out = dot(M, back) -------------------------------------------------------------
    def combine(self, out: Term, dev: int) -> None:
        product = self.ev.scale_of(out)[1]
        spec = _dot_spec(product)
        if spec is None or spec.lb or len(spec.lc) != 2:
            return
        m, back = product.args
        mask = self.dispatched.get(m)
        if mask is None:
            return
        r = self.info(back)
        if r is None and (swapped := _other_order(self.ev, spec, back)) is not None:
            spec, back = swapped
            r = self.info(back)
        if r is None or r.ed is None or r.ex is None or sorted(spec.rc) != [0, 1] or r.masks[dev] is not m:
            return  # the combine must undo this device's own dispatch
        # back's row dim k is contracted with M's dim lc[rc.index(k)]
        role = {spec.lc[spec.rc.index(k)]: k for k in (0, 1)}
        e_row, c_row = role.get(mask.e), role.get(mask.c)
        rest = r.rest()
        if e_row is None or c_row is None or out.shape[1:] != tuple(r.dense.shape[k] for k in rest):
            return
        for a in range(back.shape[0]):
            for b in range(back.shape[1]):
                pos = (a, b)
                if tuple(r.slots[a, b]) != (dev, pos[e_row], pos[c_row]) or r.ex[a, b] != pos[e_row]:
                    return
        tokens = r.per_device
        if m.shape[mask.t] != tokens:
            return
        rows = self.ev.slice_term(r.dense, r.td, dev * tokens, (dev + 1) * tokens)
        idx = self.ev.reshape_term(mask.index, Shape(mask.index.dtype, (tokens,)))  # the vector implicit
        dims = GatherDims(
            offset=tuple(range(1, 1 + len(rest))),
            collapsed=(r.ed,),
            start_map=(r.ed,),
            operand_batch=(r.td,),
            indices_batch=(0,),
            vector_dim=1,
            slice_sizes=tuple(1 if k in (r.td, r.ed) else s for k, s in enumerate(r.dense.shape)),
        )
        picked = self.ev.gather_term(rows, idx, dims, Shape(out.dtype, out.shape))
        if picked is not None:
            self.facts.append((product, picked))
            self.exempt.add(id(out))


def evaluate(ev, term: Term, env: dict[Term, np.ndarray]) -> np.ndarray | None:
    """The value of `term` with the leaves in `env` given (None past an op `ev.numeric` lacks)."""
    memo: dict[int, np.ndarray] = {}
    stack = [term]
    while stack:
        t = stack[-1]
        if id(t) in memo:
            stack.pop()
            continue
        known = env.get(t)
        if known is None:
            known = ev.folded(t)
        if known is not None:
            memo[id(t)] = np.asarray(known)
            stack.pop()
            continue
        missing = [a for a in t.args if id(a) not in memo]
        if missing:
            stack.extend(missing)
            continue
        stack.pop()
        value = ev.numeric(t, [memo[id(a)] for a in t.args])
        if value is None:
            return None
        memo[id(t)] = value
    return memo[id(term)]


EVALUABLE = {"bcast", "reshape", "transpose", "slice", "concat", "unary", "binary", "ternary", "const"}


@dataclasses.dataclass(frozen=True)
class _Dot:
    lb: list[int]
    rb: list[int]
    lc: list[int]
    rc: list[int]


def _dot_spec(t: Term) -> _Dot | None:
    if t.op != "dot":
        return None
    spec = DotSpec.parse(t.attrs[0])
    return _Dot(list(spec.lhs_batch), list(spec.rhs_batch), list(spec.lhs_contract), list(spec.rhs_contract))


def _other_order(ev, combine: _Dot, back: Term) -> tuple[_Dot, Term] | None:
    """The combine dot(M, back) over back = dot(a, b) read as dot(b, a) (the builder reads a dot
    that a dot reads in one operand order, relayouts.reoriented, which may put an expert's weights
    first): back's dim k is dot(b, a)'s dim moved[k], so the contracted dims are renamed; None when
    back is no dot or its uncontracted dims would change order (the combine's output would)."""
    if back.op != "dot":
        return None
    spec = DotSpec.parse(back.attrs[0])
    swapped, moved = swapped_dot(spec, tuple(range(len(back.shape))))
    free = [moved[k] for k in range(len(back.shape)) if k not in combine.rc]
    if free != sorted(free):
        return None
    shape = tuple(back.shape[moved.index(j)] for j in range(len(back.shape)))
    other = ev.normal("dot", (swapped.text(),), back.args[::-1], Shape(back.dtype, shape))
    renamed = _Dot(combine.lb, combine.rb, combine.lc, [moved[k] for k in combine.rc])
    return renamed, other


def _make_dot(ev, x: Term, y: Term, lb, rb, lc, rc, dtype: str) -> Term:
    spec = DotSpec(tuple(lb), tuple(rb), tuple(lc), tuple(rc), len(x.shape), len(y.shape), (x.dtype, y.dtype)).text()
    out = (
        [x.shape[i] for i in lb]
        + [x.shape[i] for i in range(len(x.shape)) if i not in lb and i not in lc]
        + [y.shape[i] for i in range(len(y.shape)) if i not in rb and i not in rc]
    )
    return ev.normal("dot", (spec,), (x, y), Shape(dtype, tuple(out)))


def _stacked_slice(w: Term) -> tuple[Term, int, int] | None:
    """W = (a reshape dropping dim p of) slice(P, p, j, j + 1): expert j's weights in a stack P."""
    inner = w.args[0] if w.op == "reshape" else w
    if inner.op != "slice" or w.op != "reshape":
        return None
    p, a, b = inner.attrs
    if b - a != 1:
        return None
    dropped = inner.shape[:p] + inner.shape[p + 1 :]
    if w.shape != dropped:
        return None
    return inner.args[0], p, a


def _same_dense(a: Routed, b: Routed) -> bool:
    return a.dense is b.dense and (a.td, a.ed, a.per_device, a.masks) == (b.td, b.ed, b.per_device, b.masks)


def _same_ex(a: Routed, b: Routed) -> bool:
    return (a.ex is None and b.ex is None) or (a.ex is not None and b.ex is not None and np.array_equal(a.ex, b.ex))


def _one_slot_each(m: np.ndarray, q: np.ndarray) -> bool:
    """m[t, e, c] in {0, 1}: every token has one slot, in expert q[t]; no slot has two tokens."""
    per_token = m.sum(axis=(1, 2))
    in_expert = m[np.arange(m.shape[0]), np.clip(q, 0, m.shape[1] - 1)].sum(axis=-1)
    in_range = np.all((q >= 0) & (q < m.shape[1]))
    return bool(in_range and np.all(per_token == 1) and np.all(in_expert == 1) and np.all(m.sum(axis=0) <= 1))
