"""A decoder stack (pre-norm attention + SwiGLU blocks) with lax.scan over stacked layer
weights, tensor-parallel inside one shard_map around the whole scan.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from common import causal_attention, rms_norm, spec

L, B, S, D, F = 3, 2, 8, 32, 32
N_HEADS, HEAD_DIM = 4, 8
HD = N_HEADS * HEAD_DIM
TP = "tp"


def _layer(x, p, reduce):
    b, s, _ = x.shape
    h = rms_norm(x, p["ln1"])
    heads = lambda t: t.reshape(b, s, -1, HEAD_DIM)
    o = causal_attention(heads(h @ p["wq"]), heads(h @ p["wk"]), heads(h @ p["wv"]))
    x = x + reduce(o.reshape(b, s, -1) @ p["wo"])
    h = rms_norm(x, p["ln2"])
    return x + reduce((jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"])


def decoder(x, params):
    def step(x, p):
        return _layer(x, p, reduce=lambda t: t), None

    x, _ = lax.scan(step, x, params)
    return x


def inputs():
    params = {
        "ln1": spec(L, D), "wq": spec(L, D, HD), "wk": spec(L, D, HD), "wv": spec(L, D, HD),
        "wo": spec(L, HD, D), "ln2": spec(L, D),
        "w_gate": spec(L, D, F), "w_up": spec(L, D, F), "w_down": spec(L, F, D),
    }
    return (spec(B, S, D), params)


# Stacked weights: the layer axis stays whole, the per-layer weight is split as in Megatron.
COL, ROW = P(None, None, TP), P(None, TP, None)
PARAM_SPECS = {
    "ln1": P(), "wq": COL, "wk": COL, "wv": COL, "wo": ROW,
    "ln2": P(), "w_gate": COL, "w_up": COL, "w_down": ROW,
}


def decoder_tp(x, params, *, mesh):
    def body(x, params):
        def step(x, p):
            return _layer(x, p, reduce=lambda t: lax.psum(t, TP)), None

        x, _ = lax.scan(step, x, params)
        return x

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), PARAM_SPECS), out_specs=P())(x, params)


def _layer_tp_fused_residual(x, p):
    b, s, _ = x.shape
    h = rms_norm(x, p["ln1"])
    heads = lambda t: t.reshape(b, s, -1, HEAD_DIM)
    o = causal_attention(heads(h @ p["wq"]), heads(h @ p["wk"]), heads(h @ p["wv"]))
    x = x + lax.psum(o.reshape(b, s, -1) @ p["wo"], TP)
    h = rms_norm(x, p["ln2"])
    mlp_partial = (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]
    return lax.psum(x + mlp_partial, TP)  # BUG: residual folded into the all-reduce, so every shard adds its copy of x (tp * x)


def decoder_tp_fused_residual(x, params, *, mesh):
    def body(x, params):
        def step(x, p):
            return _layer_tp_fused_residual(x, p), None

        x, _ = lax.scan(step, x, params)
        return x

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), PARAM_SPECS), out_specs=P())(x, params)
