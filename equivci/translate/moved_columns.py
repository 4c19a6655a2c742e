"""A product with a constant matrix that moves columns as the concatenation of scaled windows.

Over the reals, x @ R for a constant R whose every column j holds at most one non-zero entry,
R[i_j, j] = c_j, is the value whose column j is c_j * x[..., i_j] (and 0 where the column is all
zeros): the other terms of the sum are products with 0. Consecutive columns that read consecutive
rows with one factor are one window of x, so the product is the concatenation of a few scaled
windows: rotate_half written as a matrix, x @ [[0, I], [-I, 0]], is concat(-x[..., h:],
x[..., :h]), the form the other ways of writing it meet (equivci.translate.pieces). The written dot
keeps its term; this form is stated beside it and known as its pieces (`Builder.piecewise`).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term
from equivci.terms.spec import DotSpec
from equivci.translate.builder import Builder

# A matrix is read as at most this many windows (a half rotation is 2; a pair swap of every
# column, GPT-J's rotate_every_two as a matrix, is one a column and stays a dot).
MAX_WINDOWS = 8


def moved_columns(ev: Builder, spec: DotSpec, lhs: Term, rhs: Term, out: Shape) -> Term | None:
    """dot(lhs, rhs) as the concatenation of scaled windows of the operand that is not a constant,
    when the other is a constant matrix whose columns each hold at most one non-zero, contracted
    with the last dim of lhs (x @ R) or the first dim of rhs (R @ x); None otherwise."""
    if spec.lhs_batch or len(spec.lhs_contract) != 1 or out.dtype not in ("f32", "f64"):
        return None
    left, right = ev.folded(lhs), ev.folded(rhs)
    if right is not None and left is None and right.ndim == 2 and spec.lhs_contract == (len(lhs.shape) - 1,):
        x, along, matrix = lhs, len(lhs.shape) - 1, right if spec.rhs_contract == (0,) else right.T
    elif left is not None and right is None and left.ndim == 2 and spec.rhs_contract == (0,):
        x, along, matrix = rhs, 0, left.T if spec.lhs_contract == (1,) else left
    else:
        return None
    if x.dtype != out.dtype:
        return None
    runs = _runs(matrix)
    if runs is None or len(runs) > MAX_WINDOWS:
        return None
    pieces = []
    for row, width, factor in runs:
        if factor == 0:
            shape = list(x.shape)
            shape[along] = width
            pieces.append(ev.const(np.zeros(shape, matrix.dtype), x.dtype))
            continue
        scaled = ev.scaled(ev.slice_term(x, along, row, row + width), factor)
        if scaled is None:
            return None
        pieces.append(scaled)
    return ev.concat(pieces, along)


def _runs(matrix: np.ndarray) -> list[tuple[int, int, Fraction]] | None:
    """(first row, columns, factor) for each run of consecutive columns that read consecutive rows
    with one factor (factor 0: columns of zeros, row -1); None when a column has two non-zeros."""
    runs: list[tuple[int, int, Fraction]] = []
    for j in range(matrix.shape[1]):
        rows = np.flatnonzero(matrix[:, j])
        if len(rows) > 1 or not np.all(np.isfinite(matrix[:, j])):
            return None
        row, factor = (int(rows[0]), Fraction(float(matrix[rows[0], j]))) if len(rows) else (-1, Fraction(0))
        if runs:
            first, width, last = runs[-1]
            if last == factor and (factor == 0 or row == first + width):
                runs[-1] = (first, width + 1, last)
                continue
        runs.append((row, 1, factor))
    return runs
