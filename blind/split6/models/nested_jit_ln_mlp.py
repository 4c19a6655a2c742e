"""Pre-LayerNorm MLP block on a {data, model} mesh, sharded only by nested jits with
out_shardings (batch over 'data', hidden over 'model')."""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

BATCH, DIM, HIDDEN = 8, 8, 32
EPS = 1e-5


def layer_norm(x, scale, bias):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + EPS) * scale + bias


def block(p, x):
    h = layer_norm(x, p["ln_s"], p["ln_b"])
    return x + jax.nn.relu(h @ p["w1"] + p["b1"]) @ p["w2"]


def _up_down(mesh):
    up = jax.jit(lambda h, w, b: jax.nn.relu(h @ w + b),
                 out_shardings=NamedSharding(mesh, P("data", "model")))
    down = jax.jit(lambda a, w: a @ w, out_shardings=NamedSharding(mesh, P("data", None)))
    return up, down


def block_sharded(p, x, mesh):
    up, down = _up_down(mesh)
    norm = jax.jit(layer_norm, out_shardings=NamedSharding(mesh, P("data", None)))
    h = norm(x, p["ln_s"], p["ln_b"])
    return x + down(up(h, p["w1"], p["b1"]), p["w2"])


def block_sharded_skips_norm(p, x, mesh):
    up, down = _up_down(mesh)
    h = x * p["ln_s"] + p["ln_b"]
    return x + down(up(h, p["w1"], p["b1"]), p["w2"])


def inputs():
    f = jnp.float32
    p = {"ln_s": jax.ShapeDtypeStruct((DIM,), f), "ln_b": jax.ShapeDtypeStruct((DIM,), f),
         "w1": jax.ShapeDtypeStruct((DIM, HIDDEN), f), "b1": jax.ShapeDtypeStruct((HIDDEN,), f),
         "w2": jax.ShapeDtypeStruct((HIDDEN, DIM), f)}
    return p, jax.ShapeDtypeStruct((BATCH, DIM), f)
