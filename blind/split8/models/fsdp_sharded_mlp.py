"""Pre-LN GELU MLP block whose weights live as flat 1-D buffers (ZeRO-3 style)."""
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

D_MODEL, D_FF, BATCH = 16, 32, 8
SHAPES = {"w_in": (D_MODEL, D_FF), "w_out": (D_FF, D_MODEL)}


def layer_norm(x, gamma, beta, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * gamma + beta


def mlp_block(params, x):
    w_in = params["w_in"].reshape(SHAPES["w_in"])
    w_out = params["w_out"].reshape(SHAPES["w_out"])
    h = layer_norm(x, params["ln_scale"], params["ln_bias"])
    return x + jax.nn.gelu(h @ w_in) @ w_out


def make_inputs():
    f32 = jnp.float32
    params = {name: jax.ShapeDtypeStruct((math.prod(s),), f32) for name, s in SHAPES.items()}
    params["ln_scale"] = jax.ShapeDtypeStruct((D_MODEL,), f32)
    params["ln_bias"] = jax.ShapeDtypeStruct((D_MODEL,), f32)
    return params, jax.ShapeDtypeStruct((BATCH, D_MODEL), f32)


class FullyShardedMLP:
    """Every flat weight buffer is split over both mesh axes; gathered right before use."""

    shard_axes = ("x", "y")

    def __init__(self, mesh):
        self.mesh = mesh

    def unflatten(self, flat, name):
        full = jax.lax.all_gather(flat, self.shard_axes, tiled=True)
        return full.reshape(SHAPES[name])

    def _local(self, params, x):
        w_in = self.unflatten(params["w_in"], "w_in")
        w_out = self.unflatten(params["w_out"], "w_out")
        h = layer_norm(x, params["ln_scale"], params["ln_bias"])
        return x + jax.nn.gelu(h @ w_in) @ w_out

    def param_specs(self):
        spec = P(self.shard_axes)
        return {"w_in": spec, "w_out": spec, "ln_scale": P(), "ln_bias": P()}

    def __call__(self, params, x):
        fn = jax.shard_map(self._local, mesh=self.mesh,
                           in_specs=(self.param_specs(), P(self.shard_axes)),
                           out_specs=P(self.shard_axes))
        return fn(params, x)


class FullyShardedMLPv2(FullyShardedMLP):
    """Same, with the unflatten written for column-major checkpoints."""

    def unflatten(self, flat, name):
        full = jax.lax.all_gather(flat, self.shard_axes, tiled=True)
        return full.reshape(SHAPES[name][::-1]).T


def fsdp_forward(params, x, mesh):
    return FullyShardedMLP(mesh)(params, x)


def fsdp_forward_v2(params, x, mesh):
    return FullyShardedMLPv2(mesh)(params, x)
