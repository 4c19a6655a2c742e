"""bf16 encoder layer with an f32 residual stream: LayerNorm in f32, matmuls on bf16 operands with
f32 accumulation (`preferred_element_type`), attention logits soft-capped (`CAP * tanh(s / CAP)`)
and soft-maxed in f32, probabilities cast to bf16 for the value matmul, GeGLU MLP with the tanh
GELU approximation, the fused [gate | up] kernel [D, 2F]. Tensor parallel on {tp: 4}.

- `encoder_tp_f32_reduce`: heads and MLP hidden sharded, each device's f32 partial projections
  reduced by `psum` in f32; the fused MLP kernel re-laid out as [D, 2, F] outside the shard_map so
  each device gets matching gate / up columns;
- `encoder_tp_bf16_reduce`: same layout, partials cast to bf16 before a bf16 `psum`, the GeGLU
  computed from `jnp.split` of the locally re-fused [gate | up] columns.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, S, D, H, HD, F = 2, 8, 32, 8, 4, 64
TP = 4
CAP = 20.0
BF = jnp.bfloat16
F32 = jnp.float32


def enc_inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, BF)
    params = {"ln1": jax.ShapeDtypeStruct((D,), F32), "ln2": jax.ShapeDtypeStruct((D,), F32),
              "wqkv": f(3, D, H, HD), "wo": f(H, HD, D), "w_gu": f(D, 2 * F), "w_down": f(F, D)}
    return params, jax.ShapeDtypeStruct((B, S, D), F32)


def _ln(x, g):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g


def _mm(eq, a, b):
    return jnp.einsum(eq, a.astype(BF), b.astype(BF), preferred_element_type=F32)


def _softcap(s):
    return CAP * jnp.tanh(s / CAP)


def _attention(p, x, cap):
    h = _ln(x, p["ln1"])
    q, k, v = (_mm("bsd,dhk->bshk", h, p["wqkv"][i]) for i in range(3))
    s = cap(_mm("bqhk,bshk->bhqs", q, k) * HD ** -0.5)
    probs = jax.nn.softmax(s, axis=-1).astype(BF)
    o = _mm("bhqs,bshk->bqhk", probs, v)
    return _mm("bqhk,hkd->bqd", o, p["wo"])


def _geglu(h, w_gate, w_up, w_down):
    g = _mm("bsd,df->bsf", h, w_gate)
    u = _mm("bsd,df->bsf", h, w_up)
    return _mm("bsf,fd->bsd", jax.nn.gelu(g, approximate=True) * u, w_down)


def encoder(p, x):
    x = x + _attention(p, x, _softcap)
    w_gate, w_up = jnp.split(p["w_gu"], 2, axis=-1)
    return x + _geglu(_ln(x, p["ln2"]), w_gate, w_up, p["w_down"])


SPECS = {"ln1": P(), "ln2": P(), "wqkv": P(None, None, "tp"), "wo": P("tp"),
         "w_gu": P(None, None, "tp"), "w_down": P("tp")}


def _as_gate_up(p):
    return dict(p, w_gu=p["w_gu"].reshape(D, 2, F))


def _f32_local(p, x, cap):
    x = x + lax.psum(_attention(p, x, cap), "tp")
    mlp = _geglu(_ln(x, p["ln2"]), p["w_gu"][:, 0], p["w_gu"][:, 1], p["w_down"])
    return x + lax.psum(mlp, "tp")


def _f32(cap, p, x, mesh):
    return jax.shard_map(lambda p, x: _f32_local(p, x, cap), mesh=mesh, in_specs=(SPECS, P()),
                         out_specs=P(), check_vma=False)(_as_gate_up(p), x)


def encoder_tp_f32_reduce(p, x, mesh):
    return _f32(_softcap, p, x, mesh)


def encoder_tp_f32_reduce_uncapped(p, x, mesh):
    return _f32(lambda s: s, p, x, mesh)


def _bf16_local(p, x, fused_layout):
    x = x + lax.psum(_attention(p, x, _softcap).astype(BF), "tp").astype(F32)
    w_gate, w_up = jnp.split(fused_layout(p["w_gu"]), 2, axis=-1)
    mlp = _geglu(_ln(x, p["ln2"]), w_gate, w_up, p["w_down"])
    return x + lax.psum(mlp.astype(BF), "tp").astype(F32)


def _bf16(fused_layout, p, x, mesh, prepare, w_gu_spec):
    specs = dict(SPECS, w_gu=w_gu_spec)
    return jax.shard_map(lambda p, x: _bf16_local(p, x, fused_layout), mesh=mesh,
                         in_specs=(specs, P()), out_specs=P(), check_vma=False)(prepare(p), x)


def encoder_tp_bf16_reduce(p, x, mesh):
    return _bf16(lambda w: w.reshape(D, 2 * (F // TP)), p, x, mesh, _as_gate_up, P(None, None, "tp"))


def encoder_tp_bf16_reduce_fused_columns(p, x, mesh):
    return _bf16(lambda w: w, p, x, mesh, lambda p: p, P(None, "tp"))
