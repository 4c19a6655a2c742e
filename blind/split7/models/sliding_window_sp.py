"""Single-head sliding-window causal attention (window of WINDOW tokens incl. itself).
Queries are split over the sequence axis; keys/values are all-gathered.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, C = 2, 16, 8
WINDOW = 4


def args():
    s = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
    return s(B, T, C), s(C, C), s(C, C), s(C, C)


def window_attention(x, wq, wk, wv):
    q, k, v = x @ wq, x @ wk, x @ wv
    logits = jnp.einsum("...qc,...kc->...qk", q, k) / jnp.sqrt(C).astype(x.dtype)
    qi = lax.broadcasted_iota(jnp.int32, (T, T), 0)
    ki = lax.broadcasted_iota(jnp.int32, (T, T), 1)
    ok = (ki <= qi) & (qi - ki < WINDOW)
    logits = jnp.where(ok, logits, jnp.finfo(logits.dtype).min)
    return jnp.einsum("...qk,...kc->...qc", jax.nn.softmax(logits, axis=-1), v)


def window_attention_sp(x, wq, wk, wv, mesh):
    def f(x_blk, wq, wk, wv):
        n_local = x_blk.shape[1]
        x_all = lax.all_gather(x_blk, "seq", axis=1, tiled=True)
        q, k, v = x_blk @ wq, x_all @ wk, x_all @ wv
        logits = jnp.einsum("...qc,...kc->...qk", q, k) / jnp.sqrt(C).astype(x_blk.dtype)
        qi = lax.axis_index("seq") * n_local + lax.broadcasted_iota(jnp.int32, (n_local, T), 0)
        ki = lax.broadcasted_iota(jnp.int32, (n_local, T), 1)
        ok = (ki <= qi) & (qi - ki < WINDOW)
        logits = jnp.where(ok, logits, jnp.finfo(logits.dtype).min)
        return jnp.einsum("...qk,...kc->...qc", jax.nn.softmax(logits, axis=-1), v)

    return jax.shard_map(f, mesh=mesh, in_specs=(P(None, "seq"), P(), P(), P()),
                         out_specs=P(None, "seq"))(x, wq, wk, wv)


def window_attention_sp_inclusive(x, wq, wk, wv, mesh):
    def f(x_blk, wq, wk, wv):
        n_local = x_blk.shape[1]
        x_all = lax.all_gather(x_blk, "seq", axis=1, tiled=True)
        q, k, v = x_blk @ wq, x_all @ wk, x_all @ wv
        logits = jnp.einsum("...qc,...kc->...qk", q, k) / jnp.sqrt(C).astype(x_blk.dtype)
        qi = lax.axis_index("seq") * n_local + lax.broadcasted_iota(jnp.int32, (n_local, T), 0)
        ki = lax.broadcasted_iota(jnp.int32, (n_local, T), 1)
        ok = (ki <= qi) & (qi - ki <= WINDOW)
        logits = jnp.where(ok, logits, jnp.finfo(logits.dtype).min)
        return jnp.einsum("...qk,...kc->...qc", jax.nn.softmax(logits, axis=-1), v)

    return jax.shard_map(f, mesh=mesh, in_specs=(P(None, "seq"), P(), P(), P()),
                         out_specs=P(None, "seq"))(x, wq, wk, wv)
