"""Regression reproducer of an unsound verdict (found by the mutation sweep's probes,
bench/mutants.py; fixed in equivci/translate/evaluator.py, Evaluator._set_bounds).

The reference indexes with `ids`, so equivci assumes ids in [0, size) (the documented index
assumption) and gives `ids` those bounds. A `convert` used to keep its operand's bounds also when
it narrows: ids.astype(int8) was bounded [0, 128] though it wraps to -128 at ids = 128. The compare
`>= 0` was then folded to true, the mask disappeared, and the masked lookup was "proved" equal to
the plain one. It is not: ids = 128 is a valid index of the 129-row table, and the distributed
program returns 0 there. Both models must come out `unproven` (the numeric oracle never draws such
ids, so no counterexample); check.py runs both programs on such ids and shows they differ.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P


def lookup(table, ids):
    return table[ids]


def lookup_inputs():
    return (jax.ShapeDtypeStruct((129, 1), jnp.float32), jax.ShapeDtypeStruct((1,), jnp.int32))


def lookup_int8_mask(table, ids):
    return jnp.where((ids.astype(jnp.int8) >= 0)[:, None], table[ids], 0.0)


# The same defect in code people write: vocabulary-parallel cross-entropy (as in
# examples/zoo/vocab_parallel.py) that skips ignore_index (-100) tokens, testing labels kept as
# int16. With a 33000-token vocabulary, labels 32768..32999 wrap negative and are dropped.
VOCAB, TOKENS = 33000, 4


def cross_entropy(logits, labels):
    lse = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.mean(lse - target)


def cross_entropy_inputs():
    return (jax.ShapeDtypeStruct((TOKENS, VOCAB), jnp.float32), jax.ShapeDtypeStruct((TOKENS,), jnp.int32))


def cross_entropy_tp_int16_ignore_index(logits, labels, *, mesh):
    def body(logits, labels):  # logits: (T, V / tp); labels replicated
        n_local = logits.shape[-1]
        lo = lax.axis_index("tp") * n_local
        m = lax.pmax(lax.stop_gradient(jnp.max(logits, axis=-1)), "tp")
        lse = m + jnp.log(lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), "tp"))
        mine = (labels >= lo) & (labels < lo + n_local)
        local = jnp.take_along_axis(logits, jnp.where(mine, labels - lo, 0)[:, None], axis=-1)[:, 0]
        target = lax.psum(jnp.where(mine, local, 0.0), "tp")
        valid = labels.astype(jnp.int16) >= 0
        return jnp.mean(jnp.where(valid, lse - target, 0.0))

    return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P()), out_specs=P())(logits, labels)
