"""A test of integers against one number as a column of their one-hot.

For integers x and a number c in [0, N), `x == c` is column c of the one-hot
`x[..., None] == arange(N)` along the one-hot's new dim: (x == c)[i] = (x[i] == arange(N)[c]),
exact for every x. A per-expert loop compares the top-k indices with each expert's global id
(`idx == axis_index * E_local + j`: one number on each device), where the reference builds the
one-hot of those indices against every id (`one_hot(idx, E)`): the device's test is the
reference's column c, reshaped to drop its unit dim. Only a one-hot some program builds is used:
the column is stated beside the written test, which other facts read as written.

Likewise for c + arange(n) along the new dim, 0 <= c and c + n <= N: `x[..., None] == c + arange(n)`
is the window [c, c + n) of the one-hot along that dim, (x[i] == c + j) = (x[i] == arange(N)[c + j]).
A device's experts compared at once, `idx[..., None] == axis_index * E_local + arange(E_local)`,
are its columns of the reference's one-hot (a scatter of the top-k weights builds one, one_hots.py).
"""

from __future__ import annotations

import numpy as np

from equivci.hlo.ir import Shape
from equivci.terms.ir import Term
from equivci.terms.spec import BcastSpec
from equivci.translate.builder import Builder
from equivci.translate.literals import holds_positions
from equivci.translate.masks import scalar_int


def record(ev: Builder, term: Term, direction: str, a: Term, b: Term) -> None:
    """Remember `term` = (a == b) as the one-hot of x when a broadcasts integers x with one new dim
    d, their dims in order, and b holds each element's position along d."""
    if direction != "EQ" or a.op != "bcast" or a.dtype[0] not in "su" or ev.folded(a) is not None:
        return
    x = a.args[0]
    spec = BcastSpec.parse(a.attrs[0])
    new = [o for o, (kind, _) in enumerate(spec.parts) if kind == "n"]
    if len(new) != 1 or [k for _, k in spec.operand_dims()] != list(range(len(x.shape))):
        return
    if holds_positions(ev, b, new[0]):
        ev.one_hots.setdefault(x, []).append((term, new[0]))


def columns(ev: Builder, term: Term, direction: str, a: Term, b: Term) -> list[Term]:
    """The columns of a known one-hot of a equal to `term` = (a == b), b one number c in its range,
    or b = c + arange(n) along the new dim of a = broadcast(x) (module docstring)."""
    if direction != "EQ" or ev.folded(a) is not None:
        return []
    c = scalar_int(ev, b)
    if c is None:
        return _window(ev, a, b)
    found = []
    for one_hot, d in ev.one_hots.get(a, ()):
        if 0 <= c < one_hot.shape[d]:
            column = ev.slice_term(one_hot, d, c, c + 1)
            found.append(ev.reshape_term(column, Shape(term.dtype, term.shape)))
    return found


def _window(ev: Builder, a: Term, b: Term) -> list[Term]:
    """The windows [c, c + n) of the known one-hots of x equal to broadcast(x) == c + arange(n)."""
    if a.op != "bcast" or a.dtype[0] not in "su":
        return []
    x = a.args[0]
    spec = BcastSpec.parse(a.attrs[0])
    new = [o for o, (kind, _) in enumerate(spec.parts) if kind == "n"]
    if len(new) != 1 or [k for _, k in spec.operand_dims()] != list(range(len(x.shape))):
        return []
    d = new[0]
    c = position_offset(ev, b, d)
    if c is None:
        return []
    n = a.shape[d]
    return [
        ev.slice_term(one_hot, d, c, c + n)
        for one_hot, e in ev.one_hots.get(x, ())
        if e == d and 0 <= c and c + n <= one_hot.shape[d]
    ]


def position_offset(ev: Builder, y: Term, dim: int) -> int | None:
    """The number c when the integer constant y holds c + each element's position along `dim`."""
    value = ev.folded(y)
    if value is None or y.dtype[0] not in "su" or value.ndim <= dim or value.size == 0:
        return None
    c = int(value.flat[0])
    lane = c + np.arange(y.shape[dim]).reshape([-1 if k == dim else 1 for k in range(len(y.shape))])
    return c if np.array_equal(value, np.broadcast_to(lane, y.shape)) else None
