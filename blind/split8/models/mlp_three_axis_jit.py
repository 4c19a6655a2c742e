"""SwiGLU MLP sharded by jit alone on an 8-device (data, fsdp, tensor) mesh."""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

TOK, DM, DF = 8, 16, 32


def swiglu(x, w_gate, w_up, w_down):
    g = jnp.einsum("...d,df->...f", x, w_gate)
    u = jnp.einsum("...d,df->...f", x, w_up)
    return jnp.einsum("...f,fd->...d", jax.nn.silu(g) * u, w_down)


def swiglu_inputs():
    f = jnp.float32
    return (jax.ShapeDtypeStruct((2, TOK, DM), f), jax.ShapeDtypeStruct((DM, DF), f),
            jax.ShapeDtypeStruct((DM, DF), f), jax.ShapeDtypeStruct((DF, DM), f))


def _constrain(mesh, x, *spec):
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(*spec)))


def swiglu_sharded(x, w_gate, w_up, w_down, mesh):
    x = _constrain(mesh, x, "data", None, None)
    w_gu = jnp.concatenate([w_gate, w_up], axis=1)
    w_gu = _constrain(mesh, w_gu, "fsdp", "tensor")
    h = jnp.einsum("...d,df->...f", x, w_gu)
    h = _constrain(mesh, h, "data", None, "tensor")
    gate, up = jnp.split(h, 2, axis=-1)
    act = _constrain(mesh, jax.nn.silu(gate) * up, "data", None, "tensor")
    w_down = _constrain(mesh, w_down, "tensor", "fsdp")
    y = jnp.einsum("...f,fd->...d", act, w_down)
    return _constrain(mesh, y, "data", None, None)


def swiglu_sharded_v2(x, w_gate, w_up, w_down, mesh):
    x = _constrain(mesh, x, "data", None, None)
    w_gu = jnp.concatenate([w_gate, w_up], axis=1)
    w_gu = _constrain(mesh, w_gu, "fsdp", "tensor")
    h = jnp.einsum("...d,df->...f", x, w_gu)
    h = _constrain(mesh, h, "data", None, "tensor")
    up, gate = jnp.split(h, 2, axis=-1)
    act = _constrain(mesh, jax.nn.silu(gate) * up, "data", None, "tensor")
    w_down = _constrain(mesh, w_down, "tensor", "fsdp")
    y = jnp.einsum("...f,fd->...d", act, w_down)
    return _constrain(mesh, y, "data", None, None)
