"""T5-v1.1-style encoder block in bfloat16: RMSNorm (f32 statistics, bf16 output), unscaled
multi-head attention (T5 folds 1/sqrt(d) into its init) with bf16 matmuls accumulating in f32
(preferred_element_type) and the softmax in f32, gated-GELU FFN; f32 residual stream.

- `t5_tp`: shard_map on {tp: 4}; heads and FFN columns over tp, row-parallel outputs psum'd in f32;
- `t5_dp_tp`: on {dp: 2, tp: 2}; batch over dp, the FFN output reduced with psum_scatter over the
  model dim and all_gathered back.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, F = 4, 8, 32, 4, 8, 64
BF, F32 = jnp.bfloat16, jnp.float32


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, F32)
    return {"g1": f(D), "wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D), "g2": f(D),
            "wi0": f(D, F), "wi1": f(D, F), "wo2": f(F, D)}, f(B, T, D)


def _rms(x, g):
    x32 = x.astype(F32)
    return (x32 * lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * g).astype(BF)


def _mm(eq, a, b):
    return jnp.einsum(eq, a.astype(BF), b.astype(BF), preferred_element_type=F32)


def _attn(p, h):
    q, k, v = (_mm("btd,dhk->bthk", h, p[n]).astype(BF) for n in ("wq", "wk", "wv"))
    s = _mm("bqhk,bshk->bhqs", q, k)
    a = jax.nn.softmax(s, axis=-1).astype(BF)
    o = _mm("bhqs,bshk->bqhk", a, v).astype(BF)
    return _mm("bqhk,hkd->bqd", o, p["wo"])


def _ffn(p, h, act):
    gate, up = _mm("btd,df->btf", h, p["wi0"]), _mm("btd,df->btf", h, p["wi1"])
    return _mm("btf,fd->btd", act(gate, up).astype(BF), p["wo2"])


def _gated_gelu(gate, up):
    return jax.nn.gelu(gate) * up


def t5_block(p, x):
    x = x + _attn(p, _rms(x, p["g1"]))
    return x + _ffn(p, _rms(x, p["g2"]), _gated_gelu)


def _specs():
    heads = P(None, "tp", None)
    return {"g1": P(), "wq": heads, "wk": heads, "wv": heads, "wo": P("tp", None, None), "g2": P(),
            "wi0": P(None, "tp"), "wi1": P(None, "tp"), "wo2": P("tp", None)}


def _tp_local(p, x):
    x = x + lax.psum(_attn(p, _rms(x, p["g1"])), "tp")
    return x + lax.psum(_ffn(p, _rms(x, p["g2"]), _gated_gelu), "tp")


def _tp_local_ffn_norm_gain_g1(p, x):
    x = x + lax.psum(_attn(p, _rms(x, p["g1"])), "tp")
    return x + lax.psum(_ffn(p, _rms(x, p["g1"]), _gated_gelu), "tp")


def _tp(fn, p, x, mesh):
    return jax.shard_map(fn, mesh=mesh, in_specs=(_specs(), P()), out_specs=P(), check_vma=False)(p, x)


def t5_tp(p, x, mesh):
    return _tp(_tp_local, p, x, mesh)


def t5_tp_ffn_norm_gain_g1(p, x, mesh):
    return _tp(_tp_local_ffn_norm_gain_g1, p, x, mesh)


def _dp_tp_local(p, x, act):
    x = x + lax.psum(_attn(p, _rms(x, p["g1"])), "tp")
    part = lax.psum_scatter(_ffn(p, _rms(x, p["g2"]), act), "tp", scatter_dimension=2, tiled=True)
    return x + lax.all_gather(part, "tp", axis=2, tiled=True)


def _dp_tp(p, x, mesh, act):
    return jax.shard_map(lambda p, x: _dp_tp_local(p, x, act), mesh=mesh, in_specs=(_specs(), P("dp")),
                         out_specs=P("dp"), check_vma=False)(p, x)


def t5_dp_tp(p, x, mesh):
    return _dp_tp(p, x, mesh, _gated_gelu)


def t5_dp_tp_gate_up_swapped(p, x, mesh):
    return _dp_tp(p, x, mesh, lambda gate, up: jax.nn.gelu(up) * gate)
