"""A scatter at one index input as a dynamic update (equivci.translate.index_writes).

`x.at[i].set(u)` is HLO scatter, which skips an update whose window leaves x; dynamic-update-slice
clamps the start instead. They agree for i in [0, n - w], and only there: the fact is used where the
index's bounds lie in that range, which for an input the reference writes at is the valid-index
assumption (a `note` finding; `assume_valid_indices: false` refuses the proof). Checked numerically
on the terms (test_translation_against_xla: "a row and a column set at index ..."), and here on
JAX programs: a KV cache written with `.at[:, pos].set` in one program and
`lax.dynamic_update_slice` (or `dynamic_update_index_in_dim`) in the other verifies either way
round, with the note; near misses (a write at pos + 1, a start one off) are `mismatch`.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.parser import parse_module
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator

SCATTER = """HloModule m

keep {
  a = f32[] parameter(0)
  ROOT b = f32[] parameter(1)
}

ENTRY main {
  x = f32[4,3]{1,0} parameter(0)
  u = f32[3]{0} parameter(1)
  i = s32[] parameter(2)
  j = s32[1]{0} reshape(i)
  ROOT s = f32[4,3]{1,0} scatter(x, j, u), update_window_dims={0}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=0, to_apply=keep
}
"""


def _scatter_at(lo: int, hi: int):
    """The scatter's term with its index known to lie in [lo, hi]."""
    module = parse_module(SCATTER)
    table = TermTable()
    ev = Evaluator(module, table, 1)
    x, u, i = (
        table.make("param", (k,), (), shape, dtype)
        for k, (shape, dtype) in enumerate([((4, 3), "f32"), ((3,), "f32"), ((), "s32")])
    )
    ev.bounds[i] = (lo, hi)
    (term,) = ev.run(module.entry, [[x], [u], [i]])
    return term


def test_a_scatter_at_an_index_inside_the_rows_is_a_dynamic_update() -> None:
    term = _scatter_at(0, 3)
    assert term.op == "dupdate", term.op
    x, u = np.arange(12, dtype=np.float32).reshape(4, 3), -np.ones(3, np.float32)
    for i in range(4):
        want = x.copy()
        want[i] = u
        np.testing.assert_array_equal(evaluate(term, {0: x, 1: u, 2: np.int32(i)}), want)


@pytest.mark.parametrize(("lo", "hi"), [(0, 4), (-1, 3)])
def test_a_scatter_whose_index_may_leave_the_rows_is_not(lo, hi) -> None:
    """At i = 4 the scatter writes nothing and the dynamic update would clamp to row 3; at i = -1 it
    would clamp to row 0."""
    assert _scatter_at(lo, hi).op != "dupdate"


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, T, D, E = 4, 8, 6, 3


    def inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return f(B, T, E), f(B, D), f(D, E), jax.ShapeDtypeStruct((), jnp.int32)


    def cache_set(cache, x, w, pos):
        cache = cache.at[:, pos].set(jnp.tanh(x @ w))
        return cache, cache.sum(axis=1)


    def cache_updated(cache, x, w, pos):
        cache = lax.dynamic_update_slice(cache, jnp.tanh(x @ w)[:, None], (0, pos, 0))
        return cache, cache.sum(axis=1)


    def _sharded(write):
        def run(cache, x, w, pos, *, mesh):
            def body(cache, x, w, pos):
                cache = write(cache, jnp.tanh(x @ w), pos)
                return cache, cache.sum(axis=1)

            specs = (P("tp"), P("tp"), P(), P())
            return jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=(P("tp"), P("tp")))(cache, x, w, pos)

        return run


    updated = _sharded(lambda c, u, pos: lax.dynamic_update_slice(c, u[:, None], (0, pos, 0)))
    updated_in_dim = _sharded(lambda c, u, pos: lax.dynamic_update_index_in_dim(c, u, pos, axis=1))
    set_at = _sharded(lambda c, u, pos: c.at[:, pos].set(u))
    updated_one_later = _sharded(lambda c, u, pos: lax.dynamic_update_slice(c, u[:, None], (0, pos + 1, 0)))  # MARK:later
    set_one_later = _sharded(lambda c, u, pos: c.at[:, pos + 1].set(u))
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: set-vs-update, reference: m.py:cache_set, distributed: m.py:updated, inputs: m.py:inputs, mesh: {tp: 2}}
      - {name: set-vs-update-in-dim, reference: m.py:cache_set, distributed: m.py:updated_in_dim, inputs: m.py:inputs,
         mesh: {tp: 2}}
      - {name: update-vs-set, reference: m.py:cache_updated, distributed: m.py:set_at, inputs: m.py:inputs,
         mesh: {tp: 2}}
      - {name: set-vs-update-refused, reference: m.py:cache_set, distributed: m.py:updated, inputs: m.py:inputs,
         mesh: {tp: 2}, assume_valid_indices: false}
      - {name: set-vs-update-later, reference: m.py:cache_set, distributed: m.py:updated_one_later,
         inputs: m.py:inputs, mesh: {tp: 2}}
      - {name: set-vs-set-later, reference: m.py:cache_set, distributed: m.py:set_one_later, inputs: m.py:inputs,
         mesh: {tp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("index_writes"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["set-vs-update", "set-vs-update-in-dim", "update-vs-set"])
def test_a_write_at_a_valid_index_verifies_with_the_assumption_noted(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings
    assert any(f.severity == "note" and "index" in f.message for f in result.findings), result.findings


def test_the_manifest_can_refuse_the_assumption(manifest) -> None:
    result = _verify(manifest, "set-vs-update-refused")
    assert result.status is Status.UNPROVEN, (result.status, result.findings)


@pytest.mark.parametrize("name", ["set-vs-update-later", "set-vs-set-later"])
def test_a_write_one_row_off_is_a_mismatch(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
