"""InternLM-style 2-layer decoder with HF state-dict keys ("layers.{i}.attention.wq.weight", PyTorch
[out, in] layout, `x @ w.T`), RMSNorm, causal softmax attention built from an integer mask, SwiGLU.

Tensor parallel on {replica: 2, model: 4}: batch over `replica`, heads and FFN columns over `model`.

- `block_tp_psum`: Megatron column/row split, one `psum` per sub-layer;
- `block_tp_scatter`: the row-parallel partial sums are reduce-scattered over the hidden dim
  (`psum_scatter(scatter_dimension=2, tiled=True)`) and all-gathered back before the residual.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, F, L = 4, 8, 32, 4, 64, 2
HD = D // H
EPS = 1e-6


def _keys(i):
    p = f"layers.{i}."
    return {"wq": p + "attention.wq.weight", "wk": p + "attention.wk.weight",
            "wv": p + "attention.wv.weight", "wo": p + "attention.wo.weight",
            "w1": p + "feed_forward.w1.weight", "w3": p + "feed_forward.w3.weight",
            "w2": p + "feed_forward.w2.weight", "attn_norm": p + "attention_norm.weight",
            "ffn_norm": p + "ffn_norm.weight"}


def block_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    sd = {}
    for i in range(L):
        k = _keys(i)
        sd.update({k["wq"]: f(D, D), k["wk"]: f(D, D), k["wv"]: f(D, D), k["wo"]: f(D, D),
                   k["w1"]: f(F, D), k["w3"]: f(F, D), k["w2"]: f(D, F),
                   k["attn_norm"]: f(D), k["ffn_norm"]: f(D)})
    return sd, f(B, S, D)


def rms_norm(x, w):
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * (1.0 + 0.1 * w)


def causal_bias(s):
    qi = lax.broadcasted_iota(jnp.int32, (s, s), 0)
    ki = lax.broadcasted_iota(jnp.int32, (s, s), 1)
    return jnp.where(qi >= ki, 0.0, -1e9)


def causal_bias_strict(s):
    qi = lax.broadcasted_iota(jnp.int32, (s, s), 0)
    ki = lax.broadcasted_iota(jnp.int32, (s, s), 1)
    return jnp.where(qi > ki, 0.0, -1e9)


def linear(x, w):
    return x @ w.T


@jax.named_scope("attention")
def attention(x, wq, wk, wv, wo, mask_fn=causal_bias):
    b, s, _ = x.shape
    heads = lambda t: t.reshape(b, s, -1, HD).transpose(0, 2, 1, 3)
    q, k, v = heads(linear(x, wq)), heads(linear(x, wk)), heads(linear(x, wv))
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(HD).astype(x.dtype) + mask_fn(s)
    out = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)
    return linear(out.transpose(0, 2, 1, 3).reshape(b, s, -1), wo)


@jax.named_scope("feed_forward")
def feed_forward(x, w1, w3, w2):
    return linear(jax.nn.silu(linear(x, w1)) * linear(x, w3), w2)


def decoder(sd, x):
    for i in range(L):
        k = _keys(i)
        h = rms_norm(x, sd[k["attn_norm"]])
        x = x + attention(h, sd[k["wq"]], sd[k["wk"]], sd[k["wv"]], sd[k["wo"]])
        h = rms_norm(x, sd[k["ffn_norm"]])
        x = x + feed_forward(h, sd[k["w1"]], sd[k["w3"]], sd[k["w2"]])
    return x


# ---- tensor parallel -------------------------------------------------------------------------------

def _spec(name):
    if name.endswith(("wo.weight", "w2.weight")):
        return P(None, "model")  # row parallel: [out, in/tp]
    if name.endswith("norm.weight"):
        return P()
    return P("model", None)  # column parallel: [out/tp, in]


def _all_reduce(t):
    return lax.psum(t, "model")


def _scatter_gather(t):
    part = lax.psum_scatter(t, "model", scatter_dimension=2, tiled=True)
    return lax.all_gather(part, "model", axis=2, tiled=True)


def _no_reduce(t):
    return t


def _local_decoder(sd, x, attn_reduce, ffn_reduce, mask_fn=causal_bias):
    for i in range(L):
        k = _keys(i)
        h = rms_norm(x, sd[k["attn_norm"]])
        x = x + attn_reduce(attention(h, sd[k["wq"]], sd[k["wk"]], sd[k["wv"]], sd[k["wo"]],
                                      mask_fn=mask_fn))
        h = rms_norm(x, sd[k["ffn_norm"]])
        x = x + ffn_reduce(feed_forward(h, sd[k["w1"]], sd[k["w3"]], sd[k["w2"]]))
    return x


def _tp(local, sd, x, mesh):
    specs = {name: _spec(name) for name in sd}
    return jax.shard_map(local, mesh=mesh, in_specs=(specs, P("replica")),
                         out_specs=P("replica"), check_vma=False)(sd, x)


def block_tp_psum(sd, x, mesh):
    local = functools.partial(_local_decoder, attn_reduce=_all_reduce, ffn_reduce=_all_reduce)
    return _tp(local, sd, x, mesh)


def block_tp_psum_attn_unreduced(sd, x, mesh):
    local = functools.partial(_local_decoder, attn_reduce=_no_reduce, ffn_reduce=_all_reduce)
    return _tp(local, sd, x, mesh)


def block_tp_scatter(sd, x, mesh):
    local = functools.partial(_local_decoder, attn_reduce=_scatter_gather,
                              ffn_reduce=_scatter_gather)
    return _tp(local, sd, x, mesh)


def block_tp_scatter_strict_mask(sd, x, mesh):
    local = functools.partial(_local_decoder, attn_reduce=_scatter_gather,
                              ffn_reduce=_scatter_gather, mask_fn=causal_bias_strict)
    return _tp(local, sd, x, mesh)
