"""Loops with a constant trip count, unrolled (equivci/translate/unroll.py), and the facts that make
the unrolled terms meet the reference's: a microbatch as a window of the batch, an accumulator that
starts at zero, a scatter at constant indices.

Correct programs in two styles verify: gradient accumulation over microbatches in a fori_loop that
has no reference loop, and a GPipe schedule (ppermute between stages, each stage's output written
with `.at[k].set`). Near misses (one microbatch fewer, a result written to the wrong slot, a slot
written twice, a write past the end that HLO drops, a scatter that adds, a trip count that differs
between devices) are mismatches, and two writes of one slot are never taken in program order.
"""

from __future__ import annotations

import textwrap

import model_package
import pytest

from equivci.hlo.parser import parse_module
from equivci.prove.programs import build_programs
from equivci.results import Status

MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, D, M, S = 8, 4, 2, 2


    def inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((D, D), f), jax.ShapeDtypeStruct((B, D), f))


    def stack_inputs():
        f = jnp.float32
        return (jax.ShapeDtypeStruct((S, D, D), f), jax.ShapeDtypeStruct((B, D), f))


    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)


    def grad(w, x):
        return jax.grad(loss)(w, x)


    def _accum(w, x, mesh, trips):
        def body(w, x):
            micro = x.reshape(M, -1, D)
            g = lax.fori_loop(0, trips, lambda i, g: g + jax.grad(loss)(w, micro[i]), jnp.zeros_like(w))
            return lax.pmean(g / M, "dp")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P(), check_vma=False)(w, x)


    def grad_accum(w, x, *, mesh):
        return _accum(w, x, mesh, M)


    def grad_accum_short(w, x, *, mesh):
        return _accum(w, x, mesh, M - 1)  # MARK:short


    def stack(ws, x):
        for s in range(S):
            x = jnp.tanh(x @ ws[s])
        return x


    def _pipe(ws, x, mesh, slot):
        def body(w, x):
            me = lax.axis_index("pp")
            micro = x.reshape(M, -1, D)

            def tick(t, carry):
                incoming, outs = carry
                y = jnp.tanh(jnp.where(me == 0, micro[jnp.minimum(t, M - 1)], incoming) @ w[0])
                k = jnp.maximum(t - (S - 1), 0)
                write = (me == S - 1) & (t >= S - 1)
                outs = jnp.where(write, outs.at[slot(k)].set(y), outs)  # MARK:slot
                return lax.ppermute(y, "pp", [(i, (i + 1) % S) for i in range(S)]), outs

            init = (jnp.zeros_like(micro[0]), jnp.zeros_like(micro))
            _, outs = lax.fori_loop(0, M + S - 1, tick, init)
            return lax.psum(outs, "pp").reshape(x.shape)

        return jax.shard_map(body, mesh=mesh, in_specs=(P("pp"), P()), out_specs=P(), check_vma=False)(ws, x)


    def stack_pipe(ws, x, *, mesh):
        return _pipe(ws, x, mesh, lambda k: k)


    def stack_pipe_wrong_slot(ws, x, *, mesh):
        return _pipe(ws, x, mesh, lambda k: (k + 1) % M)


    def rows(w, x):
        return jnp.tanh(x @ w)


    def rows_last_of_two(w, x):
        y = jnp.tanh(x @ w)
        return y.at[2].set(y[3]).at[3].set(0.0)


    def _written(w, x, mesh, where, how="set", rotate=True):
        # numpy indices are literals of the program (a jax array would be lifted into an input)
        def body(w, x):
            y = jnp.tanh(x @ w)
            if rotate:  # rows in the order of `where` (XLA drops a scatter at 0, 1, ...)
                y = jnp.concatenate([y[2:], y[:2]])
            if how == "add":
                return jnp.ones_like(y).at[where].add(y, mode="drop")  # MARK:added
            if how == "max":  # neither a write nor a sum: max(0, y), not y
                return jnp.zeros_like(y).at[where].max(y, mode="drop")  # MARK:maxed
            return jnp.zeros_like(y).at[where].set(y, mode="drop")

        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P()), out_specs=P())(w, x)


    def rows_scattered(w, x, *, mesh):
        return _written(w, x, mesh, np.array([2, 3, 4, 5, 6, 7, 0, 1]))


    def rows_twice(w, x, *, mesh):
        return _written(w, x, mesh, np.array([0, 1, 2, 2, 4, 5, 6, 7]), rotate=False)  # MARK:twice


    def rows_added(w, x, *, mesh):
        return _written(w, x, mesh, np.array([2, 3, 4, 5, 6, 7, 0, 1]), how="add")


    def rows_maxed(w, x, *, mesh):
        return _written(w, x, mesh, np.array([2, 3, 4, 5, 6, 7, 0, 1]), how="max")


    def rows_dropped(w, x, *, mesh):
        return _written(w, x, mesh, np.array([2, 3, 4, 5, 6, 8, 0, 1]))  # MARK:dropped


    def carry_inputs():
        return (jax.ShapeDtypeStruct((B, D), jnp.float32),)


    def carry(x):
        for _ in range(2):
            x = jnp.tanh(x) * 2.0
        return x


    def carry_device_trips(x, *, mesh):
        def body(x):
            trips = 2 + lax.axis_index("dp")  # MARK:trips
            return lax.fori_loop(0, trips, lambda i, h: jnp.tanh(h) * 2.0, x)

        return jax.shard_map(body, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))(x)


    def until(w, x):
        return lax.while_loop(lambda h: jnp.sum(h) < 10.0, lambda h: h * 2.0 + 1.0, jnp.abs(x @ w))


    def until_dp(w, x, *, mesh):
        body = lambda w, x: lax.while_loop(lambda h: jnp.sum(h) < 10.0, lambda h: h * 2.0 + 1.0, jnp.abs(x @ w))
        return jax.shard_map(body, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P("dp"))(w, x)
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: accum, reference: m.py:grad, distributed: m.py:grad_accum, inputs: m.py:inputs, mesh: {dp: 2}}
      - {name: accum-short, reference: m.py:grad, distributed: m.py:grad_accum_short, inputs: m.py:inputs,
         mesh: {dp: 2}}
      - {name: pipe, reference: m.py:stack, distributed: m.py:stack_pipe, inputs: m.py:stack_inputs,
         mesh: {pp: 2}}
      - {name: pipe-wrong-slot, reference: m.py:stack, distributed: m.py:stack_pipe_wrong_slot,
         inputs: m.py:stack_inputs, mesh: {pp: 2}}
      - {name: scattered, reference: m.py:rows, distributed: m.py:rows_scattered, inputs: m.py:inputs,
         mesh: {dp: 2}}
      - {name: twice, reference: m.py:rows, distributed: m.py:rows_twice, inputs: m.py:inputs, mesh: {dp: 2}}
      - {name: dropped, reference: m.py:rows, distributed: m.py:rows_dropped, inputs: m.py:inputs,
         mesh: {dp: 2}}
      - {name: added, reference: m.py:rows, distributed: m.py:rows_added, inputs: m.py:inputs, mesh: {dp: 2}}
      - {name: maxed, reference: m.py:rows, distributed: m.py:rows_maxed, inputs: m.py:inputs, mesh: {dp: 2}}
      - {name: twice-last, reference: m.py:rows_last_of_two, distributed: m.py:rows_twice, inputs: m.py:inputs,
         mesh: {dp: 2}}
      - {name: trips, reference: m.py:carry, distributed: m.py:carry_device_trips, inputs: m.py:carry_inputs,
         mesh: {dp: 2}}
      - {name: until, reference: m.py:until, distributed: m.py:until_dp, inputs: m.py:inputs, mesh: {dp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("unroll"), "m.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["accum", "pipe", "scattered"])
def test_unrolled_loops_and_constant_scatters_verify(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["accum-short", "pipe-wrong-slot", "twice", "dropped", "added", "maxed", "trips"])
def test_near_misses_are_mismatches(manifest, name):
    result = model_package.verify_named(manifest, name)
    assert result.status is Status.MISMATCH, (result.status, result.findings)


def test_two_writes_to_one_slot_are_not_taken_in_program_order(manifest):
    """Which of two updates of one slot a scatter keeps is unspecified: never proved to be the last."""
    result = model_package.verify_named(manifest, "twice-last")
    assert result.status is not Status.VERIFIED, result.findings


def test_a_loop_whose_trip_count_depends_on_the_input_is_not_unrolled(manifest):
    c = model_package.capture_named(manifest, "until")
    programs = build_programs(parse_module(c.reference_hlo), parse_module(c.distributed_hlo), c.inputs, c.outputs,
                              c.num_devices)
    assert programs.loops and not any(a.unrolled for a in programs.loops)
