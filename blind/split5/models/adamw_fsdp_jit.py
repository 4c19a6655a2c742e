"""AdamW training step of a two-layer MLP, FSDP by jit: parameters and optimizer state sharded
over 'fsdp' on their first dimension, batch over 'fsdp' too, via sharding constraints."""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

BATCH, DIN, DHID = 8, 8, 16
LR, B1, B2, EPS, WD = 1e-2, 0.9, 0.99, 1e-8, 0.01


def adam_inputs():
    f = jnp.float32
    p = {"w1": jax.ShapeDtypeStruct((DIN, DHID), f), "w2": jax.ShapeDtypeStruct((DHID, 1), f)}
    return (p, dict(p), dict(p), jax.ShapeDtypeStruct((), jnp.int32),
            jax.ShapeDtypeStruct((BATCH, DIN), f), jax.ShapeDtypeStruct((BATCH, 1), f))


def _loss(p, x, y):
    return jnp.mean((jax.nn.gelu(x @ p["w1"]) @ p["w2"] - y) ** 2)


def adamw_step(params, mu, nu, step, x, y):
    loss, g = jax.value_and_grad(_loss)(params, x, y)
    t = (step + 1).astype(jnp.float32)
    mu = jax.tree.map(lambda m, gg: B1 * m + (1 - B1) * gg, mu, g)
    nu = jax.tree.map(lambda v, gg: B2 * v + (1 - B2) * gg * gg, nu, g)
    def upd(p, m, v):
        m_hat = m / (1 - B1 ** t)
        v_hat = v / (1 - B2 ** t)
        return p - LR * (m_hat / (jnp.sqrt(v_hat) + EPS) + WD * p)
    return jax.tree.map(upd, params, mu, nu), mu, nu, loss


def adamw_step_fsdp(params, mu, nu, step, x, y, mesh):
    shard0 = NamedSharding(mesh, P("fsdp"))
    constrain = lambda tree: jax.tree.map(  # noqa: E731
        lambda a: jax.lax.with_sharding_constraint(a, shard0), tree)
    params, mu, nu = constrain(params), constrain(mu), constrain(nu)
    x = jax.lax.with_sharding_constraint(x, shard0)
    y = jax.lax.with_sharding_constraint(y, shard0)
    new_params, mu, nu, loss = adamw_step(params, mu, nu, step, x, y)
    return constrain(new_params), constrain(mu), constrain(nu), loss
