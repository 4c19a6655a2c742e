"""LayerNorm + MLP block served by a small class: a jitted entry point with in/out shardings and a
donated activation buffer, wrapping a shard_map for the tensor-parallel MLP on a (data, model) mesh.
"""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

D, F = 16, 32


def shapes():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return f(8, D), {"g": f(D), "beta": f(D), "w1": f(D, F), "b1": f(F), "w2": f(F, D), "b2": f(D)}


def ln(x, g, beta):
    mu = x.mean(-1, keepdims=True)
    sd = jnp.sqrt(jnp.mean((x - mu) ** 2, -1, keepdims=True) + 1e-5)
    return (x - mu) / sd * g + beta


def block(x, p):
    h = ln(x, p["g"], p["beta"])
    return x + jax.nn.relu(h @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


class ShardedBlock:
    def __init__(self, mesh):
        self.mesh = mesh
        ns = lambda *spec: NamedSharding(mesh, P(*spec))
        p_shard = {"g": ns(), "beta": ns(), "w1": ns(None, "model"), "b1": ns("model"),
                   "w2": ns("model", None), "b2": ns()}
        self.step = jax.jit(self.forward, in_shardings=(ns("data"), p_shard),
                            out_shardings=ns("data"), donate_argnums=0)

    def mlp(self, h, w1, b1, w2):
        y = jax.nn.relu(h @ w1 + b1) @ w2
        return jax.lax.psum(y, "model")

    def forward(self, x, p):
        h = ln(x, p["g"], p["beta"])
        h = jax.lax.with_sharding_constraint(h, NamedSharding(self.mesh, P("data", None)))
        mlp = jax.shard_map(self.mlp, mesh=self.mesh,
                            in_specs=(P("data"), P(None, "model"), P("model"), P("model", None)),
                            out_specs=P("data"), check_vma=False)
        return x + mlp(h, p["w1"], p["b1"], p["w2"]) + p["b2"]


class ShardedBlockFast(ShardedBlock):
    def mlp(self, h, w1, b1, w2):
        return jax.nn.relu(h @ w1 + b1) @ w2


def block_sharded(x, p, mesh):
    return ShardedBlock(mesh).step(x, p)


def block_sharded_fast(x, p, mesh):
    return ShardedBlockFast(mesh).step(x, p)
