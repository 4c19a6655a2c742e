"""Ops on a value split in groups along its leading dim act group by group (equivci.translate.regroup).

The fact is checked numerically on the terms the evaluator builds (the regrouped term, reshaped,
against the op as written, on random arrays), its limits (a broadcast that moves the split dims is
not lifted), and on JAX programs in a style unlike the blind MoE cases: a vmapped per-group router
(softmax, argmax, a capacity position from a cumsum of the one-hot) against one group per device,
and near misses: positions that count the tokens of every group before it (a global cumsum), a
max over every group's tokens, a running sum within each group where the reference's runs across.
"""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Instruction, Shape
from equivci.hlo.parser import parse_module
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate.evaluator import Evaluator

RNG = np.random.default_rng(0)


def _inst(opcode: str, dims: tuple[int, ...], attrs: dict[str, str] | None = None) -> Instruction:
    return Instruction("e", opcode, Shape("f32", dims), ("a", "b"), attrs or {})


def _groups(ev: Evaluator):
    """reshape(x, [3, 4, 5]) of a parameter x of shape [12, 5]: three groups of four rows."""
    x = ev.table.make("param", (0,), (), (12, 5), "f32")
    return x, ev.reshape_term(x, Shape("f32", (3, 4, 5)))


def test_elementwise_ops_and_a_broadcast_on_groups_are_the_reshaped_ops_on_the_rows() -> None:
    ev = Evaluator(None, TermTable(), 1)
    x, grouped = _groups(ev)
    b = ev.table.make("param", (1,), (), (12,), "f32")  # a value per row, grouped as x is
    row_bias = ev.local(_inst("broadcast", (3, 4, 5), {"dimensions": "{0,1}"}), [ev.reshape_term(b, Shape("f32", (3, 4)))], 0)
    added = ev.local(_inst("add", (3, 4, 5)), [grouped, row_bias], 0)
    term = ev.local(_inst("tanh", (3, 4, 5)), [added], 0)
    assert term.op == "unary" and term.args == (added,)  # the op keeps its form (localization reads it)
    flat = ev.regrouped[term]
    assert flat.shape == (12, 5)
    assert [term, ev.reshape_term(flat, Shape("f32", (3, 4, 5)))] in ev.equal_terms  # stated for the proof
    values = {0: RNG.standard_normal((12, 5)).astype(np.float32), 1: RNG.standard_normal(12).astype(np.float32)}
    expected = np.tanh(values[0].reshape(3, 4, 5) + values[1].reshape(3, 4, 1))
    np.testing.assert_allclose(evaluate(flat, values).reshape(3, 4, 5), expected, rtol=1e-6)
    np.testing.assert_allclose(evaluate(term, values), expected, rtol=1e-6)


def test_a_broadcast_that_moves_the_split_dims_is_not_lifted() -> None:
    ev = Evaluator(None, TermTable(), 1)
    _, grouped = _groups(ev)
    moved = ev.local(_inst("broadcast", (4, 3, 5, 2), {"dimensions": "{1,0,2}"}), [grouped], 0)
    assert moved not in ev.regrouped


def _regrouped_output(fn) -> bool:
    """Whether the output of `fn` on a [24, 3] input, lowered by JAX, is known as an op on the rows."""
    x = np.zeros((24, 3), np.float32)
    module = parse_module(jax.jit(fn).lower(x).as_text(dialect="hlo"))
    ev = Evaluator(module, TermTable(), 1)
    (out,) = ev.run(module.entry, [[ev.table.make("param", (0,), (), (24, 3), "f32")]])
    return out in ev.regrouped


@pytest.mark.parametrize(
    ("fn", "lifted"),
    [
        (lambda x: jnp.max(x.reshape(4, 6, 3), axis=2), True),  # within a row
        (lambda x: jnp.max(x.reshape(4, 6, 3), axis=1), False),  # over a group's tokens
        (lambda x: jnp.cumsum(x.reshape(4, 6, 3), axis=1), True),  # along the tokens, group by group
        (lambda x: jnp.cumsum(x.reshape(4, 6, 3), axis=0), False),  # across the groups
        (lambda x: jnp.einsum("gtd,gte->gde", x.reshape(4, 6, 3), x.reshape(4, 6, 3)), True),  # per group
        (lambda x: jnp.einsum("gtd,gte->tde", x.reshape(4, 6, 3), x.reshape(4, 6, 3)), False),  # summed over groups
    ],
    ids=["row-max", "group-max", "group-cumsum", "cross-group-cumsum", "group-dot", "dot-over-groups"],
)
def test_only_ops_that_keep_the_groups_apart_are_regrouped(fn, lifted) -> None:
    assert _regrouped_output(fn) is lifted


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    GROUPS, TOKENS, D, E, C = 4, 6, 8, 3, 2


    def inputs():
        f32 = jnp.float32
        return jax.ShapeDtypeStruct((GROUPS * TOKENS, D), f32), jax.ShapeDtypeStruct((D, E), f32)


    def _router(x, w, position):
        probs = jax.nn.softmax(x @ w, axis=-1)
        onehot = jax.nn.one_hot(jnp.argmax(probs, axis=-1), E, dtype=jnp.float32)
        slot = jnp.sum(position(onehot) * onehot, axis=-1).astype(jnp.int32)  # MARK:slot
        kept = (slot < C).astype(jnp.float32)
        slots = jax.nn.one_hot(slot, C, dtype=jnp.float32) * kept[:, None]
        return (onehot[:, :, None] * slots[:, None, :] * jnp.max(probs, -1)[:, None, None]).reshape(x.shape[0], E * C)


    def _in_group(onehot):
        return jnp.cumsum(onehot, axis=0) - 1.0


    def combine_weights(x, w):
        per_group = jax.vmap(lambda g: _router(g, w, _in_group))(x.reshape(GROUPS, TOKENS, D))
        return per_group.reshape(GROUPS * TOKENS, E * C)


    def combine_weights_dp(x, w, *, mesh):
        return jax.shard_map(lambda x, w: _router(x, w, _in_group), mesh=mesh, in_specs=(P("dp"), P()),
                             out_specs=P("dp"))(x, w)


    def combine_weights_dp_global_positions(x, w, *, mesh):
        def body(x, w):
            everyone = jax.lax.all_gather(x, "dp", tiled=True)
            mine = jax.lax.axis_index("dp") * x.shape[0]

            def global_position(onehot):
                counts = jnp.cumsum(jax.nn.one_hot(jnp.argmax(everyone @ w, -1), E, dtype=jnp.float32), axis=0)
                return jax.lax.dynamic_slice_in_dim(counts, mine, x.shape[0]) - 1.0

            return _router(x, w, global_position)

        return jax.shard_map(body, mesh=mesh, in_specs=(P("dp"), P()), out_specs=P("dp"))(x, w)


    def slots(x, w):  # the tokens each group dispatches to its experts' slots
        def one(g):
            return jnp.einsum("tk,td->kd", _router(g, w, _in_group), g)

        return jax.vmap(one)(x.reshape(GROUPS, TOKENS, D)).reshape(GROUPS * E * C, D)


    def _slots_dp(x, w, mesh, tokens):
        def body(x, w):
            return jnp.einsum("tk,td->kd", _router(x, w, _in_group), tokens(x))

        return jax.shard_map(body, mesh=mesh, in_specs=(P("dp"), P()), out_specs=P("dp"))(x, w)


    def slots_dp(x, w, *, mesh):
        return _slots_dp(x, w, mesh, lambda x: x)


    def slots_dp_neighbours_tokens(x, w, *, mesh):
        return _slots_dp(x, w, mesh, lambda x: jax.lax.ppermute(x, "dp", [(k, (k + 1) % 4) for k in range(4)]))


    def loudest(x, w):  # each group's largest logit per expert
        return jax.vmap(lambda g: jnp.max(g @ w, axis=0))(x.reshape(GROUPS, TOKENS, D))


    def loudest_dp_over_everyone(x, w, *, mesh):
        def body(x, w):
            return jax.lax.pmax(jnp.max(x @ w, axis=0), "dp")[None]

        return jax.shard_map(body, mesh=mesh, in_specs=(P("dp"), P()), out_specs=P("dp"))(x, w)


    def running_total(x, w):  # a running sum across the groups, not within one
        return jnp.cumsum((x @ w).reshape(GROUPS, TOKENS, E), axis=0).reshape(GROUPS * TOKENS, E)


    def running_total_dp_within(x, w, *, mesh):
        return jax.shard_map(lambda x, w: jnp.cumsum(x @ w, axis=0), mesh=mesh, in_specs=(P("dp"), P()),
                             out_specs=P("dp"))(x, w)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: groups, reference: m.py:combine_weights, distributed: m.py:combine_weights_dp,
         inputs: m.py:inputs, mesh: {dp: 4}}
      - {name: groups-global, reference: m.py:combine_weights,
         distributed: m.py:combine_weights_dp_global_positions, inputs: m.py:inputs, mesh: {dp: 4}}
      - {name: slots, reference: m.py:slots, distributed: m.py:slots_dp, inputs: m.py:inputs, mesh: {dp: 4}}
      - {name: slots-neighbours, reference: m.py:slots, distributed: m.py:slots_dp_neighbours_tokens,
         inputs: m.py:inputs, mesh: {dp: 4}}
      - {name: max-over-everyone, reference: m.py:loudest, distributed: m.py:loudest_dp_over_everyone,
         inputs: m.py:inputs, mesh: {dp: 4}}
      - {name: total-within, reference: m.py:running_total, distributed: m.py:running_total_dp_within,
         inputs: m.py:inputs, mesh: {dp: 4}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("regroup"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["groups", "slots"])
def test_a_vmapped_router_with_capacity_positions_verifies_one_group_per_device(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize(
    "name",
    [
        "groups-global",  # positions counted over every group before this one
        # the guards' own near misses (their mutants are killed by the fast checks above)
        pytest.param("max-over-everyone", marks=pytest.mark.slow),  # a group's tokens, not every row
        pytest.param("total-within", marks=pytest.mark.slow),  # a running sum across the groups
        "slots-neighbours",  # a group's mask contracted with the next group's tokens
    ],
)
def test_near_misses_are_mismatches(manifest, name) -> None:
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)
