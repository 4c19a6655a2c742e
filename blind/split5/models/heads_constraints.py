# Multi-head self-attention sharded by jit only: heads over 'model', batch over 'data', stated
# with with_sharding_constraint on the [batch, heads, seq, head_dim] activations.
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

B, S, D, H = 4, 6, 16, 4
HD = D // H


def mha_inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((B, S, D), f),
            jax.ShapeDtypeStruct((D, D), f), jax.ShapeDtypeStruct((D, D), f),
            jax.ShapeDtypeStruct((D, D), f), jax.ShapeDtypeStruct((D, D), f))


def split_heads(t):
    return t.reshape(B, S, H, HD).transpose(0, 2, 1, 3)


def mha(x, wq, wk, wv, wo):
    q, k, v = split_heads(x @ wq), split_heads(x @ wk), split_heads(x @ wv)
    att = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / HD ** 0.5, axis=-1)
    ctx = (att @ v).transpose(0, 2, 1, 3).reshape(B, S, D)
    return ctx @ wo


def mha_sharded(x, wq, wk, wv, wo, mesh):
    heads = NamedSharding(mesh, P("data", "model", None, None))
    c = jax.lax.with_sharding_constraint
    q = c((x @ wq).reshape(B, S, H, HD).transpose(0, 2, 1, 3), heads)
    k = c((x @ wk).reshape(B, S, H, HD).transpose(0, 2, 1, 3), heads)
    v = c((x @ wv).reshape(B, S, H, HD).transpose(0, 2, 1, 3), heads)
    att = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / HD ** 0.5, axis=-1)
    ctx = c(att @ v, heads).transpose(0, 2, 1, 3).reshape(B, S, D)
    return c(ctx @ wo, NamedSharding(mesh, P("data", None, None)))
