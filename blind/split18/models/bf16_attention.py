"""bfloat16 attention sub-layer with float32 islands: RMSNorm statistics in f32, projections on bf16
operands with f32 accumulation (`preferred_element_type`) and a fan-in multiplier 1/sqrt(D) applied
in f32, logits and softmax in f32, probabilities cast to bf16 for the value matmul, output projection
accumulated in f32. f32 master parameters cast to bf16 at use; f32 output (no residual: the caller
adds it).

`attn_bf16_tp` on {dp: 2, tp: 2}: batch over dp, heads over tp; the 1/sqrt(HD) = 0.5 logit scale is
folded into q (exact in bf16, a power of two) instead of scaling the logits; the f32 partial outputs
psum-reduced over tp.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, NH = 4, 8, 32, 8
HD = D // NH
EPS = 1e-6
BF = jnp.bfloat16
F32 = jnp.float32


def attn_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, F32)
    return {"norm": f(D), "wq": f(D, NH, HD), "wk": f(D, NH, HD), "wv": f(D, NH, HD),
            "wo": f(NH, HD, D)}, f(B, S, D)


def _norm_bf16(x, g):
    xf = x.astype(F32)
    return (xf * lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + EPS) * g).astype(BF)


def _proj(h, w):
    out = jnp.einsum("bsd,dnh->bsnh", h, w.astype(BF), preferred_element_type=F32)
    return (out * D ** -0.5).astype(BF)


def _causal_softmax(logits):
    s = logits.shape[-1]
    logits = jnp.where(jnp.tril(jnp.ones((s, s), bool)), logits, -jnp.inf)
    return jax.nn.softmax(logits, axis=-1).astype(BF)


def attention_bf16(p, x):
    h = _norm_bf16(x, p["norm"])
    q, k, v = _proj(h, p["wq"]), _proj(h, p["wk"]), _proj(h, p["wv"])
    logits = jnp.einsum("bqnh,bknh->bnqk", q, k, preferred_element_type=F32) * HD ** -0.5
    ctx = jnp.einsum("bnqk,bknh->bqnh", _causal_softmax(logits), v, preferred_element_type=F32)
    return jnp.einsum("bqnh,nhd->bqd", ctx.astype(BF), p["wo"].astype(BF), preferred_element_type=F32)


SPECS = ({"norm": P(), "wq": P(None, "tp"), "wk": P(None, "tp"), "wv": P(None, "tp"),
          "wo": P("tp")}, P("dp"))


def attn_bf16_tp(p, x, mesh):
    def local(p, x):
        h = _norm_bf16(x, p["norm"])
        q = _proj(h, p["wq"]) * jnp.asarray(HD ** -0.5, BF)
        k, v = _proj(h, p["wk"]), _proj(h, p["wv"])
        logits = jnp.einsum("bqnh,bknh->bnqk", q, k, preferred_element_type=F32)
        ctx = jnp.einsum("bnqk,bknh->bqnh", _causal_softmax(logits), v, preferred_element_type=F32)
        out = jnp.einsum("bqnh,nhd->bqd", ctx.astype(BF), p["wo"].astype(BF), preferred_element_type=F32)
        return lax.psum(out, "tp")
    return jax.shard_map(local, mesh=mesh, in_specs=SPECS, out_specs=P("dp"), check_vma=False)(p, x)


def attn_bf16_tp_inverted_scale(p, x, mesh):
    def local(p, x):
        h = _norm_bf16(x, p["norm"])
        q = _proj(h, p["wq"]) * jnp.asarray(HD ** 0.5, BF)
        k, v = _proj(h, p["wk"]), _proj(h, p["wv"])
        logits = jnp.einsum("bqnh,bknh->bnqk", q, k, preferred_element_type=F32)
        ctx = jnp.einsum("bnqk,bknh->bqnh", _causal_softmax(logits), v, preferred_element_type=F32)
        out = jnp.einsum("bqnh,nhd->bqd", ctx.astype(BF), p["wo"].astype(BF), preferred_element_type=F32)
        return lax.psum(out, "tp")
    return jax.shard_map(local, mesh=mesh, in_specs=SPECS, out_specs=P("dp"), check_vma=False)(p, x)
