"""A sum of matrix products that share their left factor as the product of the summed right factors.

Over the reals, s1 · (x @ m1) + s2 · (x @ m2) = s1 · (x @ (m1 + (s2 / s1) · m2)) (a matrix
product is linear in its right operand), and a product chain (x @ a) @ b is x @ (a @ b)
(associativity). A LoRA layer's reference computes `x @ w + s * (x @ a) @ b`, where a device that
merges its block of the adapters into its block of the kernel first, `w + s * a @ b`, gathers the
merged kernel and multiplies once: the sum is stated equal, beside it, to the product of x with the
merged kernel, with the first term's factor in front and with the second's (the two normal forms
of the merged kernel, `w + s · (a @ b)` and `(1 / s) · w + a @ b`; the sum's operands keep
their order).

Products are read through the layouts the builder gives them: a dot without batch dims of one
contracted dim is op(lhs) @ op(rhs), op a transpose where the contracted dim is not the one a
matrix product contracts (a chain whose inner dot the builder wrote with its operands swapped,
(a.T @ x.T).T @ b). Factors are rank-2 matrices, except the shared left factor, which may have
leading batch dims; f32 and f64 only (a narrower product is rounded once).
"""

from __future__ import annotations

from equivci.hlo.ir import Instruction, Shape
from equivci.terms.ir import Term
from equivci.terms.spec import DotSpec
from equivci.translate.builder import Builder
from equivci.translate.reductions import WIDE, dot_term

# A matrix product as its factors, left to right: (term, transposed). A factor of rank > 2 (an
# activation with leading batch dims) is read as rows = its leading dims, columns = its last dim, so
# it may only open the product, untransposed, or close it, transposed.
Factors = tuple[tuple[Term, bool], ...]


def note(ev: Builder, inst: Instruction, args: list, result: object) -> None:
    """State `result` = s · (x @ merged) where the sum `inst` adds two scaled products of x."""
    if inst.opcode != "add" or not isinstance(result, Term) or result.dtype not in WIDE or len(args) != 2:
        return
    (s1, p1), (s2, p2) = (ev.scale_of(t) for t in args)
    f1, f2 = _factors(p1), _factors(p2)
    if len(f1) < 2 or len(f2) < 2 or f1[0] != f2[0] or s1 == 0 or s2 == 0:
        return
    x, transposed = f1[0]
    m1, m2 = _product(ev, f1[1:]), _product(ev, f2[1:])
    if m1 is None or m2 is None or m1.shape != m2.shape:
        return
    for front in (s1,) if s1 == s2 else (s1, s2):
        first, second = ev.times(m1, s1 / front), ev.times(m2, s2 / front)
        if first is None or second is None:
            continue
        merged = ev.normal("binary", ("add",), [first, second], Shape(m1.dtype, m1.shape))
        product = _dot(ev, x, transposed, merged, False)
        stated = ev.times(product, front) if product is not None and product.shape == result.shape else None
        if stated is not None and stated is not result:
            ev.equal_terms.append([result, stated])


def _factors(t: Term) -> Factors:
    """t as a product of factors; a term that is no matrix product is its own one factor."""
    one = ((t, False),)
    if t.op != "dot" or t.dtype not in WIDE:
        return one
    spec = DotSpec.parse(t.attrs[0])
    lhs, rhs = t.args
    if spec.lhs_batch or len(spec.lhs_contract) != 1 or spec.dtypes != (t.dtype, t.dtype):
        return one
    (lc,), (rc,) = spec.lhs_contract, spec.rhs_contract
    left, right = _factors(lhs), _factors(rhs)
    if lc != spec.lhs_rank - 1:  # the lhs's rows are all its dims but the contracted one
        if lc != 0:
            return one
        left = _transposed(left)
    if rc != 0:
        if rc != spec.rhs_rank - 1:
            return one
        right = _transposed(right)
    found = left + right
    return found if _valid(found) else one


def _transposed(factors: Factors) -> Factors:
    return tuple((f, not tr) for f, tr in reversed(factors))


def _valid(factors: Factors) -> bool:
    last = len(factors) - 1
    return all(len(f.shape) == 2 or (k == 0 and not tr) or (k == last and tr) for k, (f, tr) in enumerate(factors))


def _product(ev: Builder, factors: Factors) -> Term | None:
    """The product of rank-2 factors, left to right, as the program would build it."""
    if any(len(f.shape) != 2 for f, _ in factors):
        return None
    acc, transposed = factors[0]
    if len(factors) == 1 and transposed:
        return ev.transpose_term(acc, (1, 0))
    for f, tr in factors[1:]:
        found = _dot(ev, acc, transposed, f, tr)
        if found is None:
            return None
        acc, transposed = found, False
    return acc


def _dot(ev: Builder, x: Term, x_tr: bool, y: Term, y_tr: bool) -> Term | None:
    """op(x) @ op(y), x of any rank (untransposed: its last dim contracted), y of rank 2."""
    lc = 0 if x_tr else len(x.shape) - 1
    rc = 1 if y_tr else 0
    if x.shape[lc] != y.shape[rc] or x.dtype != y.dtype:
        return None
    rows = tuple(n for k, n in enumerate(x.shape) if k != lc)
    spec = DotSpec((), (), (lc,), (rc,), len(x.shape), 2, (x.dtype, y.dtype))
    return dot_term(ev, spec, x, y, Shape(x.dtype, rows + (y.shape[1 - rc],)))
