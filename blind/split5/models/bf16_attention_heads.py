"""bf16 causal attention, heads sharded over 'heads': scores and softmax in f32, PV in bf16."""
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

B, L, NH, DH = 2, 8, 4, 16


def attn_inputs():
    t = jax.ShapeDtypeStruct((B, L, NH, DH), jnp.bfloat16)
    return t, t, t


def sdpa(q, k, v):
    logits = jnp.einsum("blhd,bmhd->bhlm", q, k, preferred_element_type=jnp.float32)
    logits = logits * (1.0 / DH ** 0.5)
    mask = jnp.tril(jnp.ones((L, L), jnp.bool_))
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(jnp.bfloat16)
    return jnp.einsum("bhlm,bmhd->blhd", probs, v, preferred_element_type=jnp.float32)


def sdpa_heads(q, k, v, mesh):
    spec = P(None, None, "heads", None)
    return jax.shard_map(sdpa, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)(q, k, v)


def sdpa_heads_unscaled(q, k, v, mesh):
    @partial(jax.shard_map, mesh=mesh, in_specs=(P(None, None, "heads"),) * 3,
             out_specs=P(None, None, "heads"))
    def local(q, k, v):
        logits = jnp.einsum("blhd,bmhd->bhlm", q, k, preferred_element_type=jnp.float32)
        mask = jnp.tril(jnp.ones((L, L), jnp.bool_))
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(logits, axis=-1).astype(jnp.bfloat16)
        return jnp.einsum("bhlm,bmhd->blhd", probs, v, preferred_element_type=jnp.float32)

    return local(q, k, v)
