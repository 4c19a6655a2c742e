"""A sum over dims of a signed sum is the negated sum of its negation in one form, Σ x = -Σ(-x)
(exact: negation flips the sign bit and rounding is symmetric), stated beside the written sum
(translate/reductions.py, `negated_signed_sum`); the devices' shares of such sums, psum-ed, add up
negated (translate/collectives.py, `_negated_shares`). A vocabulary-parallel loss summed as
Σ (log Σ_d s_d + M - target) then meets the reference's negated mean of its log-softmax picks,
-Σ ((pick - m) - log s).

Checked against XLA on one device (every stated pair evaluates to what XLA computes), end to end in
two styles on a {batch: 2, vocab: 2} mesh (T5X's partition function from a pmax-stabilised psum of
exponentials with a one-hot target, keepdims; and `jax.nn.logsumexp` of the all-gathered logits less
the target picked there, summed and divided by the global count), and by near misses: the max
taken over the batch axis (each vocabulary shard then subtracts another max), the exponentials summed
over the batch axis, and the target added.
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

RNG = np.random.default_rng(29)

FUNCTIONS = {
    "row-loss": lambda x: jnp.sum((jnp.log(jnp.exp(x).sum(-1)) + x.max(-1)) - x[:, 0]),
    "negated-difference": lambda x: jnp.sum(-(x[:, 0] - x[:, 1]) - x[:, 2]),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_each_negated_signed_sum_computes_what_xla_computes(name):
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    programs, want, _ = one_device.programs(FUNCTIONS[name], (x,))
    ev = programs.evaluator
    negated = [g for g in ev.equal_terms if any(t in ev.negated_sums for t in g)]
    assert negated, ev.equal_terms
    for group in negated:
        values = [evaluate(t, {0: x}, ev.values) for t in group]
        for v in values[1:]:
            np.testing.assert_allclose(v, values[0], rtol=1e-5, atol=1e-5)
    for term, inner in ev.negated_sums.items():
        np.testing.assert_allclose(evaluate(term, {0: x}, ev.values), -evaluate(inner, {0: x}, ev.values), rtol=1e-5)
    np.testing.assert_allclose(evaluate(programs.reference_outputs[0], {0: x}, ev.values), want, rtol=1e-5, atol=1e-5)


def test_a_plain_sum_is_not_negated():
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    programs, _, _ = one_device.programs(lambda x: jnp.sum(x[:, 0] + x[:, 1]), (x,))
    assert not programs.evaluator.negated_sums


MODELS = textwrap.dedent(
    """\
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    B, S, V = 4, 4, 8
    VL = V // 2


    def inputs():
        return (jax.ShapeDtypeStruct((B, S, V), jnp.float32), jax.ShapeDtypeStruct((B, S), jnp.int32))


    def xent(logits, labels):
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


    def _sharded(body):
        def run(logits, labels, *, mesh):
            return jax.shard_map(body, mesh=mesh, in_specs=(P("batch", None, "vocab"), P("batch")),
                                 out_specs=P(), check_vma=False)(logits, labels)

        return run


    def _partition(max_axis, sum_axis, target_sign):
        def body(logits, labels):
            start = lax.axis_index("vocab") * VL
            m = lax.pmax(lax.stop_gradient(logits.max(-1, keepdims=True)), max_axis)
            lse = jnp.log(lax.psum(jnp.exp(logits - m).sum(-1, keepdims=True), sum_axis)) + m
            target = lax.psum((jax.nn.one_hot(labels - start, VL) * logits).sum(-1, keepdims=True), "vocab")
            return lax.pmean(jnp.mean(lse - target_sign * target), "batch")

        return _sharded(body)


    def _gathered_logsumexp(logits, labels):
        full = lax.all_gather(logits, "vocab", axis=2, tiled=True)
        target = jnp.take_along_axis(full, labels[..., None], axis=-1)[..., 0]
        return lax.psum(jnp.sum(jax.nn.logsumexp(full, axis=-1) - target) / (B * S), "batch")


    partition = _partition("vocab", "vocab", 1.0)
    gathered_logsumexp = _sharded(_gathered_logsumexp)
    partition_max_over_batch = _partition("batch", "vocab", 1.0)
    partition_sum_over_batch = _partition("vocab", "batch", 1.0)
    partition_target_added = _partition("vocab", "vocab", -1.0)
    """
)

CASES = ["partition", "gathered_logsumexp", "partition_max_over_batch", "partition_sum_over_batch",
         "partition_target_added"]


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    text = model_package.manifest_text([(c, "xent", c) for c in CASES], "{batch: 2, vocab: 2}")
    return model_package.write_package(tmp_path_factory.mktemp("negated_signed_sums"), "model.py", MODELS, text)


@pytest.mark.parametrize("name", ["partition", "gathered_logsumexp"])
def test_a_vocabulary_parallel_loss_summed_positive_verifies(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.VERIFIED, result.findings


@pytest.mark.parametrize("name", ["partition_max_over_batch", "partition_sum_over_batch", "partition_target_added"])
def test_near_misses_of_the_partition_function_are_mismatches(manifest, name):
    result = _verify(manifest, name)
    assert result.status is Status.MISMATCH, (name, result.findings)
