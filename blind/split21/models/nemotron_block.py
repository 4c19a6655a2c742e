"""Nemotron-like decoder block written with hand-rolled Haiku-style module classes: LayerNorm1p
(gain stored as an offset from 1, with bias), causal multi-head attention, squared-ReLU MLP, two
pre-norm residuals. Each module receives a `reduce` callback that finishes its output projection.

- `block_tp`: shard_map on {tp: 4}; heads and MLP columns over tp, psum after o-proj and down-proj;
- `block_dp_tp`: on {dp: 2, tp: 2}; batch over dp, heads and MLP columns over tp.
"""
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, F = 4, 8, 32, 4, 8, 64


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {"ln1_w": f(D), "ln1_b": f(D), "wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD),
              "wo": f(H, HD, D), "ln2_w": f(D), "ln2_b": f(D), "w_up": f(D, F), "w_down": f(F, D)}
    return params, f(B, T, D)


class LayerNorm1p:
    def __init__(self, w, b):
        self.w, self.b = w, b

    def __call__(self, x):
        mu = x.mean(-1, keepdims=True)
        var = jnp.square(x - mu).mean(-1, keepdims=True)
        return (x - mu) * lax.rsqrt(var + 1e-5) * (1.0 + self.w) + self.b


class CausalSelfAttention:
    def __init__(self, p, reduce):
        self.p, self.reduce = p, reduce

    def __call__(self, x):
        q = jnp.einsum("btd,dhk->bhtk", x, self.p["wq"])
        k = jnp.einsum("btd,dhk->bhtk", x, self.p["wk"])
        v = jnp.einsum("btd,dhk->bhtk", x, self.p["wv"])
        s = jnp.einsum("bhqk,bhsk->bhqs", q, k) / math.sqrt(HD)
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -1e30)
        o = jnp.einsum("bhqs,bhsk->bhqk", jax.nn.softmax(s, -1), v)
        return self.reduce(jnp.einsum("bhqk,hkd->bqd", o, self.p["wo"]))


class SquaredReluMLP:
    def __init__(self, p, reduce):
        self.p, self.reduce = p, reduce

    def __call__(self, x):
        return self.reduce(jnp.square(jax.nn.relu(x @ self.p["w_up"])) @ self.p["w_down"])


class Block:
    def __init__(self, p, reduce):
        self.ln1, self.ln2 = LayerNorm1p(p["ln1_w"], p["ln1_b"]), LayerNorm1p(p["ln2_w"], p["ln2_b"])
        self.attn, self.mlp = CausalSelfAttention(p, reduce), SquaredReluMLP(p, reduce)

    def __call__(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.mlp(self.ln2(h))


def block(params, x):
    return Block(params, lambda y: y)(x)


def _param_specs():
    heads_in, heads_out = P(None, "tp", None), P("tp", None, None)
    return {"ln1_w": P(), "ln1_b": P(), "wq": heads_in, "wk": heads_in, "wv": heads_in, "wo": heads_out,
            "ln2_w": P(), "ln2_b": P(), "w_up": P(None, "tp"), "w_down": P("tp", None)}


def _psum_tp(y):
    return lax.psum(y, "tp")


def _local(params, x):
    return Block(params, _psum_tp)(x)


def block_tp(params, x, mesh):
    return jax.shard_map(_local, mesh=mesh, check_vma=False, in_specs=(_param_specs(), P()), out_specs=P())(params, x)


def _local_residual_in_psum(params, x):
    blk = Block(params, lambda y: y)
    h = _psum_tp(x + blk.attn(blk.ln1(x)))
    return h + _psum_tp(blk.mlp(blk.ln2(h)))


def block_tp_residual_in_psum(params, x, mesh):
    return jax.shard_map(_local_residual_in_psum, mesh=mesh, check_vma=False, in_specs=(_param_specs(), P()),
                         out_specs=P())(params, x)


def block_dp_tp(params, x, mesh):
    return jax.shard_map(_local, mesh=mesh, check_vma=False, in_specs=(_param_specs(), P("dp")), out_specs=P("dp"))(params, x)


def _local_dropped_attn_residual(params, x):
    blk = Block(params, _psum_tp)
    h = x + blk.attn(blk.ln1(x))
    return x + blk.mlp(blk.ln2(h))


def block_dp_tp_dropped_attn_residual(params, x, mesh):
    return jax.shard_map(_local_dropped_attn_residual, mesh=mesh, check_vma=False, in_specs=(_param_specs(), P("dp")),
                         out_specs=P("dp"))(params, x)
