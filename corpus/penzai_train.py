"""A training step of penzai's dense Llama-like transformer with optax.

Reference: one step on the whole batch, jax.value_and_grad of the mean next-token
cross-entropy (optax.softmax_cross_entropy_with_integer_labels), then an optax SGD-with-momentum
update whose momentum trace is an input. Distributed: data parallel with shard_map, gradients
accumulated over microbatches with lax.scan and averaged over `dp` (plain DP), or with the
weights and optimizer state sharded over `dp` and all-gathered before use (FSDP: the gradient of
the gather is a reduce-scatter). SGD rather than Adam on purpose: Adam's first step is nearly
invariant to the gradient's scale, so a doubled gradient would be invisible to the oracle.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import PartitionSpec as P
from penzai_model import DENSE, forward, token_spec, weight_specs

BATCH = 8
MICROBATCHES = 2
OPTIMIZER = optax.sgd(learning_rate=0.1, momentum=0.9)


def _loss(weights, tokens, targets):
    logits = forward(DENSE, weights, tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def inputs():
    weights = weight_specs(DENSE)
    return weights, jax.eval_shape(OPTIMIZER.init, weights), token_spec(BATCH), token_spec(BATCH)


def _apply(weights, opt_state, grads):
    updates, opt_state = OPTIMIZER.update(grads, opt_state, weights)
    return optax.apply_updates(weights, updates), opt_state


def reference(weights, opt_state, tokens, targets):
    loss, grads = jax.value_and_grad(_loss)(weights, tokens, targets)
    return *_apply(weights, opt_state, grads), loss


def _accumulate(loss_fn, weights, tokens, targets, average=True):
    """Loss and gradient of the local batch as MICROBATCHES equal slices, summed by lax.scan."""
    micro = (tokens.reshape(MICROBATCHES, -1, tokens.shape[-1]), targets.reshape(MICROBATCHES, -1, targets.shape[-1]))

    def step(total, batch):
        loss, grads = jax.value_and_grad(loss_fn)(weights, *batch)
        return jax.tree.map(jnp.add, total, (loss, grads)), None

    # zeros_like keeps each value's shard_map varying-ness, which scan's carry must match.
    zeros = jax.tree.map(jnp.zeros_like, (targets[0, 0].astype(jnp.float32), weights))
    (loss, grads), _ = lax.scan(step, zeros, micro)
    scale = 1.0 / MICROBATCHES if average else 1.0
    return loss * scale, jax.tree.map(lambda g: g * scale, grads)


def _data_parallel(weights, opt_state, tokens, targets, mesh, reduce=lax.pmean, average=True):
    def body(w, state, t, y):
        # pcast: each dp shard differentiates its own copy, so grads are per-shard (not pre-summed).
        loss, grads = _accumulate(_loss, lax.pcast(w, "dp", to="varying"), t, y, average)
        grads = reduce(grads, "dp")
        return *_apply(w, state, grads), lax.pmean(loss, "dp")

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P(), P("dp"), P("dp")),
                         out_specs=(P(), P(), P()))(weights, opt_state, tokens, targets)


def dp(weights, opt_state, tokens, targets, *, mesh):
    return _data_parallel(weights, opt_state, tokens, targets, mesh)


def dp_grad_psum(weights, opt_state, tokens, targets, *, mesh):
    return _data_parallel(weights, opt_state, tokens, targets, mesh, reduce=lax.psum)  # BUG: gradients summed over dp instead of averaged: the step is dp times too large


def dp_accumulate_no_average(weights, opt_state, tokens, targets, *, mesh):
    return _data_parallel(weights, opt_state, tokens, targets, mesh, average=False)  # BUG: microbatch gradients summed, never divided by the number of microbatches


def fsdp(weights, opt_state, tokens, targets, *, mesh):
    """Weights and momentum sharded on their first dimension over dp; gathered for compute."""

    def gathered_loss(local, t, y):
        return _loss(jax.tree.map(lambda w: lax.all_gather(w, "dp", axis=0, tiled=True), local), t, y)

    def body(local, state, t, y):
        loss, grads = _accumulate(gathered_loss, local, t, y)
        # The gather's transpose already summed the shards' gradients (a reduce-scatter): average.
        grads = jax.tree.map(lambda g: g / lax.axis_size("dp"), grads)
        return *_apply(local, state, grads), lax.pmean(loss, "dp")

    sharded = P("dp")
    return jax.shard_map(body, mesh=mesh, in_specs=(sharded, sharded, P("dp"), P("dp")),
                         out_specs=(sharded, sharded, P()))(weights, opt_state, tokens, targets)
