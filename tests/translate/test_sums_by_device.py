"""Two sums over devices added are the sum over devices of each device's two terms:
sum_d a_d + sum_d b_d = sum_d (a_d + b_d) (finite sums commute), also in one window of both and
with one factor in front of both (translate/collectives.py, `regrouped_by_device`). A microbatch
loop that adds gradients each reduce-scattered already (FSDP inside a scan) then sums each device's
adjacent microbatch rows first, which the contraction merge joins. Checked on the builder (the
statement, evaluated, is the written sum; none for sums scaled unlike or for different windows);
end to end in two styles (the count divided out after the scan or inside it) and with the count
missing, twice or on the first microbatch only by the near misses fsdp-scan* of tests/soundness."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from equivci.hlo.ir import Shape
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.builder import Builder
from equivci.translate.collectives import combine
from equivci.translate.elementwise import binary_terms

RNG = np.random.default_rng(17)
S = Shape("f32", (4, 3))
HALF = Shape("f32", (2, 3))


def _setup(n: int = 2):
    ev = Builder(None, TermTable(), n)  # type: ignore[arg-type]
    p = [ev.table.make("param", (k,), (), S.dims, "f32") for k in range(2 * n)]
    values = {k: RNG.standard_normal(S.dims) for k in range(2 * n)}
    return ev, p, values


def _statements(ev: Builder, term):
    return [t for group in ev.equal_terms if any(u is term for u in group) for t in group if t is not term]


def test_two_all_reduced_sums_added_are_summed_by_device():
    ev, p, values = _setup(3)
    first, second = combine(ev, "add", p[:3]), combine(ev, "add", p[3:])
    term = binary_terms(ev, "add", [first, second], S)
    stated = _statements(ev, term)
    assert stated, "no sum by device stated"
    by_device = stated[-1]
    assert by_device.args[1].args == (p[2], p[5])  # the last device's two terms, added first
    np.testing.assert_allclose(evaluate(by_device, values), evaluate(term, values), rtol=1e-12)


def test_windows_of_scaled_sums_are_the_window_of_the_sum_by_device_and_pair_with_the_next():
    ev, p, values = _setup(2)
    windows = [ev.scaled(ev.slice_term(combine(ev, "add", p[k : k + 2]), 0, 0, 2), Fraction(1, 2)) for k in (0, 2)]
    term = binary_terms(ev, "add", windows, HALF)
    stated = _statements(ev, term)
    assert stated
    np.testing.assert_allclose(evaluate(stated[-1], values), evaluate(term, values), rtol=1e-12)
    third = ev.scaled(ev.slice_term(combine(ev, "add", p[:2]), 0, 0, 2), Fraction(1, 2))
    assert _statements(ev, binary_terms(ev, "add", [term, third], HALF))  # the next microbatch pairs


def test_no_sum_by_device_for_sums_scaled_unlike_or_other_windows():
    ev, p, _ = _setup(2)
    first, second = combine(ev, "add", p[:2]), combine(ev, "add", p[2:])
    unlike = binary_terms(ev, "add", [ev.scaled(first, Fraction(1, 2)), second], S)
    assert not _statements(ev, unlike)
    other = binary_terms(ev, "add", [ev.slice_term(first, 0, 0, 2), ev.slice_term(second, 0, 2, 4)], HALF)
    assert not _statements(ev, other)
