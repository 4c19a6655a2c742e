"""A test of integers against one number as a column of their one-hot
(equivci/translate/one_hot_columns.py): for c in [0, N), `x == c` is column c of
`x[..., None] == arange(N)`, exact for every x.

The stated column is evaluated against XLA on one device, in the written styles (`x == c`,
`c == x`, `x - c == 0`); no column is stated for a number outside the one-hot's range, nor for
another test. Then a per-expert mask on expert-parallel devices, `idx == axis_index * E_local + j`,
verifies against the reference's `one_hot(idx, E)`, and its near misses (local ids in place of
global ones, the next expert's id) are mismatches.

A test against c + arange(n) along the new dim is the window [c, c + n) of the one-hot, also of the
one-hot a scatter-add of the top-k weights builds (`zeros.at[rows, idx].add(w)`, one_hots.py): an
expert-parallel device's `where(idx[..., None] == axis_index * E_local + arange(E_local), w, 0)`
summed over the choices, its weights scaled by a constant (DeepSeek's routed scale), verifies
against the reference's scatter; the next device's experts and local ids are mismatches.
"""

from __future__ import annotations

import textwrap

import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from one_device import programs

from equivci.results import Status
from equivci.terms.semantics import evaluate

RNG = np.random.default_rng(29)
T, K, E = 6, 2, 8
IDX = RNG.integers(0, E, (T, K)).astype(np.int32)


def _one_hot(idx):
    return (idx[..., None] == jnp.arange(E)).astype(jnp.int32)


STYLES = {
    "x == c": lambda idx, c: idx == c,
    "c == x": lambda idx, c: jnp.equal(c, idx),
    "x - c == 0": lambda idx, c: idx - c == 0,
}


def _columns(fn):
    """The groups stated with a column of the one-hot, each evaluated against the written test."""
    built, want, _ = programs(fn, (IDX,))
    values = built.evaluator.values
    np.testing.assert_array_equal(evaluate(built.reference_outputs[0], {0: IDX}, values), want)
    found = []
    for group in built.evaluator.equal_terms:
        if any(t.op == "reshape" and t.args[0].op == "slice" and t.args[0].shape[-1] == 1 for t in group):
            first = evaluate(group[0], {0: IDX}, values)
            for other in group[1:]:
                np.testing.assert_array_equal(evaluate(other, {0: IDX}, values), first)
            found.append(group)
    return found


@pytest.mark.parametrize("style", sorted(STYLES))
@pytest.mark.parametrize("c", [0, 3, E - 1])
def test_a_test_against_a_number_is_the_column_of_the_one_hot(style, c):
    fn = lambda idx: _one_hot(idx).sum(-1) + STYLES[style](idx, c)  # noqa: E731
    assert _columns(fn)  # stated by each program the one-device test builds from the module


@pytest.mark.parametrize("c", [-1, E])
def test_no_column_outside_the_one_hot(c):
    assert _columns(lambda idx: _one_hot(idx).sum(-1) + (idx == c)) == []


def test_no_column_of_a_compare_against_other_numbers():
    # `idx[..., None] == E - 1 - arange(E)` is a one-hot of the ids reversed: its column c is not `idx == c`
    reversed_one_hot = lambda idx: (idx[..., None] == E - 1 - jnp.arange(E)).astype(jnp.int32)  # noqa: E731
    assert _columns(lambda idx: reversed_one_hot(idx).sum(-1) + (idx == 3)) == []


def test_no_column_for_another_test():
    assert _columns(lambda idx: _one_hot(idx).sum(-1) + (idx <= 3) + (idx != 2)) == []


N_WINDOW = 3


def _windows(fn):
    """The groups stated with a window of N_WINDOW columns of a one-hot, each evaluated against the
    written test."""
    built, want, _ = programs(fn, (IDX,))
    values = built.evaluator.values
    np.testing.assert_array_equal(evaluate(built.reference_outputs[0], {0: IDX}, values), want)
    found = []
    for group in built.evaluator.equal_terms:
        if any(t.op == "slice" and t.shape[-1] == N_WINDOW and t.args[0].shape[-1] == E and t.args[0].op == "binary" for t in group):
            first = evaluate(group[0], {0: IDX}, values)
            for other in group[1:]:
                np.testing.assert_array_equal(evaluate(other, {0: IDX}, values), first)
            found.append(group)
    return found


def _tested(idx, lanes):
    return (idx[..., None] == lanes).astype(jnp.int32).sum(-1)


@pytest.mark.parametrize("c", [0, 2, E - N_WINDOW])
def test_a_test_against_offset_positions_is_a_window_of_the_one_hot(c):
    assert _windows(lambda idx: _one_hot(idx).sum(-1) + _tested(idx, c + jnp.arange(N_WINDOW)))


@pytest.mark.parametrize("c", [-1, E - N_WINDOW + 1])
def test_no_window_past_the_one_hot(c):
    assert _windows(lambda idx: _one_hot(idx).sum(-1) + _tested(idx, c + jnp.arange(N_WINDOW))) == []


def test_a_window_of_the_one_hot_a_scatter_of_weights_builds():
    def fn(idx):
        ids = idx % E  # in [0, E): no wrap of a negative index before the scatter
        combine = jnp.zeros((T, E), jnp.int32).at[jnp.arange(T)[:, None], ids].add(ids + 1)
        return combine.sum(-1) + _tested(ids, 2 + jnp.arange(N_WINDOW)).sum(-1)

    assert _windows(fn)


def test_no_window_of_a_compare_against_positions_reversed():
    assert _windows(lambda idx: _one_hot(idx).sum(-1) + _tested(idx, 4 - jnp.arange(N_WINDOW))) == []


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    T, K, E, EP = 8, 2, 8, 4
    E_LOCAL = E // EP


    def inputs():
        return (jax.ShapeDtypeStruct((T, K), jnp.int32),)


    def masks(idx):
        return jax.nn.one_hot(idx, E, dtype=jnp.float32)


    def _sharded(eid, idx, mesh, test=lambda idx, e: idx == e):
        def body(idx):
            me = lax.axis_index("ep")
            return jnp.stack([test(idx, eid(me, j)).astype(jnp.float32) for j in range(E_LOCAL)], axis=-1)

        return jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(None, None, "ep"))(idx)


    def masks_ep(idx, *, mesh):
        return _sharded(lambda me, j: me * E_LOCAL + j, idx, mesh)


    def masks_ep_equal_left(idx, *, mesh):
        return _sharded(lambda me, j: me * E_LOCAL + j, idx, mesh, lambda idx, e: jnp.equal(e, idx))


    def masks_ep_local_ids(idx, *, mesh):
        return _sharded(lambda me, j: j, idx, mesh)


    def masks_ep_next_expert(idx, *, mesh):
        return _sharded(lambda me, j: me * E_LOCAL + j + 1, idx, mesh)


    TOKENS, D, F, SCALE = 16, 8, 16, 2.5


    def moe_inputs():
        f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
        return {"router": f(D, E), "bias": f(E)}, f(E, D, F), f(TOKENS, D)


    def _route(wg, x):
        # a selection bias for the choice only (load balancing), the weights from the unbiased scores
        scores = jax.nn.sigmoid(x @ wg["router"])
        _, idx = lax.top_k(scores + wg["bias"], K)
        return idx, jnp.take_along_axis(scores, idx, axis=-1) * SCALE


    def _experts(w1, x):
        return jnp.tanh(jnp.einsum("td,edf->etf", x, w1))


    def moe_scatter(wg, w1, x):
        idx, w = _route(wg, x)
        combine = jnp.zeros((TOKENS, E)).at[jnp.arange(TOKENS)[:, None], idx].add(w)
        return jnp.einsum("te,etf->tf", combine, _experts(w1, x))


    def _moe_where(wg, w1, x, mesh, first):
        def body(wg, w1, x):
            idx, w = _route(wg, x)
            mine = first(lax.axis_index("ep")) + jnp.arange(E_LOCAL)
            combine = jnp.sum(jnp.where(idx[:, :, None] == mine, w[:, :, None], 0.0), axis=1)
            return lax.psum(jnp.einsum("te,etf->tf", combine, _experts(w1, x)), "ep")

        return jax.shard_map(body, mesh=mesh, in_specs=({"router": P(), "bias": P()}, P("ep"), P()), out_specs=P(),
                             check_vma=False)(wg, w1, x)


    def moe_where_ep(wg, w1, x, *, mesh):
        return _moe_where(wg, w1, x, mesh, lambda me: me * E_LOCAL)


    def moe_where_ep_next_device(wg, w1, x, *, mesh):
        return _moe_where(wg, w1, x, mesh, lambda me: (me + 1) % (E // E_LOCAL) * E_LOCAL)


    def moe_where_ep_local_ids(wg, w1, x, *, mesh):
        return _moe_where(wg, w1, x, mesh, lambda me: 0)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: ep, reference: m.py:masks, distributed: m.py:masks_ep, inputs: m.py:inputs, mesh: {ep: 4}}
      - {name: ep-equal-left, reference: m.py:masks, distributed: m.py:masks_ep_equal_left, inputs: m.py:inputs, mesh: {ep: 4}}
      - {name: ep-local-ids, reference: m.py:masks, distributed: m.py:masks_ep_local_ids, inputs: m.py:inputs, mesh: {ep: 4}}
      - {name: ep-next-expert, reference: m.py:masks, distributed: m.py:masks_ep_next_expert, inputs: m.py:inputs, mesh: {ep: 4}}
      - {name: moe-where, reference: m.py:moe_scatter, distributed: m.py:moe_where_ep, inputs: m.py:moe_inputs, mesh: {ep: 4}}
      - {name: moe-where-next-device, reference: m.py:moe_scatter, distributed: m.py:moe_where_ep_next_device, inputs: m.py:moe_inputs, mesh: {ep: 4}}
      - {name: moe-where-local-ids, reference: m.py:moe_scatter, distributed: m.py:moe_where_ep_local_ids, inputs: m.py:moe_inputs, mesh: {ep: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("one_hot_columns"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["ep", "ep-equal-left"])
def test_a_device_mask_per_local_expert_by_global_id_verifies(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["ep-local-ids", "ep-next-expert"])
def test_a_mask_by_another_id_is_a_mismatch(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)


def test_a_device_combine_by_its_experts_ids_verifies_against_a_scatter_of_the_weights(manifest):
    result = model_package.verify_named(manifest, "moe-where")
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["moe-where-next-device", "moe-where-local-ids"])
def test_a_combine_by_other_experts_ids_is_a_mismatch(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
