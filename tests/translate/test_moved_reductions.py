"""Reductions with a negation (of a reshape too) or a size-1 reshape moved out (translate/reductions.py, `moved_reductions`):
Σ -y = -Σ y (exact in floats: negation flips the sign bit and rounding to nearest is symmetric), and a
reduction of y reshaped only by inserting or dropping size-1 dims is y's reduction over the same dims,
reshaped. Each is stated beside the written reduction.

Checked against XLA on one device (every stated pair evaluates to what XLA computes for the written
op), end to end in two styles (a vocabulary-gathered cross-entropy negating after the pick's mean over
[T, 1], against the reference's negation before its mean over [T]; a per-row sum of a negated [B, S, 1]
against the negated sum of the rows; data shards that each negate their [T/2, 1] picks before the mean,
pmean-ed, or sum them and divide by the global count, psum-ed, against the negated mean of the [T, 1] picks: the sum of a reshape of negations,
reshape(-z) = -reshape(z), is the negated sum too, and the devices' negated shares under one factor add up
as the negated sum under it, collectives.py), and by near misses: the sign dropped, the rows summed where
the reference sums the columns (a size-1 dim after them), the shards' means psum-ed where pmean-ed.
"""

from __future__ import annotations

import textwrap

import jax.numpy as jnp
import model_package
import numpy as np
import one_device
import pytest
from model_package import verify_named as _verify

from equivci.results import Status
from equivci.terms.semantics import evaluate

RNG = np.random.default_rng(17)

FUNCTIONS = {
    "negated-sum": lambda x: (-x).sum(axis=(0, 1)),
    "negated-row-sums": lambda x: jnp.sum(-x, axis=1),
    "unit-dim-sum": lambda x: x[..., None].sum(axis=(0, 1, 2)),
    "negated-unit-dim-mean": lambda x: (-x[:, None, :]).mean(axis=(0, 2)),
    "unit-dim-max": lambda x: jnp.max(x.reshape(4, 1, 6), axis=2),
    "negated-reshaped-sum": lambda x: jnp.sum((-x).reshape(4, 6, 1), axis=(0, 1, 2)),
    "exp-reshaped-sum": lambda x: jnp.sum(jnp.exp(x).reshape(4, 6, 1), axis=(0, 1, 2)),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_each_moved_reduction_computes_what_xla_computes(name):
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    programs, want, _ = one_device.programs(FUNCTIONS[name], (x,))
    ev = programs.evaluator
    stated = [group for group in ev.equal_terms if any(t.op in ("reduce", "unary", "reshape") for t in group)]
    moved = [g for g in stated if any(t.op == "reduce" or (t.args and t.args[0].op == "reduce") for t in g)]
    assert moved, ev.equal_terms
    for group in moved:
        values = [evaluate(t, {0: x}, ev.values) for t in group]
        for v in values[1:]:
            np.testing.assert_allclose(v, values[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(evaluate(programs.reference_outputs[0], {0: x}, ev.values), want, rtol=1e-5, atol=1e-6)


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    T, V, D = 8, 8, 8


    def xent_inputs():
        return (jax.ShapeDtypeStruct((T, V), jnp.float32), jax.ShapeDtypeStruct((T,), jnp.int32))


    def xent(logits, labels):
        logp = jax.nn.log_softmax(logits, axis=-1)
        return (-jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]).mean()


    def xent_kept(logits, labels):
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


    def _gathered(negated):
        def run(logits, labels, *, mesh):
            def body(logits, labels):
                logp = jax.nn.log_softmax(lax.all_gather(logits, "tp", axis=1, tiled=True), axis=-1)
                loss = jnp.take_along_axis(logp, labels[:, None], axis=-1).mean()
                return -loss if negated else loss

            return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P()), out_specs=P(),
                                 check_vma=False)(logits, labels)

        return run


    xent_gathered = _gathered(True)
    xent_gathered_unsigned = _gathered(False)


    def rows_inputs():
        return (jax.ShapeDtypeStruct((8, 8), jnp.float32),)


    def row_sums(x):
        return jnp.sum(-x, axis=1)


    def column_sums(x):
        return jnp.sum(-x, axis=0)


    def _rows(body):
        def run(x, *, mesh):
            return jax.shard_map(body, mesh=mesh, in_specs=(P(),), out_specs=P(), check_vma=False)(x)

        return run


    row_sums_unit = _rows(lambda x: -jnp.sum(x[:, :, None], axis=(1, 2)))
    column_sums_of_rows = _rows(lambda x: -jnp.sum(x[:, :, None], axis=(1, 2)))


    def _data_parallel(body):
        def run(logits, labels, *, mesh):
            return jax.shard_map(body, mesh=mesh, in_specs=(P("dp"), P("dp")), out_specs=P(),
                                 check_vma=False)(logits, labels)

        return run


    def _picks(logits, labels):
        return jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), labels[:, None], axis=-1)


    # against the reference's negated mean of its [T, 1] picks: each data shard's mean of its negated
    # [T/2, 1] picks, pmean-ed; and their sum over the shard divided by the global count, psum-ed
    xent_dp_negated_picks = _data_parallel(lambda l, y: lax.pmean((-_picks(l, y)).mean(), "dp"))
    xent_dp_negated_sums = _data_parallel(lambda l, y: lax.psum(jnp.sum(-_picks(l, y)) / T, "dp"))
    xent_dp_psum_of_means = _data_parallel(lambda l, y: lax.psum((-_picks(l, y)).mean(), "dp"))
    xent_dp_unsigned = _data_parallel(lambda l, y: lax.pmean(_picks(l, y).mean(), "dp"))
    """
)

MANIFEST = textwrap.dedent(
    """\
    version: 1
    models:
      - {name: xent_gathered, reference: moved.py:xent, distributed: moved.py:xent_gathered, inputs: moved.py:xent_inputs, mesh: {tp: 2}}
      - {name: xent_gathered_unsigned, reference: moved.py:xent, distributed: moved.py:xent_gathered_unsigned, inputs: moved.py:xent_inputs, mesh: {tp: 2}}
      - {name: row_sums_unit, reference: moved.py:row_sums, distributed: moved.py:row_sums_unit, inputs: moved.py:rows_inputs, mesh: {tp: 2}}
      - {name: column_sums_of_rows, reference: moved.py:column_sums, distributed: moved.py:column_sums_of_rows, inputs: moved.py:rows_inputs, mesh: {tp: 2}}
      - {name: xent_dp_negated_picks, reference: moved.py:xent_kept, distributed: moved.py:xent_dp_negated_picks, inputs: moved.py:xent_inputs, mesh: {dp: 2}}
      - {name: xent_dp_negated_sums, reference: moved.py:xent_kept, distributed: moved.py:xent_dp_negated_sums, inputs: moved.py:xent_inputs, mesh: {dp: 2}}
      - {name: xent_dp_psum_of_means, reference: moved.py:xent_kept, distributed: moved.py:xent_dp_psum_of_means, inputs: moved.py:xent_inputs, mesh: {dp: 2}}
      - {name: xent_dp_unsigned, reference: moved.py:xent_kept, distributed: moved.py:xent_dp_unsigned, inputs: moved.py:xent_inputs, mesh: {dp: 2}}
    """
)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return model_package.write_package(tmp_path_factory.mktemp("moved_models"), "moved.py", MODELS, MANIFEST)


@pytest.mark.parametrize("name", ["xent_gathered", "row_sums_unit", "xent_dp_negated_picks", "xent_dp_negated_sums"])
def test_a_negation_or_a_size_one_dim_outside_the_reduction_verifies(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize(
    "name", ["xent_gathered_unsigned", "column_sums_of_rows", "xent_dp_psum_of_means", "xent_dp_unsigned"]
)
def test_near_misses_of_moved_reductions_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (name, result.findings)
