"""DeepNet-style post-LN decoder block: x <- LN(ALPHA * x + sublayer(x)) around causal multi-head
attention with q/k/v biases and a GELU MLP (biases on every projection).

- `block_tp`: shard_map on {tp: 4}; heads and MLP columns over tp, psum after o-proj and down-proj,
  the output biases added once after the psum;
- `block_dp_tp`: on {dp: 2, tp: 2}; batch over dp, heads and MLP columns over tp.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, F = 4, 8, 32, 4, 8, 64
ALPHA = (2.0 * 6) ** 0.25


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    p = {"wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "bq": f(H, HD), "bk": f(H, HD),
         "bv": f(H, HD), "wo": f(H, HD, D), "bo": f(D), "g1": f(D), "b1": f(D), "w1": f(D, F), "c1": f(F),
         "w2": f(F, D), "c2": f(D), "g2": f(D), "b2": f(D)}
    return p, f(B, T, D)


def _ln(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * g + b


def _attn(p, x, reduce):
    q = jnp.einsum("btd,dhk->bthk", x, p["wq"]) + p["bq"]
    k = jnp.einsum("btd,dhk->bthk", x, p["wk"]) + p["bk"]
    v = jnp.einsum("btd,dhk->bthk", x, p["wv"]) + p["bv"]
    s = jnp.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(HD)
    s = jnp.where(jnp.arange(T)[:, None] >= jnp.arange(T)[None, :], s, -1e9)
    o = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s, axis=-1), v)
    return reduce(jnp.einsum("bqhk,hkd->bqd", o, p["wo"])) + p["bo"]


def _mlp(p, x, reduce):
    return reduce(jax.nn.gelu(x @ p["w1"] + p["c1"]) @ p["w2"]) + p["c2"]


def _block(p, x, reduce):
    x = _ln(ALPHA * x + _attn(p, x, reduce), p["g1"], p["b1"])
    return _ln(ALPHA * x + _mlp(p, x, reduce), p["g2"], p["b2"])


def block(p, x):
    return _block(p, x, lambda y: y)


def _specs():
    cin, hb = P(None, "tp", None), P("tp", None)
    return {"wq": cin, "wk": cin, "wv": cin, "bq": hb, "bk": hb, "bv": hb, "wo": P("tp", None, None), "bo": P(),
            "g1": P(), "b1": P(), "w1": P(None, "tp"), "c1": P("tp"), "w2": P("tp", None), "c2": P(), "g2": P(),
            "b2": P()}


def _psum(y):
    return lax.psum(y, "tp")


def _local(p, x):
    return _block(p, x, _psum)


def block_tp(p, x, mesh):
    return jax.shard_map(_local, mesh=mesh, in_specs=(_specs(), P()), out_specs=P(), check_vma=False)(p, x)


def _local_mlp_alpha_dropped(p, x):
    x = _ln(ALPHA * x + _attn(p, x, _psum), p["g1"], p["b1"])
    return _ln(x + _mlp(p, x, _psum), p["g2"], p["b2"])


def block_tp_mlp_alpha_dropped(p, x, mesh):
    return jax.shard_map(_local_mlp_alpha_dropped, mesh=mesh, in_specs=(_specs(), P()), out_specs=P(),
                         check_vma=False)(p, x)


def block_dp_tp(p, x, mesh):
    return jax.shard_map(_local, mesh=mesh, in_specs=(_specs(), P("dp")), out_specs=P("dp"), check_vma=False)(p, x)


def _local_norm_before_psum(p, x):
    h = _psum(_ln(ALPHA * x + _attn(p, x, lambda y: y), p["g1"], p["b1"]))
    return _ln(ALPHA * h + _mlp(p, h, _psum), p["g2"], p["b2"])


def block_dp_tp_norm_before_psum(p, x, mesh):
    return jax.shard_map(_local_norm_before_psum, mesh=mesh, in_specs=(_specs(), P("dp")), out_specs=P("dp"),
                         check_vma=False)(p, x)
