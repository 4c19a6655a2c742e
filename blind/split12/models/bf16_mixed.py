"""bfloat16 layers with float32 accumulation (preferred_element_type=f32), f32 norms and softmax,
casts back to bf16 at layer boundaries. Parameters and activations are bf16.

1. SwiGLU MLP with a fused [gate | up] kernel split by jnp.split and a (1 + w) RMSNorm computed in
   f32; tensor parallel over {tp: 4}: the fused kernel is viewed as [D, 2, F] so the hidden units
   can be sharded, partial f32 outputs all-reduced before the residual and the final cast.
2. Attention on {dp: 2, tp: 2} (batch over dp, heads over tp); the sharded code keeps logits in a
   heads-last [b, q, k, h] layout, softmax in f32 over the key dim.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BF = jnp.bfloat16
F32 = jnp.float32
B, S, D, F, H, HD = 4, 8, 32, 64, 4, 8
BRANCH_SCALE = 2.0 ** -8          # fixed muP-style multiplier on the MLP branch
NEG = float(jnp.finfo(F32).min)


def _dot(a, b):
    return jnp.dot(a, b, preferred_element_type=F32)


def rms_norm_f32(x, w):
    x32 = x.astype(F32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (y * (1.0 + w.astype(F32))).astype(BF)


def mlp_inputs():
    bf = lambda *s: jax.ShapeDtypeStruct(s, BF)
    return {"norm": bf(D), "gate_up": bf(D, 2 * F), "down": bf(F, D)}, bf(B, S, D)


def swiglu_block(p, x):
    h = rms_norm_f32(x, p["norm"])
    gate, up = jnp.split(_dot(h, p["gate_up"]), 2, axis=-1)
    act = (jax.nn.silu(gate) * up).astype(BF)
    return (x.astype(F32) + _dot(act, p["down"]) * BRANCH_SCALE).astype(BF)


def _tp_local(norm, gate_up, down, x):
    h = rms_norm_f32(x, norm)
    gate, up = jnp.split(_dot(h, gate_up.reshape(D, -1)), 2, axis=-1)
    act = (jax.nn.silu(gate) * up).astype(BF)
    out = lax.psum(_dot(act, down) * BRANCH_SCALE, "tp")
    return (x.astype(F32) + out).astype(BF)


def _tp_local_residual_inside(norm, gate_up, down, x):
    h = rms_norm_f32(x, norm)
    gate, up = jnp.split(_dot(h, gate_up.reshape(D, -1)), 2, axis=-1)
    act = (jax.nn.silu(gate) * up).astype(BF)
    out = lax.psum(x.astype(F32) + _dot(act, down) * BRANCH_SCALE, "tp")
    return out.astype(BF)


def _swiglu_tp(p, x, mesh, local):
    fn = jax.shard_map(local, mesh=mesh,
                       in_specs=(P(), P(None, None, "tp"), P("tp", None), P()), out_specs=P())
    return fn(p["norm"], p["gate_up"].reshape(D, 2, F), p["down"], x)


def swiglu_block_tp(p, x, mesh):
    return _swiglu_tp(p, x, mesh, _tp_local)


def swiglu_block_tp_residual_inside(p, x, mesh):
    return _swiglu_tp(p, x, mesh, _tp_local_residual_inside)


# ---- 2. attention, bf16 with f32 softmax ----------------------------------------------------------

def attn_inputs():
    bf = lambda *s: jax.ShapeDtypeStruct(s, BF)
    return {"wq": bf(D, H, HD), "wk": bf(D, H, HD), "wv": bf(D, H, HD), "wo": bf(H, HD, D)}, bf(B, S, D)


def _proj(x, w):
    return jnp.einsum("bsd,dhk->bshk", x, w, preferred_element_type=F32).astype(BF)


def attention(p, x):
    q, k, v = _proj(x, p["wq"]), _proj(x, p["wk"]), _proj(x, p["wv"])
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=F32) * HD ** -0.5
    causal = jnp.tril(jnp.ones((S, S), dtype=bool))
    probs = jax.nn.softmax(jnp.where(causal, logits, NEG), axis=-1).astype(BF)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v, preferred_element_type=F32).astype(BF)
    return jnp.einsum("bqhd,hdo->bqo", ctx, p["wo"], preferred_element_type=F32).astype(BF)


def _key_softmax(logits):
    return jax.nn.softmax(logits, axis=2)


def _last_dim_softmax(logits):
    return jax.nn.softmax(logits, axis=-1)


def _attn_local(p, x, softmax):
    q, k, v = _proj(x, p["wq"]), _proj(x, p["wk"]), _proj(x, p["wv"])
    logits = jnp.einsum("bqhd,bkhd->bqkh", q, k, preferred_element_type=F32) * HD ** -0.5
    causal = (jnp.arange(S)[:, None] >= jnp.arange(S)[None, :])[None, :, :, None]
    probs = softmax(jnp.where(causal, logits, NEG)).astype(BF)
    ctx = jnp.einsum("bqkh,bkhd->bqhd", probs, v, preferred_element_type=F32).astype(BF)
    out = jnp.einsum("bqhd,hdo->bqo", ctx, p["wo"], preferred_element_type=F32)
    return lax.psum(out, "tp").astype(BF)


def _attn_tp(p, x, mesh, softmax):
    heads = {"wq": P(None, "tp"), "wk": P(None, "tp"), "wv": P(None, "tp"), "wo": P("tp")}
    fn = jax.shard_map(lambda p, x: _attn_local(p, x, softmax), mesh=mesh,
                       in_specs=(heads, P("dp")), out_specs=P("dp"))
    return fn(p, x)


def attention_tp(p, x, mesh):
    return _attn_tp(p, x, mesh, _key_softmax)


def attention_tp_head_softmax(p, x, mesh):
    return _attn_tp(p, x, mesh, _last_dim_softmax)
