"""A value read with size-1 dims beside larger ones is the broadcast of its squeeze along new dims
of size 1 (equivci.terms.ir.read_unit_bcast), checked on numbers: a stage's slab of a stacked
bias, `b[i:i + 1]`, and a [2, 1, 3, 1] window of a 4-d input, in both layouts."""

from __future__ import annotations

import numpy as np
import pytest
from test_rules_numeric import B

from equivci.terms.ir import Term, read_unit_bcast
from equivci.terms.semantics import evaluate
from equivci.terms.spec import BcastSpec


def _bcast(spec: str, x: Term, shape: tuple[int, ...]) -> Term:
    return Term("bcast", (spec,), (x,), shape, x.dtype)


@pytest.mark.parametrize(
    "shape, window",
    [((4, 8), (0, 2, 3)), ((4, 8), (1, 5, 6)), ((2, 3, 3, 5), (1, 1, 2)), ((2, 3, 3, 5), (3, 0, 1))],
)
def test_a_read_window_with_unit_dims_is_the_broadcast_of_its_squeeze(shape, window) -> None:
    b = B()
    rng = np.random.default_rng(0)
    value = rng.standard_normal(shape).astype(np.float32)
    slab = b.sl(b.param(0, shape), *window)
    form = read_unit_bcast(slab)
    assert form is not None
    spec, squeezed = form
    assert 1 not in squeezed.shape
    assert all(size == 1 for kind, size in BcastSpec.parse(spec).parts if kind == "n")
    got = evaluate(_bcast(spec, squeezed, slab.shape), {0: value})
    np.testing.assert_array_equal(got, evaluate(slab, {0: value}))


def test_computed_values_and_values_without_larger_dims_are_left_alone() -> None:
    b = B()
    x = b.param(0, (1, 8))
    assert read_unit_bcast(x) is not None
    assert read_unit_bcast(b.un("tanh", x)) is None  # computed: its windows relate through the op
    assert read_unit_bcast(b.param(1, (1, 1))) is None  # no larger dim to broadcast along
    assert read_unit_bcast(b.param(2, (4, 8))) is None  # no size-1 dim
