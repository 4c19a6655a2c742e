"""Models sharded by annotations only (no shard_map): with_sharding_constraint under jit, and an
explicit-axes variant that builds its own Explicit mesh and uses reshard / out_sharding /
auto_axes. XLA's partitioner inserts every collective."""

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

B, T, D, F, NH, HD = 4, 8, 16, 32, 4, 4


def ffn(x, w1, b1, w2):
    return jax.nn.gelu(x @ w1 + b1) @ w2


def ffn_inputs():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((B, T, D), f32),
        jax.ShapeDtypeStruct((D, F), f32),
        jax.ShapeDtypeStruct((F,), f32),
        jax.ShapeDtypeStruct((F, D), f32),
    )


def ffn_annotated(x, w1, b1, w2, mesh):
    def pin(a, *spec):
        return jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P(*spec)))

    x = pin(x, "data", None, None)
    w1 = pin(w1, None, "model")
    w2 = pin(w2, "model", None)
    h = pin(jax.nn.gelu(x @ w1 + b1), "data", None, "model")
    return pin(h @ w2, "data", None, None)


def ffn_explicit(x, w1, b1, w2, mesh):
    explicit = jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Explicit,) * len(mesh.axis_names))
    with jax.sharding.use_abstract_mesh(explicit.abstract_mesh):
        x = jax.sharding.reshard(x, P("data", None, None))
        w1 = jax.sharding.reshard(w1, P(None, "model"))
        b1 = jax.sharding.reshard(b1, P("model"))
        w2 = jax.sharding.reshard(w2, P("model", None))
        h = jnp.einsum("btd,df->btf", x, w1, out_sharding=P("data", None, "model"))
        h = jax.nn.gelu(h + b1)
        y = jax.sharding.auto_axes(lambda a, b: jnp.einsum("btf,fd->btd", a, b), out_sharding=P("data", None, None))(
            h, w2
        )
        return jax.sharding.reshard(y, P())


def mha(x, wqkv, wo):
    q, k, v = jnp.split(x @ wqkv, 3, axis=-1)
    q, k, v = (a.reshape(B, T, NH, HD) for a in (q, k, v))
    att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / HD**0.5, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(B, T, NH * HD) @ wo


def mha_inputs():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((B, T, D), f32),
        jax.ShapeDtypeStruct((D, 3 * NH * HD), f32),
        jax.ShapeDtypeStruct((NH * HD, D), f32),
    )


def mha_head_sharded(x, wqkv, wo, mesh):
    heads = NamedSharding(mesh, P("data", None, "model", None))
    q, k, v = jnp.split(x @ wqkv, 3, axis=-1)
    q, k, v = (jax.lax.with_sharding_constraint(a.reshape(B, T, NH, HD), heads) for a in (q, k, v))
    att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / HD**0.5, axis=-1)
    ctx = jax.lax.with_sharding_constraint(jnp.einsum("bhqk,bkhd->bqhd", att, v), heads)
    return ctx.reshape(B, T, NH * HD) @ wo


def mha_head_sharded_transposed(x, wqkv, wo, mesh):
    heads = NamedSharding(mesh, P("data", None, "model", None))
    q, k, v = jnp.split(x @ wqkv, 3, axis=-1)
    q, k, v = (jax.lax.with_sharding_constraint(a.reshape(B, T, HD, NH).swapaxes(2, 3), heads) for a in (q, k, v))
    att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / HD**0.5, axis=-1)
    ctx = jax.lax.with_sharding_constraint(jnp.einsum("bhqk,bkhd->bqhd", att, v), heads)
    return ctx.reshape(B, T, NH * HD) @ wo
