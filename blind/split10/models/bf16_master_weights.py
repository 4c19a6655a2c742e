"""bf16 compute with f32 master weights.

The forward casts the f32 master parameters to bfloat16, keeps norms, softmax and residual streams in
float32 and asks the matmuls for float32 accumulation (preferred_element_type).
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

BF16, F32 = jnp.bfloat16, jnp.float32
N, D, F = 16, 32, 64


def to_compute(params):
    return jax.tree.map(lambda p: p.astype(BF16), params)


def mm(a, b):
    return jnp.matmul(a.astype(BF16), b, preferred_element_type=F32)


# ---- RMSNorm + SwiGLU, tensor parallel -----------------------------------------------------------

def mlp_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, F32)
    return {"norm": f(D), "gate": f(D, F), "up": f(D, F), "down": f(F, D)}, f(N, D)


def rms_norm_f32(x, w):
    x32 = x.astype(F32)
    return x32 * lax.rsqrt(jnp.mean(jnp.square(x32), -1, keepdims=True) + 1e-6) * w.astype(F32)


def _rms_norm_unscaled(x, w):
    x32 = x.astype(F32)
    return x32 * lax.rsqrt(jnp.mean(jnp.square(x32), -1, keepdims=True) + 1e-6)


def swiglu_block(master, x):
    p = to_compute(master)
    h = rms_norm_f32(x, p["norm"]).astype(BF16)
    act = (jax.nn.silu(mm(h, p["gate"])) * mm(h, p["up"])).astype(BF16)
    return x + mm(act, p["down"])


def _tp_swiglu(norm):
    def local(master, x):
        p = to_compute(master)
        h = norm(x, p["norm"]).astype(BF16)
        act = (jax.nn.silu(mm(h, p["gate"])) * mm(h, p["up"])).astype(BF16)
        return x + lax.psum(mm(act, p["down"]), "tp")
    return local


_MLP_SPECS = {"norm": P(), "gate": P(None, "tp"), "up": P(None, "tp"), "down": P("tp", None)}


def swiglu_block_tp(master, x, mesh):
    return jax.shard_map(_tp_swiglu(rms_norm_f32), mesh=mesh, in_specs=(_MLP_SPECS, P()),
                         out_specs=P())(master, x)


def swiglu_block_tp_unscaled(master, x, mesh):
    return jax.shard_map(_tp_swiglu(_rms_norm_unscaled), mesh=mesh, in_specs=(_MLP_SPECS, P()),
                         out_specs=P())(master, x)


# ---- bf16 attention, f32 scores and softmax, heads x batch mesh --------------------------------

BA, T, H, HD = 4, 8, 4, 8


def attn_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, F32)
    return {"wqkv": f(D, 3, H, HD), "wo": f(H, HD, D)}, f(BA, T, D)


def _scores(q, k):
    return jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=F32) * HD ** -0.5


def attention_bf16(master, x):
    p = to_compute(master)
    qkv = jnp.einsum("btd,dshk->sbthk", x.astype(BF16), p["wqkv"], preferred_element_type=F32)
    q, k, v = qkv.astype(BF16)
    probs = jax.nn.softmax(_scores(q, k), axis=-1).astype(BF16)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v, preferred_element_type=F32).astype(BF16)
    return jnp.einsum("bqhd,hdo->bqo", ctx, p["wo"], preferred_element_type=F32).astype(BF16)


def _attention_heads(softmax_axis):
    def local(master, x):
        p = to_compute(master)
        qkv = jnp.einsum("btd,dshk->sbthk", x.astype(BF16), p["wqkv"], preferred_element_type=F32)
        q, k, v = qkv.astype(BF16)
        probs = jax.nn.softmax(_scores(q, k), axis=softmax_axis).astype(BF16)
        ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v, preferred_element_type=F32).astype(BF16)
        out = jnp.einsum("bqhd,hdo->bqo", ctx, p["wo"], preferred_element_type=BF16)
        return lax.psum(out, "tp")
    return local


_ATTN_SPECS = {"wqkv": P(None, None, "tp"), "wo": P("tp")}


def attention_bf16_tp(master, x, mesh):
    return jax.shard_map(_attention_heads(-1), mesh=mesh, in_specs=(_ATTN_SPECS, P("data")),
                         out_specs=P("data"))(master, x)


def attention_bf16_tp_axis(master, x, mesh):
    return jax.shard_map(_attention_heads(-2), mesh=mesh, in_specs=(_ATTN_SPECS, P("data")),
                         out_specs=P("data"))(master, x)
