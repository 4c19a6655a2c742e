"""Programs sharded by jit alone (GSPMD / sharding propagation), no shard_map.

An attention block annotated with bare PartitionSpecs against the current mesh (heads on `model`,
batch on `data`), and an RMSNorm-MLP served by a jitted step whose weights are placed with
jax.device_put inside the jitted function and whose output sharding is fixed by out_shardings.
"""
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

B, T, D, H, HD = 4, 8, 16, 4, 4


def attn_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"wq": f(D, D), "wk": f(D, D), "wv": f(D, D), "wo": f(D, D)}, f(B, T, D)


def _split_heads(t):
    return t.reshape(B, T, H, HD)


def _split_heads_swapped(t):
    return t.reshape(B, T, HD, H).swapaxes(2, 3)


def attention_block(params, x):
    q, k, v = (_split_heads(x @ params[n]) for n in ("wq", "wk", "wv"))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(HD)
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v).reshape(B, T, D)
    return x + o @ params["wo"]


def _annotated_block(split_heads):
    @partial(jax.jit, out_shardings=P("data"))
    def block(params, x):
        x = lax.with_sharding_constraint(x, P("data"))
        heads = lambda w: lax.with_sharding_constraint(split_heads(x @ w), P("data", None, "model"))
        q, k, v = heads(params["wq"]), heads(params["wk"]), heads(params["wv"])
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * HD ** -0.5
        causal = lax.broadcasted_iota(jnp.int32, (T, T), 0) >= lax.broadcasted_iota(jnp.int32, (T, T), 1)
        p = jax.nn.softmax(jnp.where(causal, s, -jnp.inf), axis=-1)
        o = lax.with_sharding_constraint(jnp.einsum("bhqk,bkhd->bqhd", p, v), P("data", None, "model"))
        return x + o.reshape(B, T, D) @ params["wo"]
    return block


def attention_block_jit(params, x):
    return _annotated_block(_split_heads)(params, x)


def attention_block_jit_swapped(params, x):
    return _annotated_block(_split_heads_swapped)(params, x)


# ---- RMSNorm + GELU MLP, weights placed inside the jitted step ----------------------------------

N, F = 8, 64


def mlp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    return {"norm": f(D), "up": f(D, F), "down": f(F, D)}, f(N, D)


def rms_norm(x, w):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w


def norm_mlp(params, x):
    h = rms_norm(x, params["norm"])
    return x + jax.nn.gelu(h @ params["up"]) @ params["down"]


class MLPServer:
    def __init__(self, mesh, mean_square):
        self.mesh, self.mean_square = mesh, mean_square
        self.step = jax.jit(self._step, out_shardings=NamedSharding(mesh, P("fsdp")))

    def _place(self, params):
        ns = lambda *spec: NamedSharding(self.mesh, P(*spec))
        return {"norm": jax.device_put(params["norm"], ns()),
                "up": jax.device_put(params["up"], ns("fsdp", "tensor")),
                "down": jax.device_put(params["down"], ns("tensor", "fsdp"))}

    def _step(self, params, x):
        p = self._place(params)
        x = jax.device_put(x, NamedSharding(self.mesh, P("fsdp")))
        h = x * lax.rsqrt(self.mean_square(x) + 1e-6) * p["norm"]
        h = lax.with_sharding_constraint(jax.nn.gelu(h @ p["up"]), NamedSharding(self.mesh, P("fsdp", "tensor")))
        return x + h @ p["down"]


def norm_mlp_served(params, x, mesh):
    return MLPServer(mesh, lambda x: jnp.mean(x * x, axis=-1, keepdims=True)).step(params, x)


def norm_mlp_served_sum(params, x, mesh):
    return MLPServer(mesh, lambda x: jnp.sum(x * x, axis=-1, keepdims=True)).step(params, x)
