# A two-layer regression head whose parameters are packed into one flat vector (as an optimizer
# library would store them). The sharded version keeps the vector sharded over 'dp' with a
# sharding constraint and lets the compiler gather it; the batch is data-parallel.
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

N_IN, N_HID, N_OUT, N_BATCH = 8, 12, 4, 16
SIZES = {"w1": N_IN * N_HID, "b1": N_HID, "w2": N_HID * N_OUT, "b2": N_OUT}
TOTAL = sum(SIZES.values())  # 96 + 12 + 48 + 4 = 160


def inputs():
    return (jax.ShapeDtypeStruct((TOTAL,), jnp.float32),
            jax.ShapeDtypeStruct((N_BATCH, N_IN), jnp.float32))


def unpack(theta):
    out, start = {}, 0
    for name, size in SIZES.items():
        out[name] = theta[start:start + size]
        start += size
    return out


def head(theta, x):
    p = unpack(theta)
    h = jax.nn.relu(x @ p["w1"].reshape(N_IN, N_HID) + p["b1"])
    return h @ p["w2"].reshape(N_HID, N_OUT) + p["b2"]


def head_dp(theta, x, mesh):
    theta = jax.lax.with_sharding_constraint(theta, NamedSharding(mesh, P("dp")))
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("dp", None)))
    w1 = theta[0:N_IN * N_HID].reshape(N_IN, N_HID)
    b1 = theta[N_IN * N_HID:N_IN * N_HID + N_HID]
    off = N_IN * N_HID + N_HID
    w2 = theta[off:off + N_HID * N_OUT].reshape(N_HID, N_OUT)
    b2 = theta[off + N_HID * N_OUT:]
    h = jax.nn.relu(x @ w1 + b1)
    y = h @ w2 + b2
    return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P("dp", None)))


def head_dp_bad_offset(theta, x, mesh):
    theta = jax.lax.with_sharding_constraint(theta, NamedSharding(mesh, P("dp")))
    x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("dp", None)))
    w1 = theta[0:N_IN * N_HID].reshape(N_IN, N_HID)
    b1 = theta[N_IN * N_HID:N_IN * N_HID + N_HID]
    off = N_IN * N_HID
    w2 = theta[off:off + N_HID * N_OUT].reshape(N_HID, N_OUT)
    b2 = theta[TOTAL - N_OUT:]
    h = jax.nn.relu(x @ w1 + b1)
    y = h @ w2 + b2
    return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P("dp", None)))
