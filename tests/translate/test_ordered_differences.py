"""An order test of two integer values in one form (elementwise.ordered_difference):

    x - y cmp 0  =  x cmp y     where x's and y's bounds keep x - y inside the dtype
    x > y        =  y < x       (and >= as <=)

A rolling cache's validity `pos - (pos - i) % W >= 0` (the slot's absolute position) is then the
slot age's `(pos - i) % W <= pos`, for positions whose range is known: here the reference reads a
position embedding at `pos`, so pos is a valid index of its table (the `note` of the assumption).
Without a range the two differ (pos - age wraps near the dtype's minimum) and stay apart. Checked on
terms against XLA, and end to end on batch shards with the age test batched or vmapped per example
(verified), `<` for `<=` and `W - 1` for W (mismatch), and the age test with the assumption refused
(`assume_valid_indices: false`: unproven) unless the manifest states the positions' range
(`int_range: [0, 24]`: verified with a note naming it; `<` for `<=` stays mismatch).
"""

from __future__ import annotations

import textwrap

import jax
import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify
from one_device import programs as _programs

from equivci.hlo.parser import parse_module
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator

A = np.array([[3, -2, 7], [0, 5, -9]], np.int32)
B = np.array([[1, -2, 8], [4, -5, 2]], np.int32)


def _stated(fn, bounds: tuple[int, int]) -> tuple[list, dict]:
    """The groups stated equal to fn's output when both inputs lie in `bounds`, and the values."""
    module = parse_module(jax.jit(fn).lower(A, B).as_text(dialect="hlo"))
    table = TermTable()
    ev = Evaluator(module, table, 1)
    a, b = (table.make("param", (k,), (), A.shape, "s32") for k in (0, 1))
    ev.bounds.update({a: bounds, b: bounds})
    (out,) = ev.run(module.entry, [[a], [b]])
    return [group for group in ev.equal_terms if out in group], ev.values


@pytest.mark.parametrize(
    "fn", [lambda a, b: a - b >= 0, lambda a, b: a - b < 0, lambda a, b: a > b, lambda a, b: a >= b]
)
def test_the_ordered_form_computes_what_xla_computes(fn) -> None:
    stated, values = _stated(fn, (-10, 10))
    assert stated, "no ordered form stated"
    want = np.asarray(jax.jit(fn)(A, B))
    for t in stated[0]:
        np.testing.assert_array_equal(evaluate(t, {0: A, 1: B}, values), want)


def test_a_difference_that_may_wrap_is_not_ordered() -> None:
    """x - y >= 0 is not x >= y at x = -2**31, y = 1: bounds that reach the dtype's minimum, or
    none, state nothing."""
    assert not _stated(lambda a, b: a - b >= 0, (-(2**31), 10))[0]
    programs, _, _ = _programs(lambda a, b: a - b >= 0, (A, B))
    out = programs.reference_outputs[0]
    assert not [group for group in programs.evaluator.equal_terms if out in group]


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    B, W, D, E, NP = 8, 4, 8, 8, 24


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(B, W, E), f(B, D), f(D, E), f(NP, D), jax.ShapeDtypeStruct((B,), jnp.int32)


    def _step(cache, x, w, table, pos, valid):
        h = x + table[pos]
        k = jnp.tanh(h @ w)
        cache = cache.at[jnp.arange(cache.shape[0]), pos % W].set(k)
        scores = jnp.einsum("bwe,be->bw", cache, k)
        return cache, jnp.where(valid(pos), scores, 0.0)


    def _absolute(pos):
        return pos[:, None] - (pos[:, None] - jnp.arange(W)[None, :]) % W >= 0


    def reference(cache, x, w, table, pos):
        return _step(cache, x, w, table, pos, _absolute)


    def _sharded(valid):
        def run(cache, x, w, table, pos, *, mesh):
            specs = (P("dp"), P("dp"), P(), P(), P("dp"))
            body = lambda *a: _step(*a, valid)
            return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(P("dp"), P("dp")))(cache, x, w, table, pos)

        return run


    def _age_vmapped(pos):
        return jax.vmap(lambda p: (p - jnp.arange(W)) % W <= p)(pos)


    age = _sharded(lambda pos: (pos[:, None] - jnp.arange(W)[None, :]) % W <= pos[:, None])
    age_vmapped = _sharded(_age_vmapped)
    age_strict = _sharded(lambda pos: (pos[:, None] - jnp.arange(W)[None, :]) % W < pos[:, None])
    age_short = _sharded(lambda pos: (pos[:, None] - jnp.arange(W)[None, :]) % (W - 1) <= pos[:, None])
    """
)

CASES = {
    "age": ("age", Status.VERIFIED, ""),
    "age-vmapped": ("age_vmapped", Status.VERIFIED, ""),
    "age-strict": ("age_strict", Status.MISMATCH, ""),
    "age-short": ("age_short", Status.MISMATCH, ""),
    "age-refused": ("age", Status.UNPROVEN, ", assume_valid_indices: false"),
    # the range stated in the manifest instead of assumed from the index use
    "age-stated-range": ("age", Status.VERIFIED, ", assume_valid_indices: false, int_range: [0, 24]"),
    "age-strict-stated-range": ("age_strict", Status.MISMATCH, ", assume_valid_indices: false, int_range: [0, 24]"),
}
MANIFEST = "version: 1\nmodels:\n" + "".join(
    f"  - {{name: {name}, reference: m.py:reference, distributed: m.py:{fn}, inputs: m.py:inputs, "
    f"mesh: {{dp: 2}}{extra}}}\n"
    for name, (fn, _, extra) in CASES.items()
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("ordered_differences"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", CASES)
def test_a_rolling_cache_validity_by_slot_age(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is CASES[name][1], (result.status, result.findings)
    if result.status is Status.VERIFIED:
        said = "int_range" if "int_range" in CASES[name][2] else "index"
        assert any(f.severity == "note" and said in f.message for f in result.findings), result.findings
