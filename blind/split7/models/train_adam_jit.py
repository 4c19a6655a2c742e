"""Adam step for a linear softmax classifier, data-parallel by jit shardings only.
The step counter is an int32 input (>= 1). The second moment is read through abs() so that a
corrupted (negative) state cannot produce NaNs."""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

N, D, C = 8, 8, 4
LR, B1, B2, EPS = 1e-2, 0.9, 0.99, 1e-8


def inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((D, C), f), jax.ShapeDtypeStruct((D, C), f), jax.ShapeDtypeStruct((D, C), f),
            jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((N, D), f),
            jax.ShapeDtypeStruct((N, C), f))


def loss(w, x, target_probs):
    return -jnp.mean(jnp.sum(target_probs * jax.nn.log_softmax(x @ w), axis=-1))


def adam_step(w, m, v, step, x, target_probs):
    g = jax.grad(loss)(w, x, target_probs)
    m = B1 * m + (1 - B1) * g
    v = B2 * v + (1 - B2) * g * g
    t = step.astype(jnp.float32)
    m_hat = m / (1 - B1 ** t)
    v_hat = v / (1 - B2 ** t)
    return w - LR * m_hat / (jnp.sqrt(jnp.abs(v_hat)) + EPS), m, v


def adam_step_dp(w, m, v, step, x, target_probs, mesh):
    batch = NamedSharding(mesh, P("dp"))
    x = jax.lax.with_sharding_constraint(x, batch)
    target_probs = jax.lax.with_sharding_constraint(target_probs, batch)
    g = jax.grad(loss)(w, x, target_probs)
    g = jax.lax.with_sharding_constraint(g, NamedSharding(mesh, P()))
    m = B1 * m + (1 - B1) * g
    v = B2 * v + (1 - B2) * jnp.square(g)
    t = step.astype(jnp.float32)
    m_hat = m / (1 - B1 ** t)
    v_hat = v / (1 - B1 ** t)
    return w - LR * m_hat / (jnp.sqrt(jnp.abs(v_hat)) + EPS), m, v


def adam_step_sharded(w, m, v, step, x, target_probs, mesh):
    batch = NamedSharding(mesh, P("dp"))
    x = jax.lax.with_sharding_constraint(x, batch)
    target_probs = jax.lax.with_sharding_constraint(target_probs, batch)
    g = jax.grad(loss)(w, x, target_probs)
    g = jax.lax.with_sharding_constraint(g, NamedSharding(mesh, P()))
    m = B1 * m + (1 - B1) * g
    v = B2 * v + (1 - B2) * jnp.square(g)
    t = step.astype(jnp.float32)
    m_hat = m / (1 - B1 ** t)
    v_hat = v / (1 - B2 ** t)
    return w - LR * m_hat / (jnp.sqrt(jnp.abs(v_hat)) + EPS), m, v
