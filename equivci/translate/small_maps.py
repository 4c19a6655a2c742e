"""A dot that applies a small constant matrix along one dim, as the sums of products it computes.

`einsum("tpij,bthpj->bthpi", r, x)` with a constant r[..., i, j] (RoPE written as 2x2 rotation
matrices, one per position and pair) is, at each output index i, Σ_j r[..., i, j] · x[..., j]: the
dot's own definition, exact over the reals. Written that way, with x's slices along j in place and
the constant's slices broadcast to them, the rotation is `x0 c - x1 s` and `x0 s + x1 c`, the
interleaved or half-rotation formula the reference writes. A term whose constant's first nonzero
element is negative is subtracted as the product with the negated constant, as a formula writes
`- x1 * s` (negating a factor negates the product exactly); the terms added first, in j's order
(the first as it is where every term would be negated). Only for a constant operand with one
free and one contracted dim, both of at most `SIZE` elements, the other dims batched: a larger map
is a matrix product, not a formula.
"""

from __future__ import annotations

import numpy as np

from equivci.hlo.ir import FLOATS, Shape
from equivci.terms.ir import Term
from equivci.terms.spec import DotSpec
from equivci.translate.builder import Builder

SIZE = 4


def applied_matrix(ev: Builder, spec: DotSpec, lhs: Term, rhs: Term, out: Shape) -> Term | None:
    """dot(lhs, rhs) as concat_i(Σ_j k[.., i, j] · x[.., j]) laid out as the dot, for k the constant
    operand (see the module docstring); None where the dot is no such map."""
    for side in (0, 1):
        k, x = (lhs, rhs) if side == 0 else (rhs, lhs)
        k_batch, x_batch = (spec.lhs_batch, spec.rhs_batch) if side == 0 else (spec.rhs_batch, spec.lhs_batch)
        k_contract, x_contract = (
            (spec.lhs_contract, spec.rhs_contract) if side == 0 else (spec.rhs_contract, spec.lhs_contract)
        )
        value = ev.folded(k)
        if value is None or x.dtype not in FLOATS or k.dtype != x.dtype or len(k_contract) != 1:
            continue
        k_free = [d for d in range(len(k.shape)) if d not in k_batch and d not in k_contract]
        if len(k_free) != 1 or k.shape[k_free[0]] > SIZE or k.shape[k_contract[0]] > SIZE:
            continue
        return _expanded(ev, value, k_batch, k_free[0], k_contract[0], x, x_batch, x_contract[0], side, out)
    return None


def _expanded(
    ev: Builder,
    value: np.ndarray,
    k_batch: tuple[int, ...],
    fi: int,
    cj: int,
    x: Term,
    x_batch: tuple[int, ...],
    xj: int,
    side: int,
    out: Shape,
) -> Term:
    piece = Shape(out.dtype, tuple(1 if d == xj else n for d, n in enumerate(x.shape)))
    # k's batch dims (in k's order once fi and cj are taken out) go to the x dims they pair with
    targets = [x_batch[k_batch.index(d)] for d in sorted(k_batch)]
    layout = [value.shape[k_batch[x_batch.index(d)]] if d in x_batch else 1 for d in range(len(x.shape))]
    rows = []
    for i in range(value.shape[fi]):
        tables = []
        for j in range(value.shape[cj]):
            entry = np.moveaxis(value, (fi, cj), (-2, -1))[..., i, j]
            table = np.broadcast_to(np.transpose(entry, np.argsort(targets)).reshape(layout), piece.dims)
            nonzero = table[table != 0]
            tables.append((bool(nonzero.size) and bool(nonzero.flat[0] < 0), j, table))
        if all(negated for negated, _, _ in tables):
            tables[0] = (False, *tables[0][1:])  # every term negated: the first added as it is
        products = [
            (
                negated,
                ev.binary(
                    "multiply", ev.slice_term(x, xj, j, j + 1), ev.const(np.array(-t if negated else t), x.dtype)
                ),
            )
            for negated, j, t in sorted(tables, key=lambda entry: entry[0])
        ]
        total = products[0][1]
        for negated, product in products[1:]:
            total = ev.binary("subtract" if negated else "add", total, product)
        rows.append(total)
    applied = ev.concat(rows, xj)
    # x's layout -> the dot's: batch dims, then the free dims of lhs, then those of rhs
    x_free = [d for d in range(len(x.shape)) if d not in x_batch and d != xj]
    return ev.transpose_term(applied, (*x_batch, *([xj, *x_free] if side == 0 else [*x_free, xj])))
