"""PaLM-style parallel decoder block (attention and MLP read the same LayerNorm output and are
added to the residual together), bias-free, with QK-norm (RMSNorm over each head's query and key)
and a GELU MLP. Parameters are a flat checkpoint-style dict keyed by "/"-joined paths
("layer_0/attn/q_proj/kernel", ...), two layers looked up by f-string keys.

Parallel versions on {dp: 2, mp: 4}: batch over dp, heads and MLP hidden over mp.
- `palm_tp_two_reduces`: attention and MLP each reduced by their own psum over mp;
- `palm_tp_fused_reduce`: the two partial outputs added first and reduced by one psum, the causal
  mask built once outside the shard_map from `jnp.tril`.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD, F, LAYERS = 4, 8, 32, 8, 4, 64, 2
EPS = 1e-6


def _key(i, *path):
    return "/".join((f"layer_{i}",) + path)


def palm_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    params = {}
    for i in range(LAYERS):
        params[_key(i, "ln", "scale")] = f(D)
        params[_key(i, "ln", "bias")] = f(D)
        for name in ("q_proj", "k_proj", "v_proj"):
            params[_key(i, "attn", name, "kernel")] = f(D, H, HD)
        params[_key(i, "attn", "q_norm", "scale")] = f(HD)
        params[_key(i, "attn", "k_norm", "scale")] = f(HD)
        params[_key(i, "attn", "o_proj", "kernel")] = f(H, HD, D)
        params[_key(i, "mlp", "wi", "kernel")] = f(D, F)
        params[_key(i, "mlp", "wo", "kernel")] = f(F, D)
    return params, f(B, S, D)


def layer_norm(x, scale, bias):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + EPS) * scale + bias


def head_rms(x, scale):
    return x * lax.rsqrt((x * x).mean(-1, keepdims=True) + EPS) * scale


def attention(p, i, h, allowed):
    q = head_rms(jnp.einsum("bsd,dnh->bnsh", h, p[_key(i, "attn", "q_proj", "kernel")]),
                 p[_key(i, "attn", "q_norm", "scale")])
    k = head_rms(jnp.einsum("bsd,dnh->bnsh", h, p[_key(i, "attn", "k_proj", "kernel")]),
                 p[_key(i, "attn", "k_norm", "scale")])
    v = jnp.einsum("bsd,dnh->bnsh", h, p[_key(i, "attn", "v_proj", "kernel")])
    logits = jnp.einsum("bnqh,bnkh->bnqk", q, k) * (HD ** -0.5)
    logits = jnp.where(allowed, logits, -1e9)
    out = jnp.einsum("bnqk,bnkh->bnqh", jax.nn.softmax(logits, axis=-1), v)
    return jnp.einsum("bnqh,nhd->bqd", out, p[_key(i, "attn", "o_proj", "kernel")])


def mlp(p, i, h):
    up = jax.nn.gelu(h @ p[_key(i, "mlp", "wi", "kernel")], approximate=True)
    return up @ p[_key(i, "mlp", "wo", "kernel")]


def causal(n):
    q = jnp.arange(n)[:, None]
    k = jnp.arange(n)[None, :]
    return k <= q


def palm(params, x):
    for i in range(LAYERS):
        h = layer_norm(x, params[_key(i, "ln", "scale")], params[_key(i, "ln", "bias")])
        x = x + attention(params, i, h, causal(S)) + mlp(params, i, h)
    return x


def _specs(params):
    def spec(k):
        if k.endswith(("q_proj/kernel", "k_proj/kernel", "v_proj/kernel")):
            return P(None, "mp")
        if k.endswith("o_proj/kernel"):
            return P("mp")
        if k.endswith("wi/kernel"):
            return P(None, "mp")
        if k.endswith("wo/kernel"):
            return P("mp")
        return P()
    return {k: spec(k) for k in params}


def _shard(body, params, x, mesh):
    return jax.shard_map(body, mesh=mesh, in_specs=(_specs(params), P("dp")),
                         out_specs=P("dp"), check_vma=False)(params, x)


# ---- one psum per branch ------------------------------------------------------------------------

def _tp_layer(p, i, x, allowed):
    h = layer_norm(x, p[_key(i, "ln", "scale")], p[_key(i, "ln", "bias")])
    a = lax.psum(attention(p, i, h, allowed), "mp")
    m = lax.psum(mlp(p, i, h), "mp")
    return x + a + m


def _tp_layer_no_mlp_psum(p, i, x, allowed):
    h = layer_norm(x, p[_key(i, "ln", "scale")], p[_key(i, "ln", "bias")])
    a = lax.psum(attention(p, i, h, allowed), "mp")
    m = mlp(p, i, h)
    return x + a + m


def _layers(layer_fn, mask_fn):
    def body(p, x):
        for i in range(LAYERS):
            x = layer_fn(p, i, x, mask_fn(S))
        return x
    return body


def palm_tp_two_reduces(params, x, mesh):
    return _shard(_layers(_tp_layer, causal), params, x, mesh)


def palm_tp_two_reduces_no_mlp_psum(params, x, mesh):
    return _shard(_layers(_tp_layer_no_mlp_psum, causal), params, x, mesh)


# ---- one fused psum -----------------------------------------------------------------------------

def _fused_body(allowed):
    def body(p, x):
        for i in range(LAYERS):
            h = layer_norm(x, p[_key(i, "ln", "scale")], p[_key(i, "ln", "bias")])
            x = x + lax.psum(attention(p, i, h, allowed) + mlp(p, i, h), "mp")
        return x
    return body


def palm_tp_fused_reduce(params, x, mesh):
    allowed = jnp.tril(jnp.ones((S, S), bool))
    return _shard(_fused_body(allowed), params, x, mesh)


def palm_tp_fused_reduce_tril_offset(params, x, mesh):
    allowed = jnp.tril(jnp.ones((S, S), bool), k=-1)
    return _shard(_fused_body(allowed), params, x, mesh)
