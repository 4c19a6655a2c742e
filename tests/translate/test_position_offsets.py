"""An integer offset merged into a constant it is added to (equivci/translate/elementwise.py:
offset_merged), checked against XLA.

(x + c) + k is x + (k + c) for integers, exactly, overflow included (addition is associative modulo
2^bits): a device's positions `(start + d * n) + arange(n)` are `start + (d * n + arange(n))`,
whose constant is a window of the reference's `start + arange(N)`. Not for c - x (the sign of x is
not the offset's). The end-to-end near misses are tests/soundness (positions-sp*).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from one_device import programs

from equivci.terms.semantics import evaluate

N = 4
# near the ends of int32: the merged offset wraps as the written sums do
STARTS = [np.int32(5), np.int32(np.iinfo(np.int32).max - 2), np.int32(np.iinfo(np.int32).min + 1)]

MERGED = {  # offset -> the positions written with it
    "start-plus-offset": (8, lambda s: s + 8 + lax.iota(jnp.int32, N)),
    "offset-plus-start": (8, lambda s: 8 + s + jnp.arange(N, dtype=jnp.int32)),
    "start-minus-offset": (-3, lambda s: s - 3 + lax.iota(jnp.int32, N)),
    "arange-first": (8, lambda s: jnp.arange(N, dtype=jnp.int32) + (s + 8)),
}


def _built(fn, start):
    built, want, _ = programs(fn, (start,))
    out = built.reference_outputs[0]
    got = evaluate(out, {0: start}, built.evaluator.values)
    np.testing.assert_array_equal(got, want)
    return out, built.evaluator


@pytest.mark.parametrize("start", STARTS, ids=["small", "near-max", "near-min"])
@pytest.mark.parametrize("name", sorted(MERGED))
def test_an_offset_joins_the_constant_it_is_added_to(name, start):
    offset, fn = MERGED[name]
    out, ev = _built(fn, start)
    assert out.op == "binary" and out.attrs == ("add",)
    constants = [a for a in out.args if ev.folded(a) is not None]
    assert len(constants) == 1, "one operand is the start, the other the merged constant"
    np.testing.assert_array_equal(ev.folded(constants[0]), np.arange(N) + offset)


def test_an_offset_subtracted_from_is_no_offset():
    # 3 - s + arange(n): s counts negatively, the constant 3 is no offset of s
    out, ev = _built(lambda s: 3 - s + lax.iota(jnp.int32, N), STARTS[0])
    for start in STARTS:
        with np.errstate(over="ignore"):
            want = np.int32(3) - start + np.arange(N, dtype=np.int32)
        np.testing.assert_array_equal(evaluate(out, {0: start}, ev.values), want)


def test_a_symbolic_addend_is_no_offset():
    out, ev = _built(lambda s: s + s * 2 + lax.iota(jnp.int32, N), STARTS[0])
    constants = [ev.folded(a) for a in out.args if ev.folded(a) is not None]
    assert len(constants) == 1
    np.testing.assert_array_equal(constants[0], np.arange(N))
