"""Each device's count placed in its own slot by a one-hot product, psummed, and the earlier slots
summed: the exclusive prefix over shards of a sequence-parallel running sum (padding-aware positions
`cumsum(mask) - 1`, a running sum of features), in styles unlike blind split 20's.

Facts: x * m for a constant m of ones and zeros that changes along one dim is the select of x's
windows and zeros (x * 1 = x, x * 0 = 0 over the reals; exact on integers:
constant_selects.product_by_mask), so `one_hot(me, n) * count` is the count padded with zeros, which
the psum concatenates; a unit window of a broadcast along the one dim it adds is a reshape of its
operand (Builder.slice_term); the running sum of a device's window along the sequence of its window
along the batch (a {dp, sp} mesh) is the window of the running sum of its rows, itself the window of
the reference's (cumsums.stated_running_sum). Checked on values here and end to end; near misses
(the count doubled by `2 * one_hot`, the own slot counted, the next device's slot, an offset that
ignores the pads) are mismatch.
"""

from __future__ import annotations

import textwrap

import model_package
import numpy as np
import pytest
from model_package import verify_named as _verify

from equivci.hlo.ir import Shape
from equivci.results import Status
from equivci.terms.ir import TermTable
from equivci.terms.semantics import evaluate
from equivci.translate import constant_selects
from equivci.translate.evaluator import Evaluator

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, T, D, C = 4, 8, 4, 3


    def inputs():
        f = jax.ShapeDtypeStruct
        return f((T, D), jnp.float32), f((B, T, D), jnp.float32), f((B, T), jnp.bool_), f((D, C), jnp.float32)


    def positions(table, x, mask, w):
        pos = jnp.where(mask, jnp.cumsum(mask, axis=1) - 1, 0)
        return x + table[pos]


    def mixer(table, x, mask, w):
        return jnp.tanh(jnp.cumsum(x @ w, axis=1))


    def _slots(count, weight=1):  # each device's count in its own slot, psummed, the earlier slots summed
        me, n = lax.axis_index("sp"), lax.axis_size("sp")
        every = lax.psum(weight * jax.nn.one_hot(me, n, dtype=count.dtype) * count[:, None], "sp")
        return jnp.sum(jnp.where(jnp.arange(n) < me, every, 0), axis=1, keepdims=True)


    def _own_counted(count):
        me, n = lax.axis_index("sp"), lax.axis_size("sp")
        every = lax.psum(jax.nn.one_hot(me, n, dtype=count.dtype) * count[:, None], "sp")
        return jnp.sum(jnp.where(jnp.arange(n) <= me, every, 0), axis=1, keepdims=True)


    def _next_slot(count):
        me, n = lax.axis_index("sp"), lax.axis_size("sp")
        every = lax.psum(jax.nn.one_hot(me + 1, n, dtype=count.dtype) * count[:, None], "sp")
        return jnp.sum(jnp.where(jnp.arange(n) < me, every, 0), axis=1, keepdims=True)


    def _positions(offset, spec):
        def body(table, x, mask, w):
            start = offset(jnp.sum(mask, axis=1, dtype=jnp.int32))
            pos = jnp.where(mask, start + jnp.cumsum(mask, axis=1) - 1, 0)
            return x + table[pos]

        def run(table, x, mask, w, *, mesh):
            return jax.shard_map(body, mesh=mesh, in_specs=(P(), spec, spec, P()), out_specs=spec)(table, x, mask, w)

        return run


    def _mixed(spec):  # the float running sums' totals placed by a float one-hot (a mask written as a product)
        def body(table, x, mask, w):
            me, n = lax.axis_index("sp"), lax.axis_size("sp")
            run = jnp.cumsum(x @ w, axis=1)
            slot = (jnp.arange(n) == me).astype(run.dtype)
            every = lax.psum(slot[None, :, None] * run[:, -1:, :], "sp")
            return jnp.tanh(run + jnp.sum(jnp.where((jnp.arange(n) < me)[None, :, None], every, 0.0), axis=1,
                                          keepdims=True))

        def run(table, x, mask, w, *, mesh):
            return jax.shard_map(body, mesh=mesh, in_specs=(P(), spec, spec, P()), out_specs=spec)(table, x, mask, w)

        return run


    slots = _positions(_slots, P(None, "sp"))
    slots_dp = _positions(_slots, P("dp", "sp"))
    float_slots = _mixed(P("dp", "sp"))
    doubled = _positions(lambda count: _slots(count, weight=2), P(None, "sp"))
    own_counted = _positions(_own_counted, P(None, "sp"))
    next_slot = _positions(_next_slot, P(None, "sp"))
    ignores_pads = _positions(lambda count: lax.axis_index("sp") * (T // lax.axis_size("sp")), P("dp", "sp"))
    """
)

CASES = {
    "slots": ("positions", "{sp: 4}"),
    "slots-dp": ("positions", "{dp: 2, sp: 4}"),
    "float-slots": ("mixer", "{dp: 2, sp: 4}"),
    "doubled": ("positions", "{sp: 4}"),
    "own-counted": ("positions", "{sp: 4}"),
    "next-slot": ("positions", "{sp: 4}"),
    "ignores-pads": ("positions", "{dp: 2, sp: 4}"),
}
MANIFEST = model_package.manifest_text([(n, ref, n.replace("-", "_"), mesh) for n, (ref, mesh) in CASES.items()])


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("slot_counts"), "model.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["slots", "slots-dp", "float-slots"])
def test_counts_placed_in_slots_and_psummed_give_the_exclusive_prefix(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.slow  # 15-100 s each: the refuted programs' searches run to their budget before the oracle
@pytest.mark.parametrize("name", ["doubled", "own-counted", "next-slot", "ignores-pads"])
def test_other_slots_and_offsets_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)


# -- the facts, on values --------------------------------------------------------------------------

X = np.random.default_rng(3).standard_normal((2, 4, 3)).astype(np.float32)


def _evaluator() -> tuple[Evaluator, object]:
    ev = Evaluator(None, TermTable(), 1)
    return ev, ev.table.make("param", (0,), (), X.shape, "f32")


@pytest.mark.parametrize("mask", [[0, 1, 0, 0], [1, 1, 0, 1], [0, 0, 0, 1]])
def test_a_product_by_ones_and_zeros_along_one_dim_is_windows_and_zeros(mask):
    ev, x = _evaluator()
    m = np.broadcast_to(np.array(mask, np.float32)[None, :, None], X.shape)
    term = constant_selects.product_by_mask(ev, x, ev.const(m, "f32"))
    assert term is not None and term.op == "concat"
    np.testing.assert_array_equal(evaluate(term, {0: X}, ev.values), X * m)


@pytest.mark.parametrize(
    "mask",
    [
        np.array([0, 2, 0, 0], np.float32)[None, :, None],  # a 2 is no mask
        np.array([[0, 1, 0, 0], [1, 0, 0, 0]], np.float32)[:, :, None],  # changes along two dims
        np.ones((1, 4, 1), np.float32),  # the same everywhere: the product as written
    ],
)
def test_near_miss_other_constant_factors_stay_products(mask):
    ev, x = _evaluator()
    assert constant_selects.product_by_mask(ev, x, ev.const(np.broadcast_to(mask, X.shape), "f32")) is None


def test_a_unit_window_of_a_broadcast_along_the_dim_it_adds_is_a_reshape():
    ev, x = _evaluator()
    wide = ev.mk("bcast", ("i0,n5,i1,i2",), (x,), Shape("f32", (2, 5, 4, 3)))
    unit = ev.slice_term(wide, 1, 3, 4)
    assert unit.op == "reshape" and unit.args[0] is x
    np.testing.assert_array_equal(evaluate(unit, {0: X}, ev.values), X[:, None])
    assert ev.slice_term(wide, 1, 1, 3).op == "slice"  # two copies: a window as before
    assert ev.slice_term(wide, 2, 1, 2).op != "reshape"  # along the operand's own dim: its window
