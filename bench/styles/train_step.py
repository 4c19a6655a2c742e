"""Style 7: a full training step: forward, backward through shard_map, optimizer update.

The loss is the mean next-token cross-entropy of llama_tp's decoder (its distributed program:
Megatron TP in shard_map, vocab-parallel logits); jax.value_and_grad differentiates through
the shard_map (the transposes of its psums and of the column/row-parallel matmuls), and an SGD
step updates every weight. Float32 weights, as optimizers keep their master copy. Returns the
updated weights and the loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from kit import export
from llama_tp import SEQ, Config, decoder, decoder_tp, layer_shapes, model_inputs

LEARNING_RATE = 1e-3


def cross_entropy(logits, labels):
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.sum(jax.nn.one_hot(labels, logits.shape[-1]) * log_probs, axis=-1))


def loss_and_grads(forward, x, labels, params):
    return jax.value_and_grad(lambda p: cross_entropy(forward(x, p), labels))(params)


def sgd_step(forward, x, labels, params):
    loss, grads = loss_and_grads(forward, x, labels, params)
    return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), loss


def reference(cfg: Config, x, labels, params):
    return sgd_step(lambda x, p: decoder(cfg, x, p), x, labels, params)


def distributed(cfg: Config, x, labels, params, *, mesh):
    return sgd_step(lambda x, p: decoder_tp(cfg, x, p, mesh), x, labels, params)


def inputs(cfg: Config, dtype):
    x, params = model_inputs(cfg, layer_shapes(cfg, dtype), dtype)
    return x, jax.ShapeDtypeStruct((x.shape[0], SEQ), jnp.int32), params


export(globals(), reference, distributed, inputs, dtype=jnp.float32)
