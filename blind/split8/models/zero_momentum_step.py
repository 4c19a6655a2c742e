"""Bias-corrected momentum step with linear warmup on a flat parameter vector (ZeRO-1 style DP)."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

N_FEAT, N_OUT, N_SAMPLES = 8, 4, 16
N_PARAM = N_FEAT * N_OUT + N_OUT
B1, LR, WARMUP = 0.9, 0.1, 4.0


def unpack(flat):
    return flat[: N_FEAT * N_OUT].reshape(N_FEAT, N_OUT), flat[N_FEAT * N_OUT:]


def softmax_xent(flat, x, labels):
    w, b = unpack(flat)
    logp = jax.nn.log_softmax(x @ w + b)
    return -jnp.mean(jnp.sum(logp * jax.nn.one_hot(labels, N_OUT), -1))


def momentum_update(p, m, g, step):
    m = B1 * m + (1 - B1) * g
    t = (step + 1).astype(jnp.float32)
    lr = LR * jnp.minimum(1.0, t / WARMUP)
    return p - lr * m / (1 - B1 ** t), m


def momentum_step(flat, m, x, labels, step):
    g = jax.grad(softmax_xent)(flat, x, labels)
    return momentum_update(flat, m, g, step)


def momentum_inputs():
    f = jnp.float32
    vec = jax.ShapeDtypeStruct((N_PARAM,), f)
    return (vec, vec, jax.ShapeDtypeStruct((N_SAMPLES, N_FEAT), f),
            jax.ShapeDtypeStruct((N_SAMPLES,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32))


def momentum_step_zero(flat, m, x, labels, step):
    def per_replica(flat, m_shard, x, labels, step):
        g = jax.grad(softmax_xent)(flat, x, labels)
        n = lax.axis_size("data")
        g_shard = lax.psum_scatter(g, "data", tiled=True) / n
        size = m_shard.shape[0]
        p_shard = lax.dynamic_slice_in_dim(flat, lax.axis_index("data") * size, size)
        m_shard = B1 * m_shard + (1 - B1) * g_shard
        t = (step + 1).astype(jnp.float32)
        lr = LR * jnp.minimum(1.0, t / WARMUP)
        p_shard = p_shard - lr * m_shard / (1 - B1 ** t)
        return lax.all_gather(p_shard, "data", tiled=True), m_shard

    fn = jax.shard_map(per_replica,
                       in_specs=(P(), P("data"), P("data"), P("data"), P()),
                       out_specs=(P(), P("data")), check_vma=False)
    return fn(flat, m, x, labels, step)


def momentum_step_zero_v2(flat, m, x, labels, step):
    def per_replica(flat, m_shard, x, labels, step):
        g = jax.grad(softmax_xent)(flat, x, labels)
        n = lax.axis_size("data")
        g_shard = lax.psum_scatter(g, "data", tiled=True) / n
        size = m_shard.shape[0]
        p_shard = lax.dynamic_slice_in_dim(flat, lax.axis_index("data") * size, size)
        m_shard = B1 * m_shard + (1 - B1) * g_shard
        t = step.astype(jnp.float32)
        lr = LR * jnp.minimum(1.0, t / WARMUP)
        p_shard = p_shard - lr * m_shard / (1 - B1 ** t)
        return lax.all_gather(p_shard, "data", tiled=True), m_shard

    fn = jax.shard_map(per_replica,
                       in_specs=(P(), P("data"), P("data"), P("data"), P()),
                       out_specs=(P(), P("data")), check_vma=False)
    return fn(flat, m, x, labels, step)
