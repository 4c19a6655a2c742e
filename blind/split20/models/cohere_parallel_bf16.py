"""Cohere-Command-style parallel block in bf16: one bias-free LayerNorm (f32) feeds both the
attention and the SwiGLU MLP, both computed with bf16 operands and f32 accumulation
(`preferred_element_type`), softmax in f32; out = x + attn + mlp; then a final LayerNorm (f32) and
LM logits scaled by LOGIT_SCALE. Returns (hidden state for the next block, logits).

- `block_tp`: shard_map on {tp: 4}, heads and MLP columns split, the f32 partial sums of both
  branches psum'd together, the residual added after the psum;
- `block_dp_tp_hidden_scatter`: on {dp: 2, tp: 2}, the partial sums are reduce-scattered over the
  hidden dim (psum_scatter), the final LayerNorm's statistics psum'd over tp, the LM head's rows
  split over tp.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

B, T, D, H, HD, F, V = 2, 8, 32, 4, 8, 64, 48
LOGIT_SCALE = 0.25
bf16, f32 = jnp.bfloat16, jnp.float32


def inputs():
    f = lambda *s: jax.ShapeDtypeStruct(s, f32)
    params = {"ln": f(D), "wq": f(D, H, HD), "wk": f(D, H, HD), "wv": f(D, H, HD), "wo": f(H, HD, D),
              "w_gate": f(D, F), "w_up": f(D, F), "w_down": f(F, D), "ln_f": f(D), "w_lm": f(D, V)}
    return params, f(B, T, D)


def _mm(spec, a, b):
    return jnp.einsum(spec, a.astype(bf16), b.astype(bf16), preferred_element_type=f32)


def layer_norm(x, g):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g


def _branches(p, h):
    """f32 sum of the attention and MLP outputs (a partial sum when p holds a shard)."""
    q = _mm("btd,dnh->bnth", h, p["wq"]) * HD ** -0.5
    k = _mm("btd,dnh->bnth", h, p["wk"])
    v = _mm("btd,dnh->bnth", h, p["wv"])
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), _mm("bnqh,bnkh->bnqk", q, k), -1e9)
    o = _mm("bnqk,bnkh->bnqh", jax.nn.softmax(s, -1), v)
    attn = _mm("bnth,nhd->btd", o, p["wo"])
    g = jax.nn.silu(_mm("btd,df->btf", h, p["w_gate"])) * _mm("btd,df->btf", h, p["w_up"])
    return attn + _mm("btf,fd->btd", g, p["w_down"])


def block(p, x):
    y = x + _branches(p, layer_norm(x, p["ln"]))
    return y, _mm("btd,dv->btv", layer_norm(y, p["ln_f"]), p["w_lm"]) * LOGIT_SCALE


TP_SPECS = {"ln": P(), "wq": P(None, "tp"), "wk": P(None, "tp"), "wv": P(None, "tp"), "wo": P("tp"),
            "w_gate": P(None, "tp"), "w_up": P(None, "tp"), "w_down": P("tp"), "ln_f": P(), "w_lm": P()}


# ---- tp: one psum for both branches -------------------------------------------------------------

def _tp_local(p, x):
    y = x + lax.psum(_branches(p, layer_norm(x, p["ln"])), "tp")
    return y, _mm("btd,dv->btv", layer_norm(y, p["ln_f"]), p["w_lm"]) * LOGIT_SCALE


def _tp_local_branches_averaged(p, x):
    y = x + lax.pmean(_branches(p, layer_norm(x, p["ln"])), "tp")
    return y, _mm("btd,dv->btv", layer_norm(y, p["ln_f"]), p["w_lm"]) * LOGIT_SCALE


def block_tp(p, x, mesh):
    return jax.shard_map(_tp_local, mesh=mesh, in_specs=(TP_SPECS, P()), out_specs=(P(), P()),
                         check_vma=False)(p, x)


def block_tp_branches_averaged(p, x, mesh):
    return jax.shard_map(_tp_local_branches_averaged, mesh=mesh, in_specs=(TP_SPECS, P()),
                         out_specs=(P(), P()), check_vma=False)(p, x)


# ---- dp x tp: hidden dim scattered for the final norm -------------------------------------------

def _sharded_norm(y, g):
    mu = lax.psum(y.sum(-1, keepdims=True), "tp") / D
    var = lax.psum(((y - mu) ** 2).sum(-1, keepdims=True), "tp") / D
    return (y - mu) * lax.rsqrt(var + 1e-5) * g


def _shard_local_norm(y, g):
    mu = y.mean(-1, keepdims=True)
    var = ((y - mu) ** 2).mean(-1, keepdims=True)
    return (y - mu) * lax.rsqrt(var + 1e-5) * g


def _scatter_local(p, x, final_norm):
    part = _branches(p, layer_norm(x, p["ln"]))
    dl = D // lax.axis_size("tp")
    x_cols = lax.dynamic_slice_in_dim(x, lax.axis_index("tp") * dl, dl, axis=2)
    y = x_cols + lax.psum_scatter(part, "tp", scatter_dimension=2, tiled=True)
    g = lax.dynamic_slice_in_dim(p["ln_f"], lax.axis_index("tp") * dl, dl)
    return y, lax.psum(_mm("btd,dv->btv", final_norm(y, g), p["w_lm"]), "tp") * LOGIT_SCALE


def _run_scatter(p, x, mesh, final_norm):
    specs = dict(TP_SPECS, w_lm=P("tp"))
    local = lambda p, x: _scatter_local(p, x, final_norm)
    return jax.shard_map(local, mesh=mesh, in_specs=(specs, P("dp")), out_specs=(P("dp", None, "tp"), P("dp")),
                         check_vma=False)(p, x)


def block_dp_tp_hidden_scatter(p, x, mesh):
    return _run_scatter(p, x, mesh, _sharded_norm)


def block_dp_tp_hidden_scatter_local_norm(p, x, mesh):
    return _run_scatter(p, x, mesh, _shard_local_norm)
